"""End-to-end GRPO of a tiny masked LM on MPT bounds: a task it rarely solves at first.

A 2-layer BERT (random weights, built here; nothing downloaded) completes prompts
``"<frame> X"`` with 4 tokens; the reward is the share of them equal to the word that X
asks for (cat -> red, dog -> blue, house -> big, tree -> small), which a random model earns
about once in the vocabulary's size. :class:`mptlml.hf.MPTGRPOTrainer` trains it
(8 completions per prompt, 2 prompts per step, common masks on the policy, the old
policy and the adapter-free reference: stratified draws with the whole-completion row as
their control variate); the held-out reward (other frames, greedy
completions) is measured before and after. Runs in a few minutes on 2 CPU cores::

    PYTHONPATH=src python benchmarks/example_grpo.py --steps 60

The guide ``docs/guides/grpo.md`` shows its log.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

WORDS = ("the a my one cat dog sat on mat ran far away big small red blue house tree and "
         "or but with under over is was").split()
ANSWER = {"cat": "red", "dog": "blue", "house": "big", "tree": "small"}
TARGETS = tuple(ANSWER)
TRAIN_FRAMES = ("the", "my", "one")
HELD_OUT_FRAMES = ("a", "big small", "under the")
LENGTH = 4


def build(path: Path, seed: int):
    """A random 2-layer BERT masked LM and its word-level WordPiece tokenizer."""
    from transformers import BertConfig, BertForMaskedLM, BertTokenizer

    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
                                               *WORDS]) + "\n")
    tok = BertTokenizer(str(path / "vocab.txt"), do_lower_case=True)
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2,
                     num_attention_heads=4, intermediate_size=128, max_position_embeddings=32,
                     initializer_range=0.02)
    return BertForMaskedLM(cfg), tok


def reward(prompts, completions, **_):
    """Share of the completion's words equal to the answer to the prompt's last word."""
    out = []
    for p, c in zip(prompts, completions, strict=True):
        target, words = ANSWER[p.split()[-1]], c.split()
        out.append(sum(w == target for w in words) / LENGTH)
    return out


def held_out_reward(model, tok) -> float:
    """Mean reward of greedy completions of the held-out prompts."""
    from mptlml import generate
    from mptlml.models import MaskedLM

    lm = MaskedLM(model, tok)
    prompts = [f"{f} {t}" for f in HELD_OUT_FRAMES for t in TARGETS]
    special = set(lm.special_ids)
    allowed = [i for i in range(len(tok)) if i not in special]
    gen = generate(lm, prompts, max_new_tokens=LENGTH, allowed_ids=allowed)
    return float(np.mean(reward(prompts, gen.texts)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lora", action="store_true", help="train a peft LoRA adapter")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="2 steps: only checks that it runs")
    a = ap.parse_args()
    if a.smoke:
        a.steps = 2
    torch.set_num_threads(a.threads)
    from mptlml.hf import MPTGRPOConfig, MPTGRPOTrainer

    with tempfile.TemporaryDirectory() as tmp:
        model, tok = build(Path(tmp) / "tiny", a.seed)
        if a.lora:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(r=8, target_modules=["query", "value"]))
        before = held_out_reward(model, tok)
        data = [{"prompt": f"{f} {t}"} for f in TRAIN_FRAMES for t in TARGETS]
        args = MPTGRPOConfig(output_dir=str(Path(tmp) / "out"), num_generations=8,
                             per_device_train_batch_size=16, max_completion_length=LENGTH,
                             learning_rate=2e-3, beta=0.01, num_iterations=2,
                             num_masks=8, max_steps=a.steps, logging_steps=5,
                             report_to=[], seed=a.seed, save_strategy="no",
                             use_cpu=True, disable_tqdm=True, drift_length=LENGTH,
                             exact_length=0)
        trainer = MPTGRPOTrainer(model=model, reward_funcs=[reward], args=args,
                                 train_dataset=data, processing_class=tok)
        t0 = time.time()
        trainer.train()
        minutes = (time.time() - t0) / 60
        after = held_out_reward(trainer.model, tok)
    keys = ("reward", "reward_std", "kl", "logratio_mc_se", "kl_mc_se", "masked_inputs",
            "drift/bound_gap")
    print("| step | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for h in trainer.state.log_history:
        if "reward" in h:
            print(f"| {h['step']} | " + " | ".join(f"{h.get(k, float('nan')):.4g}" for k in keys)
                  + " |")
    print(f"\nheld-out reward (greedy): {before:.3f} before, {after:.3f} after "
          f"{a.steps} steps ({minutes:.1f} min)")


if __name__ == "__main__":
    main()
