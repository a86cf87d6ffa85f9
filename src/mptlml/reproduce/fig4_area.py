"""Fig. 4: the MPT curve S(x; M) against the masking rate, and its area (= the LML).

Setting (``docs/notes.md``, "Experiment settings"): PPCA with N = 1000,
D = 200, sigma2 = 0.2 (data drawn from the model with W entries N(0, 1));
the curve of the generating parameters

    S_hat(x; M) = (1/P) sum_{p=1..P} (1/M) sum_{j in mask_p} log p(x_j | x_R),  M = 1..D,

averaged over the data, drawn for three panels: K = 5 with P = 1 (noisy),
K = 5 with P = 100, and K = 50 with P = 1 (as the paper's right panel; set
``panels`` to change). By Proposition 1 the area sum_M S(x; M) is an unbiased
estimate of the mean log p(x); each panel reports it beside the exact LML and
its Monte Carlo standard error given the data (``area_mc_stderr``: the error
over the masks, which is what separates the area from the exact LML of the
same data; ``area_stderr`` is the spread across data points).
Vertical lines mark the 15% and 85% masking rates, as in the paper.

Reference: Moreno-Munoz, Recasens, Hauberg (NeurIPS 2023), Sec. 3.1, Fig. 4.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._validation import check_positive_int
from ..estimators import estimate_lml, mpt_curve
from ..runs.config import setting
from ..runs.output import pyplot
from ..runs.rundir import RunDir
from ._synthetic_ppca import SyntheticPPCAConfig, mean_lml
from .claims import claim
from .parts import Part

__all__ = ["PART", "Config", "captions", "claims", "run", "summary"]

_log = logging.getLogger(__name__)


@dataclass
class Config(SyntheticPPCAConfig):
    """Settings of the Fig. 4 experiment (defaults: the paper's settings).

    Besides N, sigma2, noise, seeds and dtype (:class:`~._synthetic_ppca.SyntheticPPCAConfig`):

    Attributes
    ----------
    num_tokens : int
        D.
    panels : tuple of str
        One ``"K:P"`` per panel (latent dimension and masks per size).
    marks : tuple of float
        Masking rates marked on the plot.
    share_masks : bool
        Share each mask across the data (the paper's code).
    """

    num_tokens: int = setting(200, "D, tokens of the PPCA", min=2)
    panels: tuple[str, ...] = setting(("5:1", "5:100", "50:1"),
                                      "one K:P per panel (latent dimension, masks per size)")
    marks: tuple[float, ...] = setting((0.15, 0.85), "masking rates marked on the plot",
                                       gt=0, lt=1)
    share_masks: bool = setting(False, "share each mask across the data (the paper's code)")

    @classmethod
    def quick(cls) -> Config:
        """A small setting for tests (seconds on 2 cores)."""
        return cls(num_data=200, num_tokens=40, panels=("5:1", "5:20", "20:1"))

    def parsed_panels(self) -> list[tuple[int, int]]:
        """``panels`` as ``(K, P)`` pairs, checked."""
        out = []
        for p in self.panels:
            try:
                k, n = (int(v) for v in str(p).split(":"))
            except ValueError:
                raise ValueError(f"a panel is 'K:P' (e.g. '5:100'), got {p!r}.") from None
            check_positive_int(k, "K")
            check_positive_int(n, "P")
            if k >= self.num_tokens:
                raise ValueError(f"panel {p!r}: K={k} must be smaller than D={self.num_tokens}.")
            out.append((k, n))
        if not out:
            raise ValueError("panels is empty; give at least one 'K:P'.")
        return out

    def validate(self) -> None:
        """Raise ``ValueError`` on inconsistent settings (before anything is written)."""
        super().validate()
        self.parsed_panels()


def run(cfg: Config, run_dir: RunDir) -> dict[str, Any]:
    """Compute each panel's curve and area; write ``curves.csv``, ``areas.csv`` and the figure."""
    cfg.validate()
    rows: list[dict[str, Any]] = []
    panels: list[dict[str, Any]] = []
    data: dict[int, tuple[Any, torch.Tensor]] = {}
    for i, (k, p) in enumerate(cfg.parsed_panels()):
        if k not in data:
            data[k] = cfg.synthetic(cfg.num_tokens, k)
        model, x = data[k]
        _log.info("[area] panel %d: K=%d, P=%d", i + 1, k, p)
        curve = mpt_curve(model, x, num_masks=p, seed=cfg.seed + i, share_masks=cfg.share_masks,
                          progress=True)
        exact = mean_lml(model, x)
        mc_se = area_mc_stderr(model, x, p, seed=cfg.seed + 7919 + i,
                               share_masks=cfg.share_masks)
        for m, r, s, e in zip(curve.sizes, curve.rates, curve.mean.tolist(),
                              curve.stderr.tolist(), strict=True):
            rows.append({"panel": i, "latent_dim": k, "num_masks": p, "mask_size": m,
                         "rate": r, "S_mean": s, "S_stderr": e})
        marks = {f"S_at_{round(100 * r)}pct": float(np.interp(r, curve.rates, curve.mean.numpy()))
                 for r in cfg.marks}
        panels.append({"panel": i, "latent_dim": k, "num_masks": p, "area": curve.area,
                       "area_stderr": curve.area_stderr, "area_mc_stderr": mc_se,
                       "exact_lml": exact,
                       "area_minus_exact": curve.area - exact,
                       "rel_error": abs(curve.area - exact) / abs(exact),
                       # mean |second difference| of the curve: Monte Carlo wiggle between sizes
                       "roughness": float(curve.mean.diff(n=2).abs().mean())
                       if len(curve.mean) > 2 else float("nan"), **marks})
    run_dir.write_csv("curves.csv", rows)
    run_dir.write_csv("areas.csv", panels)
    _figure(cfg, run_dir, rows, panels)
    return {"panels": panels, "num_tokens": cfg.num_tokens, "num_data": cfg.num_data}


#: masks per size of the replicate that measures the Monte Carlo variance: per datum, two
#: draws per datum pooled over the N data; shared masks, twenty draws of the data mean
_SE_MASKS = {False: 2, True: 20}


def area_mc_stderr(model: Any, x: torch.Tensor, num_masks: int, *, seed: int,
                   share_masks: bool) -> float:
    """Monte Carlo standard error, given the data, of the area of a curve with P masks per size.

    The area is the cumulative estimate of the mean LML (Proposition 1), so an
    independent replicate of that estimator with P' masks per size (another
    seed) measures its variance over the masks; the masks are i.i.d., so the
    variance at P masks is the one at P' times P'/P. With masks per datum the
    data's estimates are independent and
    SE^2 = (1/N^2) sum_n per_sample_stderr_n^2 (pooled over the N data; P' = 2);
    with shared masks they are not, and the SE of the data mean over P' = 20
    draws is used.
    """
    p_aux = _SE_MASKS[bool(share_masks)]
    est = estimate_lml(model, x, "cumulative", num_masks=p_aux, seed=seed,
                       share_masks=share_masks)
    if share_masks:
        se_aux = est.stderr
    else:
        se_aux = float(est.per_sample_stderr.double().pow(2).sum().sqrt()) / x.shape[0]
    return float(se_aux * math.sqrt(p_aux / num_masks))


def _figure(cfg: Config, run_dir: RunDir, rows: list[dict[str, Any]],
            panels: list[dict[str, Any]]) -> None:
    plt = pyplot()

    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, pan in zip(axes[0], panels, strict=True):
        pr = [r for r in rows if r["panel"] == pan["panel"]]
        rate = np.array([100 * r["rate"] for r in pr])
        s = np.array([r["S_mean"] for r in pr])
        lo = min(float(s.min()), 0.0)
        ax.fill_between(rate, s, lo, color="C0", alpha=0.25)
        ax.plot(rate, s, color="C0", lw=1.2, label=f"S(x; M), area {pan['area']:.2f}")
        for m in cfg.marks:
            ax.axvline(100 * m, color="grey", ls=":", lw=1)
            ax.text(100 * m, ax.get_ylim()[1], f" {100 * m:.0f}%", va="top", fontsize=8)
        ax.set_title(f"K={pan['latent_dim']}, P={pan['num_masks']}: "
                     f"exact LML {pan['exact_lml']:.2f}")
        ax.set_xlabel("masking rate (%)")
        ax.set_ylabel("mean log p(x_j | x_R)")
        ax.legend(fontsize=8, loc="lower left")
    fig.suptitle(f"Area under the MPT curve, PPCA N={cfg.num_data}, D={cfg.num_tokens}")
    fig.tight_layout()
    run_dir.save_figure(fig, "fig4_area")


def summary(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per panel: the area against the exact LML."""
    return [{"K": p["latent_dim"], "P": p["num_masks"], "area": p["area"],
             "area_stderr": p["area_stderr"], "area_mc_stderr": p.get("area_mc_stderr"),
             "exact_LML": p["exact_lml"],
             "area-exact": p["area_minus_exact"]} for p in results["panels"]]


#: the area must be within this many Monte Carlo standard errors of the exact LML
AREA_TOLERANCE_SE = 4.0


def claims(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Fig. 4: the area under the curve equals the exact LML; more masks, smaller error.

    Area and exact LML average the same data, so the error between them is the
    Monte Carlo one over the masks (``area_mc_stderr``), not the spread across
    data points (``area_stderr``): the area must be within
    ``AREA_TOLERANCE_SE`` Monte Carlo SEs of the exact LML. Results without an
    ``area_mc_stderr`` (runs older than it) leave the claim unchecked.
    """
    out: list[dict[str, Any]] = []
    panels = results["panels"]
    for p in panels:
        se = p.get("area_mc_stderr")
        diff = p["area"] - p["exact_lml"]
        what = f"area = LML (K={p['latent_dim']}, P={p['num_masks']})"
        paper = "the area under the MPT curve is the LML"
        if se is None or not math.isfinite(se):
            out.append(claim(what, paper, f"area {p['area']:.3f} vs exact "
                             f"{p['exact_lml']:.3f}; no Monte Carlo SE recorded", None,
                             note="re-run the experiment to record the Monte Carlo SE"))
            continue
        out.append(claim(what, paper,
                         f"area {p['area']:.3f} vs exact {p['exact_lml']:.3f}: "
                         f"{diff:+.4f} = {diff / se if se > 0 else math.inf:+.1f} Monte "
                         f"Carlo SE (SE {se:.4f} over the masks given the data; tolerance "
                         f"{AREA_TOLERANCE_SE:g} SE)",
                         abs(diff) <= AREA_TOLERANCE_SE * se + 1e-12 * abs(p["exact_lml"])))
    by_p = {(p["latent_dim"], p["num_masks"]): p for p in panels}
    for (k, pm), p in by_p.items():
        if pm == 1:
            more = [q for (k2, p2), q in by_p.items() if k2 == k and p2 > 1]
            for q in more:
                out.append(claim(f"more masks give a smoother curve (K={k}: P=1 vs "
                                 f"P={q['num_masks']})",
                                 "P = 100 gives a smoother curve than P = 1",
                                 f"roughness (mean |second difference| of the curve) "
                                 f"{p['roughness']:.4f} vs {q['roughness']:.4f}",
                                 q["roughness"] < p["roughness"]))
    return out


def captions(config: dict[str, Any], results: dict[str, Any]) -> dict[str, str]:
    """What each figure shows, its setting and the paper's figure it corresponds to."""
    panels = ", ".join(f"K={p['latent_dim']} with P={p['num_masks']}"
                       for p in results.get("panels", []))
    return {"fig4_area": (
        "Paper Figure 4. The MPT curve S(x; M), the mean log-probability of a masked token "
        "given the rest, against the masking rate M/D, averaged over the data, with its area "
        "(shaded) sum_M S(x; M) beside the exact LML in each title. PPCA N="
        f"{results.get('num_data', '?')}, D={results.get('num_tokens', '?')}, generating "
        f"parameters; panels {panels} (P masks per size). Dotted lines: 15% and 85% masking.")}


PART = Part(
    title="Figure 4: the area under the MPT curve is the LML",
    paper=(
        "The curve S(x;M) against the masking rate, summed over all M, equals the LML; more "
        "masks (P = 100 vs 1) give a smoother curve; marks at 15% and 85%."
    ),
    config=Config, run=run, summary=summary, claims=claims, captions=captions,
)
