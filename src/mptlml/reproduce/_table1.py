"""Table 1 like with like: the spread of the MPT estimate under the faithful and authors' set-ups.

Table 1 of the paper gives the spread (sd over seeds) of the cumulative MPT
estimate at P = 1, 10, 100 masks. It comes from the authors' set-up: one noise
value shared by the dimensions of a datum, one mask shared by the data (see
``docs/notes.md``, "Experiment settings"). The convergence experiment runs
both set-ups; this module compares each one's spread with Table 1's
(:func:`table1_like_with_like`); the experiment tabulates them for the
report (:func:`mptlml.reproduce.fig1_convergence.tables`).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["PAPER_TABLE1_SD", "PAPER_TABLE1_SEEDS", "SETUPS", "sd_range", "setup_name",
           "table1_like_with_like"]

#: Table 1 of the paper: the spread (sd over seeds) of the estimate at P = 1, 10, 100 masks
PAPER_TABLE1_SD: dict[str, float] = {"1": 0.47, "10": 0.12, "100": 0.03}
#: seeds behind each of Table 1's spreads (5: ``docs/notes.md``, "Experiment settings")
PAPER_TABLE1_SEEDS = 5

#: the two set-ups of Table 1: name -> (noise generator, masks shared across the data, label)
SETUPS: dict[str, tuple[str, bool, str]] = {
    "faithful": ("independent", False,
                 "faithful default (independent noise, masks per datum)"),
    "authors": ("shared", True,
                "the authors' set-up (shared noise, masks shared across the data)"),
}


def setup_name(noise: str, share_masks: bool) -> str:
    """``"faithful"``, ``"authors"`` or ``"custom"`` for a noise generator and mask sharing."""
    for name, (n, sh, _) in SETUPS.items():
        if (n, sh) == (noise, bool(share_masks)):
            return name
    return "custom"


def sd_range(num_seeds: int, level: float = 0.95) -> tuple[float, float]:
    """Central ``level`` range of s / sigma for the sd ``s`` of ``num_seeds`` normal draws.

    ``(n - 1) s^2 / sigma^2`` is chi-square with ``n - 1`` degrees of freedom,
    so ``s / sigma`` lies in ``sqrt(chi2_{a/2, n-1} / (n-1)) .. sqrt(chi2_{1-a/2, n-1} / (n-1))``
    with probability ``level`` (0.35 .. 1.67 for 5 seeds).
    """
    from scipy.stats import chi2

    k = num_seeds - 1
    lo, hi = chi2.ppf([(1 - level) / 2, (1 + level) / 2], k)
    return float(math.sqrt(lo / k)), float(math.sqrt(hi / k))


def table1_like_with_like(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Table 1 under each set-up: is the paper's spread the one a set-up predicts?

    The masks are i.i.d., so the spread over seeds at P masks is
    ``sigma_1 / sqrt(P)`` with ``sigma_1`` the sd of one mask's estimate, which
    the pooled masks of all seeds measure precisely. A spread of Table 1
    (``PAPER_TABLE1_SEEDS`` seeds) agrees with a set-up when it lies in the
    95% range of a ``PAPER_TABLE1_SEEDS``-seed sd around that prediction
    (:func:`sd_range`). One row per set-up and all-sizes panel.
    """
    paper = PAPER_TABLE1_SD
    lo, hi = sd_range(PAPER_TABLE1_SEEDS)
    rows = []
    for name, st in (results.get("setups") or {}).items():
        for pname, sds in st["sd_over_seeds"].items():
            s1 = st.get("per_mask_sd", {}).get(pname)
            if s1 is None:
                continue
            pred = {q: s1 / math.sqrt(int(q)) for q in paper if q in sds}
            ok = [lo <= paper[q] / pred[q] <= hi for q in pred]
            rows.append({"setup": name, "label": st["label"], "panel": pname,
                         "sd_over_seeds": {q: sds[q] for q in pred}, "predicted_sd": pred,
                         "paper_sd": {q: paper[q] for q in pred}, "agrees": all(ok) and bool(ok),
                         "range": (lo, hi)})
    return rows
