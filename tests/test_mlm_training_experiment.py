"""reproduce mlm-training: the quick run writes its files; claims() flips with the evidence."""

from __future__ import annotations

import json

import pytest

from mptlml.experiments import mlm_training
from mptlml.experiments.mlm_training import claims


def _fabricated(*, lml_gap: float, at15: float, high: float, bern_gap: float,
                z_chain: float) -> dict:
    def d(mean: float, se: float = 0.1) -> dict:
        return {"mean": mean, "stderr": se, "per_seed": [mean] * 3}

    return {
        "objectives": ["bert-15", "fixed-15", "random-size"], "seeds": [0, 1, 2],
        "table": [{"objective": "bernoulli_lvm", "seed": None, "model": "Bernoulli",
                   "lml": -21.0, "lml_se": 0.5}],
        "comparisons": {
            "lml_random_minus_fixed": d(lml_gap), "lml_random_minus_bert": d(0.0),
            "curve15_fixed_minus_random": d(at15, 0.01),
            "curve_high_fixed_minus_random": d(high, 0.01),
            "high_rate_threshold": 0.7, "curve15_rate": 0.15, "best_objective": "random-size",
            "best_minus_bernoulli": d(bern_gap, 0.3), "chain_vs_cumulative_max_abs_z": z_chain,
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
    # a gap within noise is not evidence either way: the hypothesis is not confirmed
    res = _fabricated(lml_gap=0.1, at15=0.0, high=-0.005, bern_gap=0.2, z_chain=1.0)
    assert [c["holds"] for c in claims(res)] == [False, False, False, True]


def test_config_refuses_bad_settings():
    with pytest.raises(ValueError, match="objective"):
        mlm_training.Config(objectives=("bert-30",)).validate()
    with pytest.raises(ValueError, match="num_test"):
        mlm_training.Config(num_test=1790).validate()


@pytest.mark.slow
def test_quick_run_writes_results_and_figures(tmp_path):
    from mptlml.experiments import run_experiment

    out = run_experiment("mlm-training", tmp_path / "run", quick=True)
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
