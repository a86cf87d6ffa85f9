"""Table 1 like with like: the spread of the MPT estimate under the faithful and authors' set-ups.

Table 1 of the paper gives the spread (sd over seeds) of the cumulative MPT
estimate at P = 1, 10, 100 masks. It comes from the authors' set-up: one noise
value shared by the dimensions of a datum, one mask shared by the data (see
NOTES.md). The convergence experiment runs both set-ups; this module compares
each one's spread with Table 1's (:func:`table1_like_with_like`) and tabulates
them for the report (:func:`tables`).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["PAPER_TABLE1_SD", "PAPER_TABLE1_SEEDS", "SETUPS", "sd_range", "setup_name",
           "table1_like_with_like", "tables"]

#: Table 1 of the paper: the spread (sd over seeds) of the estimate at P = 1, 10, 100 masks
PAPER_TABLE1_SD: dict[str, float] = {"1": 0.47, "10": 0.12, "100": 0.03}
#: seeds behind each of Table 1's spreads (NOTES.md: 5 seeds)
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
    paper = results.get("paper_table1_sd") or PAPER_TABLE1_SD
    lo, hi = sd_range(int(results.get("paper_table1_seeds", PAPER_TABLE1_SEEDS)))
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


def tables(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Table 1 like with like, for the report: the spread of each set-up beside the paper's."""
    rows = []
    paper = results.get("paper_table1_sd") or PAPER_TABLE1_SD
    qs = list(paper)
    rows.append({"set-up": "the paper (Table 1)", "panel": "D, N not stated",
                 "sd over seeds, P=" + "/".join(qs): " / ".join(f"{paper[q]:.2f}" for q in qs),
                 "predicted σ₁/√P": "", "Table 1's spread?": ""})
    for r in table1_like_with_like(results):
        rows.append({"set-up": r["label"], "panel": r["panel"],
                     "sd over seeds, P=" + "/".join(qs): " / ".join(
                         f"{r['sd_over_seeds'][q]:.3f}" for q in qs if q in r["sd_over_seeds"]),
                     "predicted σ₁/√P": " / ".join(
                         f"{r['predicted_sd'][q]:.3f}" for q in qs if q in r["predicted_sd"]),
                     "Table 1's spread?": "yes" if r["agrees"] else "no"})
    if len(rows) == 1:
        return []
    lo, hi = sd_range(int(results.get("paper_table1_seeds", PAPER_TABLE1_SEEDS)))
    return [{"title": "Table 1 like with like: the spread over mask seeds under each set-up",
             "rows": rows,
             "caption": (
                 "sd over seeds of the MPT estimate at P masks per size, and the spread each "
                 "set-up predicts, σ₁/√P, from the sd σ₁ of one mask's estimate (all seeds' "
                 "masks pooled). A Table 1 spread agrees with a set-up when it lies within "
                 f"{lo:.2f}-{hi:.2f} times the prediction (95% range of a "
                 f"{results.get('paper_table1_seeds', PAPER_TABLE1_SEEDS)}-seed sd). The "
                 "authors' code shares one noise value across the dimensions of a datum and "
                 "one mask across the data: both make the estimate's spread larger, which is "
                 "where Table 1's numbers come from. Our default draws independent noise and "
                 "masks per datum, so its spread is smaller.")}]
