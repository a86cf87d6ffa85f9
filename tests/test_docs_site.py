"""The documentation site's reference and the test suite's own index are complete.

- every public name (``__all__``) of every public package is documented on an API
  page: some ``::: path`` directive of ``docs/api/*.md`` resolves, by import, to the
  same object (so ``mptlml.hf.MPTTrainer``, which the package provides lazily, is
  found through ``mptlml.hf.trainer.MPTTrainer``);
- every directive names something that exists;
- every docstring of the package parses as numpydoc without a warning of griffe (the
  parser of the API pages), on a page or not yet, so a page added later builds strictly;
- the site loads nothing from a CDN (KaTeX ships in ``docs/javascripts/``);
- ``tests/README.md`` names every test file and helper of ``tests/``, and its table
  "Source module -> test files" names every module of ``src/mptlml``;
- every test its table of issue 42's slips names exists and is not marked slow (so
  ``make test``, ``-m "not slow"``, fails on each of those slips).

``make docs`` (``mkdocs build --strict``, without ``--quiet``) fails on any warning of
the build itself.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import re
from pathlib import Path
from typing import Any

import pytest

import mptlml

ROOT = Path(__file__).resolve().parents[1]
API = ROOT / "docs" / "api"

#: packages of mptlml that are not library API: the command line, the paper's parts and
#: the run plumbing behind them (documented in the guides, not in the API reference)
NOT_API = {"cli", "report", "reproduce", "jobs", "runs"}

_DIRECTIVE = re.compile(r"^::: (\S+)", re.MULTILINE)


def _public_packages() -> list[str]:
    names = ["mptlml"]
    for info in pkgutil.iter_modules(mptlml.__path__):
        if not info.name.startswith("_") and info.name not in NOT_API:
            names.append(f"mptlml.{info.name}")
    return names


def _resolve(path: str) -> Any:
    """The object a dotted path names: the longest importable module, then attributes."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(path)


def _directives() -> dict[str, Path]:
    found = {}
    for page in sorted(API.glob("*.md")):
        for path in _DIRECTIVE.findall(page.read_text(encoding="utf-8")):
            found[path] = page
    return found


def test_every_directive_names_an_object():
    for path, page in _directives().items():
        try:
            _resolve(path)
        except (ImportError, AttributeError) as exc:
            raise AssertionError(f"{page.relative_to(ROOT)}: ::: {path} does not exist") from exc


@pytest.mark.parametrize("package", _public_packages())
def test_every_public_name_is_on_an_api_page(package):
    directives = _directives()
    documented = {path: _resolve(path) for path in directives}
    module = importlib.import_module(package)
    missing = []
    for name in module.__all__:
        path = f"{package}.{name}"
        obj = getattr(module, name)
        if path in documented or any(o is obj for o in documented.values()):
            continue
        if isinstance(obj, type(mptlml)) and any(p.startswith(obj.__name__ + ".")
                                                 for p in documented):
            continue  # a subpackage: documented by its own page
        if name == "__version__":
            continue
        missing.append(name)
    assert not missing, (f"{package}: {missing} are public (__all__) but on no API page; "
                         "add a `::: path` directive to a page of docs/api/")


def test_every_docstring_parses_without_a_warning():
    """griffe's numpydoc parser, which ``mkdocs build --strict`` fails on, over every module."""
    import logging

    import griffe

    messages: list[str] = []

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    logger = logging.getLogger("griffe")
    handler = _Collect(level=logging.WARNING)
    logger.addHandler(handler)
    try:
        package = griffe.load("mptlml", search_paths=[str(ROOT / "src")],
                              resolve_aliases=False)

        def parse(obj: Any) -> None:
            if obj.docstring is not None:
                obj.docstring.parse("numpy")
            for member in obj.members.values():
                if not member.is_alias:
                    parse(member)

        parse(package)
    finally:
        logger.removeHandler(handler)
    assert not messages, "griffe warns (move prose out of Parameters into Notes):\n" + \
        "\n".join(sorted(set(messages)))


def _default(value: Any) -> str | None:
    """A default as text, one quote style (``'a'`` and ``"a"`` are the same default)."""
    text = None if value is None else str(value).strip()
    if text and len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = f"'{text[1:-1]}'"
    return text


def test_every_documented_default_is_the_signatures():
    """The API pages show each parameter's default as griffe reads it from the docstring
    (a numpydoc choice set's first value, or the first name's default for an entry naming
    several parameters): it must be the signature's default, for every function and method
    of the package."""
    import logging

    import griffe

    logging.getLogger("griffe").setLevel(logging.ERROR)
    package = griffe.load("mptlml", search_paths=[str(ROOT / "src")], resolve_aliases=False)
    wrong = []

    def walk(obj: Any) -> None:
        for member in obj.members.values():
            if member.is_alias:
                continue
            if member.is_function and member.docstring is not None:
                signature = {p.name: p for p in member.parameters}
                for section in member.docstring.parse("numpy"):
                    if section.kind.value != "parameters":
                        continue
                    for item in section.value:
                        p = signature.get(item.name)
                        if p is not None and _default(item.default) != _default(p.default):
                            wrong.append(f"{member.path}: {item.name} shows default "
                                         f"{item.default!s}, the signature has {p.default!s}")
            if member.is_class or member.is_module:
                walk(member)

    walk(package)
    assert not wrong, ("documented defaults that are not the signature's (give each parameter "
                       "its own entry; a choice set's first value is its default):\n"
                       + "\n".join(wrong))


def test_api_pages_show_no_raw_restructuredtext_and_no_private_bases():
    """docs/hooks.py on an API page: a role or a literal inside a type (code, where Markdown
    leaves it) shows as its text; a private base leaves the "Bases:" line."""
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)

    class Page:
        meta = {"package": "mptlml"}

    html = ('<code>list of arrays ``(K_q,)``</code> <code>dict or :class:`~a.b.Monitor`</code>'
            '<p class="doc doc-class-bases">\n Bases: <code><span title="m._Result">_Result'
            '</span></code></p><p class="doc doc-class-bases">Bases: <code>_Base</code>, '
            '<code>torch.nn.Module</code></p>')
    out = hooks.on_page_content(html, Page())
    assert "``" not in out and ":class:" not in out and "_Result" not in out
    assert "<code>list of arrays (K_q,)</code> <code>dict or Monitor</code>" in out
    assert out.endswith('<p class="doc doc-class-bases">Bases: <code>torch.nn.Module</code></p>')


def test_the_site_loads_nothing_from_a_cdn():
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert "://" not in "".join(line.split("#")[0] for line in config.splitlines()
                                 if line.strip().startswith("- ") and (".js" in line
                                                                      or ".css" in line))
    init = (ROOT / "docs" / "javascripts" / "katex-init.js").read_text(encoding="utf-8")
    assert "katex.render" in init
    for shipped in ("katex.min.js", "katex.min.css", "LICENSE"):
        assert (ROOT / "docs" / "javascripts" / "katex" / shipped).is_file()
    css = (ROOT / "docs" / "javascripts" / "katex" / "katex.min.css").read_text(encoding="utf-8")
    for font in set(re.findall(r"url\((fonts/[^)]+\.woff2)\)", css)):
        assert (ROOT / "docs" / "javascripts" / "katex" / font).is_file(), font


def test_tests_readme_names_every_test_file():
    readme = (ROOT / "tests" / "README.md").read_text(encoding="utf-8")
    files = sorted(p.name for p in (ROOT / "tests").glob("*.py") if p.name != "__init__.py")
    missing = [name for name in files if f"`{name}`" not in readme]
    assert not missing, f"tests/README.md does not name {missing}"


def test_tests_readme_maps_every_source_module_to_its_tests():
    """Every module of src/mptlml has a row (its dotted name in the first cell) in the
    table "Source module -> test files", naming test files that exist."""
    readme = (ROOT / "tests" / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Source module -> test files", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"^\| `(mptlml[\w.]*)` \| (.*?) \|", line)
        if m:
            rows[m[1]] = re.findall(r"`([\w]+\.py)`", m[2])
    src = ROOT / "src"
    modules = sorted(".".join(p.relative_to(src).with_suffix("").parts).removesuffix(".__init__")
                     for p in (src / "mptlml").rglob("*.py"))
    missing = [m for m in modules if m not in rows]
    assert not missing, f"tests/README.md's module table has no row for {missing}"
    stale = [m for m in rows if m not in modules]
    assert not stale, f"tests/README.md's module table names modules that do not exist: {stale}"
    for module, files in rows.items():
        assert files, f"{module}: no test file named"
        gone = [f for f in files if not (ROOT / "tests" / f).is_file()]
        assert not gone, f"{module}: {gone} are not files of tests/"


def _slow_tests(path: Path) -> tuple[set[str], set[str]]:
    """The test functions of a test file, and those marked slow (their own decorator, a
    slow parameter, or the module's ``pytestmark``), read from its syntax tree."""
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    module_slow = any(isinstance(node, ast.Assign) and "pytestmark" in ast.unparse(node.targets[0])
                      and "mark.slow" in ast.unparse(node.value) for node in tree.body)
    tests, slow = set(), set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            tests.add(node.name)
            if module_slow or any("mark.slow" in ast.unparse(d) for d in node.decorator_list):
                slow.add(node.name)
    return tests, slow


def test_every_slip_of_issue_42_is_caught_by_make_test():
    """Each test named in tests/README.md's table of the slips of issue 42 exists and is not
    marked slow: ``make test`` (``-m "not slow"``) runs it, so every slip fails ``make test``."""
    readme = (ROOT / "tests" / "README.md").read_text(encoding="utf-8")
    table = readme.split("Issue 42, for compare,", 1)[1].split("\n\n", 2)[1]
    named, last = [], None
    for row in table.splitlines()[2:]:
        for file, name in re.findall(r"`(?:(test_\w+\.py))?::(test_\w+)\*?(?:\[[^\]]*\])?`",
                                     row.rsplit(" | ", 1)[1]):
            last = file or last
            named.append((last, name))
    assert len(table.splitlines()) - 2 >= 21 and len(named) >= 21, table  # 21 slips
    marked = []
    for file, name in named:
        tests, slow = _slow_tests(ROOT / "tests" / file)
        assert name in tests, f"tests/README.md names {file}::{name}, which does not exist"
        if name in slow:
            marked.append(f"{file}::{name}")
    assert not marked, f"these tests catch a slip but are marked slow: {sorted(set(marked))}"
