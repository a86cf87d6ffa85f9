"""Masked-LM scoring throughput (run by hand; not a test).

    python benchmarks/bench_mlm.py [--num-sequences 10] [--pll-sequences 4] [--bert-batches 3]

1. AntiBERTy on bundled germline V sequences: MPT-curve throughput (tokens/s of
   encoder input) against the bare encoder forward on the *same* padded batches.
2. PLL: the batched scorer against a naive loop, one masked copy per forward.
3. A randomly initialised BERT-base-sized model (12 layers, hidden 768, vocab
   30,522), 15% masking: LM head at masked positions only vs full logits.

Timings are wall-clock medians of ``--repeats`` runs with torch's default threads.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mptlml import mlm_curve, pll
from mptlml.data import bundled_antibodies
from mptlml.estimation.rates import mask_sizes
from mptlml.estimation.runner import seq_seed as _seq_seed
from mptlml.masks import sample_masks
from mptlml.models import MaskedLM
from mptlml.settings import keep_heap


def _median(fn, repeats: int) -> float:
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def curve_batches(lm: MaskedLM, texts, rates, token_budget: int):
    """The padded batches the curve scorer runs (same masks, same bucketing)."""
    ids = lm.encode(texts)
    inputs = []
    for i, t in enumerate(ids):
        g = torch.Generator().manual_seed(_seq_seed(0, i))
        m = sample_masks(len(t), torch.as_tensor(mask_sizes(len(t), rates)), generator=g)
        inputs.extend(lm.corrupt(t, m, g))
    inputs.sort(key=len)
    batches, i = [], 0
    while i < len(inputs):
        j = i + 1
        while j < len(inputs) and (j - i + 1) * len(inputs[j]) <= token_budget:
            j += 1
        tmax = len(inputs[j - 1])
        x = torch.zeros(j - i, tmax, dtype=torch.long)
        a = torch.zeros(j - i, tmax, dtype=torch.long)
        for r, t in enumerate(inputs[i:j]):
            x[r, :len(t)] = t
            a[r, :len(t)] = 1
        batches.append((x, a))
        i = j
    return batches, sum(len(t) for t in inputs)


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
    args = ap.parse_args()
    keep_heap()  # opt in to glibc's larger heap thresholds (mptlml.settings), as the CLI does
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
            for x, a in batches:
                base(input_ids=x, attention_mask=a)

    def curve():
        mlm_curve(lm, texts, rates=rates, seed=0, token_budget=args.token_budget)

    bare()  # warm-up
    t_bare, t_curve = _median(bare, args.repeats), _median(curve, args.repeats)
    print(f"[1] AntiBERTy curve: {len(texts)} sequences x {len(rates)} rates = "
          f"{len(texts) * len(rates)} masked copies, {ntok} tokens")
    print(f"    bare encoder forward {ntok / t_bare:8.0f} tok/s ({t_bare:.2f} s)")
    print(f"    MPT curve            {ntok / t_curve:8.0f} tok/s ({t_curve:.2f} s)  "
          f"ratio {t_bare / t_curve:.3f}x of bare")

    # 2. PLL: batched vs one masked copy per forward ----------------------------
    ptexts = texts[:args.pll_sequences]
    ids = lm.encode(ptexts)
    ncopies = sum(len(t) for t in ids)

    def naive():
        with torch.inference_mode():
            for t in ids:
                for j in range(len(t)):
                    x = torch.cat([torch.tensor([2]), t, torch.tensor([3])])[None].clone()
                    x[0, j + 1] = lm.mask_token_id
                    lm.model(input_ids=x).logits[0, j + 1].log_softmax(-1)[t[j]]

    t_naive = _median(naive, 1)
    t_pll = _median(lambda: pll(lm, ptexts, token_budget=args.token_budget), args.repeats)
    print(f"[2] PLL of {len(ptexts)} sequences ({ncopies} masked copies): batched {t_pll:.2f} s,"
          f" one copy per forward {t_naive:.2f} s, speed-up {t_naive / t_pll:.2f}x")

    # 3. masked-only head vs full logits, BERT-base-sized ----------------------
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    big = BertForMaskedLM(BertConfig(vocab_size=30522)).eval()
    b, t = args.bert_batch_size, args.bert_seq_len
    g = torch.Generator().manual_seed(0)
    data = []
    for _ in range(args.bert_batches):
        x = torch.randint(1000, 30522, (b, t), generator=g)
        m = torch.rand(b, t, generator=g) < 0.15
        m[:, 0] = m[:, -1] = False
        y = x.clone()
        x[m] = 103
        data.append((x, m, y))

    def masked_only():
        with torch.inference_mode():
            for x, m, y in data:
                h = big.bert(input_ids=x)[0]
                big.cls(h[m]).float().log_softmax(-1).gather(1, y[m][:, None])

    def full_logits():
        with torch.inference_mode():
            for x, m, y in data:
                big(input_ids=x).logits.float().log_softmax(-1)[m].gather(1, y[m][:, None])

    masked_only()
    t_full, t_mask = _median(full_logits, args.repeats), _median(masked_only, args.repeats)
    ntok = args.bert_batches * b * t
    print(f"[3] BERT-base-sized random init, vocab 30522, 15% masked, {args.bert_batches} "
          f"batches of {b}x{t}: full logits {ntok / t_full:.0f} tok/s ({t_full:.2f} s), "
          f"masked-only head {ntok / t_mask:.0f} tok/s ({t_mask:.2f} s), "
          f"speed-up {t_full / t_mask:.2f}x")


if __name__ == "__main__":
    main()
