"""MaskedLM adapter: equivalence with a raw Hugging Face forward, PLL, special tokens, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import mptlml
from mptlml import mpt_curve, pll
from mptlml.estimators.rates import mask_sizes, mpt_area
from mptlml.models import MaskedLM

from .mlm_helpers import SENTENCES, make_tiny_bert, transformers_pll


def _assert_pll_per_token(got: torch.Tensor, ref, lengths: np.ndarray) -> None:
    """S(x; 1) = PLL / D_i agrees per token to 1e-5."""
    np.testing.assert_allclose(got.numpy() / lengths, np.asarray(ref) / lengths, atol=1e-5,
                               rtol=0)


def _raw_logprobs(lm: MaskedLM, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Independent reference: full HF forward with [CLS] x [SEP], masked by hand."""
    tok = lm.tokenizer
    x = ids.clone()
    x[mask] = tok.mask_token_id
    inp = torch.tensor([[tok.cls_token_id, *x.tolist(), tok.sep_token_id]])
    with torch.no_grad():
        logits = lm.model(input_ids=inp).logits[0, 1:-1]
    lp = torch.log_softmax(logits.double(), -1).gather(1, ids[:, None]).squeeze(1)
    return torch.where(mask, lp, torch.zeros_like(lp))


def test_adapter_equals_raw_forward(tiny):
    ids = tiny.encode(SENTENCES)
    g = torch.Generator().manual_seed(0)
    masks = [torch.rand(len(t), generator=g) < 0.4 for t in ids]
    masks = [m if m.any() else torch.ones_like(m) for m in masks]
    got = tiny.log_conditionals(SENTENCES, masks)
    for t, m, v in zip(ids, masks, got, strict=True):
        # float32 rounding: transformers 4's SDPA kernel on a padded batch differs from the
        # unpadded forward by up to ~2e-6 of the value (1.06e-5 on a log-prob of -4.9)
        torch.testing.assert_close(v, _raw_logprobs(tiny, t, m), atol=1e-5, rtol=1e-5)
        assert (v[~m] == 0).all()


def test_fixed_length_protocol_shapes(tiny):
    ids = torch.stack([t[:4] for t in tiny.encode(SENTENCES[:3])])  # (N=3, D=4)
    mask = torch.tensor([[True, False, False, True], [False, True, False, False]])
    out = tiny.log_conditionals(ids, mask)
    assert out.shape == (2, 3, 4)
    torch.testing.assert_close(out[1, 2], _raw_logprobs(tiny, ids[2], mask[1]), atol=1e-5,
                               rtol=0)
    assert tiny.log_conditionals(ids, mask[0]).shape == (3, 4)


def test_pll_equals_independent_one_copy_per_token(tiny):
    ids = tiny.encode(SENTENCES)
    ref = []
    for t in ids:
        tot = 0.0
        for j in range(len(t)):
            m = torch.zeros(len(t), dtype=torch.bool)
            m[j] = True
            tot += float(_raw_logprobs(tiny, t, m).sum())
        ref.append(tot)
    got = mptlml.pll(tiny, SENTENCES, token_budget=64)
    assert got.shape == (len(SENTENCES),)
    # S(x; 1) = PLL / D_i per token to 1e-5: the model runs in float32, padded
    # batches against one unpadded copy, so the sum over D_i tokens carries
    # D_i float32 roundings (a 2e-6 per-token gap summed over 6 tokens is 1.1e-5).
    lengths = np.array([len(t) for t in ids], dtype=float)
    _assert_pll_per_token(got, ref, lengths)
    np.testing.assert_allclose(got.numpy(), ref, atol=1e-5 * lengths.max(), rtol=0)


def test_pll_equals_transformers_directly(tiny_dir, tiny):
    """mptlml.pll against BertForMaskedLM and its tokenizer loaded from the directory, one
    masked copy per token (tests/mlm_helpers.transformers_pll: no mptlml code)."""
    ref = transformers_pll(tiny_dir, SENTENCES)
    got = mptlml.pll(tiny, SENTENCES)
    _assert_pll_per_token(got, ref, np.array([len(t) for t in tiny.encode(SENTENCES)],
                                             dtype=float))


def test_pll_antiberty_matches_naive_loop(antiberty):
    seqs = ["EVQLVESGGGLVQPGGSLRL", "QVQLQESGPGLVKPS"]
    ids = antiberty.encode(seqs)
    ref = []
    for t in ids:
        x = t.unsqueeze(0).repeat(len(t), 1)
        x[torch.arange(len(t)), torch.arange(len(t))] = antiberty.mask_token_id
        inp = torch.cat([torch.full((len(t), 1), 2), x, torch.full((len(t), 1), 3)], 1)
        with torch.no_grad():
            lp = antiberty.model(input_ids=inp).logits.log_softmax(-1)
        ref.append(float(lp[torch.arange(len(t)), torch.arange(len(t)) + 1, t].sum()))
    np.testing.assert_allclose(pll(antiberty, seqs).numpy(), ref, atol=1e-5, rtol=0)


def test_special_tokens_never_masked(tiny, monkeypatch):
    seen = []
    orig = tiny.score_positions

    def spy(inputs, positions, targets, **kw):
        seen.extend(zip(inputs, positions, strict=True))
        return orig(inputs, positions, targets, **kw)

    monkeypatch.setattr(tiny, "score_positions", spy)
    res = mpt_curve(tiny, SENTENCES, rates=[0.5, 0.99], seed=1)
    tok = tiny.tokenizer
    specials = set(tok.all_special_ids)
    assert seen
    for inp, pos in seen:
        assert inp[0] == tok.cls_token_id and inp[-1] == tok.sep_token_id
        assert int(pos.min()) >= 1 and int(pos.max()) <= len(inp) - 2
        content = inp[1:-1]
        assert all(int(v) not in specials or int(v) == tok.mask_token_id for v in content)
    # rate 0.99 masks every content token of short sentences (M = round(.99 D) = D)
    np.testing.assert_array_equal(res.sizes[:, 1], res.num_tokens)


def test_bert_corruption_option(tiny):
    lm = MaskedLM(tiny.model, tiny.tokenizer, corruption="bert")
    ids = torch.arange(5, 25)
    masks = torch.ones(400, 20, dtype=torch.bool)
    x = lm.corrupt(ids, masks, torch.Generator().manual_seed(0))[:, 1:-1]
    frac_mask = float((x == lm.mask_token_id).float().mean())
    frac_keep = float((x == ids).float().mean())
    assert abs(frac_mask - 0.8) < 0.02 and 0.09 < frac_keep < 0.13
    assert not torch.isin(x[x != lm.mask_token_id], torch.tensor(lm.special_ids)).any()


def test_curve_formulas(tiny):
    res = mptlml.mpt_curve(tiny, SENTENCES, rates=[0.2, 0.5, 0.8], num_masks=3, seed=0,
                           nominal_length=10)
    assert res.per_sample.shape == (5, 3) and res.lml.shape == (5,)
    for i, d in enumerate(res.num_tokens):
        np.testing.assert_array_equal(res.sizes[i], mask_sizes(int(d), [0.2, 0.5, 0.8]))
    np.testing.assert_allclose(res.lml, res.num_tokens * res.per_sample.mean(1))
    np.testing.assert_allclose(res.mean, res.per_sample.mean(0))
    assert res.area == pytest.approx(mpt_area(res.mean, [0.2, 0.5, 0.8], 10))
    assert torch.isfinite(res.lml_stderr).all() and np.isfinite(res.area_stderr)
    # same seed, same result; the dispatch through mptlml.estimate_lml works
    again = mpt_curve(tiny, SENTENCES, rates=[0.2, 0.5, 0.8], num_masks=3, seed=0)
    assert torch.equal(again.per_sample, res.per_sample)
    est = mptlml.estimate_lml(tiny, SENTENCES[:2], "cumulative", num_masks=2, seed=0)
    assert est.per_sample.shape == (2,) and torch.isfinite(est.per_sample_stderr).all()
    assert res.to_dict()["area"] == res.area


def test_curve_area_defaults_to_the_mean_token_count(tiny):
    """Without nominal_length the area's L is the mean number of scored tokens per sequence,
    counted here with the tokenizer itself (the masked-LM guide printed it, L = 21.5)."""
    counts = [len(tiny.tokenizer(s, add_special_tokens=False)["input_ids"]) for s in SENTENCES]
    res = mpt_curve(tiny, SENTENCES, rates=[0.25, 0.75], num_masks=2, seed=0)
    assert res.nominal_length == pytest.approx(np.mean(counts))
    assert list(res.num_tokens) == counts
    assert res.area == pytest.approx(mpt_area(res.mean, [0.25, 0.75], np.mean(counts)))


def test_exact_cumulative_with_m1_term(tiny):
    # D=2 sentence: sum over M=1..2 with P masks; M=2 is the single full mask
    res = mpt_curve(tiny, ["blue tree"], rates=[0.5], num_masks=4, cumulative=True, seed=0)
    ids = tiny.encode(["blue tree"])[0]
    full = float(_raw_logprobs(tiny, ids, torch.ones(2, dtype=torch.bool)).sum()) / 2
    singles = [float(_raw_logprobs(tiny, ids, torch.tensor(m)).sum())
               for m in ([True, False], [False, True])]
    assert min(singles) - 1e-5 <= res.lml_cumulative[0] - full <= max(singles) + 1e-5


def test_antiberty_pretrained_far_above_random(antiberty):
    seqs = ["EVQLVESGGGLVQPGGSLRLSCAASGFTFSSYAMS", "DIQMTQSPSSLSASVGDRVTITCRASQSISSYLN"]
    rnd = MaskedLM.antiberty(random_init=True)
    rates = [0.15, 0.5, 0.85]
    a = mpt_curve(antiberty, seqs, rates=rates, seed=0)
    b = mpt_curve(rnd, seqs, rates=rates, seed=0)
    assert a.area > b.area + 1.0 * a.num_tokens.double().mean()
    np.testing.assert_allclose(b.mean, -math.log(25), atol=0.6)  # few tokens at 15%
    assert abs(b.mean.mean() + math.log(25)) < 0.25
    assert (a.mean[:2] > b.mean[:2] + 1.0).all() and (a.mean > b.mean).all()


# ---------------------------------------------------------------------- bad input
def test_vocab_mismatch_is_an_error(tiny_dir, tiny, tmp_path):
    from transformers import BertTokenizer

    words = (tiny_dir / "vocab.txt").read_text().splitlines() + ["xa", "xb", "xc"]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
    # transformers 4 reads the file (3 tokens more than the model scores), transformers 5
    # ignores it (another vocabulary): a mismatch under both
    bad = BertTokenizer(vocab_file=str(tmp_path / "vocab.txt"))
    assert len(bad) != len(tiny.tokenizer)
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        MaskedLM(tiny.model, bad)


def test_vocab_mismatch_by_hand(tiny):
    from transformers import BertConfig, BertForMaskedLM

    other = BertForMaskedLM(BertConfig(vocab_size=len(tiny.tokenizer) + 3, hidden_size=8,
                                       num_hidden_layers=1, num_attention_heads=1,
                                       intermediate_size=8))
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        MaskedLM(other, tiny.tokenizer)


def test_too_long_sequence(tiny_dir, tmp_path):
    short = MaskedLM.from_pretrained(make_tiny_bert(tmp_path / "m", max_position_embeddings=8))
    with pytest.raises(ValueError, match="maximum"):
        short.encode(["the cat sat on a mat and the dog"])
    trunc = MaskedLM(short.model, short.tokenizer, truncate=True)
    assert len(trunc.encode(["the cat sat on a mat and the dog"])[0]) == 6


def test_empty_and_bad_sequences(tiny):
    with pytest.raises(ValueError, match="empty"):
        tiny.encode(["the cat", ""])
    with pytest.raises(ValueError, match="empty"):
        tiny.encode(["   "])
    with pytest.raises(TypeError, match="single string"):
        tiny.encode("the cat")
    with pytest.raises(ValueError, match="special"):
        tiny.encode([[2, 5, 6, 3]])


def test_rate_outside_unit_interval(tiny):
    for bad in ([0.0, 0.5], [0.5, 1.0], [1.5], [-0.1]):
        with pytest.raises(ValueError, match="between 0 and 1"):
            mpt_curve(tiny, SENTENCES[:1], rates=bad)


def test_unknown_model_offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ValueError, match="local model.*directory"):
        MaskedLM.from_pretrained("no-such-org/no-such-masked-lm")


def test_random_init_from_dir(tiny_dir, tiny):
    r = MaskedLM.from_pretrained(tiny_dir, random_init=True, init_seed=3)
    r2 = MaskedLM.from_pretrained(tiny_dir, random_init=True, init_seed=3)
    w = r.model.bert.embeddings.word_embeddings.weight
    w0 = tiny.model.bert.embeddings.word_embeddings.weight
    assert not torch.equal(w, w0)
    assert torch.equal(w, r2.model.bert.embeddings.word_embeddings.weight)


def test_nested_masks_refused_for_masked_lm(tiny):
    for fn in (mptlml.estimate_lml, mptlml.mpt_curve):
        with pytest.raises(ValueError, match="nested=True is not available for ragged sequences"):
            fn(tiny, SENTENCES, nested=True, seed=0)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"rate": 0.3}, ValueError, "rate= applies to ragged sequences .* with estimator='fixed-rate'"),
    ({"mask_size": 2}, ValueError, "mask_size= does not apply to ragged"),
    ({"share_masks": True}, ValueError, "share_masks=True does not apply to ragged"),
    ({"max_masks": 10}, ValueError, "max_masks applies to the exhaustive"),
    ({"rates": [0.5]}, TypeError, r"\['rates'\] do not apply to estimator 'cumulative'"),
    ({"nominal_length": 10}, TypeError, "do not apply"),
])
def test_inapplicable_arguments_refused_for_masked_lm(tiny, kwargs, error, match):
    """An argument the ragged estimator does not use is an error, never ignored."""
    with pytest.raises(error, match=match):
        mptlml.estimate_lml(tiny, SENTENCES[:2], "cumulative", seed=0, **kwargs)


def test_curve_arguments_refused_and_unknown_estimator(tiny):
    with pytest.raises(TypeError, match="pass rates=.* instead of sizes"):
        mptlml.mpt_curve(tiny, SENTENCES[:2], sizes=[1], seed=0)
    with pytest.raises(ValueError, match="share_masks=True does not apply"):
        mptlml.mpt_curve(tiny, SENTENCES[:2], share_masks=True, seed=0)
    # exhaustive scores short sequences on every mask, and refuses those with too many
    with pytest.raises(ValueError, match=r"exhaustive estimator needs 2\^D - 1 = 1073741823"):
        mptlml.estimate_lml(tiny, ["the cat sat on a mat " * 5], "exhaustive", seed=0)
    with pytest.raises(TypeError, match="int seed"):
        mptlml.estimate_lml(tiny, SENTENCES[:2], seed=torch.Generator())


def test_masked_lm_is_ragged_not_dense(tiny):
    """The ragged protocol promises no num_tokens; MaskedLM is not a fixed-D MaskedModel."""
    from mptlml.models.base import MaskedModel
    from mptlml.models.protocols import RaggedMaskedModel

    assert isinstance(tiny, RaggedMaskedModel) and not isinstance(tiny, MaskedModel)
    assert not hasattr(tiny, "num_tokens")
    fp = tiny.fingerprint()
    assert fp["num_parameters"] == sum(p.numel() for p in tiny.parameters())
    assert fp["corruption"] == "mask" and len(fp["weights_probe"]) == 16
    # the ragged reduction is the sum of the conditionals of log_conditionals
    ids = tiny.encode(SENTENCES[:2])
    masks = [torch.stack([torch.arange(len(t)) % 2 == 0, torch.arange(len(t)) < 2]) for t in ids]
    sums = tiny.ragged_masked_log_prob(ids, masks, [None, None])
    full = tiny.log_conditionals(SENTENCES[:2], masks)
    for s, f in zip(sums, full, strict=True):
        torch.testing.assert_close(s, f.sum(-1), atol=1e-6, rtol=0)


def test_results_share_types_and_field_names_with_dense_models(tiny):
    """PPCA and a masked LM give the same result types with the same fields."""
    from dataclasses import fields

    from mptlml.models import PPCA

    ppca = PPCA.random(5, 2, sigma2=0.3, seed=0)
    x = ppca.sample(6, generator=0)
    dense = mptlml.estimate_lml(ppca, x, num_masks=2, seed=0)
    ragged = mptlml.estimate_lml(tiny, SENTENCES, num_masks=2, seed=0)
    assert type(dense) is type(ragged) is mptlml.LMLEstimate
    for est in (dense, ragged):
        assert est.per_sample.dtype == torch.float64 and est.per_sample_stderr.shape == (
            est.per_sample.shape)
        assert est.mean == pytest.approx(float(est.per_sample.mean()), abs=1e-12)
        assert math.isfinite(est.stderr) and math.isfinite(est.stderr_data)
        assert est.num_model_calls > 0 and est.num_masked_rows > 0
        assert set(est.to_dict()) == {f.name for f in fields(mptlml.LMLEstimate)}
    n = len(SENTENCES)
    assert ragged.stderr == pytest.approx(
        float(ragged.per_sample_stderr.pow(2).sum().sqrt()) / n, rel=1e-12)
    dcurve = mptlml.mpt_curve(ppca, x, num_masks=2, seed=0)
    rcurve = mptlml.mpt_curve(tiny, SENTENCES, rates=[0.3, 0.7], num_masks=2, seed=0)
    assert type(dcurve) is type(rcurve) is mptlml.MPTCurve
    for c in (dcurve, rcurve):
        assert c.per_sample.shape == (c.per_sample.shape[0], len(c.rates))
        torch.testing.assert_close(c.mean, c.per_sample.mean(0))
        assert math.isfinite(c.area) and math.isfinite(c.area_stderr) and c.lml is not None
    torch.testing.assert_close(dcurve.lml, dcurve.per_sample.sum(1))
    assert rcurve.num_model_calls > 0 and rcurve.to_dict()["area_stderr"] == rcurve.area_stderr


