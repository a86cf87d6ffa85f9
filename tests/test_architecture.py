"""The package's rooms, checked by reading the imports (ast), not by running anything.

- Dependencies point one way, down the floors of :data:`FLOORS`::

      cli -> jobs/reproduce/report/lm_eval -> runs (run plumbing)
          -> training, estimators, objectives, selection, hf, data -> _scoring
          -> models -> masks -> helpers (_io, _markdown, _linalg, _validation, _progress, settings)

  A module imports its own floor or the floors below (imports inside functions
  count too). On the jobs' floor, the parts of the paper (``reproduce/``) may
  build on the user jobs (``jobs/``), never the other way round, and neither
  imports the report.
- Only the CLI and the report import the parts; only the CLI and the parts the
  jobs; only ``cli/`` and ``__main__.py`` the CLI; only the CLI the report
  (:data:`TOP_FLOOR`). The library never imports ``runs/`` (its floor is above).
- No import circle between modules.
- The estimators see models only through the protocols: ``estimators/`` and the
  scoring machinery ``_scoring/`` name no model family and import no module of one.
- The machinery knows no estimator: ``_scoring/`` imports nothing of ``estimators/``.
- Estimator names are listed in one place, the registry: no tuple, list or set
  in ``src/`` holds two of them.
- Every third-party package that ``src/`` imports is declared in ``pyproject.toml``.

Files are drawn by concept, not by length: there is no line cap.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = SRC / "mptlml"

#: the floors of the package, bottom (0) to top: room (first name under ``mptlml``) -> floor.
#: ``(root)`` is ``mptlml/__init__.py``. A new room must be placed here.
FLOORS: dict[str, int] = {
    "_io": 0, "_markdown": 0, "_linalg": 0, "_validation": 0, "_progress": 0, "_heap": 0,
    "_optional": 0,
    "settings": 0, "seeds": 0,
    "masks": 1,
    "models": 2,
    "_scoring": 3,
    "estimators": 4, "objectives": 4, "training": 4, "selection": 4, "hf": 4, "data": 4,
    "testing": 4, "(root)": 4,
    "runs": 5,
    "jobs": 6, "reproduce": 6, "report": 6, "lm_eval": 6,
    "cli": 7, "__main__": 7,
}

#: who may import what: module prefix -> the files (relative to the package) allowed to.
TOP_FLOOR: dict[str, tuple[str, ...]] = {
    "mptlml.reproduce": ("cli/", "__main__.py", "report.py", "reproduce/"),
    "mptlml.jobs": ("cli/", "__main__.py", "reproduce/", "jobs/"),
    "mptlml.report": ("cli/",),
    "mptlml.cli": ("cli/", "__main__.py"),
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return dict(_modules_under(SRC, PACKAGE))


@functools.cache
def _modules_under(src: Path, package: Path) -> tuple[tuple[str, Path], ...]:
    """The modules of ``package`` (read once per tree: every check asks for them)."""
    return tuple((_module_name(p), p) for p in sorted(package.rglob("*.py")))


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Every module of this package that ``path`` imports, anywhere in the file."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            # ``from pkg import sub`` imports the submodule; ``from mod import name`` the module
            targets = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in modules else stem
                       for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in modules:  # ``import a.b.c`` of a name inside a module
                t = t.rpartition(".")[0]
            if t.startswith("mptlml") and t != name:
                out.add(t)
    return out


def _graph() -> dict[str, set[str]]:
    return {m: set(deps) for m, deps in _graph_under(SRC, PACKAGE)}


@functools.cache
def _graph_under(src: Path, package: Path) -> tuple[tuple[str, frozenset[str]], ...]:
    """Each module's imports of the package (parsed once per tree, not once per check)."""
    modules = _modules()
    return tuple((m, frozenset(_imports(p, modules))) for m, p in modules.items())


def _rel(module: str) -> str:
    return str(_modules()[module].relative_to(PACKAGE))


def test_the_import_reader_sees_known_edges():
    g = _graph()
    assert "mptlml.reproduce.parts" in g["mptlml.report"]
    assert "mptlml.training" in g["mptlml.reproduce.fig2_training"]
    assert "mptlml._io" in g["mptlml.training.history"]
    assert "mptlml.jobs.select" in g["mptlml.reproduce.model_selection"]
    assert any(m.startswith("mptlml.jobs") for m in g["mptlml.cli"])  # imports in functions


@pytest.mark.parametrize("target", sorted(TOP_FLOOR))
def test_library_modules_do_not_import_the_top_floor(target):
    allowed = TOP_FLOOR[target]
    bad = []
    for mod, deps in _graph().items():
        rel = _rel(mod)
        if rel.startswith(allowed) or mod.startswith(target):
            continue
        bad += [f"{rel} imports {d}" for d in deps if d == target or d.startswith(target + ".")]
    assert not bad, "dependencies must point one way (cli -> jobs/reproduce/report -> library):\n" \
        + "\n".join(bad)


def test_jobs_and_parts_do_not_import_the_report_or_the_cli():
    bad = [f"{_rel(m)} imports {d}" for m, deps in _graph().items()
           if m.startswith(("mptlml.jobs", "mptlml.reproduce")) for d in deps
           if d == "mptlml.report" or d.startswith("mptlml.cli")]
    assert not bad, "\n".join(bad)


def test_no_import_circle():
    g = _graph()
    circles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for d in sorted(g.get(m, ())):
            if state.get(d) == 1:
                circles.append(path[path.index(d):] + [d])
            elif d not in state:
                visit(d)
        path.pop()
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m)
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "(root)"


def test_every_room_has_a_floor():
    rooms = {_room(m) for m in _modules()}
    assert not rooms - set(FLOORS), f"place these rooms in FLOORS: {sorted(rooms - set(FLOORS))}"
    assert not set(FLOORS) - rooms, f"rooms gone, drop from FLOORS: {sorted(set(FLOORS) - rooms)}"


def test_dependencies_point_down():
    bad = sorted(f"{_rel(m)} (floor {FLOORS[_room(m)]}) imports {d} (floor {FLOORS[_room(d)]})"
                 for m, deps in _graph().items() for d in deps
                 if FLOORS[_room(d)] > FLOORS[_room(m)])
    assert not bad, ("dependencies must point down (cli -> jobs/reproduce/report -> runs -> "
                     "training, estimators, objectives, selection -> _scoring -> models -> "
                     "masks -> "
                     "helpers):\n"
                     + "\n".join(bad))


def test_the_floor_check_sees_an_upward_import(tmp_path, monkeypatch):
    """A models file that imports the estimators is caught (the reader is not blind)."""
    pkg = tmp_path / "mptlml"
    for rel in ("__init__.py", "models/__init__.py", "models/fam.py", "estimators/__init__.py",
                "estimators/api.py"):
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text("")
    (pkg / "models/fam.py").write_text("def f():\n    from ..estimators.api import g\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", pkg)
    assert "mptlml.estimators.api" in _graph()["mptlml.models.fam"]
    with pytest.raises(AssertionError, match="models/fam.py .floor 2. imports "
                                             "mptlml.estimators.api .floor 4."):
        test_dependencies_point_down()


#: the modules of ``mptlml.models`` that hold protocols (and the one normalisation of
#: sequence input every ragged estimator starts from, and the conditional views of any
#: model through a context), not model families.
PROTOCOL_MODULES = ("mptlml.models", "mptlml.models.base", "mptlml.models.protocols",
                    "mptlml.models.sequence_input", "mptlml.models.conditional")


def _families() -> set[str]:
    import mptlml.models as models

    protocols = {"MaskedModel", "RaggedMaskedModel", "WordMaskedModel", "ConditionalView"}
    families = {n for n in models.__all__
                if isinstance(getattr(models, n), type) and n not in protocols}
    assert {"PPCA", "MaskedLM", "BernoulliLVM", "GaussianVAE"} <= families
    return families


def _estimator_files() -> list[Path]:
    rooms = ("estimators", "_scoring")
    return sorted(p for room in rooms for p in (PACKAGE / room).rglob("*.py"))


def _without_examples(text: str) -> str:
    """The file less its docstring usage examples (``>>>`` and ``...`` lines)."""
    return "\n".join(line for line in text.splitlines()
                     if not line.lstrip().startswith((">>>", "... ")))


def test_estimators_name_no_model_family():
    """The estimators see models only through the protocols (no isinstance side doors).

    Every class that ``mptlml.models`` exports, other than the protocols, is a model family;
    none of their names may appear in ``estimators/`` or ``_scoring/``, code or text (so no
    ``isinstance(model, PPCA)`` either); only a docstring's usage example may build one.
    """
    families = _families()
    found = {(p.name, n) for p in _estimator_files()
             for n in families if re.search(rf"\b{n}\b", _without_examples(p.read_text()))}
    assert not found, f"estimators/ or _scoring/ name model families: {sorted(found)}"


def test_estimators_import_no_model_family():
    """``estimators/`` and ``_scoring/`` import only the models' protocol modules, no family."""
    modules = _modules()
    families = _families()
    bad = []
    files = _estimator_files()
    for p in files:
        bad += [f"{p.relative_to(PACKAGE)} imports {d}" for d in _imports(p, modules)
                if d.startswith("mptlml.models") and d not in PROTOCOL_MODULES]
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom):
                bad += [f"{p.relative_to(PACKAGE)} imports {a.name}" for a in node.names
                        if a.name in families]
    assert files == sorted(files) and any("_scoring" in str(p) for p in files)
    assert not bad, "estimators/ and _scoring/ must reach models through the protocols:\n" \
        + "\n".join(bad)


#: import name -> distribution name, where they differ.
DISTRIBUTIONS = {"sklearn": "scikit-learn"}


def _declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        reqs += extra
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in reqs}


def test_every_third_party_import_is_declared():
    """Each package that src/ imports (anywhere in a file) is a declared dependency."""
    imported: dict[str, str] = {}
    for p in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            for n in names:
                top = n.split(".")[0]
                if top not in sys.stdlib_module_names and top != "mptlml":
                    imported.setdefault(top, str(p.relative_to(PACKAGE)))
    declared = _declared()
    missing = {top: where for top, where in imported.items()
               if DISTRIBUTIONS.get(top, top).lower().replace("_", "-") not in declared}
    assert "torch" in imported and "pandas" in imported
    assert not missing, f"declare in pyproject.toml (imported by, e.g.): {missing}"


def _name_lists(names: set[str]) -> list[str]:
    """Tuples, lists and sets in src/ that hold two or more estimator names."""
    found = []
    for p in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(), filename=str(p))):
            if isinstance(node, ast.Tuple | ast.List | ast.Set):
                held = {e.value for e in node.elts
                        if isinstance(e, ast.Constant) and e.value in names}
                if len(held) >= 2:
                    found.append(f"{p.relative_to(PACKAGE)}:{node.lineno} {sorted(held)}")
    return found


def test_estimator_names_live_only_in_the_registry():
    """A new estimator is one file: no list of estimator names elsewhere to keep in step."""
    from mptlml.estimators import available

    names = set(available())
    assert {"cumulative", "random-size", "fixed-rate"} <= names
    found = _name_lists(names)
    assert not found, "lists of estimator names outside the registry:\n" + "\n".join(found)


def test_the_name_list_check_sees_a_list(tmp_path, monkeypatch):
    (tmp_path / "mptlml").mkdir()
    (tmp_path / "mptlml" / "x.py").write_text('NAMES = ("cumulative", "random-size")\n')
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "mptlml")
    assert _name_lists({"cumulative", "random-size"}) == ["x.py:1 ['cumulative', 'random-size']"]
