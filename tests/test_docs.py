"""Every example in the README and the docs runs, and prints what the page says it prints.

The pages under ``docs/`` and ``README.md`` are read as a user reads them:

- each ```` ```python ```` block runs, in page order, in one namespace per page
  (a later block may use what an earlier one defined), in a fresh temporary
  working directory, offline (``HF_HUB_OFFLINE=1``) and without progress bars;
- a ```` ```text ```` block right after a Python block is the output that block
  prints: numbers must agree to the digits shown (one unit of the last digit),
  ``...`` stands for anything, runs of spaces are one space;
- every ``mptlml ...`` line of a ```` ```bash ```` block parses with the
  command's own parser (a flag that does not exist fails here);
- a block preceded by ``<!-- docs-test: no-run REASON -->`` (it needs a GPU,
  the Hugging Face hub, or hours) is not run but checked: it compiles, and
  every function it calls through a name the page defined exists and takes
  the keywords the block passes (:func:`check_without_running`).

So an example that stops working, or prints something else than the page
shows, fails ``make test``. ``docs/about-docs.md`` explains the conventions.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import io
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<ticks>`{3,})(?P<info>[^`]*)$")
_NO_RUN = re.compile(r"<!--\s*docs-test:\s*no-run\s+(?P<reason>.*?)\s*-->")
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


@dataclass
class Block:
    """One fenced code block of a page."""

    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    no_run: str | None = None  # why the block is checked without running
    output: str | None = None  # the text block that follows a python block

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def read_blocks(page: Path) -> list[Block]:
    """The fenced blocks of a Markdown page, with no-run marks and expected outputs."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i, last_text, prev_end = 0, "", -1
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            if lines[i].strip():
                last_text = lines[i]
            i += 1
            continue
        indent, ticks = len(m["indent"]), m["ticks"]
        lang = (m["info"].split() or [""])[0].lower()
        body, j = [], i + 1
        while j < len(lines) and not re.match(rf"^\s*{ticks}\s*$", lines[j]):
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
            j += 1
        if j == len(lines):
            raise AssertionError(f"{page}:{i + 1}: code block never closed")
        no_run = _NO_RUN.search(last_text)
        block = Block(page, i + 1, lang, "\n".join(body) + "\n",
                      no_run=no_run["reason"] if no_run else None)
        # a text block right after a python block (blank lines only between) is its output
        prev = blocks[-1] if blocks else None
        between = lines[prev_end + 1:i] if prev is not None else []
        if (lang == "text" and prev is not None and prev.lang == "python"
                and not any(s.strip() for s in between)):
            prev.output = block.code
        else:
            blocks.append(block)
        prev_end = j
        last_text = ""
        i = j + 1
    return blocks


BLOCKS = [b for page in PAGES for b in read_blocks(page)]
PYTHON = [b for b in BLOCKS if b.lang == "python"]
SHELL = [b for b in BLOCKS if b.lang in ("bash", "sh", "console")]


def outputs_match(expected: str, actual: str) -> bool:
    """Whether ``actual`` is ``expected`` up to the digits shown, ``...`` and spacing.

    A number in ``expected`` matches a number within one unit of its last digit
    (``-153.40`` matches -153.395 to -153.405 and a bit); ``...`` matches any text;
    a run of blanks matches any run of blanks.
    """
    pattern, numbers = [], []
    for part in re.split(rf"(\.\.\.|{_NUMBER.pattern}|\s+)", expected.strip()):
        if not part:
            continue
        if part == "...":
            pattern.append("(?:.*?)")
        elif part.isspace():
            pattern.append(r"\s+")
        elif _NUMBER.fullmatch(part):
            pattern.append(f"({_NUMBER.pattern})")
            numbers.append(part)
        else:
            pattern.append(re.escape(part))
    m = re.fullmatch("".join(pattern), actual.strip(), flags=re.DOTALL)
    if m is None:
        return False
    for shown, got in zip(numbers, m.groups(), strict=True):
        if "e" in shown.lower():
            tol = abs(float(shown)) * 1e-2
        else:
            tol = 10.0 ** -(len(shown.split(".")[1]) if "." in shown else 0)
        if abs(float(shown) - float(got)) > tol * (1 + 1e-9):
            return False
    return True


def test_outputs_match_reads_digits_ellipses_and_spacing():
    assert outputs_match("-159.99 +/- 0.02", "-159.993  +/- 0.0185")
    assert not outputs_match("-159.99 +/- 0.02", "-159.97 +/- 0.0185")
    assert outputs_match("a ... z", "a b c\nd z")
    assert outputs_match("[1, 2]", "[1, 2]") and not outputs_match("[1, 2]", "[1, 2, 3]")
    assert outputs_match("{'a': ..., 'b': '12.15'}", "{'a': '5.7', 'c': '1', 'b': '12.151'}")


# ---------------------------------------------------------------- the Python examples
_NAMESPACES: dict[Path, dict[str, Any]] = {}
_DONE: dict[Path, int] = {}
_FAILED: dict[Path, str] = {}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """One working directory for all pages: the files an example writes land there.

    The examples are small, so torch runs them on one thread: on a busy machine more
    threads only fight each other (the numbers do not depend on the thread count).
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield tmp_path_factory.mktemp("docs-examples")
    torch.set_num_threads(threads)


def _run(block: Block, workdir: Path) -> str:
    ns = _NAMESPACES.setdefault(block.page, {"__name__": "__main__"})
    out = io.StringIO()
    old = Path.cwd()
    os.chdir(workdir)
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(block.code, block.id, "exec"), ns)  # noqa: S102
    finally:
        os.chdir(old)
    return out.getvalue()


def _resolve(node: ast.expr, namespace: dict[str, Any]) -> Any:
    """The object a ``name.attr.attr`` expression names in ``namespace``; None if not there."""
    if isinstance(node, ast.Name):
        return namespace.get(node.id)
    if isinstance(node, ast.Attribute):
        owner = _resolve(node.value, namespace)
        if owner is None:
            return None
        if not hasattr(owner, node.attr):
            raise AssertionError(f"{type(owner).__name__} {ast.unparse(node.value)!r} has no "
                                 f"attribute {node.attr!r}")
        return getattr(owner, node.attr)
    return None


def check_without_running(block: Block, namespace: dict[str, Any]) -> None:
    """A block that cannot run here (GPU, hub, hours), checked as far as it can be unrun.

    It compiles; every call through a name that the page's earlier blocks
    defined (a module, a class, a function) resolves, and a callable without
    ``**kwargs`` accepts each keyword the block passes. So a renamed function,
    method or keyword in such an example still fails the test.
    """
    tree = ast.parse(block.code, filename=block.id)
    compile(tree, block.id, "exec")
    checked = 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        try:
            target = _resolve(node.func, namespace)
        except AssertionError as exc:
            raise AssertionError(f"{block.id}: {ast.unparse(node.func)}: {exc}") from None
        if target is None or not callable(target):
            continue
        checked += 1
        try:
            params = inspect.signature(target).parameters
        except (TypeError, ValueError):  # a builtin without a signature
            continue
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            continue
        unknown = [k.arg for k in node.keywords if k.arg is not None and k.arg not in params]
        assert not unknown, f"{block.id}: {ast.unparse(node.func)} takes no {unknown}"
    assert checked, (f"{block.id}: no call of the block goes through a name the page defined: "
                     "nothing could be checked without running it")


def test_a_renamed_keyword_fails_a_block_that_is_not_run():
    import mptlml

    ok = Block(ROOT, 1, "python", "mptlml.mpt_curve(lm, seqs, num_masks=4, seed=0)\n")
    check_without_running(ok, {"mptlml": mptlml})
    bad = Block(ROOT, 1, "python", "mptlml.pll(lm, seqs, token_budgt=4096)\n")
    with pytest.raises(AssertionError, match="takes no"):
        check_without_running(bad, {"mptlml": mptlml})
    gone = Block(ROOT, 1, "python", "mptlml.mpt_curves(lm, seqs)\n")
    with pytest.raises(AssertionError, match="no attribute 'mpt_curves'"):
        check_without_running(gone, {"mptlml": mptlml})


@pytest.mark.parametrize("block", PYTHON, ids=[b.id for b in PYTHON])
def test_python_example(block: Block, workdir: Path, monkeypatch):
    """The block runs after the page's earlier blocks and prints what the page shows."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TQDM_DISABLE", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    page_blocks = [b for b in PYTHON if b.page == block.page and not b.no_run]
    if block.page in _FAILED:
        pytest.fail(f"an earlier example of this page failed: {_FAILED[block.page]}")
    if block.no_run:
        earlier = [b for b in page_blocks if b.line < block.line]
        for b in earlier[_DONE.get(block.page, 0):]:  # the names the page defined before it
            _run(b, workdir)
        _DONE[block.page] = max(_DONE.get(block.page, 0), len(earlier))
        check_without_running(block, _NAMESPACES.get(block.page, {}))
        return
    index = page_blocks.index(block)
    for earlier in page_blocks[_DONE.get(block.page, 0):index]:  # when run alone (-k)
        _run(earlier, workdir)
    try:
        printed = _run(block, workdir)
    except BaseException:
        _FAILED[block.page] = block.id
        raise
    finally:
        _DONE[block.page] = index + 1
    if block.output is not None:
        assert outputs_match(block.output, printed), (
            f"{block.id} prints\n{printed}\nbut the page shows\n{block.output}")
    else:
        assert not printed.strip(), (
            f"{block.id} prints output that the page does not show (add a ```text block "
            f"after it):\n{printed}")


# ---------------------------------------------------------------- the command lines
def _commands(block: Block) -> list[list[str]]:
    """The argument lists of the ``mptlml`` commands in a shell block."""
    text = re.sub(r"\\\n", " ", block.code)
    found = []
    for line in text.splitlines():
        line = line.split(" #")[0].strip()
        if line.startswith("$ "):
            line = line[2:]
        if "mptlml" not in line or line.startswith("#"):
            continue
        words = shlex.split(line)
        if words[:1] == ["mptlml"]:
            found.append(words[1:])
        elif "-m" in words and words[words.index("-m") + 1:words.index("-m") + 2] == ["mptlml"]:
            found.append(words[words.index("-m") + 2:])
    return found


@pytest.mark.parametrize("block", [b for b in SHELL if _commands(b)],
                         ids=[b.id for b in SHELL if _commands(b)])
def test_command_lines_parse(block: Block):
    """Every ``mptlml`` command shown parses: its subcommand, flags and choices exist."""
    import click

    from tests.cli_helpers import parse

    for argv in _commands(block):
        try:
            parse(argv)
        except click.exceptions.Exit as exc:  # --help, --version
            assert exc.exit_code == 0, f"{block.id}: `mptlml {shlex.join(argv)}`"
        except click.ClickException as exc:
            raise AssertionError(f"{block.id}: `mptlml {shlex.join(argv)}` does not parse: "
                                 f"{exc.format_message()}") from exc


def test_every_page_is_in_the_site_navigation():
    """A page left out of mkdocs.yml's nav would be built but never linked."""
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in (ROOT / "docs").rglob("*.md"):
        rel = page.relative_to(ROOT / "docs").as_posix()
        assert rel in nav, f"docs/{rel} is not in mkdocs.yml's nav"


def test_no_page_points_outside_the_repository():
    """The docs and the README stand alone: no ../shared, no machine-specific text."""
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for bad in ("../shared", "shared/paper", "this machine", "no GPU was lent"):
            assert bad not in text, f"{page.relative_to(ROOT)} mentions {bad!r}"


# ---------------------------------------------------------------- refreshing the outputs
def update_outputs(page: Path, workdir: Path) -> int:
    """Run a page's examples and write what each prints into its ```text block.

    For a maintainer whose change moves a printed number: ``python
    tests/test_docs.py docs/PAGE.md``, then read the diff before committing it
    (the numbers of an example are documentation, not a test of correctness).
    """
    lines = page.read_text(encoding="utf-8").splitlines(keepends=True)
    edits = []
    for block in read_blocks(page):
        if block.lang != "python" or block.no_run:
            continue
        printed = _run(block, workdir)
        if block.output is not None or printed.strip():
            edits.append((block, printed))
    for block, printed in reversed(edits):
        end = block.line  # find the closing fence of the python block, then its text block
        while not lines[end].strip().startswith("```"):
            end += 1
        indent = lines[end][:len(lines[end]) - len(lines[end].lstrip())]
        text = "".join(indent + ln + "\n" if ln else "\n" for ln in printed.rstrip().split("\n"))
        new = [f"\n{indent}```text\n", text, f"{indent}```\n"]
        if block.output is not None:
            start = end + 1
            while not lines[start].strip().startswith("```text"):
                start += 1
            stop = start + 1
            while not lines[stop].strip().startswith("```"):
                stop += 1
            lines[end + 1:stop + 1] = new
        else:
            lines[end + 1:end + 1] = new
    page.write_text("".join(lines), encoding="utf-8")
    return len(edits)


if __name__ == "__main__":  # python tests/test_docs.py PAGE.md ...
    import sys
    import tempfile

    os.environ.update(HF_HUB_OFFLINE="1", TQDM_DISABLE="1", MPLBACKEND="Agg")
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        for arg in sys.argv[1:]:
            n = update_outputs(Path(arg).resolve(), Path(tmp))
            print(f"{arg}: {n} outputs written")
