"""``mptlml demo``, the main job on built-in data: PPCA on scikit-learn's handwritten digits.

Fits PPCA (scikit-learn's PCA mapped to PPCA) to a training split of the 8x8
digits, then estimates the held-out log-marginal likelihood with every MPT
estimator and sets each beside the exact value and scikit-learn's own
``score_samples``. Writes ``results.json``, ``estimates.csv``, ``curve.csv``
and the MPT curve as PNG/PDF into a run directory.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..estimators import estimate_lml, get, mpt_curve
from ..models import PPCA
from ..runs.config import RunConfig, setting
from ..runs.job import Job
from ..runs.output import can_draw, print_table, pyplot
from ..runs.rundir import RunDir

__all__ = ["JOB", "DemoConfig", "run_demo"]

_log = logging.getLogger(__name__)


@dataclass
class DemoConfig(RunConfig):
    """``mptlml demo``: its settings (every flag is one)."""

    num_masks: int = setting(10, "P, masks per size", min=1)
    seed: int = setting(0, "seed of the split and the masks", min=0)
    latent_dim: int = setting(10, "K of the PPCA fitted to the digits", min=1, max=63)


def run_demo(cfg: DemoConfig, run: RunDir) -> dict[str, Any]:
    """Run the demo into ``run`` (a job: :func:`mptlml.runs.job.run_job`)."""
    from sklearn.datasets import load_digits
    from sklearn.decomposition import PCA
    from sklearn.model_selection import train_test_split

    num_masks, seed, latent_dim = cfg.num_masks, cfg.seed, cfg.latent_dim
    x = load_digits().data.astype(np.float64)
    x_train, x_test = train_test_split(x, test_size=300, random_state=seed)
    pca = PCA(n_components=latent_dim).fit(x_train)
    model = PPCA.from_sklearn(pca)
    n, d = x_test.shape
    _log.info(f"PPCA (K={latent_dim}) fitted to {len(x_train)} digits; scoring {n} held-out digits "
          f"(D={d}) with P={num_masks} masks per size.")

    exact = model.log_marginal(x_test).detach().numpy()
    sk = pca.score_samples(x_test)
    rows: list[dict[str, Any]] = [
        {"method": "exact log p(x) (Woodbury)", "mean_lml": float(exact.mean()), "stderr": 0.0,
         "model_calls": 0},
        {"method": "sklearn PCA.score_samples", "mean_lml": float(sk.mean()), "stderr": 0.0,
         "model_calls": 0},
    ]
    estimates = {}
    for name, kwargs in [("cumulative", {}), ("random-size", {}),
                         ("fixed-rate", {"rate": 0.15}), ("chain-rule", {})]:
        # equal cost: draws of one mask get D times the draws of one mask per size
        p = num_masks * d // get(name)(**kwargs).masks_per_draw(d)
        est = estimate_lml(model, x_test, name, num_masks=p, seed=seed, progress=True, **kwargs)
        estimates[name] = est
        label = name + (" (15%)" if name == "fixed-rate" else "")
        rows.append({"method": f"MPT {label}, P={p}", "mean_lml": est.mean,
                     "stderr": est.stderr, "model_calls": est.num_model_calls})
    print_table(rows, ["method", "mean_lml", "stderr", "model_calls"],
                title="Held-out log-marginal likelihood per digit (nats)")

    curve = mpt_curve(model, x_test, num_masks=num_masks, seed=seed, progress=True)
    run.write_csv("estimates.csv", rows)
    run.write_csv("curve.csv", [
        {"size": m, "rate": r, "mean_S": float(s), "stderr": float(e)}
        for m, r, s, e in zip(curve.sizes, curve.rates, curve.mean, curve.stderr, strict=True)
    ])
    if can_draw():  # else run_job said up front that the figure is left out
        _plot_curve(curve, float(exact.mean()), latent_dim, run)
    results = {
        "data": "sklearn digits (8x8), 300 held out", "test_size": n,
        "exact_mean_lml": float(exact.mean()),
        "sklearn_score_samples_mean": float(sk.mean()),
        "max_abs_diff_vs_sklearn": float(np.abs(exact - sk).max()),
        "estimates": {k: v.to_dict() for k, v in estimates.items()},
        "curve": curve.to_dict(),
    }
    for k in results["estimates"].values():
        k.pop("per_sample", None)
        k.pop("per_sample_stderr", None)
    results["curve"].pop("per_sample", None)
    _log.info("files: results.json, estimates.csv, curve.csv"
              + (", mpt_curve.png/.pdf" if can_draw() else ""))
    return results


def _plot_curve(curve: Any, exact: float, latent_dim: int, run: RunDir) -> None:
    """The demo's figure: the MPT curve (:meth:`MPTCurve.plot`), BERT's 15% marked."""
    fig, ax = pyplot().subplots(figsize=(7.6, 4.2))
    curve.plot(ax=ax, label=f"PPCA K={latent_dim}")
    ax.axvline(0.15, color="grey", ls=":", lw=1)
    ax.annotate(" 15%: BERT's masking rate", (0.15, 0.02), xycoords=("data", "axes fraction"),
                fontsize=7, color="grey")
    ax.set_title(f"MPT curve, PPCA K={latent_dim} on held-out digits (exact LML {exact:.1f})")
    run.save_figure(fig, "mpt_curve")


JOB = Job(config=DemoConfig, run=run_demo, figures=True,
          help="PPCA on scikit-learn digits: exact LML vs every estimator")
