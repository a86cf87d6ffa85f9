"""Text from a run directory, written into Markdown as literal text.

Shared by the report (``report.md``) and the published full-size table
(:func:`mptlml.reproduce.claims.full_size_markdown`).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["md_cell"]

#: characters with a meaning in Markdown (or inline HTML) inside a line; ``(`` and ``!``
#: only act after ``]`` or before ``[``, which are escaped
_SPECIAL = frozenset("\\`*_[]<>|~&#")


def md_cell(v: Any) -> str:
    """A string from a run directory as literal Markdown text on one line.

    Every character with a meaning in Markdown or inline HTML (``* _ [ ] < > |``
    and so on) is backslash-escaped (CommonMark escapes any ASCII
    punctuation), so a value can neither format, link, embed an image, open
    an HTML tag nor break a table; a leading ``- ``, ``+ `` or ``1. `` cannot
    start a list.
    """
    text = " ".join(str("" if v is None else v).split())
    out = "".join("\\" + ch if ch in _SPECIAL else ch for ch in text)
    m = re.match(r"(\d*)([-+.)])(\s|$)", out)
    if m and (m.group(1) or m.group(2) in "-+"):
        out = out[:m.start(2)] + "\\" + out[m.start(2):]
    return out
