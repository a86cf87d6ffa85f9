"""Shared Monte Carlo runs and independent references for the statistical tests.

The tests in ``test_unbiased.py`` and ``test_se_calibration.py`` repeat an
estimator over many fixed seeds and compare

- the mean over seeds with an *independent* reference: the exact LML
  (``model.log_marginal``) or D * S(x; M) summed here over every mask of size
  M with conditionals computed here from the model's parameters (dense
  Gaussian conditioning for PPCA, a logsumexp over quadrature nodes for the
  Bernoulli model), never through the estimators' code;
- the spread over seeds with the standard error each call reports.

Everything goes through the public API (``mptlml.estimate_lml``,
``mptlml.mpt_curve``, ``mptlml.objectives.MPTLoss``, ``mptlml.models``,
``mptlml.masks.all_masks``), so the tests survive refactors of the internals.
Runs are cached per process: the mean test and the SE test of one setting
share the same seeds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np
import torch
import torch.nn.functional as F

import mptlml
from mptlml.estimators import available, get
from mptlml.masks import all_masks
from mptlml.models import PPCA, BernoulliLVM, latent_quadrature
from mptlml.objectives import MPTLoss

#: seeds per setting: the relative sampling SD of an SD estimated from S draws is about
#: 1/sqrt(2S) = 0.035 for Gaussian draws (a bit more for heavier tails), so the SE ratio
#: band [0.8, 1.25] (log-width +-0.22) is several sampling SDs wide, and the 4-SE band of
#: the mean fails by chance with probability ~6e-5 per test.
NUM_SEEDS = 400
#: first seed of the runs (fixed: the tests are deterministic)
SEED0 = 1000
#: fixed masking rate of the tests: M = floor(0.34 * 6) = 2 at D = 6
RATE = 0.34
#: masks per call of each estimator (P >= 2 so that every call reports a stderr)
NUM_MASKS = {"cumulative": 2, "nested": 2, "random-size": 12, "fixed-rate": 6}

MODELS = ("ppca", "bernoulli")
#: the built-in estimators that can train, and the unbiased ones among them, from the registry
TRAINABLE = tuple(n for n in available(trainable=True, dense=True) if n in NUM_MASKS)
UNBIASED = tuple(n for n in TRAINABLE if get(n).unbiased)


@cache
def setting(name: str) -> tuple[torch.nn.Module, torch.Tensor]:
    """A small model and data drawn from it: D = 6, K = 2, N = 16."""
    if name == "ppca":
        model = PPCA.random(6, 2, sigma2=0.2, seed=0)
    elif name == "bernoulli":  # strong loadings: the conditionals depend on x_R
        model = BernoulliLVM.random(6, 2, seed=0, scale=2.0)
    else:  # pragma: no cover - guards the parametrisations
        raise ValueError(name)
    for p in model.parameters():
        p.requires_grad_(False)
    return model, model.sample(16, generator=1)


def fixed_size(d: int) -> int:
    """M of the fixed rate, computed here: floor(RATE * D)."""
    return int(math.floor(RATE * d))


# ---------------------------------------------------------------------- references
def _ppca_conditionals(model: PPCA, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log p(x_j | x_R) for one mask ``(D,)``, by dense Gaussian conditioning: ``(N, D)``."""
    w, mu = model.W.detach().double(), model.mu.detach().double()
    d = w.shape[0]
    c = w @ w.T + float(model.sigma2) * torch.eye(d, dtype=torch.float64)
    mi, ri = torch.where(mask)[0], torch.where(~mask)[0]
    if ri.numel():
        sol = torch.linalg.solve(c[ri][:, ri], c[ri][:, mi])  # C_RR^-1 C_RM
        mean = mu[mi] + (x[:, ri] - mu[ri]) @ sol
        var = torch.diagonal(c[mi][:, mi] - c[ri][:, mi].T @ sol)  # minus: the correct sign
    else:
        mean, var = mu[mi].expand(x.shape[0], -1), torch.diagonal(c)[mi]
    out = torch.zeros_like(x)
    out[:, mi] = -0.5 * (math.log(2 * math.pi) + torch.log(var) + (x[:, mi] - mean) ** 2 / var)
    return out


def _bernoulli_conditionals(model: BernoulliLVM, x: torch.Tensor,
                            mask: torch.Tensor) -> torch.Tensor:
    """log p(x_j | x_R) for one mask, by a logsumexp over the model's quadrature rule."""
    nodes, log_w = latent_quadrature(model.latent_dim, model.quadrature, model.num_points,
                                     model.bound)
    a = nodes.double() @ model.W.detach().double().T + model.b.detach().double()  # (G, D)
    ll = torch.where(x[None] > 0.5, F.logsigmoid(a)[:, None], F.logsigmoid(-a)[:, None])
    obs = log_w.double()[:, None] + (ll * (~mask).double()).sum(-1)  # (G, N)
    cond = torch.logsumexp(obs[..., None] + ll, 0) - torch.logsumexp(obs, 0)[:, None]
    return torch.where(mask, cond, torch.zeros((), dtype=torch.float64))


def reference_conditionals(name: str, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    model, _ = setting(name)
    fn = _ppca_conditionals if name == "ppca" else _bernoulli_conditionals
    return fn(model, x.double(), mask)


@cache
def reference_curve(name: str) -> np.ndarray:
    """Mean over the data of S(x; M) for M = 1..D from every mask of each size: ``(D,)``.

    Its sum is log p(x) (Proposition 1); D * S(x; M) is the expectation of the
    fixed-rate estimator.
    """
    _, x = setting(name)
    d = x.shape[1]
    out = np.zeros(d)
    for m in range(1, d + 1):
        masks = all_masks(d, m)
        tot = sum(float(reference_conditionals(name, x, mk).sum(-1).mean()) for mk in masks)
        out[m - 1] = tot / (len(masks) * m)
    return out


@cache
def exact_lml(name: str) -> float:
    model, x = setting(name)
    with torch.no_grad():
        return float(model.log_marginal(x).double().mean())


def reference(name: str, estimator: str) -> float:
    """What the mean of an estimator must equal: the exact LML, or D * S(x; M) at a fixed rate."""
    if estimator == "fixed-rate":
        d = setting(name)[1].shape[1]
        return d * float(reference_curve(name)[fixed_size(d) - 1])
    return exact_lml(name)


# ---------------------------------------------------------------------- repeated runs
@dataclass(frozen=True)
class Runs:
    """One row per seed."""

    mean: np.ndarray  # (S,) reported mean
    stderr: np.ndarray  # (S,) reported stderr of the mean
    per_sample: np.ndarray  # (S, N)
    per_sample_stderr: np.ndarray  # (S, N)
    sizes: tuple[int, ...]


def _kwargs(estimator: str) -> tuple[str, dict]:
    if estimator == "nested":
        return "cumulative", {"nested": True}
    if estimator == "fixed-rate":
        return "fixed-rate", {"rate": RATE}
    return estimator, {}


@cache
def eval_runs(name: str, estimator: str, shared: bool, num_seeds: int = NUM_SEEDS) -> Runs:
    """``estimate_lml`` repeated over seeds SEED0 .. SEED0 + num_seeds - 1."""
    model, x = setting(name)
    est, kw = _kwargs(estimator)
    rows = [mptlml.estimate_lml(model, x, est, num_masks=NUM_MASKS[estimator], seed=SEED0 + s,
                                share_masks=shared, **kw) for s in range(num_seeds)]
    return Runs(mean=np.array([r.mean for r in rows]),
                stderr=np.array([r.stderr for r in rows]),
                per_sample=torch.stack([r.per_sample for r in rows]).numpy(),
                per_sample_stderr=torch.stack([r.per_sample_stderr for r in rows]).numpy(),
                sizes=tuple(rows[0].sizes))


@cache
def curve_runs(name: str, shared: bool, num_seeds: int = NUM_SEEDS // 2
               ) -> tuple[np.ndarray, np.ndarray]:
    """``mpt_curve`` (P = 2) over seeds: areas ``(S,)`` and per-size means ``(S, D)``."""
    model, x = setting(name)
    rows = [mptlml.mpt_curve(model, x, num_masks=2, seed=SEED0 + s, share_masks=shared)
            for s in range(num_seeds)]
    return (np.array([r.area for r in rows]), torch.stack([r.mean for r in rows]).numpy())


@cache
def objective_runs(name: str, estimator: str, shared: bool, method: str,
                   num_seeds: int = NUM_SEEDS) -> np.ndarray:
    """``MPTLoss.per_datum`` ``(S, N)`` or ``MPTLoss.batch_mean`` ``(S,)`` over seeds."""
    model, x = setting(name)
    kw = {"rate": RATE} if estimator == "fixed-rate" else {}
    obj = MPTLoss(model, estimator, num_masks=NUM_MASKS[estimator], share_masks=shared, **kw)
    fn = getattr(obj, method)
    xt = model.validate_data(x)
    with torch.no_grad():
        vals = [fn(xt, torch.Generator().manual_seed(SEED0 + s)) for s in range(num_seeds)]
    return torch.stack(vals).double().numpy()


def mean_and_se(values: np.ndarray) -> tuple[float, float]:
    """Mean over seeds (axis 0) and its standard error, from the spread over seeds alone."""
    v = np.asarray(values, dtype=np.float64)
    return float(v.mean()), float(v.std(ddof=1) / math.sqrt(v.shape[0]))


def sd_ratio(values: np.ndarray, reported_se: np.ndarray) -> float:
    """Empirical SD over seeds (axis 0) / RMS of the reported SE, pooled over other axes.

    The mean of the squared reported SEs is unbiased for the variance it
    estimates, so the RMS (not the mean of the SEs) is compared.
    """
    v = np.asarray(values, dtype=np.float64)
    emp = v.var(axis=0, ddof=1).mean()
    rep = np.mean(np.asarray(reported_se, dtype=np.float64) ** 2)
    return float(math.sqrt(emp / rep))
