"""PLL against minicons' ``MaskedLMScorer`` (run by hand; not a test).

minicons is a peer, not a dependency: install it by hand
(``pip install -c constraints.txt minicons==0.3.39``). It calls
``tokenizer.batch_encode_plus``, which transformers 5 removed;
:func:`minicons_scorer` here aliases it to the tokenizer's ``__call__`` when
missing, so this runs in the project's environment::

    PYTHONPATH=src python benchmarks/bench_minicons.py --num-sequences 40

and, with no alias needed, in an environment on transformers 4.x (mptlml runs
there too)::

    python3 -m venv /tmp/mcenv
    /tmp/mcenv/bin/pip install -c constraints.txt minicons "transformers==4.57.6" \\
        antiberty==0.1.3 -e .
    /tmp/mcenv/bin/python benchmarks/bench_minicons.py --num-sequences 40

1. Equality: on a tiny random BERT saved to a temporary directory and on
   AntiBERTy saved with its tokenizer as a local directory (minicons loads
   both by path), ``mptlml.pll`` equals minicons' ``sequence_score`` with a
   sum reduction (the PLL) to 1e-4 nats per sequence.
2. Time of the PLL of the first ``--num-sequences`` bundled germline V
   sequences: minicons one sequence per call, minicons all sequences in one
   call (it pads every masked copy to the longest), and ``mptlml.pll``
   (all masked copies bucketed by length, sub-batched by a token budget).
   The three are timed the same way (``benchmarks/_timing.py``: ``--warmup``
   untimed calls each, ``--repeats`` interleaved timed calls, the median), and
   their PLLs must agree to 1e-4 nats per sequence before any ratio is printed.

``--smoke`` scores two sequences once: it checks that the benchmark runs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

import mptlml
from mptlml.data import bundled_antibodies
from mptlml.models import MaskedLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import check_same, ratio, time_sides  # noqa: E402

#: largest |mptlml.pll - minicons| per sequence (nats) for the two to count as equal
ATOL = 1e-4



def minicons_scorer(model_dir: Path | str) -> Any:
    """minicons' ``MaskedLMScorer`` for a local model directory, on the CPU.

    minicons 0.3.39 calls ``tokenizer.batch_encode_plus``, which transformers 5
    removed; for a list of texts it is the tokenizer's ``__call__``, so the
    scorer's tokenizer gets that alias when it lacks the method.
    """
    from minicons import scorer

    mc = scorer.MaskedLMScorer(str(model_dir), "cpu")
    if not hasattr(mc.tokenizer, "batch_encode_plus"):
        mc.tokenizer.batch_encode_plus = mc.tokenizer.__call__
    return mc


def minicons_pll(model: Any, texts: list[str], batch_size: int = 8) -> list[float]:
    """PLL of each text by minicons (sum reduction), from a directory or a scorer."""
    mc = minicons_scorer(model) if isinstance(model, str | Path) else model
    out: list[float] = []
    for s in range(0, len(texts), batch_size):
        out.extend(mc.sequence_score(texts[s:s + batch_size],
                                     reduction=lambda lp: lp.sum(0).item()))
    return out

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-sequences", type=int, default=10)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=1, help="untimed calls per side first")
    ap.add_argument("--repeats", type=int, default=1, help="timed calls per side")
    ap.add_argument("--smoke", action="store_true", help="two sequences, no warm-up")
    args = ap.parse_args(argv)
    mptlml.settings.keep_heap()  # opt in to glibc's larger heap thresholds, as the CLI does
    if args.smoke:
        args.num_sequences, args.warmup, args.repeats = 2, 0, 1
    try:
        import minicons  # noqa: F401
    except ImportError:
        print("minicons is not installed here: pip install -c constraints.txt "
              "minicons==0.3.39 (see the docstring).")
        return 2
    import transformers

    from mlm_helpers import SENTENCES, make_tiny_bert

    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.get_num_threads()} threads")
    tmp = Path(tempfile.mkdtemp(prefix="bench_minicons_"))

    # 1. equality on a tiny local BERT
    tiny = make_tiny_bert(tmp / "tiny")
    ours = mptlml.pll(MaskedLM.from_pretrained(tiny), SENTENCES)
    theirs = torch.tensor(minicons_pll(tiny, SENTENCES), dtype=torch.float64)
    print(f"tiny BERT, {len(SENTENCES)} sentences: "
          + check_same("max |mptlml.pll - minicons|", float((ours - theirs).abs().max()), 0.0,
                       atol=ATOL))

    # 2. AntiBERTy as a local directory
    lm = MaskedLM.antiberty()
    adir = tmp / "antiberty"
    lm.model.save_pretrained(adir)
    lm.tokenizer.save_pretrained(adir)
    seqs = list(bundled_antibodies(limit=args.num_sequences).texts)
    spaced = [" ".join(s) for s in seqs]  # minicons gets the residues as its tokenizer needs
    copies = sum(len(s) for s in seqs)
    print(f"AntiBERTy PLL of {len(seqs)} germline V sequences ({copies} masked copies), "
          f"{args.warmup} warm-up and {args.repeats} timed call(s) per side, median")
    mc = minicons_scorer(adir)
    t = time_sides({
        "mptlml.pll": lambda: mptlml.pll(lm, seqs),
        "minicons, one sequence per call": lambda: torch.tensor(minicons_pll(mc, spaced, 1),
                                                                dtype=torch.float64),
        f"minicons, {len(seqs)} sequences per call": lambda: torch.tensor(
            minicons_pll(mc, spaced, len(spaced)), dtype=torch.float64),
    }, warmup=args.warmup, repeats=args.repeats)
    ours_t = t["mptlml.pll"]
    for label, side in t.items():  # every side computes the same PLLs, checked first
        if side is not ours_t:
            print("  " + check_same(f"max |mptlml.pll - {label}|",
                                    float((ours_t.result - side.result).abs().max()), 0.0,
                                    atol=ATOL))
    for label, side in t.items():
        extra = "" if side is ours_t else f"   ({ratio(side, ours_t):.2f}x mptlml's time)"
        print(f"  {label:36s} {side.median:8.1f} s{extra}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
