"""The numbers of a fixed small set, saved to an ``.npz``: a reorganisation must leave them equal.

    PYTHONPATH=src python benchmarks/snapshot_numbers.py OUT.npz
    PYTHONPATH=src python benchmarks/snapshot_numbers.py OUT.npz --compare BEFORE.npz

Computes, with fixed seeds and one thread (so that the reductions are the same
on every run):

- per-sample estimates, standard errors and degrees of freedom of every dense
  estimator (several options each) on a PPCA fitted to scikit-learn's digits
  and on a Bernoulli latent-variable model;
- the dense MPT curve (points, standard errors, area), also at a target
  standard error, and the dense cumulative estimate at a target standard error;
- on a tiny random BERT (WordPiece tokenizer saved to a temporary directory)
  and on AntiBERTy with three short germline sequences: the PLL (and its
  whole-word and word-l2r variants on the BERT), the cumulative, Riemann and
  chain-rule estimates, the MPT curve (with its cumulative estimate and
  whole-word units on the BERT) and the cumulative estimate and curve at a
  target standard error;
- gradients of :class:`mptlml.objectives.MPTLoss` for a PPCA;
- draws of :class:`mptlml.hf.DataCollatorForMPT` (input ids, labels, weights).

Only the public front doors are used (``mptlml.estimate_lml``,
``mptlml.mpt_curve``, ``mptlml.pll``), so the script outlives a change of
the package's inside. ``--compare`` checks every array for exact equality
(``numpy.array_equal``, NaN equal to NaN) and names those that differ.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

import mptlml
from mptlml.data import bundled_antibodies
from mptlml.hf import DataCollatorForMPT
from mptlml.models import PPCA, BernoulliLVM, MaskedLM
from mptlml.objectives import MPTLoss

WORDS = ("the cat dog sat on a mat ran far away big small red blue house tree "
         "and or but with under over is was un ##happy ##ly").split()
TEXTS = ["the cat sat on a mat", "a big dog ran far away", "the small red house",
         "blue tree", "unhappy cat", "the dog was under the big tree"]


def _array(v: Any) -> np.ndarray:
    if isinstance(v, torch.Tensor):
        return v.detach().cpu().numpy()
    if v is None:
        return np.array(np.nan)
    return np.asarray(v)


class Snapshot(dict):
    """Arrays by name."""

    def put(self, name: str, value: Any) -> None:
        assert name not in self, name
        self[name] = _array(value)

    def put_estimate(self, name: str, est: Any) -> None:
        for f in ("per_sample", "per_sample_stderr", "mean", "stderr", "stderr_data",
                  "stderr_dof", "num_masked_rows", "num_model_calls", "num_masks",
                  "size_scores", "masks_per_size", "stop_reason"):
            v = getattr(est, f)
            self.put(f"{name}/{f}", str(v) if isinstance(v, str) else v)

    def put_curve(self, name: str, c: Any) -> None:
        for f in ("mean", "stderr", "per_sample", "per_sample_stderr", "area", "area_stderr",
                  "lml", "lml_stderr", "lml_stderr_mean", "lml_cumulative", "lml_cumulative_stderr",
                  "num_masked_rows", "num_model_calls", "sizes"):
            self.put(f"{name}/{f}", getattr(c, f))
        for k, v in sorted(c.extra.items()):
            self.put(f"{name}/extra/{k}", v)


def tiny_bert(path: Path) -> Path:
    """A random 2-layer BERT masked LM and its WordPiece tokenizer, saved to ``path``."""
    from transformers import BertConfig, BertForMaskedLM, BertTokenizer

    path.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = BertTokenizer(str(path / "vocab.txt"), do_lower_case=True)
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=64,
                     initializer_range=0.5)
    torch.manual_seed(0)
    BertForMaskedLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def dense(snap: Snapshot) -> None:
    from sklearn.datasets import load_digits

    digits = load_digits().data.astype(np.float64)[:300]
    ppca = PPCA.fit(digits, 4)
    x = digits[:40]
    small = PPCA.fit(digits[:, 20:30], 2)  # D = 10: every mask can be enumerated
    xs = digits[:30, 20:30]
    bern = BernoulliLVM.random(10, 1, seed=0)
    xb = bern.sample(30, generator=1)
    runs = [
        ("cumulative", {"num_masks": 3}),
        ("cumulative", {"num_masks": 3, "share_masks": True}),
        ("cumulative", {"num_masks": 3, "nested": True}),
        ("cumulative", {"num_masks": 2, "nested": True, "share_masks": True}),
        ("random-size", {"num_masks": 8}),
        ("random-size", {"num_masks": 8, "share_masks": True}),
        ("random-size", {"num_masks": 8, "stratified": True}),
        ("adaptive-size", {"num_masks": 8}),
        ("fixed-rate", {"num_masks": 6, "rate": 0.2}),
        ("fixed-rate", {"num_masks": 6, "mask_size": 3, "share_masks": True}),
        ("chain-rule", {"num_masks": 2}),
        ("chain-rule", {"num_masks": 2, "share_masks": True}),
    ]
    for label, model, data in (("ppca", ppca, x), ("ppca10", small, xs), ("bernoulli", bern, xb)):
        for k, (name, opts) in enumerate(runs):
            # an instance carries the options that estimate_lml does not take (stratified)
            inst = mptlml.estimators.create(name, **opts)
            est = mptlml.estimate_lml(model, data, inst, num_masks=inst.num_masks, seed=k)
            snap.put_estimate(f"dense/{label}/{name}/{k}", est)
        if label != "ppca":
            snap.put_estimate(f"dense/{label}/exhaustive",
                          mptlml.estimate_lml(model, data, "exhaustive"))
    snap.put_curve("dense/curve", mptlml.mpt_curve(ppca, x, num_masks=2, seed=0))
    snap.put_curve("dense/curve_sizes", mptlml.mpt_curve(ppca, x, num_masks=3, sizes=[1, 10, 40],
                                                      seed=1))
    snap.put_curve("dense/curve_nested",
                   mptlml.mpt_curve(ppca, x, num_masks=2, nested=True, seed=2))
    snap.put_curve("dense/curve_target", mptlml.mpt_curve(small, xs, target_se=0.05, seed=3))
    snap.put_estimate("dense/target/neyman",
                  mptlml.estimate_lml(small, xs, "cumulative", target_se=0.05, seed=4))
    snap.put_estimate("dense/target/uniform",
                  mptlml.estimate_lml(small, xs, "cumulative", target_se=0.05, seed=5,
                                      allocation="uniform"))
    snap.put_estimate("dense/target/budget",
                  mptlml.estimate_lml(small, xs, "cumulative", target_se=0.001, seed=6,
                                      max_masks=200))
    snap.put_estimate("dense/target/shared",
                  mptlml.estimate_lml(small, xs, "cumulative", target_se=0.2, seed=7,
                                      share_masks=True))


def gradients(snap: Snapshot) -> None:
    model = PPCA.random(8, 2, sigma2=0.3, seed=0)
    x = model.sample(25, generator=0)
    for k, (name, opts) in enumerate([("cumulative", {"num_masks": 2}),
                                      ("cumulative", {"num_masks": 2, "share_masks": True}),
                                      ("random-size", {"num_masks": 4}),
                                      ("fixed-rate", {"num_masks": 3, "rate": 0.3}),
                                      ("adaptive-size", {"num_masks": 4})]):
        model.zero_grad()
        loss = MPTLoss(model, name, **opts)
        for step in range(3):
            value = loss(x, generator=100 * k + step)
            (-value).backward()
        snap.put(f"grad/{name}/{k}/value", value)
        for pname, p in sorted(model.named_parameters()):
            if p.grad is not None:
                snap.put(f"grad/{name}/{k}/{pname}", p.grad)


def collator(snap: Snapshot, path: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    ex = [tok(s) for s in TEXTS]
    for k, opts in enumerate([{"estimator": "random-size"},
                              {"estimator": "random-size", "stratified": True},
                              {"estimator": "fixed-rate"},
                              {"estimator": "fixed-rate", "rate": 0.5, "corruption": "bert"},
                              {"estimator": "adaptive-size"}]):
        coll = DataCollatorForMPT(tok, seed=k, **opts)
        for draw in range(2):
            b = coll(ex)
            for key in ("input_ids", "mpt_labels", "mpt_weights"):
                snap.put(f"collator/{k}/{draw}/{key}", b[key])


def ragged(snap: Snapshot, label: str, lm: Any, texts: list[str], words: bool) -> None:
    p = f"ragged/{label}"
    snap.put(f"{p}/pll", mptlml.pll(lm, texts))
    if words:
        snap.put(f"{p}/pll_whole_word", mptlml.pll(lm, texts, whole_word=True))
        tokens = mptlml.pll(lm, texts, per_token=True, variant="word_l2r")
        snap.put(f"{p}/pll_l2r_total", tokens.total)
        for i, lp in enumerate(tokens.log_probs):
            snap.put(f"{p}/pll_l2r/{i}", lp)
    snap.put_estimate(f"{p}/cumulative", mptlml.estimate_lml(lm, texts, "cumulative", num_masks=2,
                                                         seed=0))
    snap.put_estimate(f"{p}/riemann", mptlml.estimate_lml(lm, texts, "riemann", num_masks=2,
                                                      rates=[0.2, 0.5, 0.8], seed=1))
    snap.put_estimate(f"{p}/chain_rule", mptlml.estimate_lml(lm, texts, "chain-rule", num_masks=2,
                                                         seed=2))
    snap.put_curve(f"{p}/curve", mptlml.mpt_curve(lm, texts, rates=[0.1, 0.4, 0.7, 0.95],
                                              num_masks=3, seed=3, cumulative=True))
    snap.put_curve(f"{p}/curve_p1", mptlml.mpt_curve(lm, texts, rates=[0.25, 0.5, 0.75],
                                                 num_masks=1, seed=4, nominal_length=100))
    if words:
        snap.put_curve(f"{p}/curve_whole_word",
                   mptlml.mpt_curve(lm, texts, rates=[0.3, 0.6, 0.9], num_masks=2, seed=5,
                                    whole_word=True, cumulative=True))
    snap.put_estimate(f"{p}/target", mptlml.estimate_lml(lm, texts, "cumulative", target_se=0.5,
                                                     num_masks=2, seed=6))
    snap.put_curve(f"{p}/curve_target", mptlml.mpt_curve(lm, texts, rates=[0.2, 0.5, 0.8],
                                                     target_se=0.5, seed=7))


def compare(now: dict[str, np.ndarray], path: Path) -> int:
    with np.load(path, allow_pickle=False) as z:
        before = {k: z[k] for k in z.files}
    only_before, only_now = sorted(set(before) - set(now)), sorted(set(now) - set(before))
    differ = sorted(k for k in set(before) & set(now)
                    if not (before[k].shape == now[k].shape and before[k].dtype.kind == now[k]
                            .dtype.kind and np.array_equal(before[k], now[k],
                                                           equal_nan=before[k].dtype.kind == "f")))
    print(f"{len(set(before) & set(now))} arrays in both; {len(differ)} differ; "
          f"{len(only_before)} only before; {len(only_now)} only now.")
    for k in differ:
        print(f"  DIFFERS {k}: before {before[k]!r} now {now[k]!r}")
    for k in only_before:
        print(f"  only before: {k}")
    for k in only_now:
        print(f"  only now: {k}")
    return 1 if differ or only_before else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="the .npz to write")
    ap.add_argument("--compare", type=Path, help="an earlier .npz: every array must be equal")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    snap = Snapshot()
    dense(snap)
    gradients(snap)
    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_bert(Path(tmp) / "bert")
        collator(snap, path)
        bert = MaskedLM.from_pretrained(path)
        ragged(snap, "bert", bert, TEXTS, words=True)
    antibodies = [s[:20] for s in bundled_antibodies(3).texts]
    ragged(snap, "antiberty", MaskedLM.antiberty(), antibodies, words=False)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(args.out, **snap)
    print(f"{len(snap)} arrays written to {args.out}")
    return compare(snap, args.compare) if args.compare else 0


if __name__ == "__main__":
    sys.exit(main())
