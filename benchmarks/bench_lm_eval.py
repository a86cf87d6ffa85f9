"""The lm-eval backend: time per request, batched across documents against one at a time.

lm-eval hands a backend all its requests at once; :class:`mptlml.lm_eval.MPTLM`
scores them in one mptlml call (every question's masked inputs bucketed by
length under one token budget). This script times the same requests through
the backend three ways::

    PYTHONPATH=src python benchmarks/bench_lm_eval.py --docs 16 --texts 16

- **batched**: all requests in one ``loglikelihood`` (``loglikelihood_rolling``) call;
- **per document**: one call per document (its K candidates together, on common
  masks), as an adapter that loops over documents would;
- **one request at a time**: one call per request (each candidate alone).

The multiple-choice requests are a germline task built from the bundled V genes
(the first 22 residues as context; the true next three against the next three of
other genes), the rolling requests 20-residue fragments; the model is AntiBERTy.
``--model tiny`` takes a random 2-layer BERT of a 30-word vocabulary (saved to a
temporary directory) and random sentences of its words instead: a model so small
that a forward pass costs little more than its call, where batching shows most on
a CPU. A question's masks come from the
seed and its own texts, so the batched and per-document answers must be the same
numbers (checked before any time is printed); one request at a time scores each
candidate as its own question (other masks, no common masks), so only its
time and cost are shown. ``is_greedy`` (greedy unmasking) is timed apart:
``--greedy`` turns it on (off by default here: it is the same work in every mode).

The three are timed the same way (``benchmarks/_timing.py``: ``--warmup`` untimed
calls each, ``--repeats`` interleaved timed calls, the median). ``--smoke`` runs
two documents once.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import check_same, time_sides  # noqa: E402
from lm_eval.api.instance import Instance  # noqa: E402

from mptlml.data import bundled_antibodies  # noqa: E402
from mptlml.lm_eval import MPTLM  # noqa: E402
from mptlml.models import MaskedLM  # noqa: E402


def word_requests(num_docs: int, num_texts: int, candidates: int) -> tuple[list, list]:
    """lm-eval Instances over the tiny model's words: 6-word contexts, 2-word candidates."""
    from mlm_helpers import WORDS

    rng = np.random.default_rng(0)

    def words(n: int) -> str:
        return " ".join(rng.choice(WORDS, n))

    mc = [Instance("loglikelihood", {}, (ctx, " " + words(2)), i, ("words", d, 1))
          for d in range(num_docs) for ctx in [words(6)] for i in range(candidates)]
    rolling = [Instance("loglikelihood_rolling", {}, (words(8),), 0, ("sentences", d, 1))
               for d in range(num_texts)]
    return mc, rolling


def requests(num_docs: int, num_texts: int, candidates: int) -> tuple[list, list]:
    """lm-eval Instances: germline multiple-choice questions and rolling fragments."""
    genes = bundled_antibodies().texts
    step = max(1, len(genes) // max(num_docs, num_texts))
    picked = genes[::step]
    mc = []
    for d, g in enumerate(picked[:num_docs]):
        others = [h[22:25] for h in picked if h[22:25] != g[22:25]]
        choices = [g[22:25], *dict.fromkeys(others)][:candidates]
        for i, c in enumerate(choices):
            mc.append(Instance("loglikelihood", {}, (g[:22], " " + c), i, ("germline", d, 1)))
    rolling = [Instance("loglikelihood_rolling", {}, (g[30:50],), 0, ("fragments", d, 1))
               for d, g in enumerate(picked[:num_texts])]
    return mc, rolling


def per_document(fn, reqs: list) -> list:
    docs: dict[int, list] = {}
    for r in reqs:
        docs.setdefault(r.doc_id, []).append(r)
    return [x for d in sorted(docs) for x in fn(docs[d])]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--docs", type=int, default=16, help="multiple-choice documents")
    p.add_argument("--texts", type=int, default=16, help="rolling texts")
    p.add_argument("--candidates", type=int, default=4)
    p.add_argument("--num-masks", type=int, default=16)
    p.add_argument("--model", choices=["antiberty", "tiny"], default="antiberty")
    p.add_argument("--greedy", action="store_true", help="also compute is_greedy")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--smoke", action="store_true")
    a = p.parse_args(argv)
    if a.smoke:
        a.docs, a.texts, a.warmup, a.repeats = 2, 2, 0, 1
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.model == "tiny":
        from mlm_helpers import make_tiny_bert

        model = MaskedLM.from_pretrained(make_tiny_bert(Path(tempfile.mkdtemp()) / "tiny"))
        mc, rolling = word_requests(a.docs, a.texts, a.candidates)
    else:
        model = MaskedLM.antiberty()
        mc, rolling = requests(a.docs, a.texts, a.candidates)
    lm = MPTLM(model, num_masks=a.num_masks, seed=0, greedy=a.greedy)
    print(f"{model.name} on {model.device}, {torch.get_num_threads()} threads; "
          f"{a.docs} documents x {a.candidates} candidates, {len(rolling)} texts; "
          f"num_masks={a.num_masks}, greedy={a.greedy}")
    for label, reqs, fn in (("loglikelihood", mc, lm.loglikelihood),
                            ("loglikelihood_rolling", rolling, lm.loglikelihood_rolling)):
        sides = {"batched": lambda fn=fn, reqs=reqs: fn(reqs),
                 "per document": lambda fn=fn, reqs=reqs: per_document(fn, reqs),
                 "one request at a time": lambda fn=fn, reqs=reqs: [x for r in reqs
                                                                    for x in fn([r])]}
        if label == "loglikelihood_rolling":  # one request per document: the same two
            sides.pop("per document")
        before = len(lm.log.records)
        t = time_sides(sides, warmup=a.warmup, repeats=a.repeats)
        lm.log.records = lm.log.records[:before]
        first = [x[0] if isinstance(x, tuple) else x for x in t["batched"].result]
        if "per document" in t:
            other = [x[0] if isinstance(x, tuple) else x for x in t["per document"].result]
            worst = max(range(len(first)), key=lambda i: abs(first[i] - other[i]))
            print(check_same("largest |batched - per document| log-likelihood", first[worst],
                             other[worst], atol=1e-4))
        print(f"\n{label}: {len(reqs)} requests")
        base = t["batched"].median / len(reqs)
        for side, timing in t.items():
            per = timing.median / len(reqs)
            print(f"  {side:22s} {per * 1e3:9.2f} ms per request "
                  f"({timing.describe()})  x{per / base:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
