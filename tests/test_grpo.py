"""GRPO on MPT bounds (issue 51): log-ratios on common masks and MPTGRPOTrainer.

References: the exhaustive conditional MPT sum of each completion by direct forwards of the
BERT (:func:`tests.mlm_helpers.exhaustive_masked_sum`), never numbers mptlml printed; the
complementary draw checked mask by mask; the control variate's expectation by enumerating
every mask a draw can make, each with its probability.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from mptlml.estimators.sequential import (
    NUM_RATE_BINS,
    RateDensity,
    complement_cells,
    masks_at_rates,
    stratified_rates,
)
from mptlml.hf import policy_logratios
from mptlml.models import MaskedLM

from .mlm_helpers import exhaustive_masked_sum, make_tiny_bert

pytestmark = [pytest.mark.filterwarnings("ignore::FutureWarning"),
              pytest.mark.usefixtures("one_thread")]

PROMPTS = ["the cat", "a dog"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A float64 tiny BERT and a nearby one (an RL step away)."""
    from transformers import BertForMaskedLM, BertTokenizer

    path = make_tiny_bert(tmp_path_factory.mktemp("grpo") / "b", seed=0)
    tok = BertTokenizer.from_pretrained(path)
    pol = BertForMaskedLM.from_pretrained(path).double().eval()
    old = BertForMaskedLM.from_pretrained(path).double().eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for q in old.parameters():
            q.add_(0.02 * torch.randn(q.shape, generator=g, dtype=q.dtype))
    return tok, pol, old


def _exact_logratio(tok, pol, old, prompt, completion):
    def bound(net):
        ids = torch.tensor(tok(prompt + completion)["input_ids"])
        n = len(tok(prompt)["input_ids"]) - 1  # [CLS] + the prompt
        return exhaustive_masked_sum(ids, list(range(n, len(ids) - 1)), tok.mask_token_id,
                                     lambda x: net(x).logits.double().log_softmax(-1))

    return bound(pol) - bound(old)


def test_complementary_draws_are_complements_at_mirrored_stratified_rates():
    g = torch.Generator().manual_seed(0)
    density = RateDensity(np.ones(NUM_RATE_BINS))
    strata, rates, order = stratified_rates(g, 8, 9, density, complement=True)
    h = 4
    assert np.all((rates >= strata / h) & (rates <= (strata + 1) / h))  # each in its stratum
    for t in (5, 9):  # any length up to the order's
        m, sizes = masks_at_rates(t, rates, order, distinct_pairs=False)
        for j in range(2):  # stratum j's draws and stratum h - 1 - j's
            for k in range(2):
                a, b = m[2 * j + k], m[2 * (h - 1 - j) + k]
                assert torch.equal(a, ~b) and sizes[2 * j + k] + sizes[2 * (h - 1 - j) + k] == t
    y = np.arange(8.0)
    cells = complement_cells(y)  # (y_h + y_mirror) / H per antithetic pair
    assert np.allclose(cells[0], [(0 + 6) / 4, (1 + 7) / 4])
    assert np.isclose(sum(c.mean() for c in cells), y.mean())
    with pytest.raises(ValueError, match="multiple of 4"):
        stratified_rates(g, 6, 9, density, complement=True)


@pytest.mark.parametrize("control_variate", [True, False])
def test_an_enumerable_completion_s_logratio_is_exact_with_se_zero(pair, control_variate):
    tok, pol, old = pair
    comps = [" sat on", " ran far away"]  # 2 and 3 tokens: every mask
    r = policy_logratios(MaskedLM(pol, tok), MaskedLM(old, tok), PROMPTS, comps,
                         control_variate=control_variate)
    exact = [_exact_logratio(tok, pol, old, p, c) for p, c in zip(PROMPTS, comps, strict=True)]
    np.testing.assert_allclose(r.logratio.detach().numpy(), exact, atol=1e-10)
    assert r.exact.all() and np.all(r.logratio_stderr == 0) and r.masked_inputs == 3 + 7


def test_per_token_scores_sum_to_the_row_sums(pair):
    from mptlml.hf import masked_sums
    from mptlml.hf.preference import plan_inputs

    tok, pol, _ = pair
    lm = MaskedLM(pol, tok)
    ids = torch.tensor(tok(" the cat sat on a mat")["input_ids"][1:-1])
    masks = torch.tensor([[1, 0, 1, 0, 0, 1], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    x, lab = plan_inputs(lm, ids, 1, masks[:, :5])
    rows = [x[0], x[1][:-1]]  # two lengths: padded to the longest
    tg = [lab[0], lab[1][:-1]]
    tok_s = masked_sums(pol, lm, rows, tg, grad=False, per_token=True)
    assert tok_s.shape == (2, x.shape[1])
    assert torch.all(tok_s[torch.nn.utils.rnn.pad_sequence(tg, batch_first=True,
                                                           padding_value=-100) == -100] == 0)
    torch.testing.assert_close(tok_s.sum(1), masked_sums(pol, lm, rows, tg, grad=False))
    with torch.no_grad():  # a direct forward: log_softmax at each scored position
        lp = pol(x[:1]).logits.double().log_softmax(-1)[0]
    j = (lab[0] != -100).nonzero().flatten()
    torch.testing.assert_close(tok_s[0, j], lp[j, lab[0, j]])


@pytest.mark.parametrize("control_variate", [True, False])
def test_the_draw_s_expectation_over_every_mask_is_the_exact_logratio(pair, monkeypatch,
                                                                      control_variate):
    """Each draw is a uniform rate (the mean of P = 2 stratified draws has the uniform
    rate's expectation: the estimate is linear in its draws) and a uniform mask of its size
    ceil(r (T - 1)): the estimate's expectation, every mask of sizes 1..T-1 scored through
    policy_logratios (both draws on it) and weighted by its probability, equals the exact
    log-ratio and each model's exact bound (every mask, direct forwards)."""
    import mptlml.hf.logratio as lr

    tok, pol, old = pair
    prompt, comp = "the cat", " sat on a big red"
    t = len(tok(comp, add_special_tokens=False)["input_ids"])
    assert t == 5
    lp, lo = MaskedLM(pol, tok), MaskedLM(old, tok)
    forced = {}

    def rates(g, p, tmax, density, complement=False, per_stratum=2):  # both on the mask
        m, mask = forced["size"], forced["mask"]
        order = torch.tensor(list(mask) + [j for j in range(tmax) if j not in mask])
        return (np.zeros(2, dtype=np.int64), np.full(2, (m - 0.5) / (tmax - 1)),
                order.expand(2, -1).clone())

    monkeypatch.setattr(lr, "stratified_rates", rates)
    expect = np.zeros(3)
    with torch.no_grad():
        for m in range(1, t):
            for mask in itertools.combinations(range(t), m):
                forced.update(size=m, mask=mask)
                r = policy_logratios(lp, lo, [prompt], [comp], num_masks=2, exact_length=0,
                                     control_variate=control_variate)
                got = r.policy_bound.numpy()[0], r.old_bound.numpy()[0], r.logratio.numpy()[0]
                expect += np.array(got) / ((t - 1) * math.comb(t, m))
    ids = torch.tensor(tok(prompt + comp)["input_ids"])
    n = len(tok(prompt)["input_ids"]) - 1
    exact = [exhaustive_masked_sum(ids, list(range(n, len(ids) - 1)), tok.mask_token_id,
                                   lambda x, net=net: net(x).logits.double().log_softmax(-1))
             for net in (pol, old)]
    np.testing.assert_allclose(expect, [exact[0], exact[1], exact[0] - exact[1]], atol=1e-9)


def _seeded_errors(pair, prompts, comps, seeds=150, **kw):
    """``policy_logratios`` over seeds 0..seeds-1: its errors against the exact log-ratio,
    its standard errors and dof, each ``(seeds, completions)``."""
    tok, pol, old = pair
    exact = np.array([_exact_logratio(tok, pol, old, p, c)
                      for p, c in zip(prompts, comps, strict=True)])
    lp, lo = MaskedLM(pol, tok), MaskedLM(old, tok)
    est, se, dof = [], [], []
    with torch.no_grad():
        for s in range(seeds):
            r = policy_logratios(lp, lo, prompts, comps, seed=s, **kw)
            est.append(r.logratio.numpy())
            se.append(r.logratio_stderr)
            dof.append(r.dof)
    return np.array(est) - exact, np.array(se), np.array(dof)


@pytest.mark.slow
def test_the_control_variate_s_per_completion_se_is_calibrated(pair):
    """Four 6-token completions, the default 7 stratified draws (one a stratum) with the
    control variate, 150 seeds: each completion's |z| = |estimate - exact| / se exceeds 2 in
    at most 10% of the seeds overall (the SE on 6 dof), the mean is within 4 SE of the exact
    log-ratio, and the mean squared error is within the reported variance's range (the SE
    reads stratified draws as independent: conservative, not far off)."""
    prompts = PROMPTS * 2
    comps = [" sat on a big red mat", " ran far away with the cat", " was under the big tree",
             " and the dog sat on a"]
    err, se, dof = _seeded_errors(pair, prompts, comps)
    assert np.all(dof == 6)
    assert np.all(np.abs(err.mean(0)) < 4 * err.std(0) / np.sqrt(len(err)))
    z = err / se
    assert np.mean(np.abs(z) > 2) <= 0.10, np.mean(np.abs(z) > 2, axis=0)
    ratio = (err ** 2).mean(0) / (se ** 2).mean(0)
    assert np.all((ratio > 0.4) & (ratio < 1.6)), ratio


@pytest.mark.slow
@pytest.mark.parametrize("masks", ["complement", "stratified"])
def test_the_logratio_is_unbiased_and_its_se_calibrated(pair, masks):
    """6-token completions, 8 draws without the control variate: over 150 seeds the mean is
    within 4 SE of the exact log-ratio, the mean squared error matches the mean reported
    variance, and the batch mean's |z| > 2 rate is at most 10%."""
    comps = [" sat on a big red mat", " ran far away with the cat"]
    err, se, _ = _seeded_errors(pair, PROMPTS, comps, num_masks=8, masks=masks,
                                control_variate=False)
    assert np.all(np.abs(err.mean(0)) < 4 * err.std(0) / np.sqrt(len(err)))
    ratio = (err ** 2).mean(0) / (se ** 2).mean(0)
    assert np.all((ratio > 0.6) & (ratio < 1.6)), ratio
    z = err.mean(1) / (np.sqrt((se ** 2).sum(1)) / 2)
    assert np.mean(np.abs(z) > 2) <= 0.10


def test_the_policy_gets_the_gradient_and_the_old_policy_none(pair):
    tok, pol, old = pair
    comps = [" sat on a big red mat", " ran far"]
    r = policy_logratios(MaskedLM(pol, tok), MaskedLM(old, tok), PROMPTS, comps, seed=3)
    r.logratio.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in pol.parameters())
    assert all(p.grad is None for p in old.parameters())
    pol.zero_grad()
    with pytest.raises(ValueError, match="multiple of 4"):
        policy_logratios(MaskedLM(pol, tok), MaskedLM(old, tok), PROMPTS, comps, num_masks=6,
                         masks="complement")
    with pytest.raises(ValueError, match="at least 2"):
        policy_logratios(MaskedLM(pol, tok), MaskedLM(old, tok), PROMPTS, comps, num_masks=1)
    with pytest.raises(ValueError, match="one prompt per completion"):
        policy_logratios(MaskedLM(pol, tok), MaskedLM(old, tok), PROMPTS, comps[:1])


# ---------------------------------------------------------------------- the trainer
def _reward(prompts, completions, **_):
    return [c.split().count("red") / 3.0 for c in completions]


def _config(tmp_path, **kw):
    from mptlml.hf import MPTGRPOConfig

    base = dict(output_dir=str(tmp_path / "out"), num_generations=4,
                per_device_train_batch_size=8, max_completion_length=3, max_steps=2,
                logging_steps=1, report_to=[], learning_rate=1e-3, use_cpu=True,
                save_strategy="no", disable_tqdm=True, seed=0)
    return MPTGRPOConfig(**{**base, **kw})


@pytest.fixture
def fresh(tmp_path):
    from transformers import BertForMaskedLM, BertTokenizer

    path = make_tiny_bert(tmp_path / "m", seed=2)
    return BertForMaskedLM.from_pretrained(path), BertTokenizer.from_pretrained(path)


DATA = [{"prompt": "the cat"}, {"prompt": "a dog"}]


def test_bad_setups_are_refused_before_any_step(fresh, tmp_path):
    from mptlml.hf import MPTGRPOTrainer

    model, tok = fresh
    with pytest.raises(ValueError, match="num_generations must be an int >= 2"):
        _config(tmp_path, num_generations=1, per_device_train_batch_size=4)
    with pytest.raises(ValueError, match="'prompt' column"):
        MPTGRPOTrainer(model=model, reward_funcs=[_reward], args=_config(tmp_path),
                       train_dataset=[{"text": "the cat"}], processing_class=tok)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        MPTGRPOTrainer(model=model, reward_funcs=[_reward], args=_config(tmp_path),
                       train_dataset=[{"prompt": "a"}, {"prompt": " "}], processing_class=tok)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = MPTGRPOTrainer(model=model, reward_funcs=[lambda prompts, completions, **_: [1.0]],
                             args=_config(tmp_path), train_dataset=DATA, processing_class=tok)
    with pytest.raises(ValueError, match="returned 1 values .* for 8 completions"):
        trainer.train()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_a_lora_policy_is_its_own_reference_with_kl_zero_at_step_zero(fresh, tmp_path):
    import peft  # the rl extra

    from mptlml.hf import MPTGRPOTrainer

    model, tok = fresh
    model = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["query", "value"]))
    trainer = MPTGRPOTrainer(model=model, reward_funcs=[_reward],
                             args=_config(tmp_path, beta=0.1, num_masks=4, exact_length=0,
                                          drift_length=3),
                             train_dataset=DATA, processing_class=tok)
    assert trainer.adapter_reference and trainer.ref_lm is None  # no second copy of weights
    weights = {id(p) for m in (trainer.model, trainer.policy_lm.model) for p in m.parameters()}
    assert len(weights) == len(list(trainer.model.parameters()))
    trainer.train()
    logs = [h for h in trainer.state.log_history if "kl" in h]
    assert logs[0]["kl"] == 0.0 and logs[0]["kl_mc_se"] == 0.0  # LoRA's B starts at 0
    for key in ("reward", "reward_std", "logratio_mc_se", "masked_inputs", "drift/bound_gap"):
        assert key in logs[0]
    assert logs[0]["masked_inputs"] == 8 * (4 + 1)
    plans = trainer._rollout.plans  # the estimator of policy_logratios' defaults
    assert plans.control_variate and not plans.complement


def test_one_draw_strata_partition_the_rate_density():
    """``stratified_rates(per_stratum=1)``: draw h of P lies in the h-th of P strata of equal
    q-mass (its CDF value in [h/P, (h+1)/P)), for the uniform and a learned density, and
    over many seeds each draw's CDF value is uniform within its stratum (mean h + 1/2)."""
    from mptlml.estimators.sequential import RateDensity, stratified_rates

    for density in (RateDensity(np.ones(10)), RateDensity(np.linspace(1.0, 3.0, 10))):
        u = []
        for s in range(400):
            strata, rates, order = stratified_rates(torch.Generator().manual_seed(s), 7, 9,
                                                    density, per_stratum=1)
            assert strata.tolist() == list(range(7)) and order.shape == (7, 9)
            u.append(density.cdf(rates) * 7)
        u = np.array(u)
        assert np.all(np.floor(u) == np.arange(7))
        np.testing.assert_allclose(u.mean(0) - np.arange(7), 0.5, atol=0.05)


def test_the_trainer_s_path_is_policy_logratios(pair):
    """common_plans + scores + difference (what the trainer runs on a rollout) give
    policy_logratios' estimate, SE and dof on the same generators."""
    from mptlml.hf import common_plans
    from mptlml.models.sequence_input import encode_with_context

    tok, pol, old = pair
    lp, lo = MaskedLM(pol, tok), MaskedLM(old, tok)
    comps = [" sat on a big red mat", " ran far"]

    def gens():
        return [torch.Generator().manual_seed(40 + i) for i in range(2)]

    with torch.no_grad():
        r = policy_logratios(lp, lo, PROMPTS, comps, seed=gens(), exact_length=0)
        ids, n = encode_with_context(lp, PROMPTS, comps)
        plans = common_plans(lp, ids, n, seed=gens(), exact_length=0)
        est, se, dof = plans.difference(plans.scores(lp), plans.scores(lo))
    torch.testing.assert_close(est, r.logratio)
    np.testing.assert_array_equal(se, r.logratio_stderr)
    assert np.all(dof == 6) and np.all(se > 0)  # the default 7 draws
