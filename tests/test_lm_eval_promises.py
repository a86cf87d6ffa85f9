"""The lm-eval backend's promises, each pinned by a test that fails when the promise breaks.

Checked against deliberate slips (``tests/README.md``'s closing table). References:
the exhaustive conditional MPT sum by ``BertForMaskedLM`` called directly (every mask of
every size inside the continuation, its own context visible), and the spread of a rolling
text's log-likelihood over seeded runs.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from lm_eval.api.instance import Instance
from lm_eval.api.task import ConfigurableTask

import mptlml.lm_eval as mle
from mptlml.models import MaskedLM

from .diffusion_helpers import IndependentLM
from .mlm_helpers import exhaustive_masked_sum, make_tiny_bert

pytestmark = pytest.mark.usefixtures("one_thread")


_LOADED: dict = {}


def exhaustive_conditional(model_dir: Path, context: str, continuation: str) -> float:
    """sum_M mean over masks of size M inside the continuation of (1/M) sum log p, directly.

    lm-eval's split: the joined text's tokens after the context's own.
    """
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    if model_dir not in _LOADED:
        _LOADED[model_dir] = (AutoTokenizer.from_pretrained(model_dir),
                              AutoModelForMaskedLM.from_pretrained(model_dir).eval())
    tok, net = _LOADED[model_dir]
    c = tok(context, add_special_tokens=False)["input_ids"]
    full = tok(context + continuation, add_special_tokens=False)["input_ids"]
    assert full[:len(c)] == c
    ids = torch.tensor([tok.cls_token_id, *full, tok.sep_token_id])
    return exhaustive_masked_sum(ids, range(1 + len(c), 1 + len(full)), tok.mask_token_id,
                                 lambda x: net(input_ids=x).logits.double().log_softmax(-1))


# ------------------------------------------------------------------ request grouping
#: winogrande-style documents: several contexts (the choices), one continuation
MULTI_INPUT = [
    {"contexts": ["the cat sat on", "a big dog was under", "the small red house is"],
     "target": "a big tree", "label": 1},
    {"contexts": ["blue tree and", "the dog ran far"], "target": "the red mat", "label": 0},
]


def test_requests_of_one_document_are_scored_each_given_its_own_context(tiny_dir, tmp_path):
    """A document whose requests have different contexts (lm-eval's multiple-input tasks,
    as winogrande): each request is scored given its own context.

    Grouping requests into questions by document alone would score every candidate given
    the first request's context (here: equal numbers). The requests are built by lm-eval's
    own task (a local ``multiple_choice`` task whose ``doc_to_text`` is the gold index:
    the choices are the contexts); continuations of 3 tokens are exact sums, so each
    response must equal the reference of its own (context, continuation) pair to 1e-5.
    """
    data = tmp_path / "mi.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in MULTI_INPUT))
    task = ConfigurableTask(config={
        "task": "toy_mi", "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data)}},
        "output_type": "multiple_choice", "test_split": "test", "doc_to_text": "{{label}}",
        "doc_to_choice": "{{contexts}}", "doc_to_target": "{{target}}",
        "metric_list": [{"metric": "acc"}]})
    task.build_all_requests(rank=0, world_size=1)
    reqs = task.instances
    model = mle.MPTLM(MaskedLM.from_pretrained(tiny_dir), num_masks=4)
    got = [v for v, _ in model.loglikelihood(reqs)]
    for doc_id, doc in enumerate(MULTI_INPUT):
        mine = [(r.args, v) for r, v in zip(reqs, got, strict=True) if r.doc_id == doc_id]
        assert [a[0] for a, _ in mine] == doc["contexts"]  # one request per context
        want = [exhaustive_conditional(tiny_dir, *a) for a, _ in mine]
        np.testing.assert_allclose([v for _, v in mine], want, atol=1e-5)
        assert np.ptp(want) > 0.1  # the contexts do change the numbers


# ------------------------------------------------------------------ the leading space
def metaspace_lm() -> tuple[MaskedLM, object]:
    """Independent tokens (the MPT bound is exactly sum_j log p(x_j)) under a tokenizer to
    which spaces matter: word-level with SentencePiece's ``▁`` (``"on"`` and ``"▁on"`` are
    different tokens, and a trailing space is a token ``"▁"`` of its own)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = "the cat sat on a mat big red".split()
    vocab = ["[PAD]", "[UNK]", "<mask>", "\u2581", *("\u2581" + w for w in words), *words]
    tk = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(vocab)},
                                    unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tk.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]")
    module = IndependentLM(len(vocab), seed=3)
    return MaskedLM(module, tok, mask_token_id=vocab.index("<mask>")), module


def test_a_contexts_trailing_space_goes_to_its_continuation():
    """("the cat sat", " on a mat") and ("the cat sat ", "on a mat") are one request.

    lm-eval puts the space between context and continuation on either side (its
    ``target_delimiter``); the joined text is the same, and so must be the split: the
    context's trailing space moves to the continuation, whose tokens are then
    ``▁on ▁a ▁mat`` both times. Left on the context, the space is a token ``▁`` of its
    own that the joined text does not have: the split shifts by one token. On independent
    tokens a 3-token continuation's bound is exactly sum_j log p(x_j).
    """
    lm, module = metaspace_lm()
    reqs = [Instance("loglikelihood", {}, args, 0, ("toy", d, 1))
            for d, args in enumerate([("the cat sat", " on a mat"), ("the cat sat ", "on a mat")])]
    got = [v for v, _ in mle.MPTLM(lm).loglikelihood(reqs)]
    ids = lm.tokenizer.convert_tokens_to_ids(["\u2581on", "\u2581a", "\u2581mat"])
    np.testing.assert_allclose(got, [module.log_prob(torch.tensor(ids))] * 2, atol=1e-9)


# ------------------------------------------------------------------ windows of long texts
LONG_TEXT = ("the dog was under the big tree and the cat sat on the red mat "
             "a big dog ran far away the small red house blue tree and a cat "
             "was on the mat with a small dog or a big cat but the red house "
             "is over the blue tree")


@pytest.fixture(scope="module")
def short_bert(tmp_path_factory):
    """A tiny BERT of 16 positions (14 content tokens): long texts go in windows."""
    return MaskedLM.from_pretrained(make_tiny_bert(tmp_path_factory.mktemp("short"),
                                                   max_position_embeddings=16))


def _rolling(lm: MaskedLM, seed: int) -> dict:
    model = mle.MPTLM(lm, num_masks=4, seed=seed)
    req = Instance("loglikelihood_rolling", {}, (LONG_TEXT,), 0, ("ppl", 0, 1))
    value = model.loglikelihood_rolling([req])[0]
    (rec,) = model.log.records
    assert rec["loglikelihood"] == value
    return rec


def test_a_windowed_texts_standard_error_matches_its_spread_over_seeds(short_bert):
    """A text in 7 windows: its SE is sqrt(sum of the windows' variances), calibrated.

    Over 100 seeds the spread of the text's log-likelihood divided by the RMS of its
    reported SE lies in [0.7, 1.43] (measured 0.98; the ratio's sampling SD is about
    1/sqrt(2 * 99) = 7%, so the band is about 5 SDs either side). Adding the windows' SEs
    instead of their variances overstates it about twofold (ratio 0.47, measured).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # few dof per window: expected
        recs = [_rolling(short_bert, s) for s in range(100)]
    assert {r["windows"] for r in recs} == {7} and not any(r["exact"] for r in recs)
    ll = np.array([r["loglikelihood"] for r in recs])
    se = np.array([r["stderr"] for r in recs])
    ratio = ll.std(ddof=1) / math.sqrt((se ** 2).mean())
    assert 0.7 < ratio < 1.43, ratio
