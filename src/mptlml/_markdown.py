"""Text from a run directory, written into Markdown as literal text.

Shared by the report (``report.md``) and the published full-size table
(:func:`mptlml.reproduce.claims.full_size_markdown`).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["md_cell"]

#: characters with a meaning in Markdown inside a line that every renderer un-escapes after a
#: backslash: CommonMark escapes any ASCII punctuation, Python-Markdown (the docs site) only
#: its own list, which holds these (``|`` through its tables extension); ``(`` and ``!`` only
#: act after ``]`` or before ``[``, which are escaped
_BACKSLASHED = frozenset("\\`*_[]{}>|#")

#: characters that Python-Markdown does not un-escape (``\<`` would show as ``\<``), written
#: as HTML character references, which every renderer shows as the character: ``<`` (an HTML
#: tag), ``&`` (an entity), ``~`` (GitHub's strike-through), ``$`` (maths on the docs site)
_ENTITIES = {"&": "&amp;", "<": "&lt;", "~": "&#126;", "$": "&#36;"}


def md_cell(v: Any) -> str:
    """A string from a run directory as literal Markdown text on one line.

    Every character with a meaning in Markdown or inline HTML (``* _ [ ] < > |``
    and so on) is escaped, so a value can neither format, link, embed an image,
    open an HTML tag nor break a table; a leading ``- ``, ``+ `` or ``1. ``
    cannot start a list. The escapes are those that both CommonMark (GitHub,
    most viewers) and Python-Markdown (the documentation site) undo, so the
    rendered text is the value itself: a backslash before the characters both
    know, an HTML character reference (``&lt;``) for ``< & ~ $``.
    """
    text = " ".join(str("" if v is None else v).split())
    out = "".join("\\" + ch if ch in _BACKSLASHED else _ENTITIES.get(ch, ch) for ch in text)
    m = re.match(r"(\d*)([-+.)])(\s|$)", out)
    if m and (m.group(1) or m.group(2) in "-+"):
        out = out[:m.start(2)] + "\\" + out[m.start(2):]
    return out
