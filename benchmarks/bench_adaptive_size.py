"""Measurement (not a test): random-size vs adaptive-size MPT training of PPCA on the digits.

Setting: scikit-learn's 8x8 digits (pixels / 16, D = 64), 1,000 training and 300
held-out images (one split), PPCA with K = 10 (W, sigma2 learned; mu the training
mean), Adam, minibatches of 100, one mask per datum (P = 1), the same number of steps,
minibatch order and mask seeds for both objectives. Per seed:

- ``loss var @start``: variance of the minibatch objective over 200 mask draws at the
  start parameters on one fixed minibatch (adaptive: q first fitted by 50 observed
  draws at those parameters, then frozen);
- ``grad var @start``: total variance (trace of the covariance) of its gradient with
  respect to (W, log sigma2), same draws;
- ``loss var @end``: the same variance at each objective's trained parameters, with the
  q it ended training with;
- ``held-out LML``: the exact mean log p(x) of the 300 held-out images after training,
  and the paired difference adaptive - uniform with its standard error over seeds.

Run by hand::

    python benchmarks/bench_adaptive_size.py [--seeds 5] [--steps 1500]   # ~1 min, one core
    python benchmarks/bench_adaptive_size.py --smoke
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from mptlml.models import PPCA  # noqa: E402
from mptlml.objectives import MPTLoss  # noqa: E402

ESTIMATORS = ("random-size", "adaptive-size")


def data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x = load_digits().data.astype(np.float64) / 16.0
    tr, te = train_test_split(x, train_size=1000, test_size=300, random_state=seed)
    return torch.as_tensor(tr), torch.as_tensor(te)


def start_model(x: torch.Tensor, k: int, seed: int) -> PPCA:
    g = torch.Generator().manual_seed(seed)
    w = 0.1 * torch.randn(x.shape[1], k, generator=g, dtype=torch.float64)
    return PPCA(w, mu=x.mean(0), sigma2=float(x.var(0).mean()), learn_sigma2=True)


def spread(loss: MPTLoss, xb: torch.Tensor, draws: int, seed0: int,
           grads: bool) -> tuple[float, float]:
    """Variance of the objective and total variance of its gradient over mask draws."""
    model = loss.model
    params = [p for p in model.parameters() if p.requires_grad]
    vals, gs = [], []
    for s in range(draws):
        v = loss(xb, generator=seed0 + s)
        if grads:
            g = torch.autograd.grad(v, params)
            gs.append(torch.cat([t.reshape(-1) for t in g]))
        vals.append(float(v.detach()))
    gvar = float(torch.stack(gs).var(0).sum()) if grads else math.nan
    return float(np.var(vals, ddof=1)), gvar


def frozen(loss: MPTLoss) -> MPTLoss:
    """A copy whose size distribution no longer adapts (measurement only)."""
    out = copy.copy(loss)
    out.estimator_ = copy.deepcopy(loss.estimator_)
    out.estimator_.observe = lambda *args: None
    return out


def run_seed(name: str, seed: int, xtr: torch.Tensor, xte: torch.Tensor, *, k: int,
             steps: int, batch: int, lr: float, draws: int) -> dict[str, float]:
    model = start_model(xtr, k, seed)
    loss = MPTLoss(model, name, num_masks=1)
    xb = xtr[:batch]
    if name == "adaptive-size":  # fit q at the start parameters (these draws are not steps)
        with torch.no_grad():
            for s in range(50):
                loss(xb, generator=900_000 + s)
    lvar0, gvar0 = spread(frozen(loss), xb, draws, 500_000, grads=True)
    if name == "adaptive-size":  # train from a fresh q, as a user would
        loss.estimator_.reset()
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    order = torch.Generator().manual_seed(10_000 + seed)
    perm = torch.randperm(len(xtr), generator=order)
    batch_losses = []
    for step in range(steps):
        start = (step * batch) % len(xtr)
        if start == 0 and step:
            perm = torch.randperm(len(xtr), generator=order)
        idx = perm[start:start + batch]
        value = loss(xtr[idx], generator=seed * 1_000_003 + step)
        opt.zero_grad()
        (-value).backward()
        opt.step()
        batch_losses.append(float(value.detach()))
    with torch.no_grad():
        lvar1, _ = spread(frozen(loss), xb, draws, 700_000, grads=False)
        lml = float(model.log_marginal(xte).mean())
    out = {"loss_var_start": lvar0, "grad_var_start": gvar0, "loss_var_end": lvar1,
           "heldout_lml": lml, "batch_loss_var_last100": float(np.var(batch_losses[-100:]))}
    if name == "adaptive-size":
        q = loss.estimator_.size_probs(xtr.shape[1])
        out["q_max_over_min"] = float(q.max() / q.min())
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--draws", type=int, default=200)
    ap.add_argument("--latent-dim", type=int, default=10)
    ap.add_argument("--smoke", action="store_true", help="2 seeds, 10 steps, 10 draws")
    a = ap.parse_args(argv)
    if a.smoke:
        a.seeds, a.steps, a.draws = 2, 10, 10
    torch.set_num_threads(1)
    xtr, xte = data()
    t0 = time.perf_counter()
    res = {n: [run_seed(n, s, xtr, xte, k=a.latent_dim, steps=a.steps, batch=a.batch, lr=a.lr,
                        draws=a.draws) for s in range(a.seeds)] for n in ESTIMATORS}
    print(f"PPCA K={a.latent_dim} on digits (1000 train / 300 held out, pixels/16), "
          f"{a.steps} Adam steps of {a.batch}, lr={a.lr}, P=1, {a.seeds} seeds, "
          f"{a.draws} draws per variance; {time.perf_counter() - t0:.0f} s")
    keys = ["loss_var_start", "grad_var_start", "loss_var_end", "batch_loss_var_last100",
            "heldout_lml"]
    print(f"{'quantity':26s} {'random-size':>14s} {'adaptive-size':>14s} {'ratio/diff':>22s}")
    for key in keys:
        u = np.array([r[key] for r in res["random-size"]])
        v = np.array([r[key] for r in res["adaptive-size"]])
        if key == "heldout_lml":
            d = v - u
            se = d.std(ddof=1) / math.sqrt(len(d)) if len(d) > 1 else math.nan
            print(f"{key:26s} {u.mean():14.3f} {v.mean():14.3f} "
                  f"{'diff ' + f'{d.mean():+.3f} +- {se:.3f}':>22s}")
        else:
            r = v / u
            print(f"{key:26s} {u.mean():14.4g} {v.mean():14.4g} "
                  f"{'ratio ' + f'{np.exp(np.log(r).mean()):.3f}':>22s}")
    from sklearn.decomposition import PCA

    mle = PPCA.from_sklearn(PCA(n_components=a.latent_dim).fit(xtr.numpy()))
    with torch.no_grad():
        print(f"reference: held-out LML of the maximum-likelihood PPCA (sklearn PCA): "
              f"{float(mle.log_marginal(xte).mean()):.3f}")
    qs = [r["q_max_over_min"] for r in res["adaptive-size"]]
    print(f"adaptive q max/min at the end of training: {np.mean(qs):.2f} "
          f"(eps=0.1 floor; uniform = 1)")


if __name__ == "__main__":
    main()
