"""Masked inputs scored to reach a fixed standard error of the mean LML: uniform vs Neyman.

``estimate_lml(model, x, "cumulative", target_se=t, allocation=...)`` on PPCA
(D = 50 and 512; exact LML known), on a tiny random BERT and on AntiBERTy
(the first 4 bundled germline sequences at 0.3; skipped without the antiberty
package). Both run on the sequential engine (rounds, the allocation learned
between them); the table gives the masked inputs per datum, the SE reached and,
where the exact value is known, the z-score, and the saving: uniform's masked
inputs over Neyman's, as reached and at equal SE (``inputs x SE^2`` per seed,
averaged: the cost of one SE, the rounds stopping a little below the target at
different places). Not a timed test: run it by hand,

    PYTHONPATH=src python benchmarks/bench_allocation.py [--seeds 3] [--skip antiberty]
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

import mptlml
from mptlml.models import PPCA


def run(label, model, x, target, seeds, exact=None):
    rows, unit = [], []
    for alloc in ("uniform", "neyman"):
        cost, se, z = [], [], []
        for s in range(seeds):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                e = mptlml.estimate_lml(model, x, target_se=target, allocation=alloc, seed=s)
            cost.append(e.num_masked_rows / len(e.per_sample))
            se.append(e.stderr)
            if exact is not None:
                z.append((e.mean - exact) / e.stderr)
        rows.append((alloc, np.mean(cost), np.mean(se), np.mean(z) if z else float("nan")))
        unit.append(float(np.mean(np.asarray(cost) * np.asarray(se) ** 2)))
    ratio, equal_se = rows[0][1] / rows[1][1], unit[0] / unit[1]
    for alloc, c, s, z in rows:
        print(f"| {label} | {target} | {alloc} | {c:,.0f} | {s:.4f} | {z:+.2f} |"
              + (f" {ratio:.2f}x | {equal_se:.2f}x |" if alloc == "neyman" else " | |"),
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--skip", nargs="*", default=[])
    args = ap.parse_args()
    torch.set_num_threads(2)
    print("| model | target SE | allocation | masked inputs per datum | SE reached | mean z "
          "| uniform / neyman | at equal SE |")
    print("|---|---|---|---|---|---|---|---|")
    for d, n, target in ((50, 100, 0.05), (512, 20, 0.2)):
        if f"ppca{d}" in args.skip:
            continue
        m = PPCA.random(d, 10, sigma2=0.5, seed=0)
        x = m.sample(n, generator=0)
        exact = float(m.log_marginal(x).detach().mean())
        run(f"PPCA D={d}, N={n}", m, x, target, args.seeds, exact)
    if "tiny" not in args.skip:
        import sys
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.mlm_helpers import SENTENCES, make_tiny_bert

        from mptlml.models import MaskedLM
        with tempfile.TemporaryDirectory() as tmp:
            tiny = MaskedLM.from_pretrained(make_tiny_bert(Path(tmp) / "tiny"))
            run("tiny BERT, 5 sentences", tiny, SENTENCES, 0.2, args.seeds)
    if "antiberty" not in args.skip:
        try:
            from mptlml.data.text import bundled_antibodies
            from mptlml.models import MaskedLM
            ab = MaskedLM.antiberty()
        except ImportError:
            print("antiberty not installed: skipped")
            return
        texts = bundled_antibodies(4).texts
        run("AntiBERTy, 4 germline V", ab, texts, 0.3, args.seeds)


if __name__ == "__main__":
    main()
