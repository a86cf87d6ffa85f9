"""Paired conditional MPT bounds of preference pairs (issue 41): identities against references.

The references are transformers' (or the module's) own forwards over every mask of a short
response (:func:`tests.mlm_helpers.exhaustive_masked_sum`, and an autograd twin of it
here), never numbers mptlml printed.
"""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
import torch

from mptlml.hf import dpo_loss, encode_pairs, preference_bounds
from mptlml.models import MaskedLM

from .mlm_helpers import exhaustive_masked_sum, make_tiny_bert

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

PROMPTS = ["the cat", "a dog"]
CHOSEN = [" sat on a", " ran far"]  # 3 and 2 tokens: enumerable
REJECTED = [" ran far", " was under"]
BETA = 0.5


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A float64 tiny BERT policy and a reference drawn from another seed (a large margin)."""
    from transformers import BertForMaskedLM, BertTokenizer

    root = tmp_path_factory.mktemp("pref")
    p0, p1 = make_tiny_bert(root / "b0", seed=0), make_tiny_bert(root / "b1", seed=1)
    tok = BertTokenizer.from_pretrained(p0)
    pol = BertForMaskedLM.from_pretrained(p0).double().eval()
    ref = BertForMaskedLM.from_pretrained(p1).double().eval()
    return tok, pol, ref


def _input(tok, prompt, response):
    """The model input of prompt + response and the positions of the response in it."""
    ids = torch.tensor(tok(prompt + response)["input_ids"])
    n = len(tok(prompt)["input_ids"]) - 1  # [CLS] + the prompt's tokens
    return ids, list(range(n, len(ids) - 1))


def _exact_margin(tok, pol, ref, prompt, chosen, rejected, beta=BETA):
    def bound(net, response):
        ids, scored = _input(tok, prompt, response)
        return exhaustive_masked_sum(ids, scored, tok.mask_token_id,
                                     lambda x: net(x).logits.double().log_softmax(-1))

    return beta * ((bound(pol, chosen) - bound(ref, chosen))
                   - (bound(pol, rejected) - bound(ref, rejected)))


def _bound_with_grad(net, tok, prompt, response):
    """The exhaustive conditional MPT sum by direct forwards, differentiable (autograd)."""
    ids, scored = _input(tok, prompt, response)
    total = 0.0
    for m in range(1, len(scored) + 1):
        subsets = list(itertools.combinations(scored, m))
        x = ids.repeat(len(subsets), 1)
        for r, sub in enumerate(subsets):
            x[r, list(sub)] = tok.mask_token_id
        lp = net(x).logits.double().log_softmax(-1)
        total = total + sum(lp[r, list(sub), ids[list(sub)]].sum() / m
                            for r, sub in enumerate(subsets)) / len(subsets)
    return total


def test_an_exhaustive_mask_set_gives_the_exact_margin(models):
    tok, pol, ref = models
    b = preference_bounds(MaskedLM(pol, tok), MaskedLM(ref, tok), PROMPTS, CHOSEN, REJECTED,
                          beta=BETA, num_masks=4, exact_length=3)
    exact = [_exact_margin(tok, pol, ref, *t) for t in zip(PROMPTS, CHOSEN, REJECTED,
                                                            strict=True)]
    assert b.exact.all() and np.all(b.margin_se == 0)
    np.testing.assert_allclose(b.margin.detach().numpy(), exact, rtol=0, atol=1e-9)


def test_the_gradient_of_the_exhaustive_dpo_loss_is_autograd_of_the_exact_loss(models):
    """And the reference, which holds parameters that require gradients, gets none."""
    tok, pol, ref = models
    pol, ref = copy.deepcopy(pol), copy.deepcopy(ref)
    assert all(p.requires_grad for p in ref.parameters())
    b = preference_bounds(MaskedLM(pol, tok), MaskedLM(ref, tok), PROMPTS, CHOSEN, REJECTED,
                          beta=BETA, num_masks=2, exact_length=3)
    dpo_loss(b.margin).backward()
    ours = {n: p.grad.clone() for n, p in pol.named_parameters() if p.grad is not None}
    assert all(p.grad is None for p in ref.parameters())
    pol.zero_grad(set_to_none=True)
    with torch.no_grad():
        refs = [(_bound_with_grad(ref, tok, p, c), _bound_with_grad(ref, tok, p, r))
                for p, c, r in zip(PROMPTS, CHOSEN, REJECTED, strict=True)]
    margins = torch.stack([BETA * ((_bound_with_grad(pol, tok, p, c) - rc)
                                   - (_bound_with_grad(pol, tok, p, r) - rr))
                           for (p, c, r), (rc, rr) in zip(zip(PROMPTS, CHOSEN, REJECTED,
                                                              strict=True), refs, strict=True)])
    (-torch.nn.functional.logsigmoid(margins)).mean().backward()
    theirs = {n: p.grad for n, p in pol.named_parameters() if p.grad is not None}
    assert ours.keys() == theirs.keys() and len(ours) > 10
    for n in ours:
        torch.testing.assert_close(ours[n], theirs[n], rtol=0, atol=1e-6, msg=n)


def _float(tok, *nets):
    """float32 copies as MaskedLMs (statistics only: the exact references stay float64)."""
    return [MaskedLM(copy.deepcopy(n).float(), tok) for n in nets]


def _repeated(lm_pol, lm_ref, n, prompts=PROMPTS, chosen=CHOSEN, rejected=REJECTED, **kw):
    """The margins of each pair drawn n times, in one call (pair copies draw their own masks)."""
    from mptlml.hf import EncodedPairs

    e = encode_pairs(lm_pol, prompts, chosen, rejected)
    k = len(prompts)
    reps = EncodedPairs(e.chosen * n, e.chosen_context * n, e.rejected * n,
                        e.rejected_context * n)
    with torch.no_grad():
        b = preference_bounds(lm_pol, lm_ref, reps, **kw)
    return (b.margin.numpy().reshape(n, k), b.margin_se.reshape(n, k), b)


@pytest.mark.parametrize("masks", ["common", "independent", "vrpo"])
def test_the_estimated_margin_is_unbiased_and_its_se_calibrated(models, masks):
    """Over 200 draws, the mean margin is the exact one within 4 SE; the mean squared SE
    matches the spread of the margins over draws (the SE is that of the paired draws)."""
    tok, pol, ref = models
    n = 200
    m, se, b = _repeated(*_float(tok, pol, ref), n, beta=BETA, num_masks=4,
                         exact_length=1, masks=masks)
    exact = np.array([_exact_margin(tok, pol, ref, *t) for t in zip(PROMPTS, CHOSEN, REJECTED,
                                                                    strict=True)])
    # a pair whose responses' 2^T - 1 masks are no more than their draws' (T <= 2 at 4 draws)
    # is scored on every mask (the one exactness rule): its margin is the exact one, SE 0
    whole = b.exact.reshape(n, -1)[0]
    assert whole.sum() < len(whole)
    np.testing.assert_allclose(m[:, whole], np.broadcast_to(exact[whole], m[:, whole].shape),
                               rtol=0, atol=1e-4)
    assert np.all(se[:, whole] == 0)
    m, se, exact = m[:, ~whole], se[:, ~whole], exact[~whole]
    z = (m.mean(0) - exact) / (m.std(0, ddof=1) / np.sqrt(n))
    assert np.all(np.abs(z) < 4), z
    ratio = (se ** 2).mean(0) / m.var(0, ddof=1)
    assert np.all((ratio > 0.7) & (ratio < 1.4)), ratio


def test_common_masks_cut_the_margins_variance_at_equal_cost(models):
    """A policy near its reference (as in DPO): common masks cancel most of the noise."""
    tok, pol, _ = models
    near = copy.deepcopy(pol)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in near.parameters():
            p.add_(0.03 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    long_c, long_r = [" sat on a mat and ran", " ran far"], [" ran far", " was under the big tree"]
    var, rows = {}, {}
    for masks in ("common", "independent"):
        m, _, b = _repeated(*_float(tok, near, pol), 100, chosen=long_c,
                            rejected=long_r, beta=BETA, num_masks=4, exact_length=1,
                            masks=masks)
        var[masks], rows[masks] = m.var(0, ddof=1), b.masked_rows
    assert rows["common"] == rows["independent"]  # equal cost
    assert np.all(var["common"] < var["independent"] / 3), var


def test_a_module_without_attention_mask_and_a_plain_mask_id(tmp_path):
    """A masked-diffusion-style module (no attention mask: rows of one length per forward)."""
    from .diffusion_helpers import TinyDiffusionLM, make_word_tokenizer

    tok = make_word_tokenizer()
    mask_id = tok.convert_tokens_to_ids("mdm_mask")
    pol = TinyDiffusionLM(len(tok), seed=0, dropout=0.0).double().eval()
    ref = TinyDiffusionLM(len(tok), seed=1, dropout=0.0).double().eval()
    lp, lr = (MaskedLM(m, tok, mask_token_id=mask_id) for m in (pol, ref))
    b = preference_bounds(lp, lr, ["the cat", "a"], [" sat on", " big red tree"],
                          [" ran", " dog"], beta=1.0, exact_length=3)

    def bound(net, prompt, resp):
        ids = torch.tensor(tok(prompt + resp)["input_ids"])
        n = len(tok(prompt)["input_ids"])
        return exhaustive_masked_sum(ids, list(range(n, len(ids))), mask_id,
                                     lambda x: net(x).double().log_softmax(-1))

    exact = [(bound(pol, p, c) - bound(ref, p, c)) - (bound(pol, p, r) - bound(ref, p, r))
             for p, c, r in zip(["the cat", "a"], [" sat on", " big red tree"], [" ran", " dog"],
                                strict=True)]
    np.testing.assert_allclose(b.margin.detach().numpy(), exact, atol=1e-9)


def test_a_learned_density_keeps_the_margin_unbiased(models):
    """Any rate density gives the same expectation (importance weights); it moves the SE."""
    from mptlml.estimators.sequential import RateDensity

    tok, pol, ref = models
    dens = RateDensity(np.linspace(3.0, 0.5, 10))
    m, _, b = _repeated(*_float(tok, pol, ref), 200,
                        chosen=[" sat on a mat", " ran far away"],
                        rejected=[" ran far away", " was under the"],
                        beta=BETA, num_masks=4, exact_length=1, density=dens)
    exact = np.array([_exact_margin(tok, pol, ref, p, c, r) for p, c, r in
                      zip(PROMPTS, [" sat on a mat", " ran far away"],
                          [" ran far away", " was under the"],
                          strict=True)])
    z = (m.mean(0) - exact) / (m.std(0, ddof=1) / np.sqrt(200))
    assert np.all(np.abs(z) < 4), z
    assert b.spread_count.sum() == 200 * 2 * 2  # two strata per pair, both pairs sampled


def test_bad_input_is_refused_before_any_work(models, tmp_path):
    from transformers import BertTokenizer

    tok, pol, ref = models
    lp, lr = MaskedLM(pol, tok), MaskedLM(ref, tok)
    args = (PROMPTS, CHOSEN, REJECTED)
    with pytest.raises(ValueError, match="beta must be"):
        preference_bounds(lp, lr, *args, beta=0.0)
    with pytest.raises(ValueError, match="num_masks must be even"):
        preference_bounds(lp, lr, *args, num_masks=3)
    with pytest.raises(ValueError, match="masks must be one of"):
        preference_bounds(lp, lr, *args, masks="shared")
    with pytest.raises(TypeError, match="must be an mptlml.models.MaskedLM"):
        preference_bounds(pol, lr, *args)
    with pytest.raises(ValueError, match="one prompt, one chosen and one rejected"):
        preference_bounds(lp, lr, PROMPTS, CHOSEN, REJECTED[:1])
    with pytest.raises(TypeError, match="single string"):
        encode_pairs(lp, "the cat", CHOSEN, REJECTED)
    other = make_tiny_bert(tmp_path / "other", words=("x", "y", "z"))
    lo = MaskedLM(pol.__class__.from_pretrained(other), BertTokenizer.from_pretrained(other))
    with pytest.raises(ValueError, match="share one tokenizer"):
        preference_bounds(lp, lo, *args)


def test_dream_s_shifted_logits_are_read_one_position_back(models):
    """With ``shift_logits`` (Dream's head: position i predicted at i - 1) the bounds read the
    logits of the position before each masked one; the exhaustive margin by hand, each
    target read at i - 1 of the model's own logits (shifting the other way, or not at all,
    gives another margin)."""
    tok, pol, ref = models
    shifted = [MaskedLM(n, tok, shift_logits=True) for n in (pol, ref)]

    def read_back(net):
        def log_probs(x):
            lp = net(x).logits.double().log_softmax(-1)
            return torch.cat([lp[:, :1], lp[:, :-1]], dim=1)  # position i from i - 1
        return log_probs

    def bound(net, prompt, response):
        ids, scored = _input(tok, prompt, response)
        return exhaustive_masked_sum(ids, scored, tok.mask_token_id, read_back(net))

    with torch.no_grad():
        b = preference_bounds(*shifted, PROMPTS, CHOSEN, REJECTED, beta=BETA, num_masks=2)
    assert b.exact.all()
    want = np.array([BETA * ((bound(pol, p, c) - bound(ref, p, c))
                             - (bound(pol, p, r) - bound(ref, p, r)))
                     for p, c, r in zip(PROMPTS, CHOSEN, REJECTED, strict=True)])
    np.testing.assert_allclose(b.margin.numpy(), want, rtol=1e-9, atol=1e-9)
    plain = np.array([_exact_margin(tok, pol, ref, *t)
                      for t in zip(PROMPTS, CHOSEN, REJECTED, strict=True)])
    assert np.abs(want - plain).max() > 1e-3  # the shift matters here
