"""The command line shows what it runs: --version, help, --show-config, --set, --seed, counts.

Every setting of a part is a dataclass field with metadata (mptlml.runs.config);
these tests hold the CLI and every Config to it.
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from mptlml import __version__
from mptlml.cli import main
from mptlml.reproduce import PARTS, get_part, run_part
from mptlml.runs.config import (
    apply_overrides,
    describe_settings,
    format_value,
    parse_setting,
)

CONFIGS = {name: get_part(name).config for name in PARTS}
FIELDS = [(name, f) for name, cls in CONFIGS.items() for f in dataclasses.fields(cls)]


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"mptlml {__version__}"


def test_bare_command_prints_help_and_exits_0(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Usage: mptlml") and "reproduce" in out and "--quiet" in out


def test_help_opens_with_what_mptlml_does(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    first = out.split("\n\n")[1].strip()  # after the usage line
    assert first.startswith("Estimate a model's log-marginal likelihood")
    assert "Command-line interface" not in out and "nothing else" not in out
    for name in ("demo", "reproduce", "curve", "report", "select"):
        assert f"  {name} " in out, name


@pytest.mark.parametrize("name", [*PARTS, "all"])
def test_show_config_prints_every_key_and_runs_nothing(name, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["reproduce", name, "--show-config", "--quick", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    names = list(PARTS) if name == "all" else [name]
    for n in names:
        assert f"{n}: settings" in text
        for row in describe_settings(CONFIGS[n]):
            assert re.search(rf"^{re.escape(row['key'])}\s+{re.escape(row['type'])}\s", text,
                             re.M), (n, row["key"])
    assert not out.exists()


def test_show_config_shows_this_runs_values(capsys):
    assert main(["reproduce", "curve-evolution", "--show-config", "--quick", "--seed", "7",
                 "--set", "epochs=33"]) == 0
    text = capsys.readouterr().out
    # key, type, default, quick, this run
    assert re.search(r"^seed\s+int\s+1\s+1\s+7\s", text, re.M)
    assert re.search(r"^epochs\s+int\s+600\s+120\s+33\s", text, re.M)


@pytest.mark.parametrize("name,field", FIELDS, ids=[f"{n}.{f.name}" for n, f in FIELDS])
def test_every_setting_is_described_and_round_trips(name, field):
    cls = CONFIGS[name]
    assert field.metadata.get("help"), f"{name}.{field.name} has no help line"
    for cfg in (cls(), cls.quick()):
        value = getattr(cfg, field.name)
        if value is None:
            continue
        # what --show-config prints, --set reads back
        assert parse_setting(cls, f"{field.name}={format_value(value)}") == (field.name, value)


def test_every_count_has_a_lower_bound():
    counts = re.compile(r"(^|_)(num|max)_|epochs|every|budget|size|points|iterations|hidden|"
                        r"samples|dims|_dim$|^dims$|threads")
    checked = 0
    for name, f in FIELDS:
        if counts.search(f.name) and f.type in ("int", "int | None", "tuple[int, ...]"):
            assert f.metadata.get("min") is not None, f"{name}.{f.name} has no min"
            checked += 1
    assert checked >= 30, checked


def test_every_part_has_a_seed():
    for name, cls in CONFIGS.items():
        assert "seed" in {f.name for f in dataclasses.fields(cls)}, name


def test_help_example_of_set_is_a_real_key(capsys):
    assert main(["reproduce", "--help"]) == 0
    help_text = capsys.readouterr().out
    examples = re.findall(r"--set\s+([a-z][a-z0-9_.-]*)=", help_text)  # not KEY=VALUE
    assert examples
    for ex in examples:
        target, _, key = ex.rpartition(".")
        scope = [CONFIGS[target]] if target else CONFIGS.values()
        assert any(key in {f.name for f in dataclasses.fields(c)} for c in scope), ex


# ---- counts are validated in every Config and at the CLI (issue 14) ----------------------

NEGATIVE_COUNTS = [(n, f.name) for n, f in FIELDS
                   if f.metadata.get("min") is not None and f.metadata["min"] >= 1]


@pytest.mark.parametrize("name,key", NEGATIVE_COUNTS, ids=[f"{n}.{k}" for n, k in NEGATIVE_COUNTS])
def test_zero_and_negative_counts_are_refused_by_the_config(name, key):
    cls = CONFIGS[name]
    low = {f.name: f.metadata["min"] for f in dataclasses.fields(cls)}[key]
    is_tuple = isinstance(getattr(cls(), key), tuple)
    for bad in (0, -3):
        value = (bad,) if is_tuple else bad
        with pytest.raises(ValueError, match=rf"{key} must be >= {low}, got .*{bad}"):
            cls(**{key: value})
        with pytest.raises(ValueError, match=rf"{key} must be >= {low}, got '{bad}'"):
            parse_setting(cls, f"{key}={bad}")


def test_wrong_types_are_refused():
    cls = CONFIGS["antibody"]
    with pytest.raises(ValueError, match="num_masks must be an integer, got 2.5"):
        cls(num_masks=2.5)
    with pytest.raises(ValueError, match="cannot read num_masks='2.5' as int"):
        parse_setting(cls, "num_masks=2.5")
    with pytest.raises(ValueError, match="noise must be one of independent, shared"):
        CONFIGS["area"](noise="bogus")
    with pytest.raises(ValueError, match="fixed_rate must lie strictly between 0 and 1"):
        parse_setting(CONFIGS["convergence"], "fixed_rate=1.5")


@pytest.mark.parametrize("argv", [
    ["reproduce", "antibody", "--set", "num_sequences=-3"],
    ["reproduce", "bert", "--set", "num_sequences=0"],
    ["reproduce", "training", "--set", "num_inits=0"],
    ["reproduce", "convergence", "--set", "table_masks=1,-10"],
    ["reproduce", "latent", "--set", "vae_hidden=0"],
    ["reproduce", "all", "--set", "num_masks=-1"],
])
def test_cli_refuses_bad_counts_naming_key_and_value(argv, tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    key, value = argv[-1].split("=")
    assert f"mptlml: error: {key.split('.')[-1]} must be >= 1, got '{value}'" in err, err
    assert not out.exists()


@pytest.mark.parametrize("flag", ["--num-sequences", "--num-masks", "--token-budget",
                                  "--chunk-size"])
def test_curve_refuses_bad_counts(flag, tmp_path, capsys):
    argv = ["curve", "--model", "m", "--data", "d", "--out", str(tmp_path / "c"), flag, "-3"]
    assert main(argv) == 2
    assert f"mptlml: error: {flag} must be >= 1, got -3" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("flag", ["--k-max", "--num-masks", "--max-num-masks", "--true-k"])
def test_select_refuses_bad_counts(flag, capsys):
    assert main(["select", "--data", "synthetic", "--k-max", "2", flag, "0"]) == 2
    assert f"mptlml: error: {flag} must be >= 1, got 0" in capsys.readouterr().err


def test_library_limit_is_no_slice():
    from mptlml.data.text import bundled_antibodies

    assert len(bundled_antibodies(3)) == 3
    with pytest.raises(ValueError, match="limit must be a positive integer"):
        bundled_antibodies(-3)


def test_run_part_refuses_bad_settings_before_writing(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(ValueError, match="num_sequences must be >= 1, got -3"):
        run_part("antibody", out, quick=True, overrides={"num_sequences": -3})
    with pytest.raises(ValueError, match="unknown setting 'bogus' for antibody"):
        run_part("antibody", out, quick=True, overrides={"bogus": 1})
    assert not out.exists()


# ---- --set for `all`, --seed, former names ------------------------------------------------

def _overrides(argv):
    from mptlml.reproduce.driver import scoped_overrides
    from tests.cli_helpers import parse

    args = parse(["reproduce", *argv])[1].params
    names = list(PARTS) if args["name"] == "all" else [args["name"]]
    return scoped_overrides(names, list(args["set"]), seed=args["seed"],
                            reference=args["reference"])


def test_set_for_all_targets_parts():
    o = _overrides(["all", "--set", "training.num_inits=2", "--set", "num_data=50"])
    assert o["training"] == {"num_inits": 2, "num_data": 50}
    have = {n for n, c in CONFIGS.items() if "num_data" in {f.name for f in dataclasses.fields(c)}}
    assert {n for n, v in o.items() if v.get("num_data") == 50} == have
    assert "num_data" not in o["bert"]
    with pytest.raises(ValueError, match="no part has a setting 'bogus'"):
        _overrides(["all", "--set", "bogus=1"])
    with pytest.raises(ValueError, match="unknown setting 'num_masks' for area"):
        _overrides(["all", "--set", "area.num_masks=3"])


def test_seed_sets_every_parts_seed():
    o = _overrides(["all", "--seed", "5"])
    assert all(v["seed"] == 5 for v in o.values()) and set(o) == set(PARTS)
    assert _overrides(["latent", "--seed", "4"]) == {"latent": {"seed": 4}}
    with pytest.raises(ValueError, match="seed is set twice"):
        _overrides(["area", "--seed", "4", "--set", "seed=5"])


def test_former_names_are_refused_naming_the_valid_ones():
    """The package was never released: renamed settings have no aliases."""
    cls = CONFIGS["curve-evolution"]
    with pytest.raises(ValueError, match="unknown setting 'every'.*curve_every"):
        parse_setting(cls, "every=10")
    with pytest.raises(ValueError, match="unknown setting 'curve_masks'"):
        apply_overrides(cls.quick(), {"curve_masks": 3})


def test_curve_flags_are_the_settings(tmp_path, monkeypatch, capsys):
    """Every `curve` flag is a setting of CurveConfig (one declaration); --limit is gone."""
    import mptlml.runs.job
    from mptlml.jobs.curve import CurveConfig

    seen = {}
    monkeypatch.setattr(mptlml.runs.job, "run_job",
                        lambda name, job, cfg, out, **k: seen.update(cfg=cfg))
    base = ["curve", "--model", "m", "--data", "d", "--out", str(tmp_path / "c")]
    assert main([*base, "--num-sequences", "4", "--rates", "0.2,0.5", "--pll", "--no-progress",
                 "--nominal-length", "512", "--dtype", "float64"]) == 0
    assert seen["cfg"] == CurveConfig(model="m", data="d", num_sequences=4, rates="0.2,0.5",
                                      pll=True, progress=False, nominal_length=512.0,
                                      dtype="float64")
    assert main([*base, "--limit", "3"]) == 2
    assert "No such option '--limit'" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "where"), [
    (["reproduce", "area"], "runs/area"),
    (["reproduce", "area", "--quick"], "runs/area-quick"),
    (["reproduce", "all", "--quick"], "runs/all-quick"),
])
def test_reproduce_writes_where_its_help_says(argv, where, monkeypatch, capsys):
    import mptlml.reproduce as reproduce

    seen = []
    monkeypatch.setattr(reproduce, "run_part", lambda name, out, **kw: seen.append(out))
    monkeypatch.setattr(reproduce, "run_all", lambda out, **kw: seen.append(out) or {})
    assert main(argv) == 0
    assert seen == [where]
    capsys.readouterr()
    assert main(["reproduce", "--help"]) == 0
    shown = re.sub(r"-\s+", "-", capsys.readouterr().out)  # the help wraps at hyphens too
    shown = " ".join(shown.split())
    assert "default runs/NAME, runs/NAME-quick with --quick" in shown


# ---- a new part, a new command: one module plus one line ------------------------------------

def _toy_config():
    from mptlml.runs.config import RunConfig, setting

    @dataclasses.dataclass
    class Config(RunConfig):
        num_data: int = setting(3, "N", min=1)
        seed: int = setting(0, "seed", min=0)
        num_threads: int | None = setting(None, "torch threads", min=1, execution=True)

        @classmethod
        def quick(cls):
            return cls(num_data=2)

    def run(cfg, run_dir):
        run_dir.write_csv("x.csv", [{"n": cfg.num_data}])
        return {"n": cfg.num_data}

    return Config, run


def test_a_new_part_is_its_module_plus_one_registry_line(tmp_path, monkeypatch, capsys):
    """reproduce, --show-config, --set and the report find a part from its PARTS line alone."""
    import sys
    import types

    from mptlml.reproduce import parts
    from mptlml.reproduce.claims import claim

    config, run = _toy_config()
    module = types.ModuleType("mptlml.reproduce.fig9_toy")  # the part's module ...
    module.PART = parts.Part(
        config=config, run=run, title="Figure 9: a toy part", paper="N is positive",
        claims=lambda res: [claim("N > 0", "N > 0", res["n"], res["n"] > 0)])
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(parts.PARTS, "toy", "fig9_toy")  # ... and its one line
    assert main(["reproduce", "toy", "--show-config", "--set", "num_data=5"]) == 0
    shown = capsys.readouterr().out
    assert re.search(r"^num_data\s+int\s+3\s+2\s+5\s", shown, re.M)
    assert re.search(r"^num_threads .*execution only", shown, re.M)
    out = tmp_path / "toy"
    assert main(["reproduce", "toy", "--quick", "--out", str(out), "--set", "num_data=4"]) == 0
    assert json.loads((out / "results.json").read_text())["results"]["n"] == 4
    assert main(["report", str(out)]) == 0
    md = (tmp_path / "toy-report" / "report.md").read_text()  # beside the part's run
    assert "## Figure 9: a toy part" in md and "| N \\> 0 | N \\> 0 | 4 | ✅ holds |" in md


def test_a_new_command_is_its_job_module_plus_one_line(tmp_path, monkeypatch, capsys):
    """A job (config, run) becomes a command with its settings as flags: one line."""
    import mptlml.cli
    from mptlml.cli.command import job_command
    from mptlml.runs.job import Job

    config, run = _toy_config()
    job = Job(config=config, run=run, help="a toy job")
    every = mptlml.cli.commands
    monkeypatch.setattr(mptlml.cli, "commands", lambda: [*every(), job_command("toy", job)])
    assert main(["--help"]) == 0
    assert re.search(r"^\s+toy\s+a toy job$", capsys.readouterr().out, re.M)
    out = tmp_path / "toy"
    assert main(["toy", "--num-data", "7", "--out", str(out)]) == 0
    assert json.loads((out / "results.json").read_text())["config"]["num_data"] == 7
    assert main(["toy", "--num-data", "0", "--out", str(tmp_path / "bad")]) == 2
    assert "mptlml: error: --num-data must be >= 1, got 0" in capsys.readouterr().err
