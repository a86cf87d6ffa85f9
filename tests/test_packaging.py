"""The package a user installs: a light core, extras that name themselves, one version.

- ``pip install mptlml`` without extras estimates a PPCA LML: the README's first
  example runs in a fresh interpreter in which transformers, datasets, accelerate,
  huggingface_hub, pandas, jinja2, matplotlib and lm_eval cannot be imported (a
  ``sys.meta_path`` blocker), and every library package imports there;
- a feature that needs an extra says which (``pip install "mptlml[hf]"``), checked in the
  same interpreter, and every import of an optional package in ``src/`` follows a
  ``require`` of it (read from the source);
- ``pyproject.toml`` declares what the blocker assumes: those packages are in the extras,
  not in the core; the version is ``mptlml.__version__`` and nowhere else; the licence is
  an SPDX expression with its file; ``py.typed`` ships.

- with the ``hf`` extra alone (every other extra blocked) a masked LM is scored, its PLL
  equal to one masked forward per token written with transformers directly.

A fresh virtual environment with ``pip install .`` checks the same for real (see the
closing note of the packaging change); this file lets every test run check it without one.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from mptlml._optional import EXTRAS

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "mptlml"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))

#: the library's packages and the command line (click is in the core), which must import
#: with the core alone
LIBRARY = ["mptlml", "mptlml.models", "mptlml.estimators", "mptlml.objectives",
           "mptlml.training", "mptlml.selection", "mptlml.data", "mptlml.masks",
           "mptlml.settings", "mptlml.testing", "mptlml.hf", "mptlml.cli"]

_BLOCKER = """
import importlib.abc, sys
BLOCKED = set({blocked!r})
class _Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)", name=name)
        return None
sys.meta_path.insert(0, _Blocker())
"""


def _run_probe(probe: str, cwd: Path, **env: str) -> str:
    """Run ``probe`` in a fresh Python on this checkout's src (one thread, no bars); its stdout."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"),
                                                        os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1", **env}
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env=env, cwd=cwd, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def _readme_ppca_example() -> str:
    """The first Python block of README.md (the PPCA example)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```python\n(.*?)```", text, re.DOTALL)
    assert block and "PPCA" in block[1], "README.md's first example is no longer the PPCA one"
    return block[1]


@pytest.fixture(scope="module")
def core_only() -> dict:
    """Run the README example and the extras' doors in an interpreter without the extras."""
    probe = _BLOCKER.format(blocked=sorted(EXTRAS)) + textwrap.dedent(f"""
        import importlib, json, tempfile
        for name in {LIBRARY!r}:
            importlib.import_module(name)
        print("----- README")
        exec(compile({_readme_ppca_example()!r}, "README.md", "exec"))
        print("----- doors")
        from mptlml.models import MaskedLM
        doors = {{
            "to_pandas": lambda: est.to_pandas(),
            "MPTCurve.plot": lambda: curve.plot(),
            "MaskedLM.from_pretrained": lambda: MaskedLM.from_pretrained(tempfile.mkdtemp()),
            "MPTTrainer": lambda: importlib.import_module("mptlml.hf").MPTTrainer,
            "report": lambda: importlib.import_module("mptlml.report")._render(None, "", None),
            "lm_eval": lambda: importlib.import_module("mptlml.lm_eval"),
        }}
        out = {{}}
        for name, door in doors.items():
            try:
                door()
                out[name] = "no error"
            except ImportError as exc:
                out[name] = str(exc)
        out["imported"] = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
        print(json.dumps(out))
    """)
    readme, doors = _run_probe(probe, ROOT).split("----- README\n")[1].split("----- doors\n")
    return {"readme": readme, **json.loads(doors)}


@pytest.mark.slow  # core_only: a blocked interpreter in its own process
def test_the_readme_ppca_example_runs_with_the_core_alone(core_only):
    printed = core_only["readme"]
    assert re.search(r"MPT estimate -?\d+\.\d\d \+/- \d+\.\d\d, exact -?\d+\.\d\d", printed)
    assert "area under the MPT curve" in printed
    assert core_only["imported"] == []


@pytest.mark.slow  # core_only: a blocked interpreter in its own process
@pytest.mark.parametrize("door, extra", [("to_pandas", "report"), ("MPTCurve.plot", "report"),
                                         ("MaskedLM.from_pretrained", "hf"),
                                         ("MPTTrainer", "hf"), ("report", "report"),
                                         ("lm_eval", "lm-eval")])
def test_a_missing_extra_is_named(core_only, door, extra):
    assert f'pip install "mptlml[{extra}]"' in core_only[door], core_only[door]


def _guarded(node: ast.AST, parents: dict[ast.AST, ast.AST], top: str) -> bool:
    """An import that follows ``require(top, ...)``, sits in ``try/except ImportError``,
    or runs only when ``top`` is already in ``sys.modules``."""
    child, parent = node, parents.get(node)
    while parent is not None:
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(parent, field, None)
            if isinstance(stmts, list) and child in stmts:
                for prev in stmts[:stmts.index(child)]:
                    if (isinstance(prev, ast.Expr) and isinstance(prev.value, ast.Call)
                            and getattr(prev.value.func, "id", None) == "require"
                            and isinstance(prev.value.args[0], ast.Constant)
                            and prev.value.args[0].value == top):
                        return True
        if isinstance(parent, ast.Try) and child in parent.body and any(
                "ImportError" in ast.unparse(h.type or ast.Name("BaseException"))
                for h in parent.handlers):
            return True
        if isinstance(parent, ast.If) and "sys.modules" in ast.unparse(parent.test) \
                and top in ast.unparse(parent.test):
            return True
        child, parent = parent, parents.get(parent)
    return False


def test_every_optional_import_follows_a_require():
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                tops = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                tops = {node.module.split(".")[0]}
            else:
                continue
            for top in tops & set(EXTRAS):
                if not _guarded(node, parents, top):
                    bad.append(f"{path.relative_to(PACKAGE)}:{node.lineno} imports {top}")
    assert not bad, ("an optional package is imported without `require(name, purpose)` "
                     "before it (mptlml._optional):\n" + "\n".join(bad))


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].lower().replace("_", "-")


def test_the_extras_hold_what_the_core_does_not():
    project = PYPROJECT["project"]
    core = {_name(r) for r in project["dependencies"]}
    extras = project["optional-dependencies"]
    for module, extra in EXTRAS.items():
        dist = module.replace("_", "-")
        assert dist not in core, f"{dist} is optional (extra {extra!r}) but in the core"
        assert dist in {_name(r) for r in extras[extra]}, f"{dist} missing from [{extra}]"
    assert {"torch", "numpy", "scipy", "scikit-learn", "tqdm"} <= core
    # every optional feature: every extra but the developers' (test, docs)
    features = [e for e in extras if e not in ("all", "test", "docs")]
    assert extras["all"] == [f"mptlml[{','.join(features)}]"]


def test_one_version_an_spdx_licence_and_typed():
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "mptlml.__version__"}
    init = (PACKAGE / "__init__.py").read_text(encoding="utf-8")
    assert len(re.findall(r"^__version__ = ", init, re.MULTILINE)) == 1
    assert not re.search(r"^version:", (ROOT / "CITATION.cff").read_text(encoding="utf-8"),
                         re.MULTILINE)
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    assert "MIT License" in (ROOT / "LICENSE").read_text(encoding="utf-8")
    requires = PYPROJECT["build-system"]["requires"]
    assert any(re.fullmatch(r"setuptools>=(\d+)", r) and int(r.split(">=")[1]) >= 77
               for r in requires)
    assert (PACKAGE / "py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["mptlml"]


@pytest.mark.slow  # its own process, extras blocked
def test_the_hf_extra_alone_scores_a_masked_lm(tiny_dir):
    """With ``mptlml[hf]`` and no other extra, a masked LM is scored: PLL, an MPT bound, compare.

    The report, mnist and lm-eval extras are blocked from import; the tiny BERT is saved to a
    temporary directory; the PLL is checked against one masked forward per token, written with
    transformers directly.
    """
    blocked = sorted(m for m, extra in EXTRAS.items() if extra != "hf")
    d = str(tiny_dir)
    # not installed, as transformers' own probes see it (importlib.util.find_spec -> None)
    block = f"import sys\nBLOCKED = set({blocked!r})\nsys.modules.update(dict.fromkeys(BLOCKED))\n"
    probe = block + textwrap.dedent(f"""
        import json, torch, mptlml
        from transformers import BertForMaskedLM, BertTokenizer
        from mptlml.models import MaskedLM
        lm = MaskedLM.from_pretrained({d!r})
        text = "the cat sat on a mat"
        pll = float(mptlml.pll(lm, [text])[0])
        tok = BertTokenizer.from_pretrained({d!r})
        bert = BertForMaskedLM.from_pretrained({d!r}).eval()
        ids = tok(text, return_tensors="pt")["input_ids"][0]
        ref = 0.0
        for j in range(1, len(ids) - 1):
            x = ids.clone()
            x[j] = tok.mask_token_id
            with torch.no_grad():
                lp = torch.log_softmax(bert(input_ids=x[None]).logits[0, j].double(), -1)
            ref += float(lp[ids[j]])
        est = mptlml.estimate_lml(lm, [text], "cumulative", num_masks=2, seed=0)
        cmp = mptlml.compare(lm, ["the cat sat on"], [[" a mat", " a tree"]], seed=0)
        gone = sorted(m for m, v in sys.modules.items()
                      if m.split(".")[0] in BLOCKED and v is not None)
        print(json.dumps({{"pll": pll, "ref": ref, "lml": float(est.mean),
                          "choice": cmp.choice[0], "imported": gone}}))
    """)
    out = json.loads(_run_probe(probe, ROOT, HF_HUB_OFFLINE="1").strip().splitlines()[-1])
    assert out["pll"] == pytest.approx(out["ref"], abs=1e-4)
    assert out["lml"] < 0 and out["choice"] in (0, 1)
    assert out["imported"] == []


@pytest.fixture(scope="module")
def core_cli(tmp_path_factory) -> dict:
    """``mptlml`` commands in an interpreter without any extra (the core install's CLI).

    Each command runs through :func:`mptlml.cli.main` into its own ``--out`` under a
    temporary directory; returned: per command, its exit code, stderr, stdout and the
    files it left.
    """
    tmp = tmp_path_factory.mktemp("core-cli")
    commands = {
        "demo": ["demo", "--num-masks", "2", "--latent-dim", "3"],
        "select": ["select", "--data", "digits", "--k-max", "2", "--num-masks", "2",
                   "--max-num-masks", "2"],
        "curve": ["curve", "--model", "antiberty", "--data", "antibodies"],
        "reproduce": ["reproduce", "convergence", "--quick"],
        "reproduce-all": ["reproduce", "all", "--quick"],
        "report": ["report", str(tmp / "demo")],
    }
    probe = _BLOCKER.format(blocked=sorted(EXTRAS)) + textwrap.dedent(f"""
        import contextlib, io, json, os
        from mptlml.cli import main
        out = {{}}
        for name, argv in {commands!r}.items():
            where = os.path.join({str(tmp)!r}, name)
            err, std = io.StringIO(), io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(std):
                code = main([*argv, "--out", where] if name != "report" else argv)
            files = sorted(os.listdir(where)) if os.path.isdir(where) else []
            out[name] = {{"code": code, "stderr": err.getvalue(), "stdout": std.getvalue(),
                         "files": files}}
        out["imported"] = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
        print(json.dumps(out))
    """)
    return json.loads(_run_probe(probe, tmp).strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("name, files", [
    ("demo", ["curve.csv", "estimates.csv", "results.json"]),
    ("select", ["results.json", "scores.csv"])])
def test_the_core_cli_runs_what_needs_no_extra(core_cli, name, files):
    """demo and select write their numbers without pandas or matplotlib, and say the figure
    is left out (one warning naming the report extra)."""
    res = core_cli[name]
    assert res["code"] == 0, res["stderr"]
    assert res["files"] == files
    assert res["stderr"].count('no figures are drawn') == 1
    assert 'pip install "mptlml[report]"' in res["stderr"]
    assert "Traceback" not in res["stderr"]
    assert core_cli["imported"] == []


@pytest.mark.slow
@pytest.mark.parametrize("name, extra, what", [
    ("curve", "hf", "mptlml curve needs transformers"),
    ("reproduce", "report", "mptlml reproduce convergence needs matplotlib"),
    ("reproduce-all", "report", "mptlml reproduce convergence needs matplotlib"),
    ("report", "report", "mptlml report needs jinja2")])
def test_the_core_cli_refuses_what_needs_an_extra_up_front(core_cli, name, extra, what):
    """One line naming the command, the package and the extra; exit 2; nothing written."""
    res = core_cli[name]
    assert res["code"] == 2
    line, = res["stderr"].strip().splitlines()
    assert line.startswith(f"mptlml: error: {what}, which is not installed")
    assert f'pip install "mptlml[{extra}]"' in line
    assert res["files"] == [] and res["stdout"] == ""


def test_the_csv_of_a_run_needs_no_pandas_and_reads_back_as_pandas_does(tmp_path):
    """RunDir.write_csv (the standard library's csv) reads back through pandas as written:
    empty cells for None, NaN and missing keys, quoted commas and quotes, floats exact."""
    import pandas as pd

    from mptlml.runs.rundir import RunDir

    rows = [{"a": 0.1 + 0.2, "b": None, "c": 'x, "y"', "d": float("nan"), "e": True},
            {"a": 2, "c": "plain"}]
    with RunDir(tmp_path / "run", "t") as rd:
        rd.write_csv("t.csv", rows)
        text = rd.file("t.csv").read_text()
        back = pd.read_csv(rd.file("t.csv"))
    assert text.splitlines() == ["a,b,c,d,e", '0.30000000000000004,,"x, ""y""",,True',
                                 "2,,plain,,"]
    assert back["a"].tolist() == [0.1 + 0.2, 2.0] and back["c"].tolist() == ['x, "y"', "plain"]


def test_the_readme_and_the_makefile_agree():
    """make test's worker cap and make demo's steps, as the README says them; make test
    leaves the slow tests out, make test-slow runs them, and CI runs both (every test)."""
    make = (ROOT / "Makefile").read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    cap = re.search(r"^test: .*\n\t.*--maxprocesses (\d+)", make, re.MULTILINE)
    assert cap and f"at most {cap[1]})" in readme.split("make test ")[1].splitlines()[0]
    fast = re.search(r"^test: .*\n\t(.*)\n", make, re.MULTILINE)[1]
    slow = re.search(r"^test-slow: .*\n\t(.*)\n", make, re.MULTILINE)[1]
    assert fast.endswith('-m "not slow"') and slow == fast.replace('-m "not slow"', "-m slow")
    assert "make test-slow" in readme.split("make test ")[1].splitlines()[1]
    ci = [line for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
          if line.startswith("make ")]
    assert ci[:2] == ["make test", "make test-slow"], ci
    demo = re.search(r"^demo: .*\n((?:\t.*\n)+)", make, re.MULTILINE)[1]
    assert "reproduce antibody" in demo
    assert "AntiBERTy" in readme.split("make demo ")[1].splitlines()[0]
    assert '".[all,test,docs]"' in make  # all holds antibody (test_the_extras_hold_...)
