"""Benchmark: ``mptlml.estimate_lml`` against a naive reference of the paper's algorithm.

Run by hand (not a test)::

    python benchmarks/bench_estimators.py            # full cases, ~5 minutes on 2 cores
    python benchmarks/bench_estimators.py --quick    # smaller P, well under a minute

The naive reference is the paper's loop: for every mask a fresh random
permutation, the dense covariance S = W W^T + sigma2 I, ``torch.inverse`` of
S_RR, the conditional mean m = mu_M + S_MR^T S_RR^-1 (x_R - mu_R) and the
marginal conditional variances diag(S_MM - S_MR^T S_RR^-1 S_MR) of the masked
tokens, one mask at a time and shared by the whole batch of N data. At
D = 512 it is too slow to run in full, so it is timed on a stratified subset
of the masks and extrapolated per mask (the output says so).

``estimate_lml`` is timed twice per case:

- ``share_masks=True``: the same estimator as the reference (each mask shared
  across the data, same P): the ratio is the speed-up at equal work;
- ``share_masks=False`` (the default): one mask per datum, N times more
  (mask, datum) pairs and a lower standard error;
- for the all-sizes cases also ``nested=True, share_masks=True``: the masks
  of the D sizes are the prefixes of P random orders (prefix sums, D times
  fewer random masks), the same number of masks as the reference but
  dependent across sizes, so its standard error is printed beside it.

Before any timing the benchmark opts in to ``mptlml.settings.keep_heap`` (the
library never calls it; the CLI does), so the naive loop and ``estimate_lml``
run with the same allocator settings; ``MPTLML_KEEP_HEAP=0`` runs both without.

The last table compares estimators at equal standard error: the time each
would need to reach a given standard error of the mean LML, using
time ~ P and SE^2 ~ 1/P, i.e. ``t * (SE / target)^2``.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import time
from collections.abc import Callable

import torch

import mptlml
from mptlml.masks import fixed_rate_size
from mptlml.models import PPCA
from mptlml.settings import keep_heap

LOG_2PI = math.log(2 * math.pi)


# ---------------------------------------------------------------------- naive reference
def naive_mask_score(w: torch.Tensor, mu: torch.Tensor, sigma2: float, x: torch.Tensor,
                     m: int, g: torch.Generator) -> torch.Tensor:
    """(1/M) sum_{j in mask} log p(x_j | x_R) for one random mask of size M shared by all data.

    The paper's algorithm, literally: permutation, dense S, inverse of S_RR.
    """
    d = w.shape[0]
    perm = torch.randperm(d, generator=g)
    mi, ri = perm[:m], perm[m:]
    s = w @ w.T + sigma2 * torch.eye(d, dtype=w.dtype)
    s_mm = s[mi][:, mi]
    if ri.numel():
        s_rr_inv = torch.inverse(s[ri][:, ri])
        s_mr = s[ri][:, mi]  # (R, M)
        coef = s_rr_inv @ s_mr  # (R, M)
        mean = mu[mi] + (x[:, ri] - mu[ri]) @ coef  # (N, M)
        var = torch.diagonal(s_mm - s_mr.T @ coef)
    else:
        mean = mu[mi].expand(x.shape[0], m)
        var = torch.diagonal(s_mm)
    lp = -0.5 * (LOG_2PI + torch.log(var) + (x[:, mi] - mean) ** 2 / var)
    return lp.sum(1) / m  # (N,)


def naive_time_per_mask(model: PPCA, x: torch.Tensor, sizes: list[int], seed: int = 0
                        ) -> float:
    """Mean wall time of one naive mask over the given sizes (each timed once)."""
    w, mu, s2 = model.W.detach(), model.mu.detach(), float(model.sigma2)
    g = torch.Generator().manual_seed(seed)
    naive_mask_score(w, mu, s2, x, sizes[0], g)  # warm-up
    t0 = time.perf_counter()
    for m in sizes:
        naive_mask_score(w, mu, s2, x, m, g)
    return (time.perf_counter() - t0) / len(sizes)


def naive_check(model: PPCA, x: torch.Tensor, sizes: list[int], p: int) -> tuple[float, float]:
    """Naive estimate of the mean LML (cumulative or fixed-rate) with P masks per size."""
    w, mu, s2 = model.W.detach(), model.mu.detach(), float(model.sigma2)
    g = torch.Generator().manual_seed(1)
    d = w.shape[0]
    per = torch.stack([torch.stack([naive_mask_score(w, mu, s2, x, m, g) for _ in range(p)])
                       for m in sizes])  # (S, P, N)
    total = per.sum(0) if len(sizes) == d else d * per[0]
    samples = total.double().mean(1)
    return float(samples.mean()), float(samples.std() / math.sqrt(p))


# ---------------------------------------------------------------------- timing helpers
def best_of(fn: Callable[[], object], repeats: int, warm_up: bool = True
            ) -> tuple[float, object]:
    """Smallest wall time of ``repeats`` calls (after one warm-up) and the last result."""
    out = fn() if warm_up else None
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def stratified_sizes(d: int, count: int, fixed: int | None) -> list[int]:
    """``count`` sizes spread evenly over 1..D (or the fixed size repeated)."""
    if fixed is not None:
        return [fixed] * count
    return sorted({max(1, min(d, round((i + 0.5) * d / count))) for i in range(count)})


# ---------------------------------------------------------------------- cases
CASES = [
    # name, D, estimator, P, target ratio
    ("N=100 D=50 K=2 P=100 all sizes", 50, "cumulative", 100, 100),
    ("N=100 D=512 K=2 fixed M=76 P=300", 512, "fixed-rate", 300, 300),
    ("N=100 D=512 K=2 P=10 all sizes", 512, "cumulative", 10, 300),
]


def run_case(name: str, d: int, estimator: str, p: int, target: float, dtype: torch.dtype,
             quick: bool, repeats: int) -> dict:
    n, k, s2 = 100, 2, 0.2
    model = PPCA.random(d, k, sigma2=s2, seed=0, dtype=dtype)
    x = model.sample(n, generator=1)
    msize = fixed_rate_size(0.15, d) if estimator == "fixed-rate" else None
    kw = {"rate": 0.15} if estimator == "fixed-rate" else {}
    num_masks_total = p * (1 if msize else d)  # masks per datum (or per batch, shared)

    # naive: full when cheap, a stratified subset otherwise
    if d <= 64:
        sub = None
        g = torch.Generator().manual_seed(0)
        w, mu = model.W.detach(), model.mu.detach()
        sizes = list(range(1, d + 1))
        t0 = time.perf_counter()
        for m in sizes:
            for _ in range(p):
                naive_mask_score(w, mu, s2, x, m, g)
        t_naive = time.perf_counter() - t0
        naive_note = f"all {num_masks_total} masks timed"
    else:
        sub = 16 if quick else 48
        per_mask = naive_time_per_mask(model, x, stratified_sizes(d, sub, msize))
        t_naive = per_mask * num_masks_total
        naive_note = (f"{sub} of {num_masks_total} masks timed ({per_mask * 1e3:.2f} ms each), "
                      "extrapolated")

    t_shared, est_shared = best_of(
        lambda: mptlml.estimate_lml(model, x, estimator, num_masks=p, seed=0, share_masks=True,
                                    **kw), repeats)
    t_indep, est_indep = best_of(
        lambda: mptlml.estimate_lml(model, x, estimator, num_masks=p, seed=0, **kw), 1,
        warm_up=False)
    t_nested = est_nested = None
    if estimator == "cumulative":
        t_nested, est_nested = best_of(
            lambda: mptlml.estimate_lml(model, x, estimator, num_masks=p, seed=0,
                                        share_masks=True, nested=True), repeats)
    return {
        "case": name, "dtype": str(dtype).replace("torch.", ""), "estimator": estimator,
        "P": p, "D": d, "naive_s": t_naive, "naive_note": naive_note,
        "shared_s": t_shared, "indep_s": t_indep,
        "ratio_shared": t_naive / t_shared, "target": target,
        "se_shared": est_shared.stderr, "se_indep": est_indep.stderr,
        "nested_s": t_nested, "se_nested": est_nested.stderr if est_nested else None,
        "exact": est_shared.exact, "est_shared": est_shared.mean, "est_indep": est_indep.mean,
    }


def equal_se_table(quick: bool) -> list[dict]:
    """Time to reach a common SE of the mean LML, per estimator (D=512 and D=50, float64)."""
    rows = []
    # P per datum-mask variant and per shared variant (shared masks are cheaper per mask, so
    # they get more draws: a steadier SE estimate)
    for d, p_pd, p_sh in ((50, 20, 100), (512, 2 if quick else 4, 4 if quick else 20)):
        model = PPCA.random(d, 2, sigma2=0.2, seed=0)
        x = model.sample(100, generator=1)
        variants = [
            # label, estimator, P, share_masks, nested
            ("cumulative, masks per datum", "cumulative", p_pd, False, False),
            ("cumulative, shared masks", "cumulative", p_sh, True, False),
            ("cumulative nested, per datum", "cumulative", p_pd, False, True),
            ("cumulative nested, shared", "cumulative", p_sh, True, True),
            ("random-size, masks per datum", "random-size", p_pd * d // 2, False, False),
            ("random-size, shared masks", "random-size", p_pd * d // 2, True, False),
            ("chain-rule (exact for PPCA)", "chain-rule", 2, False, False),
        ]
        for label, est, p, share, nested in variants:
            t, r = best_of(lambda est=est, p=p, share=share, nested=nested, model=model, x=x:
                           mptlml.estimate_lml(model, x, est, num_masks=p, seed=0,
                                               share_masks=share, nested=nested),
                           1, warm_up=False)
            rows.append({"D": d, "variant": label, "P": p, "time_s": t, "se": r.stderr,
                         "err": r.mean - r.exact})
        target = 0.01
        for r in rows[-len(variants):]:
            se = r["se"] if r["se"] == r["se"] else 0.0
            r["time_to_se"] = r["time_s"] * max(se / target, 1e-300) ** 2 if se > 0 else r[
                "time_s"]
            r["target_se"] = target
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller P and fewer repeats")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per case")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's choice, one per core)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    repeats = args.repeats or (1 if args.quick else 3)
    kept = keep_heap()  # the one opt-in (mptlml.settings); before any timing, for both
    print(f"mptlml benchmark: torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
          f"load average {os.getloadavg()[0]:.2f} at start")
    print("allocator: " + ("glibc mmap/trim thresholds raised by mptlml.settings.keep_heap before "
                           "any timing (naive loop and estimate_lml alike)" if kept else
                           "left alone (not glibc, or MPTLML_KEEP_HEAP=0)"))
    t_start = time.perf_counter()
    results = []
    for dtype in (torch.float64, torch.float32):
        for name, d, est, p, target in CASES:
            if args.quick:
                p = max(1, p // 5)
                name = name.replace(f"P={p * 5}", f"P={p}")
            r = run_case(name, d, est, p, target, dtype, args.quick, repeats)
            results.append(r)
            ok = "meets" if r["ratio_shared"] >= target else "MISSES"
            print(f"\n[{r['dtype']}] {r['case']}")
            print(f"  naive paper loop      {r['naive_s']:9.3f} s   ({r['naive_note']})")
            print(f"  estimate_lml shared   {r['shared_s']:9.4f} s   "
                  f"ratio {r['ratio_shared']:7.1f}x   target >= {target}x: {ok}")
            print(f"  estimate_lml per-datum{r['indep_s']:9.4f} s   (100x the (mask, datum) "
                  f"pairs; SE {r['se_indep']:.4f} vs {r['se_shared']:.4f} shared; ratio to a "
                  f"naive loop over the same pairs {100 * r['naive_s'] / r['indep_s']:.0f}x)")
            if r["nested_s"] is not None:
                print(f"  estimate_lml nested   {r['nested_s']:9.4f} s   ratio "
                      f"{r['naive_s'] / r['nested_s']:7.1f}x   (same P; SE {r['se_nested']:.4f} "
                      f"vs {r['se_shared']:.4f} independent shared masks)")
            print(f"  estimates: shared {r['est_shared']:.3f}, per-datum {r['est_indep']:.3f}, "
                  f"exact {r['exact']:.3f}")
    print("\nEqual standard error (float64, N=100, K=2): time to reach SE = 0.01 nats "
          "(extrapolated: t * (SE/0.01)^2)")
    print(f"  {'D':>4}  {'variant':32} {'P':>6} {'time s':>9} {'SE':>9} {'err':>9} "
          f"{'t@SE s':>10}")
    for r in equal_se_table(args.quick):
        print(f"  {r['D']:>4}  {r['variant']:32} {r['P']:>6} {r['time_s']:9.4f} {r['se']:9.4f} "
              f"{r['err']:9.4f} {r['time_to_se']:10.4f}")
    print(f"\ntotal benchmark time {time.perf_counter() - t_start:.1f} s, "
          f"load average {os.getloadavg()[0]:.2f} at end")


if __name__ == "__main__":
    main()
