"""PLL against minicons' ``MaskedLMScorer`` (run by hand; not a test).

minicons 0.3.39 (a test dependency) calls ``tokenizer.batch_encode_plus``,
which transformers 5 removed; ``tests/mlm_helpers.minicons_pll`` aliases it to
the tokenizer's ``__call__`` when missing, so this runs in the project's
environment::

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
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

import mptlml
from mptlml.data import bundled_antibodies
from mptlml.models import MaskedLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def _timed(fn):
    t = time.perf_counter()
    v = fn()
    return v, time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-sequences", type=int, default=10)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    mptlml.settings.keep_heap()  # opt in to glibc's larger heap thresholds, as the CLI does
    try:
        import minicons  # noqa: F401
    except ImportError:
        print("minicons is not installed here: pip install -e '.[test]' (see the docstring).")
        return 2
    import transformers

    from mlm_helpers import SENTENCES, make_tiny_bert, minicons_pll, minicons_scorer

    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.get_num_threads()} threads")
    tmp = Path(tempfile.mkdtemp(prefix="bench_minicons_"))

    # 1. equality on a tiny local BERT
    tiny = make_tiny_bert(tmp / "tiny")
    ours = mptlml.pll(MaskedLM.from_pretrained(tiny), SENTENCES)
    theirs = torch.tensor(minicons_pll(tiny, SENTENCES), dtype=torch.float64)
    gap = float((ours - theirs).abs().max())
    print(f"tiny BERT, {len(SENTENCES)} sentences: max |mptlml.pll - minicons| = {gap:.2e}")

    # 2. AntiBERTy as a local directory
    lm = MaskedLM.antiberty()
    adir = tmp / "antiberty"
    lm.model.save_pretrained(adir)
    lm.tokenizer.save_pretrained(adir)
    seqs = list(bundled_antibodies(limit=args.num_sequences).texts)
    spaced = [" ".join(s) for s in seqs]  # minicons gets the residues as its tokenizer needs
    copies = sum(len(s) for s in seqs)
    print(f"AntiBERTy PLL of {len(seqs)} germline V sequences ({copies} masked copies)")
    ours, t_ours = _timed(lambda: mptlml.pll(lm, seqs))
    mc = minicons_scorer(adir)
    one, t_one = _timed(lambda: minicons_pll(mc, spaced, 1))
    allb, t_all = _timed(lambda: minicons_pll(mc, spaced, len(spaced)))
    gap_one = float((ours - torch.tensor(one, dtype=torch.float64)).abs().max())
    gap_all = float((ours - torch.tensor(allb, dtype=torch.float64)).abs().max())
    print(f"  max |mptlml.pll - minicons| = {gap_one:.2e} (one per call), "
          f"{gap_all:.2e} (all in one call)")
    print(f"  mptlml.pll                         {t_ours:8.1f} s")
    print(f"  minicons, one sequence per call    {t_one:8.1f} s   "
          f"({t_one / t_ours:.2f}x mptlml's time)")
    print(f"  minicons, {len(seqs)} sequences per call  {t_all:8.1f} s   "
          f"({t_all / t_ours:.2f}x mptlml's time)")
    ok = max(gap, gap_one, gap_all) < 1e-4  # nats per sequence, as the docstring says
    print("equality:", "holds" if ok else "FAILS")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
