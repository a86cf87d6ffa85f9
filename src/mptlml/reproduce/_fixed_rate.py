"""Why fixed-rate MPT training of PPCA is slow: the objective is flat along W's scale.

The fixed-rate objective D * S(x; M) and the exact LML share their optimum
(the exact maximiser of one is within a hair of the other's), but along W's
scale (W -> c W) the fixed-rate objective is an order of magnitude flatter, so
Adam with a few stochastic masks drifts there for thousands of epochs. These
helpers measure that for the Fig. 2 experiment (:mod:`.training`): the W-only
optimum, the curvature along the scale, the exact maximiser by L-BFGS, the
epoch from which a run stays near the target, and the note the report shows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..models import PPCA
from ._synthetic_ppca import exact_fixed_rate, mean_lml

__all__ = ["epochs_text", "flat_direction", "maximise_fixed_rate", "scale_curvature",
           "settle_epoch", "slow_fixed_rate_note", "w_only_optimum"]


def w_only_optimum(x: torch.Tensor, latent_dim: int, sigma2: float) -> torch.Tensor:
    """The W maximising the exact LML with mu = 0 and sigma2 fixed (Tipping & Bishop 1999).

    ``W = U_K (Lambda_K - sigma2 I)^{1/2}`` with ``U_K, Lambda_K`` the top K
    eigenvectors and eigenvalues of ``S = X^T X / N`` (the second moment about
    the fixed mean 0); unique up to a rotation of the latent space.
    """
    xd = x.double()
    lam, u = torch.linalg.eigh(xd.T @ xd / xd.shape[0])
    lam, u = lam.flip(0)[:latent_dim], u.flip(1)[:, :latent_dim]
    return (u * (lam - sigma2).clamp_min(0).sqrt()).to(x.dtype).contiguous()


def scale_curvature(f: Callable[[torch.Tensor], float], w: torch.Tensor,
                    h: float = 1e-3) -> float:
    """``d^2/dc^2 f(c W)`` at ``c = 1`` by central differences (nats per datum).

    How sharply an objective of W falls off when W is scaled; near zero, the
    objective is flat along W's scale and a stochastic optimizer drifts there.
    """
    return (f((1 + h) * w) - 2 * f(w) + f((1 - h) * w)) / h**2


def maximise_fixed_rate(model: PPCA, x: torch.Tensor, mask_size: int,
                        masks: torch.Tensor, max_iter: int = 500) -> tuple[PPCA, int]:
    """Maximise the exact fixed-rate objective D * S(x; M) over W by L-BFGS, in place.

    The objective is the mean over every mask of size M (``masks``, all
    C(D, M) of them at D = 10), so it is deterministic and its maximiser is
    found in a few hundred evaluations. Returns the model and the number of
    evaluations.
    """
    d = model.num_tokens
    opt = torch.optim.LBFGS([model.W], lr=1.0, max_iter=max_iter, tolerance_grad=1e-9,
                            tolerance_change=1e-12, line_search_fn="strong_wolfe")
    calls = [0]

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = -d * model.masked_log_prob(x, masks, None).double().mean() / mask_size
        loss.backward()
        calls[0] += 1
        return loss

    opt.step(closure)
    return model, calls[0]


def settle_epoch(rows: list[dict[str, Any]], target: float, tol: float = 0.01) -> int | None:
    """First epoch from which the exact LML stays within ``tol`` of ``target``; None if never."""
    out = [r["epoch"] for r in rows if abs(r["exact_lml"] - target) >= tol * abs(target)]
    if not out:
        return rows[0]["epoch"]
    if out[-1] == rows[-1]["epoch"]:
        return None
    return next(r["epoch"] for r in rows if r["epoch"] > out[-1])


def flat_direction(cfg: Any, x: torch.Tensor, mask_size: int,
                   masks: torch.Tensor) -> dict[str, Any]:
    """Why fixed-rate training is slow: curvature along W's scale, and the exact maximiser."""
    w_star = w_only_optimum(x, cfg.latent_dim, cfg.sigma2)

    def model(w: torch.Tensor) -> PPCA:
        return PPCA(w, None, cfg.sigma2)

    curv = {"exact_lml": scale_curvature(lambda w: mean_lml(model(w), x), w_star),
            "fixed_rate": scale_curvature(
                lambda w: exact_fixed_rate(model(w), x, mask_size, masks), w_star)}
    start = cfg.init(cfg.seed)  # the start of training's first initialisation
    fr_model, evals = maximise_fixed_rate(start, x, mask_size, masks)
    fr_lml = mean_lml(fr_model, x)
    return {"optimum_lml": mean_lml(model(w_star), x), "scale_curvature": curv,
            "flatness_ratio": curv["exact_lml"] / curv["fixed_rate"]
            if curv["fixed_rate"] != 0 else float("inf"),
            "fixed_rate_maximiser": {
                "exact_lml": fr_lml, "evaluations": evals, "start": "init 0",
                "bias": exact_fixed_rate(fr_model, x, mask_size, masks) - fr_lml}}


def epochs_text(st: dict[str, Any]) -> str:
    eps = st.get("settle_epochs") or []
    return ", ".join(f"init {i}: " + (f"epoch {e}" if e is not None else f"not in {st['epochs']}")
                     for i, e in enumerate(eps))


def slow_fixed_rate_note(results: dict[str, Any]) -> str:
    """Why fixed-rate training converges slowly, with this run's numbers."""
    flat = results.get("flat_direction")
    if not flat:
        return ""
    c = flat["scale_curvature"]
    st = results["objectives"]
    text = (f"Along W's scale (W -> cW at the LML's optimum) the exact LML has second derivative "
            f"{c['exact_lml']:.3f} nats per datum, the exact fixed-rate objective "
            f"{c['fixed_rate']:.3f}: {flat['flatness_ratio']:.0f}x flatter. With P="
            f"{results.get('num_masks', '?')} stochastic masks and Adam (lr "
            f"{results.get('lr', '?')}) the fixed-rate runs move slowly and noisily along it.")
    if "all-sizes" in st and "fixed-rate" in st:
        text += (f" Epoch from which the exact LML stays within 1% of the generating "
                 f"parameters': all sizes {epochs_text(st['all-sizes'])}; fixed rate "
                 f"{epochs_text(st['fixed-rate'])}.")
    m = flat["fixed_rate_maximiser"]
    text += (f" The exact fixed-rate objective's maximiser (L-BFGS from {m['start']}, "
             f"{m['evaluations']} evaluations) has exact LML {m['exact_lml']:.3f} against "
             f"{flat['optimum_lml']:.3f} at the LML's optimum: the two objectives share their "
             "optimum, and the paper trains the fixed rate for 10,000 epochs, ten times the "
             "1,000 of all sizes.")
    return text
