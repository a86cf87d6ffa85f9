"""Benchmark: one PPCA MPT training step (forward + backward), batched vs the paper's loop.

Setting of Fig. 2: N = 2000, D = 10, K = 2, P = 1 mask per size, all sizes
M = 1..D. Both sides compute the cumulative MPT objective

    L(W) = (1/N) sum_n sum_{M=1..D} (1/M) sum_{j in mask_M} log p(x_nj | x_nR)

and its gradient with respect to W, then take an Adam step.

- ``paper loop``: the authors' route, written here: for each size M one
  mask shared by the data, the D x D covariance C = W W^T + sigma2 I, an
  explicit inverse of C_RR per mask, the Gaussian conditional of every masked
  token (with the correct minus sign), a Python loop over the sizes.
- ``mptlml``: :class:`mptlml.objectives.MPTLoss` (one ``score_masks`` call for
  all sizes, latent-posterior / Woodbury conditionals), with masks shared by
  the data (as the paper: the step averages over the data inside the model,
  from the sufficient statistics of ``[e, z*]``, O(D^2 K) per mask) and with
  independent masks per datum (the default of the estimates: N times more
  distinct masks, 20000 here, so more work than the paper's 10).

Run by hand (not a test)::

    python benchmarks/bench_training.py [--repeats 200] [--threads 1]
    python benchmarks/bench_training.py --smoke     # tiny: checks that it runs

First checks that the two routes give the same objective on the same masks
(to 1e-9 relative), then times every side the same way
(``benchmarks/_timing.py``: the same warm-up steps, interleaved timed steps,
the median) and prints the median step time of each and the speed-up ratios.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from mptlml.models import PPCA  # noqa: E402
from mptlml.objectives import MPTLoss  # noqa: E402
from mptlml.settings import keep_heap  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import check_same, ratio, time_sides  # noqa: E402

LOG_2PI = math.log(2 * math.pi)


def paper_perms(d: int, g: torch.Generator) -> list[torch.Tensor]:
    """One random order per size M = 1..D; its first M entries are the mask."""
    return [torch.randperm(d, generator=g) for _ in range(d)]


def paper_step_value(w: torch.Tensor, sigma2: float, x: torch.Tensor,
                     perms: list[torch.Tensor]) -> torch.Tensor:
    """Cumulative MPT objective by the per-mask inverse route (one shared mask per size)."""
    n, d = x.shape
    c = w @ w.T + sigma2 * torch.eye(d, dtype=x.dtype)
    total = x.new_zeros(())
    for m, perm in zip(range(1, d + 1), perms, strict=True):
        mi, ri = perm[:m], perm[m:]
        c_mm = c[mi][:, mi]
        if len(ri):
            c_mr = c[mi][:, ri]
            k = c_mr @ torch.linalg.inv(c[ri][:, ri])  # (M, R)
            mean = x[:, ri] @ k.T  # mu = 0
            var = torch.diagonal(c_mm - k @ c_mr.T)
        else:
            mean = x.new_zeros(n, m)
            var = torch.diagonal(c_mm)
        xm = x[:, mi]
        logp = -0.5 * (LOG_2PI + torch.log(var) + (xm - mean) ** 2 / var)
        total = total + logp.sum(1).mean() / m
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-data", type=int, default=2000)
    ap.add_argument("--num-tokens", type=int, default=10)
    ap.add_argument("--latent-dim", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps per side first")
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    ap.add_argument("--smoke", action="store_true", help="N=50, 3 steps: checks that it runs")
    args = ap.parse_args()
    keep_heap()  # opt in to glibc's larger heap thresholds (mptlml.settings), as the CLI does
    if args.smoke:
        args.num_data, args.repeats, args.warmup = 50, 3, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    n, d, k = args.num_data, args.num_tokens, args.latent_dim
    true = PPCA.random(d, k, 0.2, seed=0, dtype=dtype)
    x = true.sample(n, generator=1)

    # paper loop
    w = torch.randn(d, k, generator=torch.Generator().manual_seed(7), dtype=torch.float64) \
        .to(dtype).requires_grad_(True)
    opt = torch.optim.Adam([w], lr=1e-2)
    g = torch.Generator().manual_seed(0)

    def paper_step():
        opt.zero_grad(set_to_none=True)
        (-paper_step_value(w, 0.2, x, paper_perms(d, g))).backward()
        opt.step()

    # the two routes compute the same objective: same W, same shared masks -> equal values
    check = PPCA(w.detach(), None, 0.2)
    perms = paper_perms(d, torch.Generator().manual_seed(1))
    masks = torch.zeros(d, d, dtype=torch.bool)
    for m, perm in enumerate(perms, start=1):
        masks[m - 1, perm[:m]] = True
    with torch.no_grad():
        ours = (check.masked_log_prob_mean(x, masks, None)
                / torch.arange(1, d + 1, dtype=torch.float64)).sum()
        ref = paper_step_value(w.detach(), 0.2, x, perms)
    print(check_same("same objective on the same masks (paper loop vs mptlml)", float(ours),
                     float(ref), atol=1e-12,
                     rtol=1e-9 if dtype == torch.float64 else 1e-4))

    sides = {"paper loop (per-mask inverse)": paper_step}
    for share in (False, True):
        model = PPCA.random(d, k, 0.2, seed=7, dtype=dtype)
        obj = MPTLoss(model, "cumulative", num_masks=1, share_masks=share)
        opt2 = torch.optim.Adam(model.parameters(), lr=1e-2)
        g2 = torch.Generator().manual_seed(0)

        def step(obj=obj, opt2=opt2, g2=g2):
            opt2.zero_grad(set_to_none=True)
            (-obj(x, generator=g2)).backward()
            opt2.step()

        sides["mptlml MPTLoss, " + ("shared masks" if share else "masks per datum")] = step
    timed = time_sides(sides, warmup=args.warmup, repeats=args.repeats)
    print(f"PPCA MPT training step, N={n}, D={d}, K={k}, P=1, all sizes, forward+backward, "
          f"{args.dtype}, torch {torch.__version__}, threads={torch.get_num_threads()}, "
          f"median of {args.repeats} after {args.warmup} warm-up steps, each side alike")
    base = timed["paper loop (per-mask inverse)"]
    for label, t in timed.items():
        print(f"  {label:40s} {1e3 * t.median:8.3f} ms   x{ratio(base, t):5.2f} vs paper loop")


if __name__ == "__main__":
    main()
