"""Benchmark: ``mptlml.estimate_lml`` against a naive reference of the paper's algorithm.

Run by hand (not a test)::

    python benchmarks/bench_estimators.py            # full cases, ~5 minutes on 2 cores
    python benchmarks/bench_estimators.py --quick    # smaller P, well under a minute
    python benchmarks/bench_estimators.py --smoke    # tiny sizes: checks that it runs

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

Every side is timed the same way (``benchmarks/_timing.py``: the same warm-up
call, the same number of interleaved timed calls, the median), and before any
ratio is printed the benchmark checks that the two sides compute the same
number: on the same masks, the naive score of each mask equals
``model.masked_log_prob / M`` (to rounding); where the naive loop runs in
full, its estimate and ``estimate_lml``'s agree within 4 combined standard
errors (different random masks); otherwise the shared and per-datum
estimates agree within 4 combined standard errors, and the all-sizes ones
with the exact LML.

The last table compares estimators at equal standard error: the time each
would need to reach a given standard error of the mean LML, using
time ~ P and SE^2 ~ 1/P, i.e. ``t * (SE / target)^2``.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch

import mptlml
from mptlml.masks import fixed_rate_size
from mptlml.models import PPCA
from mptlml.settings import keep_heap

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import check_same, time_sides  # noqa: E402

LOG_2PI = math.log(2 * math.pi)


# ---------------------------------------------------------------------- naive reference
def naive_mask_score(w: torch.Tensor, mu: torch.Tensor, sigma2: float, x: torch.Tensor,
                     m: int, g: torch.Generator | None,
                     perm: torch.Tensor | None = None) -> torch.Tensor:
    """(1/M) sum_{j in mask} log p(x_j | x_R) for one random mask of size M shared by all data.

    The paper's algorithm, literally: permutation, dense S, inverse of S_RR.
    The mask is the first M entries of ``perm`` (a fresh random one by default).
    """
    d = w.shape[0]
    if perm is None:
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


def naive_subset(model: PPCA, x: torch.Tensor, sizes: list[int], seed: int = 0) -> None:
    """One naive mask of each of the given sizes (the timed subset at large D)."""
    w, mu, s2 = model.W.detach(), model.mu.detach(), float(model.sigma2)
    g = torch.Generator().manual_seed(seed)
    for m in sizes:
        naive_mask_score(w, mu, s2, x, m, g)


def naive_estimate(model: PPCA, x: torch.Tensor, sizes: list[int], p: int, seed: int = 0
                   ) -> tuple[float, float]:
    """Naive estimate of the mean LML (cumulative or fixed-rate), P shared masks per size.

    Returns the mean and its Monte Carlo standard error (over the P draws).
    """
    w, mu, s2 = model.W.detach(), model.mu.detach(), float(model.sigma2)
    g = torch.Generator().manual_seed(seed)
    d = w.shape[0]
    per = torch.stack([torch.stack([naive_mask_score(w, mu, s2, x, m, g) for _ in range(p)])
                       for m in sizes])  # (S, P, N)
    total = per.sum(0) if len(sizes) == d else d * per[0]  # (P, N)
    samples = total.double().mean(1)
    se = float(samples.std() / math.sqrt(p)) if p > 1 else float("nan")
    return float(samples.mean()), se


def check_same_masks(model: PPCA, x: torch.Tensor, sizes: list[int], seed: int = 2) -> str:
    """The naive score of a mask equals mptlml's ``masked_log_prob / M`` on the same mask."""
    w, mu, s2 = model.W.detach(), model.mu.detach(), float(model.sigma2)
    d = w.shape[0]
    g = torch.Generator().manual_seed(seed)
    worst = 0.0
    scale = 0.0
    with torch.no_grad():
        for m in sizes:
            perm = torch.randperm(d, generator=g)
            mask = torch.zeros(1, d, dtype=torch.bool)
            mask[0, perm[:m]] = True
            ref = naive_mask_score(w, mu, s2, x, m, None, perm=perm).double()
            ours = model.masked_log_prob(x, mask, None)[0].double() / m
            worst = max(worst, float((ref - ours).abs().max()))
            scale = max(scale, float(ref.abs().max()))
    tol = (1e-8 if x.dtype == torch.float64 else 1e-3) * max(1.0, scale)
    return check_same(f"{len(sizes)} shared masks, naive score vs masked_log_prob / M "
                      "(max over masks and data)", worst, 0.0, atol=tol)


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
#: ``--smoke``: the same three kinds of case at tiny sizes (D > 64 exercises the subset path)
SMOKE_CASES = [
    ("N=20 D=8 K=2 P=4 all sizes", 8, "cumulative", 4, 1),
    ("N=20 D=80 K=2 fixed M=12 P=4", 80, "fixed-rate", 4, 1),
    ("N=20 D=80 K=2 P=2 all sizes", 80, "cumulative", 2, 1),
]


def run_case(name: str, d: int, estimator: str, p: int, target: float, dtype: torch.dtype,
             quick: bool, repeats: int, warmup: int = 1, n: int = 100) -> dict:
    k, s2 = 2, 0.2
    model = PPCA.random(d, k, sigma2=s2, seed=0, dtype=dtype)
    x = model.sample(n, generator=1)
    msize = fixed_rate_size(0.15, d) if estimator == "fixed-rate" else None
    kw = {"rate": 0.15} if estimator == "fixed-rate" else {}
    num_masks_total = p * (1 if msize else d)  # masks per datum (or per batch, shared)

    sizes_all = [msize] if msize else list(range(1, d + 1))
    checks = [check_same_masks(model, x, stratified_sizes(d, 8, msize))]
    ours = {
        "shared": lambda: mptlml.estimate_lml(model, x, estimator, num_masks=p, seed=0,
                                              share_masks=True, **kw),
        "indep": lambda: mptlml.estimate_lml(model, x, estimator, num_masks=p, seed=0, **kw),
    }
    if estimator == "cumulative":
        ours["nested"] = lambda: mptlml.estimate_lml(model, x, estimator, num_masks=p, seed=0,
                                                     share_masks=True, nested=True)
    # naive: the full loop when cheap, a stratified subset of the masks otherwise
    if d <= 64:
        naive = {"naive": lambda: naive_estimate(model, x, sizes_all, p)}
        naive_note = f"all {num_masks_total} masks timed"
    else:
        sub = min(16 if quick else 48, num_masks_total)
        sub_sizes = stratified_sizes(d, sub, msize)
        naive = {"naive": lambda: naive_subset(model, x, sub_sizes)}
    t = time_sides({**naive, **ours}, warmup=warmup, repeats=repeats)
    est_shared, est_indep = t["shared"].result, t["indep"].result
    est_nested = t["nested"].result if "nested" in t else None
    if d <= 64:
        t_naive = t["naive"].median
        nv_mean, nv_se = t["naive"].result
        checks.append(check_same("naive estimate vs estimate_lml (shared masks), within 4 SE",
                                 est_shared.mean, nv_mean,
                                 atol=4 * math.hypot(nv_se, est_shared.stderr)))
    else:
        per_mask = t["naive"].median / len(sub_sizes)
        t_naive = per_mask * num_masks_total
        naive_note = (f"{len(sub_sizes)} of {num_masks_total} masks timed "
                      f"({per_mask * 1e3:.2f} ms each), extrapolated")
        checks.append(check_same("shared vs per-datum estimate, within 4 SE", est_shared.mean,
                                 est_indep.mean,
                                 atol=4 * math.hypot(est_shared.stderr, est_indep.stderr)))
        if estimator == "cumulative":
            checks.append(check_same("shared estimate vs exact LML, within 4 SE",
                                     est_shared.mean, est_shared.exact_lml,
                                     atol=4 * est_shared.stderr))
    t_shared, t_indep = t["shared"].median, t["indep"].median
    t_nested = t["nested"].median if "nested" in t else None
    return {
        "case": name, "dtype": str(dtype).replace("torch.", ""), "estimator": estimator,
        "P": p, "D": d, "N": n, "naive_s": t_naive, "naive_note": naive_note,
        "shared_s": t_shared, "indep_s": t_indep,
        "ratio_shared": t_naive / t_shared, "target": target, "checks": checks,
        "se_shared": est_shared.stderr, "se_indep": est_indep.stderr,
        "nested_s": t_nested, "se_nested": est_nested.stderr if est_nested else None,
        "exact": est_shared.exact_lml, "est_shared": est_shared.mean, "est_indep": est_indep.mean,
    }


def equal_se_table(quick: bool, repeats: int = 1, warmup: int = 1,
                   smoke: bool = False) -> list[dict]:
    """Time to reach a common SE of the mean LML, per estimator (D=512 and D=50, float64).

    All variants of one D are timed together by :func:`_timing.time_sides`
    (same warm-up, interleaved repeats, median).
    """
    rows = []
    # P per datum-mask variant and per shared variant (shared masks are cheaper per mask, so
    # they get more draws: a steadier SE estimate)
    grid = (((8, 4, 8), (32, 2, 4)) if smoke else
            ((50, 20, 100), (512, 2 if quick else 4, 4 if quick else 20)))
    for d, p_pd, p_sh in grid:
        model = PPCA.random(d, 2, sigma2=0.2, seed=0)
        x = model.sample(20 if smoke else 100, generator=1)
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
        sides = {label: (lambda est=est, p=p, share=share, nested=nested, model=model, x=x:
                         mptlml.estimate_lml(model, x, est, num_masks=p, seed=0,
                                             share_masks=share, nested=nested))
                 for label, est, p, share, nested in variants}
        timed = time_sides(sides, warmup=warmup, repeats=repeats)
        target = 0.01
        for label, est, p, _, _ in variants:
            r = timed[label].result
            if est == "chain-rule":  # exact for every order in PPCA
                check_same(f"D={d} {label} vs exact LML", r.mean, r.exact_lml, atol=1e-8,
                           rtol=1e-9)
            else:  # every unbiased variant estimates the same LML
                check_same(f"D={d} {label} vs exact LML, within 5 SE", r.mean, r.exact_lml,
                           atol=5 * r.stderr)
            se = r.stderr if r.stderr == r.stderr else 0.0
            t = timed[label].median
            rows.append({"D": d, "variant": label, "P": p, "time_s": t, "se": r.stderr,
                         "err": r.mean - r.exact_lml, "target_se": target,
                         "time_to_se": t * (se / target) ** 2 if se > 0 else t})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller P and fewer repeats")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes, one repeat: checks that the benchmark runs")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per case")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls per side first")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's choice, one per core)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    repeats = args.repeats or (1 if args.quick or args.smoke else 3)
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
        for name, d, est, p, target in (SMOKE_CASES if args.smoke else CASES):
            if args.quick:
                p = max(1, p // 5)
                name = name.replace(f"P={p * 5}", f"P={p}")
            r = run_case(name, d, est, p, target, dtype, args.quick or args.smoke, repeats,
                         warmup=args.warmup, n=20 if args.smoke else 100)
            results.append(r)
            ok = "meets" if r["ratio_shared"] >= target else "MISSES"
            print(f"\n[{r['dtype']}] {r['case']}")
            for c in r["checks"]:
                print(f"  {c}")
            print(f"  naive paper loop      {r['naive_s']:9.3f} s   ({r['naive_note']})")
            print(f"  estimate_lml shared   {r['shared_s']:9.4f} s   "
                  f"ratio {r['ratio_shared']:7.1f}x   target >= {target}x: {ok}")
            print(f"  estimate_lml per-datum{r['indep_s']:9.4f} s   ({r['N']}x the (mask, datum) "
                  f"pairs; SE {r['se_indep']:.4f} vs {r['se_shared']:.4f} shared; ratio to a "
                  f"naive loop over the same pairs "
                  f"{r['N'] * r['naive_s'] / r['indep_s']:.0f}x)")
            if r["nested_s"] is not None:
                print(f"  estimate_lml nested   {r['nested_s']:9.4f} s   ratio "
                      f"{r['naive_s'] / r['nested_s']:7.1f}x   (same P; SE {r['se_nested']:.4f} "
                      f"vs {r['se_shared']:.4f} independent shared masks)")
            print(f"  estimates: shared {r['est_shared']:.3f}, per-datum {r['est_indep']:.3f}, "
                  f"exact {r['exact']:.3f}")
    print(f"\nEqual standard error (float64, N={20 if args.smoke else 100}, K=2): time to "
          "reach SE = 0.01 nats "
          "(extrapolated: t * (SE/0.01)^2)")
    print(f"  {'D':>4}  {'variant':32} {'P':>6} {'time s':>9} {'SE':>9} {'err':>9} "
          f"{'t@SE s':>10}")
    for r in equal_se_table(args.quick, repeats=repeats, warmup=args.warmup, smoke=args.smoke):
        print(f"  {r['D']:>4}  {r['variant']:32} {r['P']:>6} {r['time_s']:9.4f} {r['se']:9.4f} "
              f"{r['err']:9.4f} {r['time_to_se']:10.4f}")
    print(f"\ntotal benchmark time {time.perf_counter() - t_start:.1f} s, "
          f"load average {os.getloadavg()[0]:.2f} at end")


if __name__ == "__main__":
    main()
