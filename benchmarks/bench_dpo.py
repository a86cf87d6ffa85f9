"""DPO on paired MPT bounds: the margin's variance per mask, common masks vs independent vs VRPO.

A small masked LM is trained here (nothing is downloaded)::

    PYTHONPATH=src python benchmarks/bench_dpo.py            # ~10 min on 2 busy CPU cores
    PYTHONPATH=src python benchmarks/bench_dpo.py --smoke    # seconds: only checks that it runs

**Task.** Letters a-h. A prompt is 3 letters; a *chosen* response is 8 letters drawn from
the prompt's letters, a *rejected* one 8 letters drawn from the other letters. The
reference is a 2-layer BERT (hidden 32) trained by MPT (:class:`mptlml.hf.MPTTrainer`)
for ``--sft-steps`` on prompt + response texts whose responses are chosen-like or
rejected-like with equal chance, so it has no preference to start with; the policy is
that model after ``--dpo-steps`` of :class:`mptlml.hf.MPTDPOTrainer` (beta 0.1, 8 masks
per response and step, the allocation learned).

**Variance.** After ``--early-steps`` (the policy near its reference) and after
``--dpo-steps``, on ``--pairs`` held-out pairs, each margin is estimated ``--repeats`` times
(other seeds) by each scheme at equal masks: ``num_masks = 8`` draws plus the whole
response (9 masked inputs per response and model) for the paired schemes, 9 draws for
VRPO's rule (one mask per size M ~ U{1..T}, weight T / M, shared by policy and
reference, chosen and rejected independent). Reported: the variance of the margin over
repeats times the masked inputs per response (the *variance per mask*: what one masked
input buys), the mean over pairs, and the ratio to common masks; the mean squared
reported SE over that variance (1: the SE is calibrated).

**Before / after.** Held-out implicit reward accuracy (share of pairs with margin > 0,
a tie counting one half) before training (policy = reference: every margin exactly 0 on
common masks) and after; and :func:`mptlml.compare`'s choice between chosen and rejected
(their conditional bounds on common masks) under the reference and under the policy.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

LETTERS = "abcdefgh"


def make_pairs(n: int, seed: int, length: int = 8) -> list[dict[str, str]]:
    """Preference pairs: chosen letters from the prompt's, rejected ones from the others."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        prompt = rng.sample(LETTERS, 3)
        other = [c for c in LETTERS if c not in prompt]
        out.append({"prompt": " ".join(prompt),
                    "chosen": " " + " ".join(rng.choice(prompt) for _ in range(length)),
                    "rejected": " " + " ".join(rng.choice(other) for _ in range(length))})
    return out


def train_reference(workdir: Path, steps: int, seed: int = 0):
    """A tiny BERT trained by MPT on prompt + response texts, half of each kind."""
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast, TrainingArguments

    from mptlml.hf import DataCollatorForMPT, MPTTrainer

    (workdir / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
                                                  *LETTERS]) + "\n")
    tok = BertTokenizerFast(str(workdir / "vocab.txt"))
    rng = random.Random(seed + 1)
    texts = [p["prompt"] + (p["chosen"] if rng.random() < 0.5 else p["rejected"])
             for p in make_pairs(2048, seed + 2)]
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=16,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(seed)
    model = BertForMaskedLM(cfg)
    args = TrainingArguments(str(workdir / "sft"), max_steps=steps, per_device_train_batch_size=32,
                             learning_rate=3e-3, report_to=[], save_strategy="no",
                             logging_strategy="no", use_cpu=True, disable_tqdm=True, seed=seed)
    MPTTrainer(model=model, args=args, train_dataset=[tok(t) for t in texts],
               data_collator=DataCollatorForMPT(tok, seed=seed)).train()
    return model.eval(), tok


def accuracy(margins: np.ndarray) -> float:
    """Share of margins > 0, a tie counting one half."""
    return float(np.mean((margins > 0) + 0.5 * (margins == 0)))


def variance_table(policy, reference, pairs, repeats: int, density) -> list[dict]:
    """Per scheme: variance per mask of the margin (mean over pairs) and SE calibration."""
    from mptlml.hf import EncodedPairs, encode_pairs, preference_bounds

    e = encode_pairs(policy, [p["prompt"] for p in pairs], [p["chosen"] for p in pairs],
                     [p["rejected"] for p in pairs])
    k = len(pairs)
    reps = EncodedPairs(e.chosen * repeats, e.chosen_context * repeats,
                        e.rejected * repeats, e.rejected_context * repeats)
    rows = []
    for label, kw in (("common masks, learned allocation (MPTDPOTrainer)",
                       {"masks": "common", "num_masks": 8, "density": density}),
                      ("common masks, uniform rates", {"masks": "common", "num_masks": 8}),
                      ("VRPO's rule (one mask per uniform size)", {"masks": "vrpo",
                                                                   "num_masks": 9}),
                      ("independent masks", {"masks": "independent", "num_masks": 8})):
        with torch.no_grad():
            b = preference_bounds(policy, reference, reps, beta=0.1, exact_length=1, seed=7,
                                  **kw)
        m = b.margin.numpy().reshape(repeats, k)
        se = b.margin_se.reshape(repeats, k)
        per_response = b.masked_rows / (2 * len(reps))
        var = m.var(0, ddof=1)
        rows.append({"scheme": label, "masks": per_response,
                     "var_per_mask": float(np.mean(var * per_response)),
                     "calibration": float(np.mean((se ** 2).mean(0)) / np.mean(var))})
    base = rows[0]["var_per_mask"]
    for r in rows:
        r["ratio"] = r["var_per_mask"] / base
    return rows


def compare_choice(lm, pairs) -> tuple[float, float]:
    """compare's choice of chosen over rejected (share) and the mean bound difference."""
    import mptlml

    res = mptlml.compare(lm, [p["prompt"] for p in pairs],
                         [[p["chosen"], p["rejected"]] for p in pairs], num_masks=32,
                         max_masks=256, seed=0)
    diff = [float(s[0] - s[1]) for s in res.scores]
    return float(np.mean([c == 0 for c in res.choice])), float(np.mean(diff))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sft-steps", type=int, default=300)
    ap.add_argument("--dpo-steps", type=int, default=60)
    ap.add_argument("--early-steps", type=int, default=5,
                    help="also measure the variance at this step (policy near its reference)")
    ap.add_argument("--pairs", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=80)
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    if a.smoke:
        a.sft_steps, a.dpo_steps, a.early_steps, a.pairs, a.repeats = 5, 3, 1, 4, 6
    torch.set_num_threads(1)
    from transformers import TrainingArguments

    from mptlml.hf import MPTDPOTrainer, preference_bounds
    from mptlml.models import MaskedLM

    t0 = time.time()
    workdir = Path(tempfile.mkdtemp())
    ref_model, tok = train_reference(workdir, a.sft_steps)
    held = make_pairs(a.pairs, seed=99)
    args = TrainingArguments(str(workdir / "dpo"), max_steps=a.dpo_steps,
                             per_device_train_batch_size=16, learning_rate=2e-3, report_to=[],
                             save_strategy="no", logging_steps=max(a.dpo_steps // 3, 1),
                             use_cpu=True, disable_tqdm=True, seed=0)
    import copy

    from transformers import TrainerCallback

    early: dict = {}

    class Snapshot(TrainerCallback):  # the policy and allocation at --early-steps
        def on_step_end(self, args, state, control, model=None, **kw):
            if state.global_step == a.early_steps:
                early["model"] = copy.deepcopy(model).eval()

    trainer = MPTDPOTrainer(model=copy.deepcopy(ref_model), ref_model=ref_model, args=args,
                            train_dataset=make_pairs(2048, seed=5), processing_class=tok,
                            beta=0.1, num_masks=8, callbacks=[Snapshot()])
    policy, reference = trainer.policy_lm, trainer.ref_lm
    prompts = [p["prompt"] for p in held]

    def held_accuracy() -> float:
        with torch.no_grad():
            b = preference_bounds(policy, reference, prompts, [p["chosen"] for p in held],
                                  [p["rejected"] for p in held], beta=0.1, seed=3)
        return accuracy(b.margin.numpy())

    before = held_accuracy()
    ref_lm = MaskedLM(ref_model, tok)
    choice_ref = compare_choice(ref_lm, held)
    trainer.train()
    policy.model.eval()
    after = held_accuracy()
    choice_pol = compare_choice(MaskedLM(policy.model, tok), held)
    print(f"## DPO on paired MPT bounds ({time.time() - t0:.0f} s so far)\n")
    print("| | before (policy = reference) | after |")
    print("|---|---|---|")
    print(f"| held-out implicit reward accuracy ({len(held)} pairs) | {before:.0%} | {after:.0%} |")
    print(f"| compare chooses the chosen response | {choice_ref[0]:.0%} | {choice_pol[0]:.0%} |")
    print(f"| mean bound difference, chosen - rejected (nats) | {choice_ref[1]:.2f} | "
          f"{choice_pol[1]:.2f} |")
    logs = [h for h in trainer.state.log_history if "margin_mc_se" in h]
    print("\n| step | loss | rewards/accuracies | rewards/margins | rewards/margins_sd | "
          "margin_mc_se |")
    print("|---|---|---|---|---|---|")
    for h in logs:
        print(f"| {h['step']} | {h['loss']:.3f} | {h['rewards/accuracies']:.2f} | "
              f"{h['rewards/margins']:.3f} | {h['rewards/margins_sd']:.3f} | "
              f"{h['margin_mc_se']:.3f} |")
    rows = [(state, r) for state, pol in (
        (f"after {a.early_steps} DPO steps", MaskedLM(early["model"], tok)),
        (f"after {a.dpo_steps} DPO steps", policy))
        for r in variance_table(pol, reference, held, a.repeats, trainer.density)]
    cost = {r["masks"] for _, r in rows}
    if len(cost) != 1:
        raise RuntimeError(f"the schemes were not run at equal masks: {sorted(cost)}")
    print(f"\nevery scheme at {cost.pop():.0f} masked inputs per response and model\n")
    print("| state | scheme | margin variance per mask | vs common masks | mean SE² / variance |")
    print("|---|---|---|---|---|")
    for state, r in rows:
        print(f"| {state} | {r['scheme']} | {r['var_per_mask']:.4g} | {r['ratio']:.1f}x | "
              f"{r['calibration']:.2f} |")
    print(f"\nlearned rate density (10 bins): {np.round(trainer.density.mass, 3).tolist()}")
    print(f"total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
