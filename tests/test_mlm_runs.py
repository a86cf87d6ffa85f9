"""Masked-LM runs: Table 2 from the reference curves, resume, data parallel, CLI, loaders."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import mptlml
from mptlml import mpt_curve
from mptlml.cli import main
from mptlml.data import load_texts
from mptlml.models import MaskedLM
from mptlml.reproduce.table2_bert import default_reference

from .mlm_helpers import SENTENCES

REFERENCE = default_reference()  # the authors' curves, shipped in mptlml/data


@pytest.fixture(scope="module")
def texts_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("data") / "texts.txt"
    p.write_text("\n".join(SENTENCES * 2) + "\n")
    return p


# ---------------------------------------------------------------------- Table 2
#: Table 2 of the paper, typed from its text (pre-trained, random init)
TABLE2 = {"ax": (-1715.75, -5245.31), "cola": (-1657.68, -5283.52),
          "qnli": (-1770.28, -5343.98), "mrpc": (-1773.45, -5362.21)}


def test_packaged_reference_is_the_documented_file():
    import hashlib
    import re

    readme = (REFERENCE.parent / "README.md").read_text()
    digest = re.search(r"bert_mpt_curves\.csv.*?SHA-256 of this file:\s*`([0-9a-f]{64})`",
                       readme, re.S).group(1)
    assert hashlib.sha256(REFERENCE.read_bytes()).hexdigest() == digest
    assert "shared" not in str(REFERENCE)


def test_table2_areas_from_reference():
    from mptlml.reproduce.table2_bert import PAPER_TABLE2, table2_from_reference

    assert PAPER_TABLE2 == TABLE2
    rows = {r["task"]: r for r in table2_from_reference(REFERENCE)}
    for task, (pre, rnd) in TABLE2.items():
        assert abs(rows[task]["pretrained"] - pre) < 0.01, task
        assert abs(rows[task]["random"] - rnd) < 0.01, task
    # the area by hand from the CSV: (512 / 100) * sum of the 99 non-empty rates
    with REFERENCE.open() as f:
        vals = [float(r["mean_log_prob_of_masked_tokens"]) for r in csv.DictReader(f)
                if r["glue_task"] == "mrpc" and r["bert_weights"] == "pretrained"
                and r["mean_log_prob_of_masked_tokens"]]
    assert len(vals) == 99
    assert rows["mrpc"]["pretrained"] == pytest.approx(5.12 * sum(vals), abs=1e-4)


def test_reproduce_bert_offline(tmp_path, capsys, caplog, monkeypatch):
    """Offline and without --reference: Table 2 from the packaged curves, every area recomputed."""
    from mptlml.reproduce.table2_bert import claims

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["reproduce", "bert", "--out", str(tmp_path / "b")]) == 0
    out, err = capsys.readouterr()
    assert "-1715.75" in out  # the table, on stdout
    assert "offline" in err + caplog.text  # the warning, through logging
    assert (tmp_path / "b" / "table2.csv").is_file()
    assert (tmp_path / "b" / "mpt_curve.png").is_file()
    res = json.loads((tmp_path / "b" / "results.json").read_text())["results"]
    assert res["reference"].startswith("packaged")
    statuses = [c["status"] for c in claims(res)]
    assert statuses.count("recomputed") == 12 and statuses.count("not run") == 1, statuses


def test_reproduce_bert_reference_overrides(tmp_path, capsys, monkeypatch):
    """--reference PATH replaces the packaged curves (here a copy with AX pre-trained shifted)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rows = list(csv.DictReader(REFERENCE.open()))
    for r in rows:
        if r["glue_task"] == "ax" and r["bert_weights"] == "pretrained" and \
                r["mean_log_prob_of_masked_tokens"]:
            r["mean_log_prob_of_masked_tokens"] = str(
                float(r["mean_log_prob_of_masked_tokens"]) - 1.0)
    mine = tmp_path / "mine.csv"
    with mine.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    assert main(["reproduce", "bert", "--out", str(tmp_path / "b"),
                 "--reference", str(mine)]) == 0
    res = json.loads((tmp_path / "b" / "results.json").read_text())["results"]
    assert res["reference"] == str(mine)
    ax = next(r for r in res["table2"] if r["task"] == "ax")
    assert ax["pretrained"] == pytest.approx(-1715.75 - 5.12 * 99, abs=0.01)


def test_reproduce_bert_missing_reference(tmp_path):
    assert main(["reproduce", "bert", "--out", str(tmp_path / "b"),
                 "--reference", str(tmp_path / "nope.csv")]) == 2
    assert not (tmp_path / "b" / "results.json").exists()


# ---------------------------------------------------------------------- resume
def test_resume_after_interruption_gives_identical_results(tiny_dir, tmp_path):
    lm = MaskedLM.from_pretrained(tiny_dir)
    kw = dict(rates=[0.1, 0.3, 0.6, 0.9], num_masks=2, seed=5, chunk_size=2, cumulative=True)
    full = mpt_curve(lm, SENTENCES * 2, **kw)

    calls = {"n": 0}
    orig = lm.score_positions

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt  # interrupted in the middle of the run
        return orig(*a, **k)

    lm.score_positions = flaky
    with pytest.raises(KeyboardInterrupt):
        mpt_curve(lm, SENTENCES * 2, checkpoint_dir=tmp_path, **kw)
    assert len(list((tmp_path / "curve").glob("chunk_*.npz"))) == 2
    calls["n"] = -1000  # no more interruptions
    resumed = mpt_curve(lm, SENTENCES * 2, checkpoint_dir=tmp_path, **kw)
    assert calls["n"] == -1000 + (5 - 2) + 5  # 3 curve chunks left, 5 exact chunks
    assert torch.equal(resumed.per_sample, full.per_sample)
    assert torch.equal(resumed.lml_cumulative, full.lml_cumulative)
    # a different run in the same checkpoint directory is refused
    with pytest.raises(ValueError, match="different run"):
        mpt_curve(lm, SENTENCES * 2, checkpoint_dir=tmp_path, **{**kw, "seed": 6})


# ---------------------------------------------------------------------- CLI
def _per_seq(path: Path) -> list[dict]:
    with open(path / "per_sequence.csv") as f:
        return list(csv.DictReader(f))


def test_curve_cli_and_bad_inputs(tiny_dir, texts_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["curve", "--model", str(tiny_dir), "--data", str(texts_file), "--out", str(out),
                 "--rates", "0.1:0.9:0.2", "--pll", "--no-progress", "-q"]) == 0
    res = json.loads((out / "results.json").read_text())
    summary = res["results"]["models"]["pretrained"]
    assert summary["num_sequences"] == 10
    # every entry of the run directory is listed, the checkpoint chunks (--resume) too
    assert sorted(p.name + "/" * p.is_dir() for p in out.iterdir()
                  if p.name != "results.json") == res["files"]
    assert "checkpoint/" in res["files"]
    # the summary is the command's result: on stdout even under -q (which silences logs)
    printed = capsys.readouterr().out
    assert "curve: summary" in printed
    assert f"{summary['area']:.4f}" in printed and f"{summary['mean_pll']:.4f}" in printed
    rows = _per_seq(out)
    assert len(rows) == 10 and "pll" in rows[0]
    lm = MaskedLM.from_pretrained(tiny_dir)
    np.testing.assert_allclose([float(r["pll"]) for r in rows],
                               mptlml.pll(lm, SENTENCES * 2).numpy(), atol=1e-9)
    # existing run directory is refused
    assert main(["curve", "--model", str(tiny_dir), "--data", str(texts_file),
                 "--out", str(out)]) == 2
    bad = tmp_path / "bad.txt"
    bad.write_text("the cat\n\nthe dog\n")
    cases = [
        (["--data", str(bad)], "blank"),
        (["--rates", "0.5,1.2"], "between 0 and 1"),
        (["--model", "no-such-org/no-such-model"], "local"),
    ]
    longf = tmp_path / "long.csv"
    longf.write_text("id,text\n1," + " ".join(["cat"] * 80) + "\n")
    cases += [(["--data", str(longf), "--column", "text"], "maximum"),
              (["--data", str(longf), "--column", "sentence"], "column")]
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        for i, (extra, msg) in enumerate(cases):
            args = ["curve", "--model", str(tiny_dir), "--data", str(texts_file),
                    "--out", str(tmp_path / f"bad{i}"), "--no-progress"]
            for j in range(0, len(extra), 2):
                k = args.index(extra[j]) if extra[j] in args else None
                if k is not None:
                    args[k + 1] = extra[j + 1]
                else:
                    args += extra[j:j + 2]
            capsys.readouterr()
            assert main(args) == 2, extra
            assert msg in capsys.readouterr().err, extra
            assert not (tmp_path / f"bad{i}" / "results.json").exists()
            assert not (tmp_path / f"bad{i}" / "curve.csv").exists()
    finally:
        del os.environ["HF_HUB_OFFLINE"]


@pytest.mark.slow
def test_reproduce_antibody_quick(tmp_path):
    pytest.importorskip("antiberty")
    assert main(["reproduce", "antibody", "--quick", "--out", str(tmp_path / "a")]) == 0
    res = json.loads((tmp_path / "a" / "results.json").read_text())["results"]
    pre, rnd = res["models"]["pretrained"], res["models"]["random_init"]
    assert pre["area"] > rnd["area"] + 100
    assert abs(rnd["mean_log_prob_per_token"] + np.log(25)) < 0.3
    assert (tmp_path / "a" / "mpt_curve.pdf").is_file()


# data parallel (torchrun, accelerate launch): tests/test_devices.py


# ---------------------------------------------------------------------- loaders
def test_local_loaders(tmp_path):
    (tmp_path / "a.tsv").write_text("id\tsentence\n1\tthe cat\n2\tthe dog\n")
    assert load_texts(tmp_path / "a.tsv", column="sentence").texts == ["the cat", "the dog"]
    with pytest.raises(ValueError, match="--column"):
        load_texts(tmp_path / "a.tsv")
    (tmp_path / "a.jsonl").write_text('{"text": "a b"}\n{"txt": "c"}\n')
    with pytest.raises(ValueError, match="no field 'text'"):
        load_texts(tmp_path / "a.jsonl")
    (tmp_path / "b.jsonl").write_text('{"s": "a b"}\n')
    assert load_texts(tmp_path / "b.jsonl", column="s").texts == ["a b"]
    (tmp_path / "x.fasta").write_text(">s1 x\nEVQ\nLVE\n>s2\nQVQ\n")
    d = load_texts(tmp_path / "x.fasta")
    assert d.texts == ["EVQLVE", "QVQ"] and d.ids == ["s1", "s2"]
    with pytest.raises(ValueError, match="unknown data format"):
        (tmp_path / "x.xml").write_text("<a/>")
        load_texts(tmp_path / "x.xml")
    from mptlml.data import bundled_antibodies

    ab = bundled_antibodies()
    assert len(ab) == 111 and all(set(s) <= set("ACDEFGHIKLMNPQRSTVWY") for s in ab.texts)


def test_rate_grids_are_one_definition_and_say_what_is_wrong():
    """--rates START:STOP:STEP, the configs' rate_start/rate_step and the paper's grid agree."""
    from mptlml.estimators.rates import default_rates, rate_grid
    from mptlml.jobs.curve import parse_rates

    np.testing.assert_array_equal(rate_grid(0.01, 0.01), default_rates())
    np.testing.assert_array_equal(parse_rates("0.01:0.99:0.01"), default_rates())
    np.testing.assert_allclose(parse_rates("0.1:0.9:0.2"), [0.1, 0.3, 0.5, 0.7, 0.9])
    np.testing.assert_allclose(parse_rates("0.15,0.5"), [0.15, 0.5])
    with pytest.raises(ValueError, match="cannot read rates"):
        parse_rates("0.1:x:0.1")
    with pytest.raises(ValueError, match="stop must lie strictly between 0 and 1"):
        parse_rates("0.1:1.0:0.1")  # readable, but 1.0 is no masking rate: said so


def test_a_grid_of_too_many_rates_is_refused_before_any_work(tiny, tmp_path, capsys,
                                                             monkeypatch):
    """One cap (MAX_RATES) for the library and the command line, checked before the grid is
    built or scored: before, rate_grid(0.01, 1e-9) built 980 M rates and mpt_curve scored
    any grid, while only the command line refused."""
    from mptlml.estimators.rates import MAX_RATES, check_rates, rate_grid
    from mptlml.jobs.curve import parse_rates

    assert MAX_RATES == 10_000
    assert rate_grid(0.0001, 0.0001, stop=1.0 - 1e-9).size == 9_999
    with pytest.raises(ValueError, match=r"a grid of 262,145 masking rates is more than "
                                         r"10,000 .*take a larger step"):
        rate_grid(0.5, 2.0 ** -20, stop=0.75)
    with pytest.raises(ValueError, match=r"a grid of 9\d\d,\d{3},\d{3} masking rates"):
        rate_grid(0.01, 1e-9)  # not built: 980 M rates
    fine = np.arange(1, MAX_RATES + 2) / (MAX_RATES + 2)  # 10,001 rates
    with pytest.raises(ValueError, match="a grid of 10,001 masking rates"):
        check_rates(fine)
    grid = "0.5:0.75:0.0000152587890625"  # step 2^-16: 16,385 rates
    with pytest.raises(ValueError, match=f"rates '{grid}': a grid of 16,385 masking rates"):
        parse_rates(grid)

    def no_work(*args, **kwargs):
        raise AssertionError("the model was called")

    monkeypatch.setattr(tiny.model, "forward", no_work)
    with pytest.raises(ValueError, match="a grid of 10,001 masking rates"):
        mpt_curve(tiny, SENTENCES, rates=fine, num_masks=1, seed=0)
    capsys.readouterr()
    assert main(["curve", "--model", "no-such-dir", "--data", "antibodies", "--rates", grid,
                 "--out", str(tmp_path / "r")]) == 2
    assert "a grid of 16,385 masking rates" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


# ---------------------------------------------------------------------- curve: cost, ids, context
def _curve(tiny_dir, data, out, *extra):
    return main(["curve", "--model", str(tiny_dir), "--data", str(data), "--out", str(out),
                 "--rates", "0.1:0.9:0.2", "--no-progress", *extra])


def test_curve_target_se_records_the_mc_se_the_stop_and_the_plan(tiny_dir, texts_file, tmp_path,
                                                                  capsys, caplog):
    """--target-se: results.json and the summary give the MC SE, the target, stop_reason and
    the rounds of each sequence (the sequential engine); --max-masks bounds it
    (stop_reason 'budget')."""
    assert _curve(tiny_dir, texts_file, tmp_path / "t", "--target-se", "0.5") == 0
    printed = capsys.readouterr().out
    s = json.loads((tmp_path / "t" / "results.json").read_text())["results"]["models"]
    s = s["pretrained"]
    direct = mpt_curve(MaskedLM.from_pretrained(tiny_dir), SENTENCES * 2,
                       rates=[0.1, 0.3, 0.5, 0.7, 0.9], seed=0, target_se=0.5)
    assert s["mc_se"] == pytest.approx(direct.lml_stderr_mean, rel=1e-9)
    assert s["target_se"] == 0.5 and s["stop_reason"] == direct.stop_reason
    assert s["rounds_per_sequence"] == direct.extra["rounds"]
    assert s["num_masked_inputs"] == direct.num_masked_rows
    assert "stop_reason" in printed and f"{s['mc_se']:.4f}" in printed
    # a budget below the plan: cut to it, and said so
    assert _curve(tiny_dir, texts_file, tmp_path / "b", "--target-se", "0.01",
                  "--max-masks", "60") == 0
    s = json.loads((tmp_path / "b" / "results.json").read_text())["results"]["models"]
    s = s["pretrained"]
    assert s["stop_reason"] == "budget" and s["mc_se"] > 0.01
    assert s["num_masked_inputs"] <= 60 * len(SENTENCES * 2)


def test_curve_refuses_conflicts_and_unbounded_work_before_any_work(tiny_dir, texts_file,
                                                                    tmp_path, capsys,
                                                                    monkeypatch):
    """Conflicting or unbounded settings are refused before the model is loaded; a target
    so small that its plan overflows is refused with the plan's cost, not an int64 array."""
    import mptlml.jobs.curve as curve_job

    real = curve_job.load_model
    cases = [
        (["--whole-word", "--pll", "--pll-variant", "word_l2r"], "pass one of the two"),
        (["--max-masks", "100"], "give --target-se too"),
        (["--target-se", "0.1", "--cumulative"], "does not combine with --target-se"),
        (["--rates", "0.00000001:0.99999999:0.000000001"], "take a larger step"),
        (["--context-column", "context", "--whole-word"], "does not combine"),
    ]

    def no_model(*a, **k):
        raise AssertionError("the model was loaded before the settings were checked")

    monkeypatch.setattr(curve_job, "load_model", no_model)
    for i, (extra, msg) in enumerate(cases):
        capsys.readouterr()
        assert _curve(tiny_dir, texts_file, tmp_path / f"c{i}", *extra) == 2, extra
        err = capsys.readouterr().err
        assert msg in err, (extra, err)
        assert not (tmp_path / f"c{i}").exists()
    monkeypatch.setattr(curve_job, "load_model", real)
    # a target beyond reach spends its cap (the engine's rounds), within max_masked_inputs:
    # past it, refused before any draw, naming the target and its budget
    from mptlml import settings

    with settings.max_masked_inputs(1000):
        assert _curve(tiny_dir, texts_file, tmp_path / "tiny", "--target-se", "1e-12") == 2
    err = capsys.readouterr().err
    assert "target_se=1e-12" in err and "max_masks" in err and "-9223" not in err
    assert not (tmp_path / "tiny").exists()


def test_curve_ids_from_an_id_column_and_the_models_name_in_the_csvs(tiny_dir, tmp_path):
    data = tmp_path / "t.csv"
    data.write_text("id,text,n\n" + "".join(f"s{i},{t},{i}\n" for i, t in enumerate(SENTENCES)))
    assert _curve(tiny_dir, data, tmp_path / "a", "--column", "text") == 0
    rows = _per_seq(tmp_path / "a")
    assert [r["id"] for r in rows] == [f"s{i}" for i in range(len(SENTENCES))]
    name = MaskedLM.from_pretrained(tiny_dir).name
    assert {r["model"] for r in rows} == {name} and {r["weights"] for r in rows} == {"pretrained"}
    with open(tmp_path / "a" / "curve.csv") as f:
        assert {r["model"] for r in csv.DictReader(f)} == {name}
    assert _curve(tiny_dir, data, tmp_path / "b", "--column", "text", "--id-column", "n") == 0
    assert [r["id"] for r in _per_seq(tmp_path / "b")] == [str(i) for i in range(len(SENTENCES))]
    assert _curve(tiny_dir, data, tmp_path / "c", "--column", "text", "--id-column", "nope") == 2
    dup = tmp_path / "d.csv"
    dup.write_text("id,text\na,the cat\na,the dog\n")
    with pytest.raises(ValueError, match="repeats the id 'a'"):
        load_texts(dup, column="text")


def test_curve_given_a_context_column_equals_mpt_curve_with_context(tiny_dir, tmp_path, capsys):
    """--context-column (default 'context'): the CLI's numbers are mpt_curve(..., context=)'s
    and pll(..., context=)'s; the outputs say the curve is conditional."""
    # joined as written (lm-eval's convention): the space ends the context
    contexts = ["the big dog ", "a cat ", "the red house ", "the blue tree ", "a mat "]
    conts = ["sat on a mat", "ran far away", "was small", "and the house", "was red"]
    data = tmp_path / "c.csv"
    data.write_text("text,context\n"
                    + "".join(f"{t},{c}\n" for t, c in zip(conts, contexts, strict=True)))
    assert _curve(tiny_dir, data, tmp_path / "r", "--column", "text", "--num-masks", "2",
                  "--pll", "--seed", "3") == 0
    printed = capsys.readouterr().out
    res = json.loads((tmp_path / "r" / "results.json").read_text())["results"]
    lm = MaskedLM.from_pretrained(tiny_dir)
    direct = mpt_curve(lm, conts, context=contexts, rates=[0.1, 0.3, 0.5, 0.7, 0.9],
                       num_masks=2, seed=3)
    rows = _per_seq(tmp_path / "r")
    assert [r["context"] for r in rows] == contexts
    np.testing.assert_allclose([float(r["lml_riemann"]) for r in rows], direct.lml.numpy(),
                               rtol=1e-12)
    np.testing.assert_allclose([float(r["num_tokens"]) for r in rows], direct.num_tokens.numpy())
    np.testing.assert_allclose([float(r["pll"]) for r in rows],
                               mptlml.pll(lm, conts, context=contexts).numpy(), rtol=1e-12)
    s = res["models"]["pretrained"]
    assert res["context_column"] == "context" and "context" in s["conditional"]
    assert s["area"] == pytest.approx(direct.area, rel=1e-12)
    assert "given" in printed and "context" in printed
    # the unconditional curve of the same texts differs (the context is used)
    plain = mpt_curve(lm, conts, rates=[0.1, 0.3, 0.5, 0.7, 0.9], num_masks=2, seed=3)
    assert not np.allclose(plain.lml.numpy(), direct.lml.numpy())
