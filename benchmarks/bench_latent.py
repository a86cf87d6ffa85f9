"""Benchmark: one MPT epoch of the Bernoulli latent linear model on digits (run by hand).

N = 2000 binarised 8x8 digits (the 1797 images, tiled up to 2000 rows), D = 64,
K = 2, the paper's 20 x 20 grid (G = 400), full batch: one forward and backward
pass of ``MPTLoss`` and an Adam step, for each MPT estimator with P = 1.
Target: under one second per epoch on 2 cores (one mask per datum).

    python benchmarks/bench_latent.py [--repeats 5] [--threads 2] [--dtype float32]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mptlml.data import load_images
from mptlml.models import BernoulliLVM
from mptlml.objectives import ELBO, MPTLoss
from mptlml.settings import keep_heap


def _epoch_times(model, objective, x, repeats: int) -> list[float]:
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    times = []
    for i in range(repeats + 1):
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        (-objective.per_datum(x, g).mean()).backward()
        opt.step()
        if i:  # the first call warms up
            times.append(time.perf_counter() - t)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    args = ap.parse_args()
    keep_heap()  # opt in to glibc's larger heap thresholds (mptlml.settings), as the CLI does
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    x = load_images("digits")
    x = x.repeat(2, 1)[:2000].to(dtype)
    print(f"N={x.shape[0]}, D={x.shape[1]}, K=2, grid 20x20, {args.dtype}, "
          f"{args.threads} thread(s), median of {args.repeats} epochs")
    from mptlml.models import LinearVAE

    cases = [("random-size, P=1", {"estimator": "random-size"}),
             ("fixed-rate 33%, P=1", {"estimator": "fixed-rate", "rate": 0.33}),
             ("cumulative (all 64 sizes), P=1", {"estimator": "cumulative"})]
    for label, kw in cases:
        model = BernoulliLVM.random(64, 2, seed=0, scale=0.5, dtype=dtype)
        times = _epoch_times(model, MPTLoss(model, **kw), x, args.repeats)
        print(f"  MPT {label:32s} {statistics.median(times) * 1e3:9.1f} ms/epoch")
    vae = LinearVAE(torch.randn(64, 2, dtype=dtype) * 0.5)
    times = _epoch_times(vae, ELBO(vae), x, args.repeats)
    print(f"  {'ELBO (linear VAE), reference':36s} {statistics.median(times) * 1e3:9.1f} ms/epoch")


if __name__ == "__main__":
    main()
