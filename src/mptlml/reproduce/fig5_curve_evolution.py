"""Fig. 5 (left): the MPT curve during MPT training of PPCA, its area converging to the LML.

A PPCA from a random initialisation (W0 with N(0, 1) entries; sigma2 and mu
fixed at their generating values) is trained with the cumulative MPT loss
(Adam, P = 1 mask per size per epoch) for 600 epochs; every 100 epochs the
curve S_hat(x; M), M = 1..D, is measured with ``curve_num_masks`` fresh masks per
size, with its area sum_M S_hat(x; M) (the cumulative estimate of the mean
LML, Proposition 1) and the exact LML of the current parameters. At random
initialisation the curve is nearly flat; as training proceeds it rises at
low masking rates and the area approaches the LML of the generating
parameters.

The paper does not state N, D, K of this panel; the defaults here (N = 1000,
D = 50, K = 5, sigma2 = 0.2) are a choice, recorded in results.json.

Reference: Moreno-Munoz, Recasens, Hauberg (NeurIPS 2023), Sec. 3.2, Fig. 5.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..models import PPCA
from ..objectives import MPTLoss
from ..runs.config import setting
from ..runs.output import pyplot
from ..runs.rundir import RunDir
from ..training import exact_lml, mpt_curve_monitor, train
from ._synthetic_ppca import PPCATrainingConfig, mean_lml
from .claims import claim
from .parts import Part

__all__ = ["PART", "Config", "captions", "claims", "run", "summary"]


@dataclass
class Config(PPCATrainingConfig):
    """Settings of the Fig. 5-left experiment.

    Besides N, D, K, sigma2, lr, P, noise, seeds and dtype
    (:class:`~._synthetic_ppca.PPCATrainingConfig`):

    Attributes
    ----------
    epochs : int
        Training epochs (600 in the paper).
    curve_every : int
        Epochs between curves (100 in the paper; formerly ``every``).
    curve_num_masks : int
        Masks per size when measuring each curve (formerly ``curve_masks``).
    """

    num_tokens: int = setting(50, "D, tokens of the generating and of the trained PPCA", min=2)
    latent_dim: int = setting(5, "K, latent dimension (< num_tokens)", min=1)
    lr: float = setting(2e-2, "Adam learning rate", gt=0)
    epochs: int = setting(600, "training epochs (600 in the paper)", min=1)
    curve_every: int = setting(100, "epochs between curves (100 in the paper)", min=1)
    curve_num_masks: int = setting(10, "P, masks per size when measuring each curve", min=1)

    @classmethod
    def quick(cls) -> Config:
        """A small setting for tests (seconds on 2 cores)."""
        return cls(num_data=200, num_tokens=16, latent_dim=2, epochs=120, curve_every=20,
                   lr=5e-2, curve_num_masks=4)


def run(cfg: Config, run_dir: RunDir) -> dict[str, Any]:
    """Train, measure the curve every ``curve_every`` epochs, write CSVs and the figure."""
    cfg.validate()
    true, x = cfg.data()
    gt_lml, mle_lml = mean_lml(true, x), mean_lml(PPCA.fit(x, cfg.latent_dim), x)
    model = cfg.init(cfg.seed)
    hist = train(model, MPTLoss(model, "cumulative", num_masks=cfg.num_masks), x,
                 epochs=cfg.epochs, lr=cfg.lr, seed=cfg.seed + 1,
                 monitors={"exact_lml": exact_lml(),
                           "curve": mpt_curve_monitor(every=cfg.curve_every,
                                                      num_masks=cfg.curve_num_masks,
                                                      seed=cfg.seed + 2)})
    run_dir.write_json("history.json", hist.to_dict())  # reload with History.load
    run_dir.write_csv("training.csv", [
        {"epoch": r["epoch"], "neg_mpt_loss": r["objective"], "exact_lml": r["exact_lml"]}
        for r in hist.records])
    d = cfg.num_tokens
    curves, checkpoints = [], []
    for r in hist.records:
        if "curve/area" not in r:
            continue
        for m, s in enumerate(r["curve/curve"], start=1):
            curves.append({"epoch": r["epoch"], "mask_size": m, "rate": m / d, "S_mean": s})
        checkpoints.append({"epoch": r["epoch"], "area": r["curve/area"],
                            "exact_lml": r["exact_lml"], "area_minus_exact": r["curve/area"]
                            - r["exact_lml"], "gap_to_gt": r["curve/area"] - gt_lml})
    run_dir.write_csv("curves.csv", curves)
    run_dir.write_csv("areas.csv", checkpoints)
    _figure(cfg, run_dir, curves, checkpoints, gt_lml)
    return {"gt_lml": gt_lml, "mle_lml": mle_lml, "checkpoints": checkpoints,
            "final_area": checkpoints[-1]["area"], "final_exact_lml": hist.last["exact_lml"],
            "final_rel_gap_to_gt": abs(checkpoints[-1]["area"] - gt_lml) / abs(gt_lml)}


def _figure(cfg: Config, run_dir: RunDir, curves: list[dict[str, Any]],
            checkpoints: list[dict[str, Any]], gt_lml: float) -> None:
    plt = pyplot()

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    cmap = plt.get_cmap("viridis")
    last = max(1, checkpoints[-1]["epoch"]) if checkpoints else 1
    for c in checkpoints:
        pts = [(100 * r["rate"], r["S_mean"]) for r in curves if r["epoch"] == c["epoch"]]
        a = np.array(pts)
        ax.plot(a[:, 0], a[:, 1], color=cmap(c["epoch"] / last), lw=1.4)
    ax.axvline(85, color="grey", ls=":", lw=1)
    ax.set_xlabel("masking rate (%)")
    ax.set_ylabel("mean log p(x_j | x_R)")
    ax.set_title(f"MPT curve during training (GT LML {gt_lml:.2f})")
    # a colour bar for the epoch instead of a legend, which would cover the curves
    sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(0, last))
    fig.colorbar(sm, ax=ax, label="epoch", pad=0.02)
    ep = [c["epoch"] for c in checkpoints]
    ax2.plot(ep, [c["area"] for c in checkpoints], "o-", label="area under the curve")
    ax2.plot(ep, [c["exact_lml"] for c in checkpoints], "s--", label="exact LML, current W")
    ax2.axhline(gt_lml, color="k", ls=":", lw=1, label=f"exact LML, generating W ({gt_lml:.2f})")
    ax2.set_xlabel("epoch")
    ax2.set_ylabel("nats per datum")
    ax2.set_title("area vs exact LML")
    ax2.legend(fontsize=8)
    fig.suptitle(f"PPCA N={cfg.num_data}, D={cfg.num_tokens}, K={cfg.latent_dim}, "
                 f"cumulative MPT, P={cfg.num_masks}, Adam lr={cfg.lr}")
    fig.tight_layout()
    run_dir.save_figure(fig, "fig5_curve_evolution")


def summary(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per checkpoint: the area against the exact LML and the GT LML."""
    return [{"epoch": c["epoch"], "area": c["area"], "exact_LML": c["exact_lml"],
             "GT_LML": results["gt_lml"], "area-exact": c["area_minus_exact"]}
            for c in results["checkpoints"]]


def claims(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Fig. 5 left: under MPT training the area converges to the true LML."""
    gt = results["gt_lml"]
    cps = results["checkpoints"]
    track = max(abs(c["area_minus_exact"]) / abs(c["exact_lml"]) for c in cps)
    return [
        claim("final area within 1% of the generating parameters' LML",
              "the area converges to the true LML",
              f"{results['final_area']:.3f} vs {gt:.3f} "
              f"({100 * results['final_rel_gap_to_gt']:.2f}%)",
              results["final_rel_gap_to_gt"] < 0.01),
        claim("at every checkpoint the area tracks the current exact LML (within 2%)",
              "the area is the LML at every stage (Proposition 1)",
              f"worst relative gap {100 * track:.2f}% over {len(cps)} checkpoints",
              track < 0.02),
    ]


def captions(config: dict[str, Any], results: dict[str, Any]) -> dict[str, str]:
    """What each figure shows, its setting and the paper's figure it corresponds to."""
    every = config.get("curve_every", "?")
    masks = config.get("curve_num_masks", "?")
    return {"fig5_curve_evolution": (
        "Paper Figure 5 (left). Left: the MPT curve S(x; M) against the masking rate, measured "
        f"every {every} epochs (colour: epoch, see the bar) while a PPCA is "
        f"trained by the cumulative MPT loss from a random start; right: its area beside the "
        "exact LML of the current parameters and of the generating ones. PPCA N="
        f"{config.get('num_data', '?')}, D={config.get('num_tokens', '?')}, "
        f"K={config.get('latent_dim', '?')}, Adam lr {config.get('lr', '?')}, "
        f"{config.get('epochs', '?')} epochs, {masks} masks per size "
        "per curve. The paper does not state N, D, K for this panel.")}


PART = Part(
    title="Figure 5 (left): the curve during training",
    paper="Under MPT training the area under the curve converges to the true LML.",
    config=Config, run=run, summary=summary, claims=claims, captions=captions,
)
