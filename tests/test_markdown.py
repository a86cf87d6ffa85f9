"""``mptlml._markdown.md_cell``: run-directory text shows as itself once rendered.

The reference is the renderers themselves: each string is put in a table cell
through ``md_cell``, rendered by Python-Markdown with the documentation site's
extensions (``pymdownx.arithmatex`` included) and by markdown-it-py's CommonMark
with GitHub's tables and strike-through (how ``report.md`` is read), and the
visible text of the cell must be the string, in one cell, with no element inside.
"""

from __future__ import annotations

from html.parser import HTMLParser

import markdown
import pytest
from markdown_it import MarkdownIt

from mptlml._markdown import md_cell

NASTY = [
    "spread over the last half of training < 2% of its mean",
    "rank correlation >= 0.8; -64.70 -> 0.68",
    "a | b || c",
    "<script>alert(1)</script> <b>bold</b> <!-- comment -->",
    "&lt; is an entity, & alone, &amp; &#36; &copy;",
    "**strong** *em* _u_ __d__ `code` ``two``",
    "[link](http://evil.example) ![img](x.png) <http://auto.example> [^1]",
    "~~struck~~ ~one~",
    "$x$ and $$y$$ cost $5 and $6",
    r"\(x\) \[y\] back\slash \\ \* \_",
    "{: .cls } {#id} {{ jinja }}",
    "- a list?",
    "+ plus",
    "1. numbered",
    "2) numbered",
    "# heading?",
    "> quote?",
    "mnist_data(), mnist_5k.csv.gz: E_pi log q_pi(x)",
    "mean |second difference| of the curve",
    "OMP_NUM_THREADS=1 and fashion_mnist",
    "line one\nline two\tand a tab",
]


class _Cells(HTMLParser):
    """The text of each <td> and the tags found inside it."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.cells: list[str] = []
        self.inner_tags: list[str] = []
        self._depth = 0

    def handle_starttag(self, tag, attrs):
        if tag == "td":
            self.cells.append("")
            self._depth = 1
        elif self._depth:
            self.inner_tags.append(tag)

    def handle_endtag(self, tag):
        if tag == "td":
            self._depth = 0

    def handle_data(self, data):
        if self._depth:
            self.cells[-1] += data


def _site_markdown(text: str) -> str:
    md = markdown.Markdown(
        extensions=["tables", "attr_list", "md_in_html", "footnotes", "admonition",
                    "pymdownx.superfences", "pymdownx.inlinehilite", "pymdownx.arithmatex"],
        extension_configs={"pymdownx.arithmatex": {"generic": True}})
    return md.convert(text)


def _commonmark(text: str) -> str:
    return MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(text)


@pytest.mark.parametrize("render", [_site_markdown, _commonmark], ids=["python-markdown",
                                                                       "commonmark"])
@pytest.mark.parametrize("value", NASTY)
def test_a_cell_renders_as_the_value_itself(render, value):
    table = f"| claim | ours |\n|---|---|\n| x | {md_cell(value)} |\n"
    cells = _Cells()
    cells.feed(render(table))
    assert len(cells.cells) == 2, f"the table broke: {cells.cells}"
    assert cells.cells[1].strip() == " ".join(value.split())
    assert cells.inner_tags == []


@pytest.mark.parametrize("value", NASTY)
def test_a_cell_is_one_line_without_raw_specials(value):
    cell = md_cell(value)
    assert "\n" not in cell and "<" not in cell and "$" not in cell and "~" not in cell
