"""GRPO's log-ratio on MPT bounds: MSE against the exact log-ratio at equal forwards.

A small masked LM is trained here (nothing is downloaded)::

    PYTHONPATH=src python benchmarks/bench_grpo.py            # a few minutes on 2 CPU cores
    PYTHONPATH=src python benchmarks/bench_grpo.py --smoke    # seconds: only checks it runs

**Models.** Letters a-h; texts are a 3-letter prompt and a 6-letter continuation, a motif of
two of the prompt's letters said three times (its tokens depend on each other: the bound's
sizes differ, which a fully masked completion does not see). pi_old is a 2-layer BERT
(hidden 32) trained by MPT for ``--train-steps`` on such texts; pi_new is pi_old after one
exact GRPO-like step: one SGD step of ``--lr`` on ``mean_i A_i B(y_i | x_i)``, B the exact
conditional bound (every mask of the 6 tokens) and A_i = +1 / -1 for completions with /
without the prompt's first letter.

**Target.** For 6-letter completions sampled from pi_old by :func:`mptlml.generate`, the
exact log-ratio ``L = B_new(y|x) - B_old(y|x)`` (both bounds on all 63 masks).

**Estimators, about 8 forwards per completion and model** (each repeated with other seeds;
old and new always on the same masks, as every peer does):

- ``d1``: d1 / diffu-GRPO's one-step estimate ``sum_j log p(y_j | x~, all of y masked)``,
  x~ the prompt with each token masked at 15%: 8 draws of the prompt mask, averaged;
- ``coupled``: coupled-GRPO's mask and its complement (DiffuCoder), t ~ U(0.2, 0.8), each
  completion token masked with probability t in the first pass and in the second pass
  otherwise: every token's log-probability read once, from the pass where it is masked,
  summed (``sum_{j in M} log p + sum_{j not in M} log p``), 4 pairs averaged;
- ``mptlml``: :func:`mptlml.hf.policy_logratios` as it runs by default: stratified draws
  plus the whole completion's mask, whose per-token scores are the draws' control variate
  (P strata of one draw each; ``num_masks=7``: 8 forwards, the default; ``15``: 16); and,
  for comparison, the complementary
  draw with the control variate (``masks="complement"``, ``num_masks=4``: 5 forwards; ``8``: 9)
  and without it (the former default, ``masks="complement", control_variate=False``,
  ``num_masks=8``: 9 forwards).

Forwards are masked inputs scored per completion and model (one row of a model forward
each; the old and the new model score the same rows, so every estimator costs twice its
forwards in all). d1's 8 rows are 8 prompt masks; coupled-GRPO's 8 rows are 4 masks and
their complements (a pass with no token masked is dropped, so at most 8); mptlml's are its
P draws and the whole-completion row.

Reported: MSE of each against L over completions and repeats, forwards, the ratios to d1's
and coupled-GRPO's MSE, and MSE x forwards / 8 (the MSE at 8 forwards of an unbiased
estimator whose variance falls as 1 / forwards) with its ratio to coupled-GRPO's; and the
calibration of mptlml's ``logratio_stderr``: |z| > 2 per completion (on its ``dof``: 6 for
the control variate at ``num_masks=7``, 2 for the complementary draw) and of the mean over
the completions (the ``logratio_mc_se`` a trainer logs), and the mean se^2 over the MSE.

Measured (``--repeats 40 --completions 16 --train-steps 150``, 8.2 min on 2 shared CPU
cores; the table is in the guide "GRPO and generation"): coupled-GRPO's MSE 0.6018, d1's
5.33; the default (``num_masks=7``, 8 forwards) 0.2625, 0.436x coupled-GRPO's and 0.049x
d1's, |z| > 2 per completion 9.4%. With ``--seed 1``: 0.375x coupled-GRPO's, 0.034x d1's,
6.4%.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

LETTERS = list("abcdefgh")


def _texts(rng: random.Random, n: int) -> list[tuple[str, str]]:
    out = []
    for _ in range(n):
        p = rng.sample(LETTERS, 3)
        motif = [rng.choice(p), rng.choice(p)]
        out.append((" ".join(p), " ".join(motif * 3)))
    return out


def _model(path: Path, seed: int, steps: int):
    from transformers import BertConfig, BertForMaskedLM, BertTokenizer

    from mptlml.hf import DataCollatorForMPT, mpt_batch_loss

    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
                                               *LETTERS]) + "\n")
    tok = BertTokenizer(str(path / "vocab.txt"))
    torch.manual_seed(seed)
    model = BertForMaskedLM(BertConfig(vocab_size=len(tok), hidden_size=32,
                                       num_hidden_layers=2, num_attention_heads=2,
                                       intermediate_size=64, max_position_embeddings=16,
                                       hidden_dropout_prob=0.0,
                                       attention_probs_dropout_prob=0.0)).double()
    collate = DataCollatorForMPT(tok, seed=seed)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    rng = random.Random(seed)
    model.train()
    for _ in range(steps):
        batch = collate([tok(p + " " + c) for p, c in _texts(rng, 32)])
        loss = mpt_batch_loss(model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return model.eval(), tok


def _exact_bounds(lm, plans, model):
    return plans.bounds(plans.scores(lm, model, grad=torch.is_grad_enabled()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train-steps", type=int, default=300)
    ap.add_argument("--completions", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=60)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    if a.smoke:
        a.train_steps, a.completions, a.repeats = 5, 4, 3
    torch.set_num_threads(2)
    import copy

    from mptlml import generate
    from mptlml.hf import common_plans, masked_sums, policy_logratios
    from mptlml.hf.preference import plan_inputs
    from mptlml.models import MaskedLM

    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        old, tok = _model(Path(tmp) / "m", a.seed, a.train_steps)
    print(f"trained ({(time.time() - t0) / 60:.1f} min)", flush=True)
    lm_old = MaskedLM(old, tok)
    rng = random.Random(a.seed + 1)
    prompts = [p for p, _ in _texts(rng, a.completions)]
    allowed = [tok.convert_tokens_to_ids(c) for c in LETTERS]
    gen = generate(lm_old, prompts, max_new_tokens=6, temperature=1.0, seed=a.seed,
                   allowed_ids=allowed)
    ids = [torch.cat([p, c]) for p, c in zip(gen.prompt_ids, gen.ids, strict=True)]
    nctx = [len(p) for p in gen.prompt_ids]
    adv = torch.tensor([1.0 if tok.convert_tokens_to_ids(p.split()[0]) in c.tolist() else -1.0
                        for p, c in zip(prompts, gen.ids, strict=True)], dtype=torch.float64)
    exact = common_plans(lm_old, ids, nctx, exact_length=6)
    new = copy.deepcopy(old)
    lm_new = MaskedLM(new, tok)
    obj = (adv * _exact_bounds(lm_new, exact, new)).mean()
    obj.backward()
    with torch.no_grad():
        for q in new.parameters():
            q.add_(a.lr * q.grad)
            q.grad = None
        truth = (_exact_bounds(lm_new, exact, new) - _exact_bounds(lm_old, exact, old)).numpy()
    off = len(lm_old.prefix)

    def d1(seed: int) -> np.ndarray:
        g = torch.Generator().manual_seed(seed)
        out = []
        for full, n in zip(ids, nctx, strict=True):
            rows, tgts = [], []
            for _ in range(8):
                m = torch.zeros(len(full), dtype=torch.bool)
                m[n:] = True
                m[:n] = torch.rand(n, generator=g) < 0.15
                x, lab = plan_inputs(lm_old, full, 0, m[None], g)
                lab[0, off:off + n] = -100  # the prompt's masked tokens are not scored
                rows.append(x[0])
                tgts.append(lab[0])
            s = [masked_sums(mod, lm_old, rows, tgts, grad=False) for mod in (new, old)]
            out.append(float((s[0] - s[1]).mean()))
        return np.array(out)

    def coupled(seed: int) -> np.ndarray:
        g = torch.Generator().manual_seed(seed)
        out = []
        for full, n in zip(ids, nctx, strict=True):
            t_len = len(full) - n
            masks = []
            for _ in range(4):
                t = 0.2 + 0.6 * float(torch.rand(1, generator=g))
                m = torch.rand(t_len, generator=g) < t
                masks += [m, ~m]
            keep = [m for m in masks if m.any()]
            x, lab = plan_inputs(lm_old, full, n, torch.stack(keep), g)
            s = [masked_sums(mod, lm_old, list(x), list(lab), grad=False) for mod in (new, old)]
            out.append(float((s[0] - s[1]).sum() / 4))
        return np.array(out)

    def ours(num_masks: int, masks: str, control: bool):
        def run(seed: int) -> tuple[np.ndarray, np.ndarray]:
            r = policy_logratios(lm_new, lm_old, [p.tolist() for p in gen.prompt_ids],
                                 [c.tolist() for c in gen.ids], num_masks=num_masks,
                                 seed=seed, masks=masks, control_variate=control,
                                 exact_length=0)
            return r.logratio.numpy(), r.logratio_stderr, r.dof
        return run

    rows = {"d1 (one step, prompt 15%)": (d1, 8), "coupled-GRPO (mask + complement)": (coupled, 8),
            "mptlml control variate, num_masks=7 (the default)": (ours(7, "stratified", True), 8),
            "mptlml control variate, num_masks=15": (ours(15, "stratified", True), 16),
            "mptlml complement + control variate, num_masks=4": (ours(4, "complement", True), 5),
            "mptlml complement + control variate, num_masks=8": (ours(8, "complement", True), 9),
            "mptlml complement, no control variate, num_masks=8":
                (ours(8, "complement", False), 9)}
    res = {}
    with torch.no_grad():
        for name, (fn, fw) in rows.items():
            est, se, dof = [], [], []
            for r in range(a.repeats):
                out = fn(1000 * r + 7)
                est.append(out[0] if isinstance(out, tuple) else out)
                if isinstance(out, tuple):
                    se.append(out[1])
                    dof.append(out[2])
            est = np.array(est)
            print(f"{name} ({(time.time() - t0) / 60:.1f} min)", flush=True)
            res[name] = (((est - truth) ** 2).mean(), fw, np.array(se) if se else None, est,
                         np.array(dof) if dof else None)
    d1_mse = res["d1 (one step, prompt 15%)"][0]
    cg_mse = res["coupled-GRPO (mask + complement)"][0]
    print(f"{a.completions} completions of 6 tokens, {a.repeats} repeats; exact log-ratio: "
          f"mean {truth.mean():+.4f}, sd {truth.std():.4f}\n")
    print("| estimator | forwards | MSE | / d1 | / coupled-GRPO | MSE x forwards / 8 | "
          "(that) / coupled-GRPO |")
    print("|---|---|---|---|---|---|---|")
    for name, (mse, fw, _, _, _) in res.items():
        at8 = mse * fw / 8
        print(f"| {name} | {fw} | {mse:.4g} | {mse / d1_mse:.3f} | {mse / cg_mse:.3f} | "
              f"{at8:.4g} | {at8 / cg_mse:.3f} |")
    print("\n| mptlml | dof | |z| > 2 per completion | |z| > 2 of the batch mean | "
          "mean se^2 / MSE |")
    print("|---|---|---|---|---|")
    for name, (mse, _, se, est, dof) in res.items():
        if se is None:
            continue
        z = (est - truth) / np.where(se > 0, se, np.nan)
        zb = (est - truth).mean(1) / (np.sqrt((se ** 2).sum(1)) / se.shape[1])
        print(f"| {name} | {np.median(dof):g} | {np.nanmean(np.abs(z) > 2):.3f} | "
              f"{np.mean(np.abs(zb) > 2):.3f} | {(se ** 2).mean() / mse:.3f} |")
    print(f"\n({(time.time() - t0) / 60:.1f} min)")


if __name__ == "__main__":
    main()
