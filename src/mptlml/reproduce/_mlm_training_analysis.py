"""Analysis and figures of ``reproduce mlm-training`` (:mod:`mptlml.reproduce.mlm_training`).

- :func:`comparisons`: paired differences between objectives (same held-out
  images, same evaluation masks), pooled over seeds;
- ``mpt_curve``: held-out MPT curves per objective (mean of the seeds' curves
  per image, +/-1 standard error over images; Paired colours: dark line,
  light band) and the cumulative LML per seed beside the exact references;
- ``samples``: held-out digits, then samples of each seed-0 model by
  random-order unmasking.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from .._optional import require
from ..estimators.stats import mean_stderr, sum_stderr
from ..runs.rundir import RunDir

__all__ = ["OBJECTIVES", "comparisons", "figures", "fmt_diff", "mean_se", "seeds_to_decide",
           "undecided_note", "z_score"]

#: objective name -> label in tables and figures
OBJECTIVES = {"bert-15": "BERT 15% (80/10/10)", "fixed-15": "fixed 15% MPT",
              "random-size": "random-size MPT"}


def mean_se(v: np.ndarray) -> tuple[float, float]:
    """Mean and its standard error (NaN for a single value)."""
    m, se = mean_stderr(np.asarray(v, dtype=np.float64).reshape(-1))
    return float(m), float(se)


def comparisons(cfg: Any, evals: dict, refs: dict) -> dict[str, Any]:
    """Paired (same held-out images, same masks) differences between objectives."""
    out: dict[str, Any] = {}
    rates = cfg.rates()
    hi = rates >= 0.7
    i15 = int(np.argmin(np.abs(rates - cfg.rate)))

    def pooled(a: str, b: str, fn: Any) -> dict[str, float] | None:
        if a not in cfg.objectives or b not in cfg.objectives:
            return None
        d = [fn(evals[(a, s)]) - fn(evals[(b, s)]) for s in cfg.seeds]
        per_seed = [mean_se(v) for v in d]
        means = np.array([m for m, _ in per_seed])
        within = float(sum_stderr(np.array([se for _, se in per_seed]))) / len(per_seed)
        between = mean_se(means)[1] if means.size > 1 else 0.0
        return {"mean": float(means.mean()), "stderr": max(within, between),
                "per_seed": means.tolist(), "stderr_within": within, "stderr_between": between}

    out["lml_random_minus_fixed"] = pooled("random-size", "fixed-15", lambda e: e["lml"])
    out["lml_random_minus_bert"] = pooled("random-size", "bert-15", lambda e: e["lml"])
    out["curve15_fixed_minus_random"] = pooled(
        "fixed-15", "random-size", lambda e: e["curve_scores"][:, i15])
    out["curve_high_fixed_minus_random"] = pooled(
        "fixed-15", "random-size", lambda e: e["curve_scores"][:, hi].mean(1))
    out["high_rate_threshold"] = 0.7
    out["curve15_rate"] = float(rates[i15])
    best = max(cfg.objectives, key=lambda o: np.mean([evals[(o, s)]["lml"].mean()
                                                      for s in cfg.seeds]))
    out["best_objective"] = best
    ref = "bernoulli_lvm" if "bernoulli_lvm" in refs else "independent"
    gap = np.mean([evals[(best, s)]["lml"] for s in cfg.seeds], axis=0) - refs[ref]
    m, se = mean_se(gap)
    out["reference"] = ref
    out["best_minus_reference"] = {"mean": m, "stderr": se}
    z = []
    for e in evals.values():
        d = e["lml"] - e["chain"]
        m, se = mean_se(d)
        z.append(m / se if se > 0 else 0.0)
    out["chain_vs_cumulative_max_abs_z"] = float(np.max(np.abs(z)))
    return out




def fmt_diff(d: dict[str, float] | None, digits: int = 2) -> str:
    """``"+0.19 +/- 0.43"``: a paired difference and its standard error."""
    return "n/a" if d is None else f"{d['mean']:+.{digits}f} +/- {d['stderr']:.{digits}f}"


def z_score(d: dict[str, float]) -> float:
    """mean / stderr of a paired difference (+-inf for a zero SE)."""
    return d["mean"] / d["stderr"] if d["stderr"] > 0 else math.copysign(math.inf, d["mean"])


#: z of a two-sided 5% test plus that of 80% power: the budget of :func:`seeds_to_decide`.
_Z_DECIDE = 1.96 + 0.84


def seeds_to_decide(d: dict[str, Any]) -> int | None:
    """Seeds needed to decide a paired difference: ``ceil((2.8 s / |mean|)^2)``.

    ``s = stderr * sqrt(n)`` is the spread of one seed's difference implied by
    the standard error over the ``n`` seeds run (the sample SD of the per-seed
    differences when, as usual, the spread between seeds dominates the SE).
    With that many seeds a true difference equal to the observed one is found
    at the two-sided 5% level with 80% power (z > 1.96 + 0.84). None when it
    cannot be said (fewer than two seeds, or a zero difference).
    """
    n = len(d.get("per_seed") or [])
    if n < 2 or d["mean"] == 0 or not math.isfinite(d["stderr"]):
        return None
    s = d["stderr"] * math.sqrt(n)
    return max(int(math.ceil((_Z_DECIDE * s / abs(d["mean"])) ** 2)), n + 1)


def undecided_note(d: dict[str, Any], what: str) -> str:
    """Why a difference within its noise decides nothing, and what budget would."""
    n = len(d.get("per_seed") or [])
    need = seeds_to_decide(d)
    budget = ("the per-seed spread is unknown with one seed; run more seeds" if need is None
              else f"about {need} seeds (per-seed spread {d['stderr'] * math.sqrt(n):.2f}) "
              "would decide a true difference of this size (two-sided 5% test, 80% power)")
    return (f"Undecided: {what} is {fmt_diff(d)} (z = {z_score(d):+.1f}) over {n} seed(s), "
            f"within two standard errors of zero: neither confirmed nor refuted; {budget}.")


def figures(cfg: Any, run_dir: RunDir, evals: dict, refs: dict,
            samples: dict[str, torch.Tensor], test_x: torch.Tensor) -> None:
    """``mpt_curve.png`` (curves and LML per seed) and ``samples.png`` (random-order samples)."""
    require("matplotlib", "a run's figures")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paired = plt.get_cmap("Paired").colors  # (light, dark) pairs
    rates = cfg.rates()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [3, 2]})
    for k, obj in enumerate(cfg.objectives):
        light, dark = paired[2 * k], paired[2 * k + 1]
        scores = np.mean([evals[(obj, s)]["curve_scores"] for s in cfg.seeds], axis=0)  # (N, K)
        mean, se = mean_stderr(scores)
        ax.fill_between(rates, mean - se, mean + se, color=light, alpha=0.55, lw=0)
        ax.plot(rates, mean, color=dark, lw=1.8, label=OBJECTIVES[obj])
        for j, s in enumerate(cfg.seeds):
            m, se_ = mean_se(evals[(obj, s)]["lml"])
            bx.errorbar(k + (j - (len(cfg.seeds) - 1) / 2) * 0.15, m, yerr=se_, fmt="o",
                        color=dark, ms=4, capsize=2)
    ax.axvline(cfg.rate, color="0.5", ls=":", lw=1, label=f"training rate {cfg.rate:.0%}")
    ax.set_xlabel("masking rate M / D")
    ax.set_ylabel("S(x; M): mean log-prob of a masked pixel")
    ns = len(cfg.seeds)
    what = "binary" if cfg.levels == 2 else f"{cfg.levels}-level"
    ax.set_title(f"held-out MPT curves, {what} digits (mean of {ns} seed{'s' if ns > 1 else ''}"
                 ", +/-1 SE)")
    ax.legend(frameon=False)
    for key, ls, label in (("bernoulli_lvm", "--", "Bernoulli LVM (exact)"),
                           ("independent", ":", "independent pixels (exact)")):
        if key not in refs:
            continue
        m, se = mean_se(refs[key])
        bx.axhline(m, color="k", ls=ls, lw=1, label=label)
        bx.axhspan(m - se, m + se, color="0.85", zorder=0)
    bx.set_xticks(range(len(cfg.objectives)))
    bx.set_xticklabels([OBJECTIVES[o].replace(" (", "\n(") for o in cfg.objectives], fontsize=8)
    bx.set_ylabel("held-out log p(x) bound (nats / image)")
    bx.set_title("cumulative LML estimate per seed (+/-1 SE)")
    bx.legend(frameon=False, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2),
              ncol=2)
    fig.tight_layout()
    run_dir.save_figure(fig, "mpt_curve")

    rows = [("held-out data", test_x[:cfg.num_samples])] + [
        (OBJECTIVES[o], samples[o]) for o in cfg.objectives if o in samples]
    n = cfg.num_samples
    fig, axes = plt.subplots(len(rows), n, figsize=(1.0 * n + 1.6, 1.05 * len(rows)),
                             squeeze=False)
    for r, (label, imgs) in enumerate(rows):
        for c in range(n):
            a = axes[r, c]
            if c < imgs.shape[0]:
                a.imshow(imgs[c].reshape(8, 8).numpy(), cmap="gray_r", vmin=0, vmax=1,
                         interpolation="nearest")
            a.set_xticks([])
            a.set_yticks([])
        axes[r, 0].set_ylabel(label.replace(" (", "\n("), rotation=0, ha="right",
                              va="center", fontsize=8)
    fig.suptitle("samples by random-order unmasking (seed-0 models)", fontsize=9)
    run_dir.save_figure(fig, "samples")
