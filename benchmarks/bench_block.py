"""The block bound of a block-diffusion LM against BD3-LM's own NELBO estimator, at equal forwards.

On a tiny BD3-LM (:mod:`mptlml.models.tiny_bd3lm`, blocks of ``--block`` tokens, random
weights) and texts of random words, each text's block bound is estimated

- by mptlml (``estimate_lml(lm, texts, "learned-rate", num_masks=P)``): in every block the
  whole block once and P stratified rates (two per stratum), every block of a row in one
  x_t + x_0 forward; P + 1 forward rows per text (+ the enumerated masks of a short last
  block, counted); its reported SE^2, averaged over the seeds, beside its variance;
- by BD3-LM's estimator (its ``_forward_pass_diffusion`` with the log-linear schedule): per
  forward row one noise level t_b ~ U[1e-3, 1] per block (its ``_sample_t``, antithetic
  sampling off), each token of block b masked with probability t_b (the BOS never), the
  row's value ``sum_b (1 / t_b) sum_{j masked in b} log p(x_j | x_t, x_0)``; the mean of
  as many rows as mptlml's.

Both are scored by the same module through the same adapter (the same conditionals). Over
``--seeds`` seeds, the variance of each text's estimate; the ratio is the variance per
forward (and per FLOP: both use the one layout, 2L tokens per row) BD3-LM's estimator
needs over mptlml's. BD3-LM's estimator integrates t over [1e-3, 1] (its NELBO's
interval), mptlml's block bound is Proposition 1's sum over every mask size; their means
differ by that truncation, reported too.

It also measures a round's forwards and token passes (a FLOP proxy: the tiny model's
FLOPs are linear in tokens at these lengths) for all blocks of a sequence in one x_t + x_0
forward against recomputing the clean prefix for each block (the ``"prefix"`` layout).

    PYTHONPATH=src python benchmarks/bench_block.py [--seeds 30] [--texts 6] [--smoke]
"""

from __future__ import annotations

import argparse
import math
import tempfile
import warnings

import numpy as np
import torch

import mptlml
from mptlml.models import MaskedLM
from mptlml.models.tiny_bd3lm import save_tiny_bd3lm


def texts_of(n: int, lo: int, hi: int, seed: int, words: list[str]) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(words, size=int(rng.integers(lo, hi + 1))))
            for _ in range(n)]


def bd3lm_nelbo(lm: MaskedLM, ids: torch.Tensor, rows: int, g: torch.Generator,
                eps: float = 1e-3) -> float:
    """BD3-LM's estimate of the block bound of one text from ``rows`` forward rows."""
    spans = lm.block_spans([ids])[0]
    d = len(ids)
    t = torch.empty(rows, d, dtype=torch.float64)
    for a, e in spans:
        tb = torch.rand(rows, 1, generator=g, dtype=torch.float64) * (1 - eps) + eps
        t[:, a:e] = tb
    masks = torch.rand(rows, d, generator=g, dtype=torch.float64) < t
    lp = lm.block_position_log_probs([ids], [masks])[0]
    return float((lp / t * masks).sum(1).mean())


class TokenCounter:
    """A forward pre-hook counting the forwards and the token passes of a module."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.forwards, self.tokens = 0, 0
        module.register_forward_pre_hook(self.hook, with_kwargs=True)

    def hook(self, module, args, kwargs):
        x = kwargs.get("input_ids", args[0] if args else None)
        self.forwards += 1
        self.tokens += int(x.numel())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--length", type=int, default=64, help="the model's model_length")
    ap.add_argument("--texts", type=int, default=6)
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--num-masks", type=int, default=98, help="P: P + 1 forward rows per text")
    ap.add_argument("--init-std", type=float, default=0.5,
                    help="the random weights' spread (larger: more spread conditionals)")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    if a.smoke:
        a.texts, a.seeds, a.num_masks = 2, 3, 8
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", RuntimeWarning)
    d = tempfile.mkdtemp()
    words = "the cat dog sat on a mat ran far away big small red blue house tree".split()
    save_tiny_bd3lm(d, block_size=a.block, model_length=a.length, seed=0, words=words,
                    init_std=a.init_std)
    lm = MaskedLM.from_pretrained(d, trust_remote_code=True)
    texts = texts_of(a.texts, a.length // 2, a.length - 1, 0, words)
    ids = lm.encode(texts)

    ours, theirs, rows_ours, se2 = [], [], None, []
    for s in range(a.seeds):
        r = mptlml.estimate_lml(lm, texts, "learned-rate", num_masks=a.num_masks, seed=s)
        ours.append(r.per_sample.numpy())
        se2.append(r.per_sample_stderr.numpy() ** 2)
        rows_ours = r.num_masked_rows_per_sample.numpy()
        g = torch.Generator().manual_seed(10_000 + s)
        theirs.append([bd3lm_nelbo(lm, t, int(n), g) for t, n in zip(ids, rows_ours,
                                                                       strict=True)])
    ours, theirs = np.array(ours), np.array(theirs)
    v_ours, v_theirs = ours.var(0, ddof=1), theirs.var(0, ddof=1)
    print(f"tiny BD3-LM, B={a.block}, model_length={a.length}, init_std={a.init_std}, "
          f"{a.texts} texts, "
          f"{a.seeds} seeds, P={a.num_masks}\n")
    se2 = np.array(se2).mean(0)
    print("| text | tokens | blocks | forward rows | mptlml mean | BD3-LM mean | "
          "var mptlml | its mean SE^2 | var BD3-LM | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    ratios = v_theirs / v_ours
    for i, t in enumerate(ids):
        nb = len(lm.block_spans([t])[0])
        print(f"| {i} | {len(t)} | {nb} | {int(rows_ours[i])} | {ours[:, i].mean():.3f} | "
              f"{theirs[:, i].mean():.3f} | {v_ours[i]:.4f} | {se2[i]:.4f} | "
              f"{v_theirs[i]:.4f} | "
              f"{ratios[i]:.1f}x |")
    gm = float(np.exp(np.log(ratios).mean()))
    print(f"\nvariance ratio per forward (= per FLOP, one layout): geometric mean {gm:.1f}x, "
          f"range {ratios.min():.1f}x-{ratios.max():.1f}x")

    # forwards and token passes of one row of every block: x_t + x_0 vs the prefix per block
    counter = TokenCounter(lm.model)
    pre = MaskedLM(lm.model, lm.tokenizer, family="fast_dllm_v2", block_size=a.block,
                   mask_token_id=lm.mask_token_id)
    pre.prefix, pre.subs = list(lm.prefix), True
    print("\n| tokens | blocks | layout | forwards per row | token passes per row |")
    print("|---|---|---|---|---|")
    for n_tok in (a.length // 2 - 1, a.length - 1):
        t = torch.tensor(np.random.default_rng(1).integers(3, 3 + len(words), n_tok))
        nb = len(lm.block_spans([t])[0])
        m = torch.zeros(1, n_tok, dtype=torch.bool)
        for s0, _ in lm.block_spans([t])[0]:
            m[0, s0] = True  # one masked token in every block
        got = {}
        for name, model in (("x_t + x_0", lm), ("prefix per block", pre)):
            counter.forwards = counter.tokens = 0
            model.block_position_log_probs([t], [m], batch_size=1)
            got[name] = (counter.forwards, counter.tokens)
            print(f"| {n_tok} | {nb} | {name} | {counter.forwards} | {counter.tokens} |")
        a_, b_ = got["x_t + x_0"], got["prefix per block"]
        print(f"| {n_tok} | {nb} | saving | {b_[0] / a_[0]:.1f}x | {b_[1] / a_[1]:.2f}x "
              f"((n + 1) / 4 = {(nb + 1) / 4:.2f}) |")
    assert math.isfinite(gm)


if __name__ == "__main__":
    main()
