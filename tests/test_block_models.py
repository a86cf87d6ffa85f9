"""Block-diffusion LMs: the block bound against the module called directly, calibration, refusals.

The reference (:func:`reference_block_bound`) calls the tiny BD3-LM module directly, one
block at a time, in its other layout (the clean prefix and the noised block, cut at the
block's end, one sequence under the block-causal mask), and enumerates every mask of every
block; mptlml scores x_t + x_0 in one forward for all blocks of a row.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

import mptlml
from mptlml.models import MaskedLM
from mptlml.models.blocks import block_spans
from mptlml.models.tiny_bd3lm import load_modeling, save_tiny_bd3lm

TEXTS = ["the cat sat on a mat",
         "big red house tree far away the dog ran on a blue mat",
         "a dog"]


@pytest.fixture(scope="module")
def hub_dir(tmp_path_factory):
    return save_tiny_bd3lm(tmp_path_factory.mktemp("bd3lm") / "tiny", block_size=4,
                           model_length=32, seed=1)


@pytest.fixture(scope="module")
def lm(hub_dir):
    return MaskedLM.from_pretrained(hub_dir, trust_remote_code=True)


def block_terms(module, mask_id, full: torch.Tensor, start: int, block: int) -> float:
    """The MPT sum of the content positions ``full[start:]`` of each block, by enumeration,
    the module called on the clean prefix and the noised block (padded with the mask id)."""
    total = 0.0
    t = len(full)
    for b0 in range(0, t, block):
        pos = [j for j in range(b0, min(b0 + block, t)) if j >= start]
        if not pos:
            continue
        by_size: dict[int, list[float]] = {}
        for m in range(1, len(pos) + 1):
            for sub in itertools.combinations(pos, m):
                x = full[: b0 + block].clone()
                if len(x) < b0 + block:
                    x = torch.cat([x, torch.full((b0 + block - len(x),), mask_id)])
                x[list(sub)] = mask_id
                with torch.no_grad():
                    logits = module(input_ids=x[None]).logits[0].double()
                logits[:, mask_id] = -math.inf  # SUBS
                lp = torch.log_softmax(logits, -1)
                by_size.setdefault(m, []).append(float(sum(lp[j, full[j]] for j in sub)))
        total += sum(np.mean(v) / m for m, v in by_size.items())
    return total


def reference_block_bound(lm: MaskedLM, text: str, context: str | None = None) -> float:
    module = lm.model
    bos = lm.tokenizer.bos_token_id
    ctx = [] if context is None else lm.tokenizer(context, add_special_tokens=False)["input_ids"]
    cont = lm.tokenizer(text, add_special_tokens=False)["input_ids"]
    full = torch.tensor([bos, *ctx, *cont])
    return block_terms(module, lm.mask_token_id, full, 1 + len(ctx), lm.block_size)


def test_block_model_loads_from_the_hub_layout(lm, hub_dir):
    assert lm.block_size == 4 and lm.layout == "xt_x0" and lm.subs
    assert lm.mask_token_id == lm.model.config.vocab_size - 1  # the last vocabulary entry
    assert lm.prefix == [lm.tokenizer.bos_token_id] and lm.suffix == []
    assert (hub_dir / "modeling_bd3lm.py").exists()


def test_block_spans_count_from_the_input_start():
    assert block_spans(6, 1, 4) == [(0, 3), (3, 6)]
    assert block_spans(9, 3, 4) == [(0, 1), (1, 5), (5, 9)]
    assert block_spans(4, 0, 4) == [(0, 4)]


def test_block_bound_equals_enumeration_with_the_module_called_directly(lm):
    r = mptlml.estimate_lml(lm, TEXTS, "learned-rate", num_masks=8, seed=0)
    ref = [reference_block_bound(lm, t) for t in TEXTS]
    np.testing.assert_allclose(r.per_sample.numpy(), ref, atol=1e-5, rtol=0)
    assert (r.per_sample_stderr == 0).all()
    assert r.num_blocks.tolist() == r.exact_blocks.tolist() == [2, 4, 1]
    # one forward per row for all blocks: the longest block's 15 masks, not 15 per block
    assert r.num_masked_rows_per_sample.tolist() == [7, 15, 3]


@pytest.mark.parametrize("context", ["the cat sat", "the cat", "big red house tree far"])
def test_continuation_in_context_scores_its_own_tokens_of_each_block(lm, context):
    """A continuation that starts inside a block: that block's context tokens are clean and
    visible, the term is the MPT sum over the continuation's tokens of the block only."""
    r = mptlml.estimate_lml(lm, [" on a mat the dog"], "learned-rate", num_masks=8, seed=0,
                            context=context)
    ref = reference_block_bound(lm, " on a mat the dog", context)
    assert abs(float(r.per_sample[0]) - ref) < 1e-5
    assert float(r.per_sample_stderr[0]) == 0


def test_prefix_layout_gives_the_same_bound(lm):
    """The same module scored by the prefix layout (one forward per block, the prefix
    recomputed): the same exact bound, more forwards."""
    pre = MaskedLM(lm.model, lm.tokenizer, family="fast_dllm_v2", block_size=4,
                   mask_token_id=lm.mask_token_id, force_family=True)  # a bd3lm module
    pre.prefix = list(lm.prefix)  # the same frame (BD3-LM's BOS)
    pre.subs = True
    a = mptlml.estimate_lml(lm, TEXTS[:2], "learned-rate", num_masks=8, seed=0)
    b = mptlml.estimate_lml(pre, TEXTS[:2], "learned-rate", num_masks=8, seed=0)
    np.testing.assert_allclose(a.per_sample.numpy(), b.per_sample.numpy(), atol=1e-5)


@pytest.mark.slow
def test_block_bound_se_is_calibrated_where_blocks_are_drawn(tmp_path):
    """Blocks of 8 (255 masks each, drawn with P = 16): |z| > 2 in at most 10% of seeds."""
    d = save_tiny_bd3lm(tmp_path / "b8", block_size=8, model_length=32, seed=2)
    lm8 = MaskedLM.from_pretrained(d, trust_remote_code=True)
    texts = ["the cat sat on a mat", "big red house tree far away the dog ran"]
    truth = np.array([reference_block_bound(lm8, t) for t in texts])
    zs = []
    for seed in range(60):
        r = mptlml.estimate_lml(lm8, texts, "learned-rate", num_masks=16, seed=seed)
        assert r.exact_blocks.tolist() == [0, 1]  # the 2-token last block of text 2
        zs += list((r.per_sample.numpy() - truth) / r.per_sample_stderr.numpy())
    zs = np.array(zs)
    assert np.mean(np.abs(zs) > 2) <= 0.10
    assert abs(np.mean(zs)) < 0.4  # unbiased


def test_target_se_is_reached_on_a_block_model(tmp_path):
    d = save_tiny_bd3lm(tmp_path / "b8", block_size=8, model_length=32, seed=2)
    lm8 = MaskedLM.from_pretrained(d, trust_remote_code=True)
    r = mptlml.estimate_lml(lm8, TEXTS[:2], "learned-rate", target_se=1.0, seed=0)
    assert r.stop_reason == "target" and r.stderr <= 1.0


def test_full_attention_estimators_are_refused_on_a_block_model(lm):
    for est in ("cumulative", "random-size", "riemann"):
        with pytest.raises(ValueError, match="block-diffusion LM"):
            mptlml.estimate_lml(lm, TEXTS[:1], est, num_masks=2, seed=0)


def test_mismatched_family_is_refused_by_name(lm, hub_dir):
    with pytest.raises(ValueError, match="full-attention family.*bd3lm"):
        MaskedLM(lm.model, lm.tokenizer, family="llada", mask_token_id=lm.mask_token_id)
    # from_pretrained reads the config before the weights: the family contradicts it by name
    with pytest.raises(ValueError, match="family='mdlm' contradicts the checkpoint.*'bd3lm'"):
        MaskedLM.from_pretrained(hub_dir, trust_remote_code=True, family="mdlm")
    mod = load_modeling(hub_dir)
    full = mod.TinyBD3LM(mod.TinyBD3LMConfig(block_size=4))
    full.config.model_type = "llada"
    with pytest.raises(ValueError, match="block-diffusion family.*full-attention"):
        MaskedLM(full, lm.tokenizer, family="bd3lm")
    with pytest.raises(ValueError, match="block_size=.*block-diffusion family"):
        MaskedLM(torch.nn.Linear(2, 2), lm.tokenizer, block_size=4, mask_token_id=3,
                 vocab_size=20)
    with pytest.raises(ValueError, match="disagrees"):
        MaskedLM(lm.model, lm.tokenizer, family="bd3lm", block_size=8)


def test_module_wrapped_with_family_and_block_size(lm):
    plain = MaskedLM(lm.model, lm.tokenizer, family="bd3lm", block_size=4)
    assert plain.block_size == 4 and plain.layout == "xt_x0"
    a = mptlml.estimate_lml(plain, TEXTS[:1], "learned-rate", num_masks=8, seed=0)
    assert abs(float(a.per_sample[0]) - reference_block_bound(lm, TEXTS[0])) < 1e-5


def direct_block_row(lm: MaskedLM, full: torch.Tensor, b0: int, masked: list[int]
                     ) -> torch.Tensor:
    """The module called directly on the clean prefix before block ``b0`` and the block with
    ``masked`` hidden (padded with the mask id), SUBS applied: log-probs ``(b0 + B, V)``."""
    block, mask_id = lm.block_size, lm.mask_token_id
    x = full[: b0 + block].clone()
    if len(x) < b0 + block:
        x = torch.cat([x, torch.full((b0 + block - len(x),), mask_id)])
    x[masked] = mask_id
    with torch.no_grad():
        logits = lm.model(input_ids=x[None]).logits[0].double()
    logits[:, mask_id] = -math.inf  # SUBS
    return torch.log_softmax(logits, -1)


def full_ids(lm: MaskedLM, text: str, context: str | None = None) -> tuple[torch.Tensor, int]:
    ctx = [] if context is None else lm.tokenizer(context, add_special_tokens=False)["input_ids"]
    cont = lm.tokenizer(text, add_special_tokens=False)["input_ids"]
    return torch.tensor([lm.tokenizer.bos_token_id, *ctx, *cont]), 1 + len(ctx)


@pytest.mark.parametrize("context", [None, "the cat"])
def test_block_pll_equals_the_module_called_directly(lm, context):
    """Each token masked alone, its own block's other tokens and earlier blocks visible."""
    if context is None:
        got = mptlml.pll(lm, TEXTS, per_token=True)
        per_token, total = got.log_probs, got.total
    else:  # per_token does not combine with context=
        total = mptlml.pll(lm, [" " + t for t in TEXTS], context=[context] * len(TEXTS))
    for i, text in enumerate(TEXTS):
        full, start = full_ids(lm, text if context is None else " " + text, context)
        ref = [float(direct_block_row(lm, full, j // lm.block_size * lm.block_size, [j])
                     [j, full[j]]) for j in range(start, len(full))]
        if context is None:
            assert np.abs(per_token[i] - np.array(ref)).max() < 1e-5
        assert abs(float(total[i]) - sum(ref)) < 1e-5
    with pytest.raises(ValueError, match="block-diffusion LM.*whole_word"):
        mptlml.pll(lm, TEXTS[:1], whole_word=True)


def test_block_pll_scores_every_block_of_a_row_in_one_forward(lm):
    from mptlml.estimators.block import block_pll

    ids = lm.encode(TEXTS[1:2])
    _, calls = block_pll(lm, ids, batch_size=1)
    assert calls == lm.block_size  # one row per position in a block, not one per token
    assert len(ids[0]) > 2 * lm.block_size


def test_block_curve_equals_enumeration_with_the_module_called_directly(lm):
    """Every (block, rate) cell enumerable: the curve is exact, and equals the per-block
    S_b(x; round(r |b|)) by enumeration, weighted by |b| / D."""
    rates = [0.2, 0.5, 0.8]
    c = mptlml.mpt_curve(lm, TEXTS, num_masks=6, rates=rates, seed=0)  # C(4, 2) = 6
    for i, text in enumerate(TEXTS):
        full, start = full_ids(lm, text)
        d = len(full) - start
        for k, r in enumerate(rates):
            ref = 0.0
            for b0 in range(0, len(full), lm.block_size):
                pos = [j for j in range(b0, min(b0 + lm.block_size, len(full))) if j >= start]
                if not pos:
                    continue
                m = min(max(math.floor(r * len(pos) + 0.5), 1), len(pos))
                vals = []
                for sub in itertools.combinations(pos, m):
                    lp = direct_block_row(lm, full, b0, list(sub))
                    vals.append(sum(float(lp[j, full[j]]) for j in sub) / m)
                ref += len(pos) * float(np.mean(vals))
            assert abs(float(c.per_sample[i, k]) - ref / d) < 1e-6
        assert float(c.per_sample_stderr[i].max()) == 0.0
        assert abs(float(c.lml[i]) - d * float(c.per_sample[i].mean())) < 1e-9
    assert c.extra["exact_cells"] == [3 * len(lm.block_spans(lm.encode([t]))[0])
                                      for t in TEXTS]


def test_block_curve_draws_where_blocks_are_long(lm):
    """P < C(|b|, M): drawn, with a standard error; the mean over seeds meets the exact curve."""
    rates = [0.5]
    exact = mptlml.mpt_curve(lm, TEXTS[1:2], num_masks=6, rates=rates, seed=0)
    runs = [mptlml.mpt_curve(lm, TEXTS[1:2], num_masks=2, rates=rates, seed=s)
            for s in range(6)]
    assert all(float(r.per_sample_stderr.max()) > 0 for r in runs)
    mean = np.mean([float(r.per_sample[0, 0]) for r in runs])
    se = np.sqrt(np.mean([float(r.per_sample_stderr[0, 0]) ** 2 for r in runs]) / len(runs))
    assert abs(mean - float(exact.per_sample[0, 0])) < 5 * se
    with pytest.raises(ValueError, match="block-diffusion LM.*target_se"):
        mptlml.mpt_curve(lm, TEXTS[:1], num_masks=2, seed=0, target_se=0.1)


def direct_greedy(lm: MaskedLM, context: str, steps: int) -> list[int]:
    """Greedy unmasking block by block with the module called directly (prefix layout)."""
    tok, module, b, mask = lm.tokenizer, lm.model, lm.block_size, lm.mask_token_id
    ctx = [tok.bos_token_id, *tok(context, add_special_tokens=False)["input_ids"]]
    state = torch.tensor(ctx + [mask] * steps)
    while (state == mask).any():
        holes = (state == mask).nonzero().flatten()
        holes = holes[holes // b == int(holes[0]) // b]
        end = (int(holes[0]) // b + 1) * b
        x = torch.cat([state[:end], torch.full((max(0, end - len(state)),), mask)])
        with torch.no_grad():
            logits = module(input_ids=x[None]).logits[0].double()
        logits[:, mask] = -math.inf
        top, arg = torch.log_softmax(logits, -1)[holes].max(-1)
        k = int(torch.argmax(top))
        state[holes[k]] = arg[k]
    return state[len(ctx):].tolist()


def test_lm_eval_scores_a_block_model_with_is_greedy(lm):
    from lm_eval.api.instance import Instance

    from mptlml.lm_eval.backend import MPTLM

    greedy = direct_greedy(lm, "the cat sat", 3)
    words = [lm.tokenizer.convert_ids_to_tokens(i) for i in greedy]
    assert not any(w.startswith("[") for w in words)  # plain words: a text to score
    wrong = [w for w in ("dog", "cat", "mat") if w != words[0]][0]
    conts = [" " + " ".join(words), " " + " ".join([wrong, *words[1:]])]
    backend = MPTLM(pretrained=lm)
    out = backend.loglikelihood([Instance("loglikelihood", {}, ("the cat sat", c), i,
                                          ("t", 0, 1)) for i, c in enumerate(conts)])
    assert [g for _, g in out] == [True, False]
    ref = [reference_block_bound(lm, c, "the cat sat") for c in conts]
    np.testing.assert_allclose([ll for ll, _ in out], ref, atol=1e-5)
    (rolled,) = backend.loglikelihood_rolling([Instance("loglikelihood_rolling", {},
                                                        (TEXTS[0],), 0, ("t", 0, 1))])
    assert abs(rolled - reference_block_bound(lm, TEXTS[0])) < 1e-5


def test_the_guide_shows_the_table_of_block_families():
    from pathlib import Path

    from mptlml.models.conventions import block_conventions_table

    guide = (Path(__file__).parents[1] / "docs" / "guides" / "block-models.md").read_text()
    assert block_conventions_table() in guide
