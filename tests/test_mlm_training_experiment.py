"""reproduce mlm-training: the quick run writes its files; claims() flips with the evidence."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from mptlml.reproduce import mlm_training
from mptlml.reproduce._mlm_training_analysis import seeds_to_decide
from mptlml.reproduce.mlm_training import claims


def _fabricated(*, lml_gap: float, at15: float, high: float, bern_gap: float,
                z_chain: float, reference: str = "bernoulli_lvm") -> dict:
    def d(mean: float, se: float = 0.1) -> dict:
        return {"mean": mean, "stderr": se, "per_seed": [mean] * 3}

    return {
        "objectives": ["bert-15", "fixed-15", "random-size"], "seeds": [0, 1, 2],
        "table": [{"objective": reference, "seed": None, "model": "reference",
                   "lml": -21.0, "lml_se": 0.5}],
        "comparisons": {
            "lml_random_minus_fixed": d(lml_gap), "lml_random_minus_bert": d(0.0),
            "curve15_fixed_minus_random": d(at15, 0.01),
            "curve_high_fixed_minus_random": d(high, 0.01),
            "high_rate_threshold": 0.7, "curve15_rate": 0.15, "best_objective": "random-size",
            "reference": reference, "best_minus_reference": d(bern_gap, 0.3),
            "chain_vs_cumulative_max_abs_z": z_chain,
        },
    }


def test_claims_hold_on_supporting_results():
    res = _fabricated(lml_gap=1.0, at15=0.0, high=-0.1, bern_gap=2.0, z_chain=1.0)
    verdicts = [c["holds"] for c in claims(res)]
    assert verdicts == [True, True, True, True]
    for c in claims(res):
        assert c["claim"] and c["paper"] and c["ours"]
        json.dumps(c)


def test_claims_fail_on_contrary_results():
    res = _fabricated(lml_gap=-1.0, at15=-0.1, high=0.05, bern_gap=-3.0, z_chain=6.0)
    assert [c["holds"] for c in claims(res)] == [False, False, False, False]
    assert [c["status"] for c in claims(res)] == ["fails"] * 4
    # a gap within noise is not evidence either way: undecided, neither confirmed nor refuted
    res = _fabricated(lml_gap=0.1, at15=0.0, high=-0.005, bern_gap=0.2, z_chain=1.0)
    assert [c["holds"] for c in claims(res)] == [None, None, None, True]
    assert [c["status"] for c in claims(res)] == ["undecided"] * 3 + ["holds"]


def test_random_vs_fixed_within_noise_is_undecided_with_its_budget():
    """The full run's 3 seeds (+1.04, -0.38, -0.09; z = +0.4): undecided, with the numbers and
    the seeds that would decide it, (2.8 s / d)^2 with s the per-seed spread."""
    res = _fabricated(lml_gap=0.19, at15=0.0, high=-0.1, bern_gap=2.0, z_chain=1.0)
    per_seed = [1.04, -0.38, -0.09]
    sd = float(np.std(per_seed, ddof=1))  # 0.750: the SE over seeds is sd / sqrt(3)
    res["comparisons"]["lml_random_minus_fixed"] = {
        "mean": float(np.mean(per_seed)), "stderr": sd / math.sqrt(3), "per_seed": per_seed}
    c = claims(res)[0]
    assert c["status"] == "undecided" and c["holds"] is None
    assert "+0.19 +/- 0.43" in c["note"] and "z = +0.4" in c["note"]
    need = math.ceil((2.8 * sd / 0.19) ** 2)  # 123
    assert need == 123 and f"about {need} seeds" in c["note"]
    assert seeds_to_decide(res["comparisons"]["lml_random_minus_fixed"]) == need
    # one seed: no spread to plan with
    one = {"mean": 0.2, "stderr": 0.3, "per_seed": [0.2]}
    assert seeds_to_decide(one) is None


def test_quick_hypotheses_are_undecided_but_the_identity_is_decided():
    """At quick sizes (60 steps) the hypotheses about trained MLMs are undecided, with the
    full-size outcome beside them; the chain-rule identity is decided, and fails when broken."""
    res = _fabricated(lml_gap=-1.0, at15=-0.1, high=0.05, bern_gap=-3.0, z_chain=1.0)
    res["quick"] = True
    got = claims(res)
    assert [c["status"] for c in got] == ["undecided"] * 3 + ["holds"]
    for c in got[:3]:
        assert "Not decided at quick sizes" in c["note"]
        assert "at full size (2026-" in c["note"], c["note"]  # from the packaged table
        assert c["full_size"]["status"] in ("holds", "undecided")
    res["comparisons"]["chain_vs_cumulative_max_abs_z"] = 6.0  # a broken identity
    assert claims(res)[3]["status"] == "fails"


def test_claims_name_the_reference_of_the_data():
    """Grey levels have no Bernoulli reference: the claim is against independent pixels."""
    res = _fabricated(lml_gap=1.0, at15=0.0, high=-0.1, bern_gap=2.0, z_chain=1.0,
                      reference="independent")
    c = claims(res)[2]
    assert "independent pixels" in c["claim"] and c["holds"]
    binary = _fabricated(lml_gap=1.0, at15=0.0, high=-0.1, bern_gap=-2.0, z_chain=1.0)
    c = claims(binary)[2]
    assert "Bernoulli" in c["claim"] and not c["holds"]


def test_independent_pixels_reference_is_the_counted_categorical():
    """Held-out log-likelihood of independent pixels, by hand: counts, floor, renormalise."""
    import torch

    from mptlml.reproduce._mlm_training_data import _independent

    train = torch.tensor([[0, 2], [1, 2], [1, 2], [1, 2]])
    test = torch.tensor([[1, 0], [0, 2]])
    p0 = [0.25, 0.75, 1e-3]  # pixel 0: counts of 0, 1, 2 among 4 images; 2 never seen
    p1 = [1e-3, 1e-3, 1.0]  # pixel 1: always 2
    z0, z1 = sum(p0), sum(p1)
    want = [math.log(p0[1] / z0) + math.log(p1[0] / z1),
            math.log(p0[0] / z0) + math.log(p1[2] / z1)]
    got = _independent(train, test, 3)
    assert got == pytest.approx(want, abs=1e-12)


def test_config_refuses_bad_settings():
    with pytest.raises(ValueError, match="objective"):
        mlm_training.Config(objectives=("bert-30",)).validate()
    with pytest.raises(ValueError, match="num_test"):
        mlm_training.Config(num_test=1790).validate()
    with pytest.raises(ValueError, match="levels"):
        mlm_training.Config(levels=5)
    # the Bernoulli reference exists for binary pixels only: its settings are refused, not ignored
    with pytest.raises(ValueError, match="bernoulli_epochs.*levels=17"):
        mlm_training.Config(levels=17, bernoulli_epochs=10).validate()
    mlm_training.Config(levels=17).validate()
    mlm_training.Config.quick().validate()


@pytest.mark.slow
def test_quick_run_writes_results_and_figures(tmp_path):
    from mptlml.reproduce import run_part

    out = run_part("mlm-training", tmp_path / "run", quick=True)
    res = out["results"]
    files = set(out["files"])
    for f in ("training.csv", "curve.csv", "lml_table.csv", "per_sequence.csv",
              "mpt_curve.png", "mpt_curve.pdf", "samples.png", "samples.pdf"):
        assert f in files and (tmp_path / "run" / f).stat().st_size > 0
    objectives = {r["objective"] for r in res["table"]}
    assert objectives == {"bert-15", "fixed-15", "random-size", "bernoulli_lvm", "independent"}
    assert len([r for r in res["table"] if r["seed"] is not None]) == 9
    for r in res["table"]:
        assert r["lml"] < 0 and r["lml_se"] > 0
    assert res["stratified"]["plain_var"] > 0
    assert len(claims(res)) == 4


@pytest.mark.slow
def test_grey_levels_run_end_to_end(tmp_path):
    """17 grey levels: 17 pixel tokens, independent pixels as the one exact reference."""
    from mptlml.reproduce import run_part

    over = {"levels": 17, "objectives": ("random-size",), "num_seeds": 1, "steps": 8,
            "num_test": 12, "rate_start": 0.25, "rate_step": 0.5, "num_samples": 2,
            "variance_draws": 4, "score15_num_masks": 1}
    out = run_part("mlm-training", tmp_path / "grey", quick=True, overrides=over)
    res = out["results"]
    assert res["levels"] == 17
    assert {r["objective"] for r in res["table"]} == {"random-size", "independent"}
    assert res["comparisons"]["reference"] == "independent"
    # an untrained-ish model over 17 tokens is near the uniform -ln 17 per pixel, well below 0
    row = next(r for r in res["table"] if r["objective"] == "random-size")
    assert -64 * math.log(17) - 40 < row["lml"] < 0
    assert "independent pixels" in claims(res)[-2]["claim"]


@pytest.mark.parametrize("levels", [2, 17])
def test_pixels_are_scikit_learns_digits(levels):
    """The split holds scikit-learn's raw digits (0..16), or them binarised at half intensity."""
    import numpy as np
    import torch
    from sklearn.datasets import load_digits

    from mptlml.reproduce._mlm_training_data import split

    raw = torch.from_numpy(load_digits().data.astype(np.int64))  # independent of load_images
    want = raw if levels == 17 else (raw > 8).long()  # x / 16 > 0.5
    perm = torch.randperm(raw.shape[0], generator=torch.Generator().manual_seed(4))
    train, test = split(levels, 30, 4)
    assert torch.equal(test, want[perm[:30]]) and torch.equal(train, want[perm[30:]])
    assert int(train.max()) == levels - 1 and int(train.min()) == 0


@pytest.mark.slow
def test_worker_processes_give_the_same_numbers_as_one_process(tmp_path):
    """The (objective, seed) runs in two spawned processes = the same runs one after the other."""
    import json

    from mptlml.reproduce import run_part

    base = {"objectives": ("bert-15", "random-size"), "num_seeds": 2, "steps": 6,
            "num_test": 12, "rate_start": 0.25, "rate_step": 0.5, "num_samples": 2,
            "variance_draws": 4, "score15_num_masks": 1, "bernoulli_epochs": 3}
    one = run_part("mlm-training", tmp_path / "one", quick=True,
                         overrides={**base, "workers": 1})["results"]
    two = run_part("mlm-training", tmp_path / "two", quick=True,
                         overrides={**base, "workers": 2})["results"]
    assert one["workers"] == 1 and two["workers"] == 2
    drop = {"train_s"}
    rows = [[{k: v for k, v in r.items() if k not in drop} for r in res["table"]]
            for res in (one, two)]
    assert rows[0] == rows[1]  # exact: same floats, same order
    assert one["stratified"] == two["stratified"]
    for f in ("curve.csv", "per_sequence.csv", "training.csv"):
        assert (tmp_path / "one" / f).read_text() == (tmp_path / "two" / f).read_text(), f
    same = [json.dumps(res["comparisons"], sort_keys=True, default=repr) for res in (one, two)]
    assert same[0] == same[1]


def test_training_with_eager_attention_matches_sdpa(monkeypatch):
    """_train switches to the eager attention on the CPU: SDPA's math fallback with dropout is
    the same operations, so the losses are bit-identical and the weights after three steps
    differ only by the order of float roundings in the backward (below 1e-5)."""
    import torch

    from mptlml.reproduce._mlm_training_data import pixel_ids, split, tokenizer

    cfg = mlm_training.Config(steps=3, batch_size=8, hidden_size=16, num_heads=2,
                              intermediate_size=32, warmup_steps=1, log_every=1)
    tok = tokenizer(2)
    train_x, _ = split(2, 40, 0)
    ids = pixel_ids(train_x[:64], tok, 2)
    runs = {}
    for name in ("eager", "sdpa"):
        if name == "sdpa":  # keep the model's own (SDPA) attention throughout
            from transformers import BertForMaskedLM
            monkeypatch.setattr(BertForMaskedLM, "set_attn_implementation",
                                lambda self, impl: None)
        for objective in ("bert-15", "random-size"):
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                model, rows, _ = mlm_training._train(cfg, objective, 0, ids, tok)
            runs[name, objective] = ([r["loss"] for r in rows],
                                     [p.detach().clone() for p in model.parameters()])
            assert model.config._attn_implementation == "sdpa"  # evaluation: the fused kernel
    for objective in ("bert-15", "random-size"):
        (la, pa), (lb, pb) = runs["eager", objective], runs["sdpa", objective]
        assert la == lb
        worst = max(float((a - b).abs().max()) for a, b in zip(pa, pb, strict=True))
        assert worst < 1e-5  # Adam divides by sqrt(v): a 1e-9 gradient difference where v ~ 0


def test_every_objective_and_seed_trains_on_its_own_seeds_masks(monkeypatch):
    """Each (objective, seed) job masks with the collator of its own seed.

    The batches the training loop received (recorded by wrapping the collator it builds)
    equal those of a fresh ``collator(objective, tok, rate, seed)`` applied to the same
    examples in the same order, and differ from another seed's: one seed's collator for
    every job would shrink the between-seed spread behind the part's claims.
    """
    import torch

    from mptlml.reproduce import _mlm_training_data as data

    cfg = mlm_training.Config(steps=3, batch_size=8, hidden_size=16, num_heads=2,
                              intermediate_size=32, warmup_steps=1, log_every=1,
                              num_seeds=2)
    tok = data.tokenizer(2)
    train_x, _ = data.split(2, 40, 0)
    ids = data.pixel_ids(train_x[:64], tok, 2)
    seen: list[tuple[list, dict]] = []

    def recording(*args):
        inner = data.collator(*args)

        def collate(examples):
            batch = inner(examples)
            seen.append((examples, {k: v.clone() for k, v in batch.items()}))
            return batch
        return collate

    monkeypatch.setattr(mlm_training, "collator", recording)
    for objective in cfg.objectives:
        for seed in cfg.seeds:
            seen.clear()
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                mlm_training._train(cfg, objective, seed, ids, tok)
            assert len(seen) == cfg.steps
            own = data.collator(objective, tok, cfg.rate, seed)
            other = data.collator(objective, tok, cfg.rate, seed + 1)
            for examples, batch in seen:
                want, not_want = own(examples), other(examples)
                assert all(torch.equal(batch[k], want[k]) for k in want), (objective, seed)
                assert not all(torch.equal(batch[k], not_want[k]) for k in not_want)
