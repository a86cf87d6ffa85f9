"""One way to time both sides of a benchmark, and to check they agree before comparing them.

Every benchmark in this folder times its reference side and the mptlml side
with :func:`time_sides`: the same number of warm-up calls, the same number of
timed calls (interleaved, so that a change of machine load hits both sides
alike) and the same statistic (the median). A ratio is printed only after
:func:`check_same` has confirmed that the two sides compute the same number.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Timing", "check_same", "ratio", "time_sides"]


@dataclass
class Timing:
    """Wall times of one side (seconds) and the result of its last call."""

    label: str
    times: list[float] = field(default_factory=list)
    result: Any = None

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    def describe(self, scale: float = 1.0, unit: str = "s") -> str:
        lo, hi = min(self.times), max(self.times)
        return (f"{self.median * scale:10.4f} {unit} (median of {len(self.times)}; "
                f"range {lo * scale:.4f}-{hi * scale:.4f})")


def time_sides(sides: dict[str, Callable[[], Any]], *, warmup: int = 1,
               repeats: int = 3) -> dict[str, Timing]:
    """Time every side the same way: ``warmup`` untimed calls each, then ``repeats`` rounds.

    In each round every side is called once, in turn, so that slow phases of a
    shared machine fall on all sides. Returns the timings by label (median:
    :attr:`Timing.median`).
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats}, {warmup}.")
    out = {label: Timing(label) for label in sides}
    for _ in range(warmup):
        for label, fn in sides.items():
            out[label].result = fn()
    for _ in range(repeats):
        for label, fn in sides.items():
            t0 = time.perf_counter()
            res = fn()
            out[label].times.append(time.perf_counter() - t0)
            out[label].result = res
    return out


def check_same(what: str, a: float, b: float, *, atol: float, rtol: float = 0.0) -> str:
    """Raise ``SystemExit`` unless ``|a - b| <= atol + rtol |b|``; else a one-line report.

    For Monte Carlo results from different draws pass ``atol`` = a few
    combined standard errors.
    """
    gap = abs(float(a) - float(b))
    tol = atol + rtol * abs(float(b))
    if not (gap <= tol) or not (math.isfinite(a) and math.isfinite(b)):
        raise SystemExit(f"CHECK FAILED, {what}: {a!r} vs {b!r} (|diff| {gap:.3g} > {tol:.3g}); "
                         "the two sides do not compute the same thing, no ratio is printed.")
    return f"check {what}: {float(a):.10g} vs {float(b):.10g} (|diff| {gap:.2g} <= {tol:.2g})"


def ratio(reference: Timing, ours: Timing) -> float:
    """Speed-up of ``ours`` over ``reference``: ratio of the medians."""
    return reference.median / ours.median
