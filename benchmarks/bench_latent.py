"""Benchmark: one MPT epoch of the Bernoulli latent linear model on digits (run by hand).

N = 2000 binarised 8x8 digits (the 1797 images, tiled up to 2000 rows), D = 64,
K = 2, the paper's 20 x 20 grid (G = 400), full batch: one forward and backward
pass of ``MPTLoss`` and an Adam step, for each MPT estimator with P = 1.
Target: under one second per epoch on 2 cores (one mask per datum).

    python benchmarks/bench_latent.py [--repeats 5] [--threads 2] [--dtype float32]
    python benchmarks/bench_latent.py --smoke     # N=100, one epoch each: checks that it runs

Every case is timed the same way (``benchmarks/_timing.py``: one warm-up epoch,
interleaved timed epochs, the median). No ratio is printed: the cases are
different objectives, reported side by side (the ELBO as a reference cost).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from mptlml.data import load_images
from mptlml.models import BernoulliLVM
from mptlml.objectives import ELBO, MPTLoss
from mptlml.settings import keep_heap

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import time_sides  # noqa: E402


def _epoch(model, objective, x):
    """One full-batch epoch (forward, backward, Adam step) as a closure."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        value = objective.per_datum(x, g).mean()
        (-value).backward()
        opt.step()
        return float(value.detach())

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    ap.add_argument("--smoke", action="store_true", help="N=100, one epoch: checks that it runs")
    args = ap.parse_args()
    keep_heap()  # opt in to glibc's larger heap thresholds (mptlml.settings), as the CLI does
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    x = load_images("digits")
    n = 100 if args.smoke else 2000
    repeats = 1 if args.smoke else args.repeats
    x = x.repeat(2, 1)[:n].to(dtype)
    print(f"N={x.shape[0]}, D={x.shape[1]}, K=2, grid 20x20, {args.dtype}, "
          f"{args.threads} thread(s), median of {repeats} epochs after one warm-up epoch")
    from mptlml.models import LinearVAE

    cases = [("random-size, P=1", {"estimator": "random-size"}),
             ("fixed-rate 33%, P=1", {"estimator": "fixed-rate", "rate": 0.33}),
             ("cumulative (all 64 sizes), P=1", {"estimator": "cumulative"})]
    sides = {}
    for label, kw in cases:
        model = BernoulliLVM.random(64, 2, seed=0, scale=0.5, dtype=dtype)
        sides[f"MPT {label}"] = _epoch(model, MPTLoss(model, **kw), x)
    vae = LinearVAE(torch.randn(64, 2, generator=torch.Generator().manual_seed(0),
                                dtype=torch.float64).to(dtype) * 0.5)
    sides["ELBO (linear VAE), reference"] = _epoch(vae, ELBO(vae), x)
    timed = time_sides(sides, warmup=1, repeats=repeats)
    for label, t in timed.items():
        if not t.result == t.result:  # NaN objective: the timing means nothing
            raise SystemExit(f"{label}: the objective is NaN")
        print(f"  {label:36s} {t.median * 1e3:9.1f} ms/epoch   (objective {t.result:.3f})")


if __name__ == "__main__":
    main()
