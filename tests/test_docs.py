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
- a text block preceded by ``<!-- docs-test: pinned REASON -->`` (on the line
  between it and its Python block) restates a reference: an exact LML,
  scikit-learn's value, a closed form. :func:`update_outputs` never rewrites
  it: when the example prints something else, it refuses to write the page;
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
_PINNED = re.compile(r"^\s*<!--\s*docs-test:\s*pinned\s+(?P<reason>\S.*?)\s*-->\s*$")
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
    pinned: str | None = None  # why that output restates a reference (never rewritten)

    @property
    def id(self) -> str:
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page
        return f"{page}:{self.line}"


def read_blocks(page: Path) -> list[Block]:
    """The fenced blocks of a Markdown page, with no-run marks and expected outputs."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i, last_text, prev_end = 0, "", -1
    pinned_used: set[int] = set()
    fenced: set[int] = set()  # 0-based lines inside code blocks (a mark shown there is text)
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
        fenced.update(range(i, j + 1))
        no_run = _NO_RUN.search(last_text)
        block = Block(page, i + 1, lang, "\n".join(body) + "\n",
                      no_run=no_run["reason"] if no_run else None)
        # a text block right after a python block (blank lines, or a pinned mark, between)
        # is its output
        prev = blocks[-1] if blocks else None
        between = lines[prev_end + 1:i] if prev is not None else []
        marks = [_PINNED.match(s) for s in between if _PINNED.match(s)]
        if (lang == "text" and prev is not None and prev.lang == "python"
                and all(not s.strip() or _PINNED.match(s) for s in between)):
            prev.output = block.code
            prev.pinned = marks[-1]["reason"] if marks else None
            pinned_used.update(prev_end + 1 + k for k, s in enumerate(between)
                               if _PINNED.match(s))
        else:
            blocks.append(block)
        prev_end = j
        last_text = ""
        i = j + 1
    stray = [k + 1 for k, s in enumerate(lines) if "docs-test: pinned" in s
             and s.lstrip().startswith("<!--") and k not in pinned_used | fenced]
    if stray:  # a mark that pins nothing would let the rewriting tool change what it meant
        raise AssertionError(f"{page}:{stray[0]}: a `<!-- docs-test: pinned REASON -->` mark "
                             "must stand between a python block and its text block, with a "
                             "reason")
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
class PinnedOutputChanged(RuntimeError):
    """The page-rewriting tool would change an output pinned to a reference."""


def update_outputs(page: Path, workdir: Path) -> int:
    """Run a page's examples and write what each prints into its ```text block.

    For a maintainer whose change moves a printed number: ``python
    tests/test_docs.py docs/PAGE.md``, then read the diff before committing it
    (the numbers of an example are documentation, not a test of correctness).

    A pinned output (``<!-- docs-test: pinned REASON -->`` before it) restates a
    reference, so it is never rewritten: when its example prints something that
    does not match it, :class:`PinnedOutputChanged` is raised and the page is not
    written at all. A change there is a change of behaviour, to be checked against
    the reference and edited by hand.
    """
    lines = page.read_text(encoding="utf-8").splitlines(keepends=True)
    edits, changed = [], []
    for block in read_blocks(page):
        if block.lang != "python" or block.no_run:
            continue
        printed = _run(block, workdir)
        if block.pinned is not None:
            if not outputs_match(block.output, printed):
                changed.append(f"{block.id} (pinned: {block.pinned}) now prints\n{printed}"
                               f"but the page pins\n{block.output}")
        elif block.output is not None or printed.strip():
            edits.append((block, printed))
    if changed:
        raise PinnedOutputChanged(
            f"{page.relative_to(ROOT) if page.is_relative_to(ROOT) else page}: not written: "
            f"{len(changed)} pinned output(s) would change. A pinned output restates a "
            "reference (an exact value, scikit-learn, a closed form): find why the code "
            "disagrees with it; if the change is intended, check it against the reference "
            "and edit the block by hand.\n\n" + "\n".join(changed))
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


def _page(tmp_path: Path, pinned_output: str, mark: str = "<!-- docs-test: pinned exact -->"):
    page = tmp_path / "page.md"
    page.write_text("```python\nprint(2 + 2)\n```\n\n" + mark + "\n```text\n"
                    + pinned_output + "\n```\n\n```python\nprint('new')\n```\n\n"
                    "```text\nold\n```\n", encoding="utf-8")
    return page


def test_the_rewriting_tool_refuses_to_change_a_pinned_output(tmp_path):
    """A pinned output that the code no longer prints stops the rewrite of the whole page."""
    page = _page(tmp_path, "7")
    before = page.read_text(encoding="utf-8")
    blocks = read_blocks(page)
    assert blocks[0].pinned == "exact" and blocks[0].output == "7\n" and blocks[1].pinned is None
    with pytest.raises(PinnedOutputChanged, match=r"(?s)pinned: exact\) now prints\n4\n"
                                                  r".*pins\n7"):
        update_outputs(page, tmp_path)
    assert page.read_text(encoding="utf-8") == before  # nothing written, not even the free block


def test_the_rewriting_tool_keeps_a_matching_pinned_output_and_rewrites_the_rest(tmp_path):
    page = _page(tmp_path, "4.0")
    assert update_outputs(page, tmp_path) == 1
    text = page.read_text(encoding="utf-8")
    assert "<!-- docs-test: pinned exact -->\n```text\n4.0\n```" in text  # as written
    assert "```text\nnew\n```" in text and "old" not in text


def test_a_pinned_mark_that_pins_nothing_is_refused(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Some text.\n\n<!-- docs-test: pinned exact -->\n\n```python\nx = 1\n"
                    "```\n", encoding="utf-8")
    with pytest.raises(AssertionError, match="must stand between a python block"):
        read_blocks(page)
    no_reason = _page(tmp_path, "4", mark="<!-- docs-test: pinned -->")
    with pytest.raises(AssertionError, match="with a reason"):
        read_blocks(no_reason)


def test_the_outputs_that_restate_a_reference_are_pinned():
    """The examples whose printed numbers are a reference (an exact LML, scikit-learn's
    value, Proposition 1's identity) cannot be rewritten by the tool."""
    pinned = {b.id.split(":")[0] for b in PYTHON if b.pinned}
    for page in ("README.md", "docs/index.md", "docs/getting-started.md",
                 "docs/concepts/proposition-1.md", "docs/guides/your-model.md"):
        assert page in pinned, f"{page} has no pinned output"


if __name__ == "__main__":  # python tests/test_docs.py PAGE.md ...
    import sys
    import tempfile

    os.environ.update(HF_HUB_OFFLINE="1", TQDM_DISABLE="1", MPLBACKEND="Agg")
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        for arg in sys.argv[1:]:
            try:
                n = update_outputs(Path(arg).resolve(), Path(tmp))
            except PinnedOutputChanged as exc:
                print(f"error: {exc}", file=sys.stderr)
                sys.exit(1)
            print(f"{arg}: {n} outputs written")
