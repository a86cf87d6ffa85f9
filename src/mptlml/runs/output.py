"""What a run shows besides its files: printed tables (stdout) and figures (matplotlib, Agg)."""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Mapping, Sequence
from typing import Any

from .._optional import require

__all__ = ["can_draw", "print_table", "pyplot"]


def can_draw() -> bool:
    """Whether matplotlib (the ``report`` extra) is installed, so that figures can be drawn."""
    try:
        return importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):
        return False


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend (figures go to files only)."""
    require("matplotlib", "a run's figures")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def print_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None,
                title: str | None = None) -> str:
    """Format rows as a plain-text table, print it and return it.

    Floats take one format per column: four decimals when the column's largest
    magnitude is at least 1e-3 (so a rounding-level 3.9e-16 beside 0.0424
    reads 0.0000), else four significant digits in scientific notation.
    """
    if not rows:
        return ""
    cols = list(columns) if columns is not None else list(rows[0].keys())
    fixed = {c: max((abs(v) for r in rows if isinstance(v := r.get(c), float)
                     and math.isfinite(v)), default=1.0) >= 1e-3 for c in cols}

    def fmt(v: Any, col: str) -> str:
        if isinstance(v, float):
            return str(v) if not math.isfinite(v) else f"{v:.4f}" if fixed[col] else f"{v:.4g}"
        return "" if v is None else str(v)

    cells = [[fmt(r.get(c, ""), c) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = []
    if title:
        lines.append(title)
    lines.append("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    lines.append("  ".join("-" * w for w in widths))
    lines.extend("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells)
    text = "\n".join(lines)
    print(text)
    return text
