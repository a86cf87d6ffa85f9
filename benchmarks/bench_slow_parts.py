"""Benchmark: the two slowest parts of ``mptlml reproduce all``, profiled, before vs after.

The full reproduction spends most of its time in two parts:

- ``mlm-training``: nine small BERTs (3 objectives x 3 seeds) trained for
  3,000 steps and evaluated on 297 held-out digits. Each run is seeded on its
  own, so the runs are independent jobs. Before: one process, one job after
  the other (torch's default threads), training through SDPA. After: the
  jobs in one worker process per core, one thread each (``workers``,
  ``num_threads``), training through the eager attention (the same
  operations as SDPA's CPU fallback with dropout). The script checks that
  the tables are identical with one worker and with two, and prints how far
  the eager attention's rounding moves the LMLs.
- ``antibody``: 111 sequences x 99 masking rates plus the PLL, for AntiBERTy
  pre-trained and randomly initialised. The script profiles it (where the
  time goes), measures the float32 matrix products it is made of against
  the machine's bfloat16 ones, and times a few sequences in float32 and in
  bfloat16 (``--dtype bfloat16``, which changes the arithmetic: the script
  prints how much the curve moves).

Run by hand (not a test)::

    python benchmarks/bench_slow_parts.py [--part mlm-training|antibody|both]
        [--steps 300] [--num-test 100] [--num-sequences 4] [--json OUT.json]
    python benchmarks/bench_slow_parts.py --smoke     # tiny: checks that it runs

Every side of a part runs in the same invocation, one after the other, on the
same machine state; the ratios are the figures to read, not the seconds.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import math
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from mptlml.reproduce import run_part  # noqa: E402


def _num(v: float | None) -> str:
    return "n/a" if v is None or not math.isfinite(v) else f"{v:.2f}"


def _table(res: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "train_s"} for r in res["table"]]


def bench_mlm_training(steps: int, num_test: int, out: Path) -> dict[str, Any]:
    """The same reduced-size mlm-training (3 objectives x 3 seeds) three ways, timed."""
    size = {"steps": steps, "num_test": num_test, "log_every": max(1, steps // 4),
            "warmup_steps": min(100, steps // 3), "variance_draws": 50,
            "bernoulli_epochs": 50}
    sides = {
        "before: 1 process, default threads, SDPA": {"workers": 1, "num_threads": None},
        "1 process, 1 thread, eager": {"workers": 1, "num_threads": 1},
        "after: default workers, 1 thread each, eager": {},
    }
    from transformers import BertForMaskedLM

    times, tables, workers = {}, {}, {}
    for i, (name, over) in enumerate(sides.items()):
        keep = BertForMaskedLM.set_attn_implementation
        if i == 0:  # the code before: trains with the model's own (SDPA) attention
            BertForMaskedLM.set_attn_implementation = lambda self, impl: None
        t0 = time.perf_counter()
        try:
            res = run_part("mlm-training", out / f"mlm{i}",
                                 overrides={**size, **over})["results"]
        finally:
            BertForMaskedLM.set_attn_implementation = keep
        times[name] = time.perf_counter() - t0
        tables[name], workers[name] = _table(res), res["workers"]
        print(f"  {name:45s} {times[name]:8.1f} s  ({res['workers']} process(es))", flush=True)
    names = list(sides)
    same = tables[names[1]] == tables[names[2]]
    print(f"  one process, 1 thread = worker processes, 1 thread each (exact): {same}")
    if not same:
        raise SystemExit("the worker processes changed the numbers")
    gap = max(abs(a["lml"] - b["lml"]) for a, b in zip(tables[names[0]], tables[names[2]],
                                                         strict=True))
    print(f"  largest |LML before - LML after| over the table: {gap:.3g} nats / image "
          "(the eager backward rounds in another order; training amplifies it)")
    base = times[names[0]]
    for name in names[1:]:
        print(f"  speed-up of '{name}' over the before side: {base / times[name]:.2f}x")
    return {"size": size, "seconds": times, "workers": workers, "identical": same,
            "largest_lml_change": gap,
            "speedup": {n: base / times[n] for n in names[1:]}}


def _gemm_gflops(dtype: torch.dtype, threads: int) -> float:
    """Throughput of AntiBERTy's largest product: (tokens x 512) @ (512 x 2048)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, w = torch.randn(4000, 512, dtype=dtype), torch.randn(2048, 512, dtype=dtype)
        torch.nn.functional.linear(a, w)
        best = math.inf
        for _ in range(8):
            t0 = time.perf_counter()
            torch.nn.functional.linear(a, w)
            best = min(best, time.perf_counter() - t0)
        return 2 * 4000 * 512 * 2048 / best / 1e9
    finally:
        torch.set_num_threads(before)


def bench_antibody(num_sequences: int, out: Path) -> dict[str, Any]:
    """Profile of the antibody part, GEMM throughput, float32 vs bfloat16 on a few sequences."""
    size = {"num_sequences": num_sequences, "progress": False}
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    f32 = run_part("antibody", out / "ab32", overrides=size)["results"]
    prof.disable()
    t32 = time.perf_counter() - t0
    stream = io.StringIO()
    stats = pstats.Stats(prof, stream=stream).sort_stats("tottime")
    stats.print_stats(8)
    total = sum(v[2] for v in stats.stats.values())  # type: ignore[attr-defined]
    share = {fn[2]: v[2] / total for fn, v in stats.stats.items()  # type: ignore[attr-defined]
             if fn[2] in ("<built-in method torch._C._nn.linear>",
                          "<built-in method torch._C._nn.scaled_dot_product_attention>",
                          "<built-in method torch._C._nn.gelu>")}
    print("\n".join(ln for ln in stream.getvalue().splitlines()
                    if "{" in ln or "ncalls" in ln))
    print("  share of the run's time in:")
    for k, v in share.items():
        print(f"    {k:60s} {v:6.1%}")
    gemm = {f"{dt}, {th} thread(s)": _gemm_gflops(getattr(torch, dt), th)
            for dt in ("float32", "bfloat16") for th in (1, 2)}
    for k, v in gemm.items():
        print(f"  GEMM (4000x512)@(512x2048) {k:22s} {v:7.1f} GFLOP/s")
    t0 = time.perf_counter()
    bf = run_part("antibody", out / "ab16", overrides={**size, "dtype": "bfloat16"})
    t16 = time.perf_counter() - t0
    moved = {m: bf["results"]["models"][m]["area"] - f32["models"][m]["area"]
             for m in f32["models"]}
    print(f"  float32 {t32:.1f} s, bfloat16 {t16:.1f} s: {t32 / t16:.2f}x; area moves by "
          + ", ".join(f"{m} {d:+.2f}" for m, d in moved.items())
          + " (area SE " + ", ".join(f"{m} {_num(f32['models'][m]['area_se'])}"
                                     for m in f32["models"]) + ")")
    return {"num_sequences": num_sequences, "seconds": {"float32": t32, "bfloat16": t16},
            "time_share": share, "gemm_gflops": gemm, "bfloat16_area_shift": moved}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=("mlm-training", "antibody", "both"), default="both")
    ap.add_argument("--steps", type=int, default=300, help="training steps per mlm-training run")
    ap.add_argument("--num-test", type=int, default=100, help="held-out digits (mlm-training)")
    ap.add_argument("--num-sequences", type=int, default=4, help="antibody sequences")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: checks that it runs")
    args = ap.parse_args(argv)
    if args.smoke:
        args.steps, args.num_test, args.num_sequences = 4, 12, 1
    out: dict[str, Any] = {"torch_threads": torch.get_num_threads()}
    with tempfile.TemporaryDirectory() as tmp:
        if args.part in ("mlm-training", "both"):
            print(f"mlm-training, {args.steps} steps, {args.num_test} held-out digits:")
            out["mlm-training"] = bench_mlm_training(args.steps, args.num_test, Path(tmp))
        if args.part in ("antibody", "both"):
            print(f"antibody, {args.num_sequences} sequences, 99 rates and the PLL:")
            out["antibody"] = bench_antibody(args.num_sequences, Path(tmp))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
