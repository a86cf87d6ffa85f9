"""Classifier-free guidance of likelihood scores (``cfg_scale``, LLaDA's ``cfg``).

Reference: guided scores computed here by direct forwards of the module (``BertForMaskedLM``
in float64, or a plain masked-diffusion module): for each masked input x, c = logits(x),
u = logits(x with the prompt, the frame's leading tokens and the context, masked too), and
the guided log-probability ``log_softmax(u + (s + 1)(c - u))`` at the masked tokens; the
exhaustive sum runs over every mask of every size inside the continuation.
"""

from __future__ import annotations

import copy
import itertools
import math

import numpy as np
import pytest
import torch

import mptlml
from mptlml.models import PPCA, MaskedLM
from mptlml.models.conditional import ConditionedSequences

from .diffusion_helpers import MASK_WORD, TinyDiffusionLM, make_word_tokenizer
from .mlm_helpers import exhaustive_masked_sum

pytestmark = pytest.mark.usefixtures("one_thread")

CONTEXT = "the cat sat on"
SHORT = [" a mat", " the red house", " a big blue tree"]  # 2 to 4 tokens: exact in compare


@pytest.fixture(scope="module")
def lm64(tiny):
    """The tiny BERT in float64: guided and reference scores agree to rounding."""
    return MaskedLM(copy.deepcopy(tiny.model).double(), tiny.tokenizer)


def guided_log_probs(module, x: torch.Tensor, prompt_end: int, scale: float,
                     mask_id: int) -> torch.Tensor:
    """log_softmax of the guided logits of inputs ``x (Q, T)`` by direct forwards: ``(Q, T, V)``."""
    xu = x.clone()
    xu[:, :prompt_end] = mask_id
    with torch.no_grad():
        out_c, out_u = module(input_ids=x), module(input_ids=xu)
    c = (out_c if isinstance(out_c, torch.Tensor) else out_c.logits).double()
    u = (out_u if isinstance(out_u, torch.Tensor) else out_u.logits).double()
    return torch.log_softmax(u + (scale + 1) * (c - u), -1)


def framed(lm: MaskedLM, context: str, cont: str) -> tuple[torch.Tensor, int, list[int]]:
    """The model input (frame included), where the prompt ends, and the continuation's positions."""
    tok = lm.tokenizer
    c = tok(context, add_special_tokens=False)["input_ids"]
    full = tok(context + cont, add_special_tokens=False)["input_ids"]
    assert full[:len(c)] == c
    pre = len(lm.prefix)
    ids = torch.tensor([*lm.prefix, *full, *lm.suffix])
    return ids, pre + len(c), list(range(pre + len(c), pre + len(full)))


def guided_exhaustive(lm: MaskedLM, context: str, cont: str, scale: float) -> float:
    """sum_M mean over masks of size M of (1/M) sum of guided log-probs: every mask, directly."""
    ids, end, scored = framed(lm, context, cont)
    return exhaustive_masked_sum(
        ids, scored, lm.mask_token_id,
        lambda x: guided_log_probs(lm.model, x, end, scale, lm.mask_token_id))


def guided_pll(lm: MaskedLM, context: str, cont: str, scale: float) -> float:
    """sum_j guided log p(x_j | x_{-j}) over the continuation, directly."""
    ids, end, scored = framed(lm, context, cont)
    x = ids.repeat(len(scored), 1)
    for r, j in enumerate(scored):
        x[r, j] = lm.mask_token_id
    lp = guided_log_probs(lm.model, x, end, scale, lm.mask_token_id)
    return sum(float(lp[r, j, ids[j]]) for r, j in enumerate(scored))


@pytest.mark.parametrize("scale", [0.5, 2.0])
def test_guided_exhaustive_compare_equals_the_direct_guided_sum(lm64, scale):
    res = mptlml.compare(lm64, [CONTEXT], [SHORT], cfg_scale=scale)
    assert bool(res.exact[0].all())  # every mask of every size was scored
    ref = np.array([guided_exhaustive(lm64, CONTEXT, c, scale) for c in SHORT])
    assert np.abs(res.scores[0] - ref).max() < 1e-6, (res.scores[0], ref)
    plain = np.array([guided_exhaustive(lm64, CONTEXT, c, 0.0) for c in SHORT])
    assert np.abs(ref - plain).min() > 1e-3  # guidance moved every score


def test_guided_pll_and_estimate_lml_equal_the_direct_guided_scores(lm64):
    scale = 1.5
    got = mptlml.pll(lm64, SHORT, context=CONTEXT, cfg_scale=scale)
    ref = [guided_pll(lm64, CONTEXT, c, scale) for c in SHORT]
    assert np.abs(got.numpy() - np.array(ref)).max() < 1e-6
    # a one-token continuation has one mask: every estimator's sum is exact
    one = guided_pll(lm64, CONTEXT, " mat", scale)
    for estimator in ["cumulative", "chain-rule"]:  # masked sums, and targeted ones
        est = mptlml.estimate_lml(lm64, [" mat", " tree"], estimator, context=CONTEXT,
                                  cfg_scale=scale, num_masks=2, seed=0)
        assert float(est.per_sample[0]) == pytest.approx(one, abs=1e-9)


def test_the_guided_model_scores_every_mask_as_the_direct_reference(lm64):
    """The model level: ConditionedSequences(cfg_scale=) on every mask of a 4-token continuation."""
    scale = 0.7
    cont = " a big blue tree"
    view = ConditionedSequences(lm64, CONTEXT, cfg_scale=scale)
    (t,) = view.encode([cont])
    masks = torch.tensor(list(itertools.product([False, True], repeat=len(t)))[1:])
    (got,) = view.ragged_masked_log_prob([t], [masks], [None])
    ids, end, scored = framed(lm64, CONTEXT, cont)
    x = ids.repeat(len(masks), 1)
    x[:, scored] = torch.where(masks, lm64.mask_token_id, x[:, scored])
    lp = guided_log_probs(lm64.model, x, end, scale, lm64.mask_token_id)
    ref = [sum(float(lp[r, scored[j], ids[scored[j]]]) for j in m.nonzero().flatten().tolist())
           for r, m in enumerate(masks)]
    assert np.abs(got.numpy() - np.array(ref)).max() < 1e-9


def test_cfg_scale_zero_is_the_unguided_score_exactly(tiny):
    a = mptlml.compare(tiny, [CONTEXT], [SHORT + [" the big red mat and"]], seed=3)
    b = mptlml.compare(tiny, [CONTEXT], [SHORT + [" the big red mat and"]], seed=3,
                       cfg_scale=0.0)
    assert all(np.array_equal(x, y) for x, y in zip(a.scores, b.scores, strict=True))
    assert torch.equal(mptlml.pll(tiny, SHORT, context=CONTEXT),
                       mptlml.pll(tiny, SHORT, context=CONTEXT, cfg_scale=0))


def test_a_masked_diffusion_module_without_frame_is_guided_as_llada_guides_it():
    """No special tokens, the mask id a plain vocabulary entry, no attention mask."""
    tok = make_word_tokenizer()
    mask_id = tok.convert_tokens_to_ids(MASK_WORD)
    module = TinyDiffusionLM(len(tok), seed=2).double()
    lm = MaskedLM(module, tok, mask_token_id=mask_id, add_special_tokens=False)
    ctx, conts = "the cat sat", [" on a mat", " far away"]
    res = mptlml.compare(lm, [ctx], [conts], cfg_scale=0.5)
    ref = [guided_exhaustive(lm, ctx, c, 0.5) for c in conts]
    assert np.abs(res.scores[0] - np.array(ref)).max() < 1e-6


@pytest.mark.parametrize("bad, kind", [(-0.5, ValueError), (math.nan, ValueError),
                                       (math.inf, ValueError), (True, TypeError),
                                       ("0.5", TypeError)])
def test_bad_scales_are_refused_at_every_door(tiny, bad, kind):
    with pytest.raises(kind, match="cfg_scale"):
        mptlml.compare(tiny, [CONTEXT], [SHORT], cfg_scale=bad)
    with pytest.raises(kind, match="cfg_scale"):
        mptlml.pll(tiny, SHORT, context=CONTEXT, cfg_scale=bad)
    with pytest.raises(kind, match="cfg_scale"):
        mptlml.estimate_lml(tiny, SHORT, context=CONTEXT, cfg_scale=bad)


def test_guidance_without_a_context_or_of_a_dense_model_is_refused(tiny):
    with pytest.raises(ValueError, match="pass context="):
        mptlml.estimate_lml(tiny, SHORT, cfg_scale=0.5)
    with pytest.raises(ValueError, match="pass context="):
        mptlml.pll(tiny, SHORT, cfg_scale=0.5)
    ppca = PPCA(torch.randn(3, 1, dtype=torch.float64))
    with pytest.raises(TypeError, match="dense model"):
        mptlml.estimate_lml(ppca, torch.zeros(2, 3, dtype=torch.float64), "exhaustive",
                            context=[0], cfg_scale=0.5)

    class Unguided:  # a ragged model without guidance
        name = "unguided"

        def encode(self, sequences):
            return tiny.encode(sequences)

        def ragged_masked_log_prob(self, ids, masks, generators, **kwargs):
            raise AssertionError("never scored")

        def fingerprint(self):
            return {}

    with pytest.raises(TypeError, match="can be guided"):
        mptlml.compare(Unguided(), [CONTEXT], [SHORT], cfg_scale=0.5)
    with pytest.raises(ValueError, match="prompt_lengths"):
        tiny.ragged_masked_log_prob([torch.tensor([5, 6])], [torch.ones(1, 2, dtype=torch.bool)],
                                    [None], cfg_scale=0.5)


def test_guidance_with_an_empty_context_is_refused_before_any_work(tiny):
    """An empty prompt leaves guidance nothing to mask: refused at every door, naming the
    continuation, before a masked input is scored (an empty string, a context of spaces,
    an empty id list)."""
    calls = []
    hook = tiny.model.register_forward_hook(lambda *a: calls.append(1))
    try:
        for contexts in (["", CONTEXT], [CONTEXT, "   "]):
            with pytest.raises(ValueError, match="context of continuation [0-9]+ has no token"):
                mptlml.compare(tiny, contexts, [SHORT, SHORT], cfg_scale=0.5)
        ids = [t.tolist() for t in tiny.encode(SHORT)]
        for context, conts in (("", SHORT), ([[] for _ in SHORT], ids)):
            with pytest.raises(ValueError, match="context of continuation 0 has no token"):
                mptlml.pll(tiny, conts, context=context, cfg_scale=0.5)
            with pytest.raises(ValueError, match="context of continuation 0 has no token"):
                mptlml.estimate_lml(tiny, conts, context=context, cfg_scale=0.5)
    finally:
        hook.remove()
    assert not calls
    mptlml.pll(tiny, SHORT, context="", cfg_scale=0.0)  # unguided: an empty context is fine
