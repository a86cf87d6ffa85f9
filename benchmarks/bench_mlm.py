"""Masked-LM scoring throughput (run by hand; not a test).

    python benchmarks/bench_mlm.py [--num-sequences 10] [--pll-sequences 4] [--bert-batches 3]
    python benchmarks/bench_mlm.py --smoke      # tiny sizes: checks that it runs

1. AntiBERTy on bundled germline V sequences: MPT-curve throughput (tokens/s of
   encoder input) against the bare encoder forward on the *same* padded batches.
2. PLL: the batched scorer against a naive loop, one masked copy per forward.
3. A randomly initialised BERT-base-sized model (12 layers, hidden 768, vocab
   30,522), 15% masking: LM head at masked positions only vs full logits.

Both sides of each comparison are timed the same way (``benchmarks/_timing.py``:
one warm-up call each, ``--repeats`` interleaved timed calls, the median), and
each comparison first checks that the two sides compute the same numbers:
(1) the curve's scores equal the masked log-probabilities computed from the
very batches the bare forward runs (plus the LM head); (2) the batched PLL
equals the naive loop's; (3) the masked-only head gives the full-logits
values.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from mptlml import mpt_curve, pll
from mptlml.data import bundled_antibodies
from mptlml.estimators.rates import mask_sizes
from mptlml.masks import sample_masks
from mptlml.models import MaskedLM
from mptlml.seeds import spawn as _spawn
from mptlml.settings import keep_heap

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import check_same, ratio, time_sides  # noqa: E402


def curve_batches(lm: MaskedLM, texts, rates, token_budget: int):
    """The padded batches the curve scorer runs (same masks, same bucketing).

    Returns the batches ``(input_ids, attention_mask, copies)``, where each copy
    is ``(sequence, rate index, masked positions in the row, targets)``, and the
    number of tokens.
    """
    ids = lm.encode(texts)
    off = len(lm.prefix)
    copies = []
    for i, t in enumerate(ids):
        g = torch.Generator().manual_seed(_spawn(0, i))
        m = sample_masks(len(t), torch.as_tensor(mask_sizes(len(t), rates)), generator=g)
        rows = lm.corrupt(t, m, g)
        for k in range(m.shape[0]):
            pos = m[k].nonzero().flatten()
            copies.append((rows[k], i, k, pos + off, t[pos]))
    copies.sort(key=lambda c: len(c[0]))
    batches, i = [], 0
    while i < len(copies):
        j = i + 1
        while j < len(copies) and (j - i + 1) * len(copies[j][0]) <= token_budget:
            j += 1
        tmax = len(copies[j - 1][0])
        x = torch.zeros(j - i, tmax, dtype=torch.long)
        a = torch.zeros(j - i, tmax, dtype=torch.long)
        for r, c in enumerate(copies[i:j]):
            x[r, :len(c[0])] = c[0]
            a[r, :len(c[0])] = 1
        batches.append((x, a, [c[1:] for c in copies[i:j]]))
        i = j
    return batches, sum(len(c[0]) for c in copies)


def reference_scores(lm: MaskedLM, batches, shape) -> np.ndarray:
    """S_hat per (sequence, rate) from the batches: mean log p of the masked targets."""
    out = np.full(shape, np.nan)
    with torch.inference_mode():
        for x, a, copies in batches:
            logp = lm.model(input_ids=x, attention_mask=a).logits.float().log_softmax(-1)
            for r, (i, k, pos, tgt) in enumerate(copies):
                out[i, k] = float(logp[r, pos, tgt].double().mean())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--num-sequences", type=int, default=10)
    ap.add_argument("--rate-step", type=float, default=0.02)
    ap.add_argument("--pll-sequences", type=int, default=4)
    ap.add_argument("--bert-batches", type=int, default=3)
    ap.add_argument("--bert-seq-len", type=int, default=128)
    ap.add_argument("--bert-batch-size", type=int, default=16)
    ap.add_argument("--token-budget", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat")
    args = ap.parse_args()
    keep_heap()  # opt in to glibc's larger heap thresholds (mptlml.settings), as the CLI does
    if args.smoke:
        args.num_sequences, args.rate_step, args.pll_sequences = 2, 0.3, 1
        args.bert_batches, args.bert_seq_len, args.bert_batch_size, args.repeats = 1, 16, 2, 1
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"device {'cuda' if torch.cuda.is_available() else 'cpu'}")

    # 1. curve vs bare forward -------------------------------------------------
    lm = MaskedLM.antiberty()
    texts = bundled_antibodies(args.num_sequences).texts
    rates = [round(r, 4) for r in torch.arange(args.rate_step, 0.99 + 1e-9,
                                               args.rate_step).tolist()]
    batches, ntok = curve_batches(lm, texts, rates, args.token_budget)
    base = lm.model.base_model

    def bare():
        with torch.inference_mode():
            for x, a, _ in batches:
                base(input_ids=x, attention_mask=a)

    def curve():
        return mpt_curve(lm, texts, rates=rates, seed=0, token_budget=args.token_budget)

    ref = reference_scores(lm, batches, (len(texts), len(rates)))
    res = curve()
    print(check_same("curve scores vs the bare batches' masked log-probs (max |diff|)",
                     float(np.abs(res.per_sample.numpy() - ref).max()), 0.0, atol=1e-4))
    t = time_sides({"bare": bare, "curve": curve}, warmup=1, repeats=args.repeats)
    t_bare, t_curve = t["bare"].median, t["curve"].median
    print(f"[1] AntiBERTy curve: {len(texts)} sequences x {len(rates)} rates = "
          f"{len(texts) * len(rates)} masked copies, {ntok} tokens")
    print(f"    bare encoder forward {ntok / t_bare:8.0f} tok/s ({t_bare:.2f} s)")
    print(f"    MPT curve            {ntok / t_curve:8.0f} tok/s ({t_curve:.2f} s)  "
          f"ratio {ratio(t['bare'], t['curve']):.3f}x of bare")

    # 2. PLL: batched vs one masked copy per forward ----------------------------
    ptexts = texts[:args.pll_sequences]
    ids = lm.encode(ptexts)
    ncopies = sum(len(t) for t in ids)
    pre, suf = torch.tensor(lm.prefix, dtype=torch.long), torch.tensor(lm.suffix,
                                                                        dtype=torch.long)
    off = len(lm.prefix)

    def naive():
        out = []
        with torch.inference_mode():
            for t in ids:
                total = 0.0
                for j in range(len(t)):
                    x = torch.cat([pre, t, suf])[None].clone()
                    x[0, j + off] = lm.mask_token_id
                    total += float(lm.model(input_ids=x).logits[0, j + off].float()
                                   .log_softmax(-1)[t[j]])
                out.append(total)
        return np.array(out)

    def batched():
        return np.asarray(pll(lm, ptexts, token_budget=args.token_budget), dtype=np.float64)

    print(check_same("PLL, batched vs naive loop (max |diff| per sequence)",
                     float(np.abs(batched() - naive()).max()), 0.0, atol=1e-3))
    t = time_sides({"naive": naive, "pll": batched}, warmup=1, repeats=args.repeats)
    print(f"[2] PLL of {len(ptexts)} sequences ({ncopies} masked copies): batched "
          f"{t['pll'].median:.2f} s, one copy per forward {t['naive'].median:.2f} s, "
          f"speed-up {ratio(t['naive'], t['pll']):.2f}x")

    # 3. masked-only head vs full logits, BERT-base-sized ----------------------
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    big = BertForMaskedLM(BertConfig(vocab_size=30522)).eval()
    b, t_len = args.bert_batch_size, args.bert_seq_len
    g = torch.Generator().manual_seed(0)
    data = []
    for _ in range(args.bert_batches):
        x = torch.randint(1000, 30522, (b, t_len), generator=g)
        m = torch.rand(b, t_len, generator=g) < 0.15
        m[:, 0] = m[:, -1] = False
        y = x.clone()
        x[m] = 103
        data.append((x, m, y))

    def masked_only():
        out = []
        with torch.inference_mode():
            for x, m, y in data:
                h = big.bert(input_ids=x)[0]
                out.append(big.cls(h[m]).float().log_softmax(-1).gather(1, y[m][:, None]))
        return torch.cat(out)

    def full_logits():
        out = []
        with torch.inference_mode():
            for x, m, y in data:
                out.append(big(input_ids=x).logits.float().log_softmax(-1)[m]
                           .gather(1, y[m][:, None]))
        return torch.cat(out)

    print(check_same("masked-only head vs full logits (max |diff| of log-probs)",
                     float((masked_only() - full_logits()).abs().max()), 0.0, atol=1e-4))
    t = time_sides({"full": full_logits, "masked": masked_only}, warmup=1,
                   repeats=args.repeats)
    t_full, t_mask = t["full"].median, t["masked"].median
    ntok = args.bert_batches * b * t_len
    print(f"[3] BERT-base-sized random init, vocab 30522, 15% masked, {args.bert_batches} "
          f"batches of {b}x{t_len}: full logits {ntok / t_full:.0f} tok/s ({t_full:.2f} s), "
          f"masked-only head {ntok / t_mask:.0f} tok/s ({t_mask:.2f} s), "
          f"speed-up {ratio(t['full'], t['masked']):.2f}x")


if __name__ == "__main__":
    main()
