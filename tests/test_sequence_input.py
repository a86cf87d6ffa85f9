"""Sequences are what they look like: one normalisation of sequence input (issue 23).

Every ragged entry point (pll, mpt_curve, estimate_lml on a masked LM, the
collator, the text loaders) refuses input that would be scored as something
else: special-token strings in texts, dicts and BatchEncodings, float ids,
list-valued text fields.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

from mptlml import estimate_lml, mpt_curve, pll
from mptlml.data.text import load_texts
from mptlml.hf import DataCollatorForMPT
from mptlml.models import MaskedLM
from mptlml.models.sequence_input import normalise_sequences

from .mlm_helpers import make_tiny_bert


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoTokenizer, BertForMaskedLM

    path = make_tiny_bert(tmp_path_factory.mktemp("seq") / "bert", seed=2)
    tok = AutoTokenizer.from_pretrained(path)
    return MaskedLM(BertForMaskedLM.from_pretrained(path), tok), tok


ENTRY_POINTS = {
    "pll": lambda m, s: pll(m, s),
    "pll-word": lambda m, s: pll(m, s, whole_word=True),
    "mpt_curve": lambda m, s: mpt_curve(m, s, rates=[0.5], num_masks=1),
    "estimate_lml": lambda m, s: estimate_lml(m, s, "cumulative", num_masks=1),
    "chain-rule": lambda m, s: estimate_lml(m, s, "chain-rule", num_masks=2),
}


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize("text, token", [("the [MASK] sat", "[MASK]"),
                                         ("[CLS] [SEP]", "[CLS]"),
                                         ("the cat [PAD]", "[PAD]")])
def test_special_token_strings_in_texts_are_refused(tiny, entry, text, token):
    """Before: "the [MASK] sat" was scored with [MASK] as a content token."""
    mlm, _ = tiny
    with pytest.raises(ValueError, match=rf"special token '\{token[:-1]}\]'.*from the text"):
        ENTRY_POINTS[entry](mlm, ["the cat sat", text])


def test_special_ids_are_handled_the_same_on_both_paths(tiny):
    mlm, tok = tiny
    with pytest.raises(ValueError, match=r"special token '\[MASK\]'.*from the ids"):
        pll(mlm, [tok.convert_tokens_to_ids(["the", "[MASK]", "sat"])])
    # the unknown token is content on both paths: the same score from the text and the ids
    text = "the xyzzy dog was under the big tree and the cat sat on the red mat and a cat sat"
    with pytest.warns(UserWarning, match="unknown token"):
        ids = mlm.encode([text])[0]
    assert int((ids == tok.unk_token_id).sum()) == 1 and len(ids) == 20
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a, b = pll(mlm, [text]), pll(mlm, [ids.tolist()])
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize("entry", ["pll", "mpt_curve", "estimate_lml"])
def test_dicts_and_batch_encodings_are_refused(tiny, entry):
    """Before: pll(mlm, tokenizer(texts)) scored the key names 'input_ids', ... as texts."""
    mlm, tok = tiny
    for batch in (tok(["the cat sat", "a dog"]), {"input_ids": [[5, 6]]}):
        with pytest.raises(TypeError, match="key names"):
            ENTRY_POINTS[entry](mlm, batch)


@pytest.mark.parametrize("bad, match", [
    ([[5.0, 6.0, 7.0]], "never truncated"),
    ([[5, 6.7, 7]], "never truncated"),
    (torch.tensor([[5.0, 6.0]]), "never truncated"),
    ([np.array([5.0, 6.0])], "never truncated"),
    ([[True, False]], "not a token id"),
    ([[[5, 6], [7, 8]]], "nested"),
    ([["the cat", "a dog"]], "list of 2 strings"),
    ([None], "NoneType"),
    (["the cat", [5, 6]], "mix texts and token ids"),
    ("the cat", "single string"),
    ([], "no sequences"),
])
def test_malformed_sequences_are_refused_by_every_entry_point(tiny, bad, match):
    """Before: float ids were truncated to ints and scored."""
    mlm, _ = tiny
    for entry in ("pll", "mpt_curve", "estimate_lml"):
        with pytest.raises((TypeError, ValueError), match=match):
            ENTRY_POINTS[entry](mlm, bad)
    with pytest.raises((TypeError, ValueError), match=match):
        mlm.encode(bad)


def test_integer_ids_of_every_kind_are_one_sequence(tiny):
    mlm, _ = tiny
    ids = [5, 6, 7]
    forms = [[ids], [tuple(ids)], [torch.tensor(ids)], [np.array(ids, dtype=np.int32)],
             torch.tensor([ids]), np.array([ids]), [[np.int64(i) for i in ids]]]
    for f in forms:
        out = normalise_sequences(f)
        assert len(out) == 1 and out[0].dtype == torch.long and out[0].tolist() == ids
    torch.testing.assert_close(pll(mlm, forms[2]), pll(mlm, forms[0]))


def test_the_collator_refuses_float_ids_and_mask_tokens(tiny):
    _, tok = tiny
    coll = DataCollatorForMPT(tok, seed=0)
    with pytest.raises(TypeError, match="never truncated"):
        coll([{"input_ids": [2.0, 5.0, 6.0, 3.0]}])
    with pytest.raises(ValueError, match=r"mask token '\[MASK\]'"):
        coll([dict(tok("the [MASK] sat"))])
    with pytest.raises(TypeError, match="single BatchEncoding"):
        coll(tok(["the cat"]))


@pytest.mark.parametrize("value", [["the cat", "sat"], {"a": "the cat"}])
def test_list_or_dict_text_fields_are_refused_with_file_and_line(tmp_path, value):
    """Before: the field's Python repr "['the cat', 'sat']" was scored as the text."""
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps({"text": "the cat"}) + "\n" + json.dumps({"text": value}) + "\n")
    with pytest.raises(ValueError, match=rf"data.jsonl: line 2, field 'text' holds a "
                                         rf"{type(value).__name__}"):
        load_texts(path)


def test_sampling_refuses_float_allowed_ids(tiny):
    from mptlml.hf import sample_random_order

    mlm, _ = tiny
    with pytest.raises(TypeError, match="allowed_ids, position 0: 5.5"):
        sample_random_order(mlm, 2, 3, allowed_ids=[5.5, 6])


# ---------------------------------------------------------------- (context, continuation) pairs
PAIRS = [("the cat sat", " on a mat"), ("the cat sat ", "on a mat"), ("the cat", " sat on a mat"),
         ("", "a big mat")]


def _split_by_the_tokenizer(tok, context: str, cont: str) -> tuple[list[int], list[int]]:
    """lm-eval's split, by the tokenizer called directly: the context's trailing space moves
    to the continuation; the continuation is the joined text's tokens after the context's."""
    ctx = context.rstrip()
    c = tok(ctx, add_special_tokens=False)["input_ids"] if ctx else []
    full = tok(ctx + context[len(ctx):] + cont, add_special_tokens=False)["input_ids"]
    return c, full[len(c):]


def _metaspace_lm(family: str) -> MaskedLM:
    """A sentencepiece-like tokenizer (a word's leading space is its own token's) with BOS,
    EOS and a mask token, on a module of independent tokens, as ``family`` scores it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from .diffusion_helpers import IndependentLM

    words = "the cat sat on a mat big".split()
    vocab = ["[PAD]", "[UNK]", "<bos>", "<eos>", "<mask>", "\u2581",
             *("\u2581" + w for w in words), *words]
    tk = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(vocab)},
                                    unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    tk.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first")
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]",
                                  bos_token="<bos>", eos_token="<eos>", mask_token="<mask>")
    return MaskedLM(IndependentLM(len(vocab), seed=1), tok, family=family,
                    mask_token_id=tok.mask_token_id)


@pytest.mark.parametrize("family", ["bert", "dream", "llada"])
def test_a_pair_is_tokenised_as_the_tokenizer_splits_its_joined_text(tiny, family):
    """encode_with_context, the one tokenisation of (context, continuation) at every door,
    equals the tokenizer called on the pieces: BERT's WordPiece, and a sentencepiece-like
    tokenizer (where the leading space belongs to the word) under Dream's frame (BOS/EOS,
    prepended BOS already there) and LLaDA's (the tokenizer's frame: add_bos puts a BOS
    before each context, visible)."""
    from mptlml.models.sequence_input import context_bos, encode_with_context

    lm = tiny[0] if family == "bert" else _metaspace_lm(family)
    tok = lm.tokenizer
    want = [_split_by_the_tokenizer(tok, c, x) for c, x in PAIRS]
    if family != "bert":  # the space before "on" is one token ▁on, on either side of the join
        assert want[0] == want[1]
        assert tok.convert_ids_to_tokens(want[1][1])[0] == "\u2581on"
    ids, nctx = encode_with_context(lm, [c for c, _ in PAIRS], [x for _, x in PAIRS])
    assert [(t[:n].tolist(), t[n:].tolist()) for t, n in zip(ids, nctx, strict=True)] == want
    if family == "dream":  # Dream's frame leads with the BOS: nothing is added before contexts
        assert (lm.prefix, lm.suffix) == ([tok.bos_token_id], [tok.eos_token_id])
        assert context_bos(lm, True) == []
    elif family == "llada":  # the BOS joins the frame: the content ids are the same
        bos = context_bos(lm, True)
        assert bos == [tok.bos_token_id] and context_bos(lm, False) == []
        framed = lm.with_prefix(bos)
        assert framed.prefix == [*lm.prefix, *bos] and lm.prefix != framed.prefix
        ids, nctx = encode_with_context(framed, [c for c, _ in PAIRS], [x for _, x in PAIRS])
        assert [(t[:n].tolist(), t[n:].tolist()) for t, n in zip(ids, nctx, strict=True)] == want
        row = framed.corrupt(ids[0], torch.zeros(1, len(ids[0]), dtype=torch.bool))[0]
        assert row.tolist() == [*lm.prefix, *bos, *ids[0].tolist(), *lm.suffix]
    else:
        with pytest.raises(ValueError, match="no BOS token"):
            context_bos(lm, True)


def test_an_lm_eval_request_is_tokenised_in_one_pass(tiny, monkeypatch):
    """The lm-eval backend calls the tokenizer once for all its requests, on each joined
    text and each distinct context (a question's candidates share theirs), and compare
    does not tokenize again (it is handed ids)."""
    from lm_eval.api.instance import Instance

    import mptlml.lm_eval as mle

    mlm, tok = tiny
    calls: list[list[str]] = []
    real = type(tok).__call__

    def counting(self, text, *args, **kwargs):
        calls.append(list(text) if isinstance(text, list | tuple) else [text])
        return real(self, text, *args, **kwargs)

    docs = [("the cat sat on ", ["a mat", "the dog"]), ("a big dog", [" ran", " is big", " sat"])]
    reqs = [Instance("loglikelihood", {}, (c, x), i, ("t", d, 1))
            for d, (c, xs) in enumerate(docs) for i, x in enumerate(xs)]
    model = mle.MPTLM(mlm, num_masks=4, greedy=False)
    monkeypatch.setattr(type(tok), "__call__", counting)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.loglikelihood(reqs)
    monkeypatch.undo()
    assert len(calls) == 1  # one pass
    joined = [c.rstrip() + c[len(c.rstrip()):] + x for c, xs in docs for x in xs]
    assert sorted(calls[0]) == sorted(joined + [c.rstrip() for c, _ in docs])
    # the ids scored are the tokenizer's split of each request
    (cmp_ids,) = [model._pair_ids([mle.backend._Key("t", 0, 0, ("the cat sat on ", "a mat"))])]
    c, x = _split_by_the_tokenizer(tok, "the cat sat on ", "a mat")
    assert (cmp_ids[0][0].tolist(), cmp_ids[1][0].tolist()) == (c, x)
