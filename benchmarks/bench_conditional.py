"""Conditional scoring on germline V genes: ``mptlml.compare`` against LLaDA's 128-draw scheme.

A multiple-choice benchmark built from the bundled human germline V genes and
AntiBERTy (both ship with the package; nothing is downloaded)::

    PYTHONPATH=src python benchmarks/bench_conditional.py --genes 12  # ~15 min on 2 CPU cores
    PYTHONPATH=src python benchmarks/bench_conditional.py --smoke    # 2 questions, 1 repeat

**Questions.** For each of ``--genes`` genes (spread over the bundled list), the
context is its first ``--context`` residues and the candidates are four
continuations of ``--length`` residues: the true one, a two-point mutant of it, a
shuffle of it, and the same positions of another gene (chosen to differ). A
second set asks the same with ``--short`` residues, short enough for the
exhaustive conditional sum (every mask inside the continuation), the reference
that decides which candidate the bound prefers.

**LLaDA's scheme** (written here from its description; LLaDA's ``eval_llada.py``
does the same): ``mc_num = 128`` draws per candidate in batches of ``b = 32``;
in each batch a random ``k`` in 1..L and the mask counts
``l = round(linspace(k, k + (b - 1) L / b, b))`` wrapped into 1..L (torch's
round, half to even), positions uniform; each draw gives
``(L / l) sum_{j masked} log p(x_j | rest)``; the estimate is their mean. Its
standard error, which LLaDA does not report, is taken here from the spread of
its four batch means (3 degrees of freedom per run). Candidates are scored
independently (each its own masks).

**mptlml**: :func:`mptlml.compare` with its defaults (16 masks per round on
stratified rates, the rate density learned over the call, common masks across
the candidates of a question, the whole continuation scored once) and
``decide=True`` (a candidate stops drawing once it is behind the leader
beyond the sequential rule's threshold, a question once every other
candidate has), at most ``--max-masks`` masked inputs per candidate (the whole
continuation's included): by default 128, the budget LLaDA's scheme spends on every
candidate.

Reported, per set: masked inputs per question, the ratio to LLaDA's, and how often
the chosen candidate agrees with LLaDA's and with the exhaustive one.

**One sequence's bound** (no context): the first ``--bound-length`` residues of
``--genes`` genes. Precision is measured, not read off the estimators' own SEs:

- a *size profile* per sequence (``--profile-masks`` uniform masks at every size)
  gives S(M) and the spread of one mask's score; from it LLaDA's variance and
  bias follow exactly for its scheme (:func:`llada_moments`; checked against the
  SE of its batch means over ``--repeats`` runs), and so does the best any
  allocation of masks over sizes can do (Neyman's, with each sequence's own
  spreads known: ``(sum_M sd_M)^2`` per unit of variance);
- ``compare`` at LLaDA's budget (128 masks, spent whole) and with ``target_se``
  set to the median of LLaDA's SEs, each over ``--bound-seeds`` seeds: its
  precision is the spread of its estimates over the seeds. The cost LLaDA needs
  for that target is ``128 v_LLaDA / target^2``.

**Close and easy questions on a trained small model** (``--trained-only`` runs these
alone, in about 10 minutes on 2 CPU cores, most of it training): a 2-layer BERT
(hidden 64) trained by masked LM for ``--train-steps`` on sentences of a small
probabilistic grammar ("the A N V P the A N and the A N", each word's distribution
skewed and depending on the word before), so that the grammar's continuations are
plausible and differ by a spread of amounts. Each question gives the first 3 words
as context and four 5-word continuations: for the *close* set, four of the
grammar's own continuations, kept when the exhaustive leader gap is 0.1-3 nats;
for the *easy* set, one of them against three shuffles of it, kept when the gap
exceeds 3 nats (``--questions`` each, from ``--pool`` drawn). ``compare`` runs at its
defaults with ``decide=True`` (and at each ``--walk`` delta); reported: masked
inputs per question against LLaDA's 128 draws per candidate, agreement with the
exhaustive choice (and LLaDA's), the share within delta of the exhaustive best,
undecided and tied shares.

The table goes to stdout and, with ``--out FILE``, to a Markdown file.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
import warnings
import zlib
from pathlib import Path

import numpy as np
import torch

import mptlml
from mptlml.data import bundled_antibodies
from mptlml.estimators.llada import llada_counts
from mptlml.models import MaskedLM
from mptlml.models.sequence_input import encode_with_context

AMINO = "ACDEFGHIKLMNPQRSTVWY"


def questions(genes: list[str], context: int, length: int, seed: int
              ) -> tuple[list[str], list[list[str]]]:
    """Context and four candidates (true, 2-point mutant, shuffle, other gene) per gene."""
    rng = np.random.default_rng(seed)
    ctxs, cands = [], []
    for g, seq in enumerate(genes):
        true = seq[context:context + length]
        mutant = list(true)
        for p in rng.choice(length, 2, replace=False):
            mutant[p] = rng.choice([a for a in AMINO if a != mutant[p]])
        shuffled = true
        while shuffled == true:
            shuffled = "".join(rng.permutation(list(true)))
        others = [s[context:context + length] for s in genes if s[context:context + length]
                  not in (true, "".join(mutant), shuffled)]
        other = others[(g * 7) % len(others)]
        ctxs.append(seq[:context])
        cands.append([true, "".join(mutant), shuffled, other])
    return ctxs, cands


def random_masks(length: int, context: int, counts: list[int], g: torch.Generator
                 ) -> list[torch.Tensor]:
    """One mask per count: that many continuation positions, uniformly; the context never."""
    rows = []
    for cnt in counts:
        m = torch.zeros(length, dtype=torch.bool)
        m[context + torch.randperm(length - context, generator=g)[:cnt]] = True
        rows.append(m)
    return rows


def llada(model: MaskedLM, contexts: list[str], continuations: list[str], seed: int,
          mc_num: int = 128, batch: int = 32) -> tuple[np.ndarray, np.ndarray, int]:
    """LLaDA's estimate of log p(continuation | context) per pair, its SE, masked inputs."""
    ids, nctx = encode_with_context(model, contexts, continuations)
    g = torch.Generator().manual_seed(seed)
    masks = []
    for x, c in zip(ids, nctx, strict=True):
        n = len(x) - c
        rows = []
        for _ in range(mc_num // batch):
            k = int(torch.randint(1, n + 1, (), generator=g))
            rows += random_masks(len(x), c, llada_counts(k, n, batch).tolist(), g)
        masks.append(torch.stack(rows))
    with torch.no_grad():
        sums = model.ragged_masked_log_prob(ids, masks, [None] * len(ids))
    est, se = [], []
    for x, c, m, s in zip(ids, nctx, masks, sums, strict=True):
        n = len(x) - c
        draws = s.double().numpy() * n / m.sum(1).double().numpy()
        means = draws.reshape(-1, batch).mean(1)
        est.append(means.mean())
        se.append(means.std(ddof=1) / math.sqrt(len(means)))
    return np.array(est), np.array(se), sum(len(m) for m in masks)


def exhaustive(model: MaskedLM, contexts: list[str], continuations: list[str]) -> np.ndarray:
    """sum_M mean over every mask of M tokens inside the continuation of their mean log-prob."""
    ids, nctx = encode_with_context(model, contexts, continuations)
    masks, sizes = [], []
    for x, c in zip(ids, nctx, strict=True):
        n = len(x) - c
        rows, ms = [], []
        for m in range(1, n + 1):
            for sub in itertools.combinations(range(n), m):
                row = torch.zeros(len(x), dtype=torch.bool)
                row[[c + j for j in sub]] = True
                rows.append(row)
                ms.append(m)
        masks.append(torch.stack(rows))
        sizes.append(np.array(ms))
    with torch.no_grad():
        sums = model.ragged_masked_log_prob(ids, masks, [None] * len(ids))
    return np.array([sum(s.double().numpy()[ms == m].mean() / m for m in np.unique(ms))
                     for s, ms in zip(sums, sizes, strict=True)])


def multiple_choice(model: MaskedLM, genes: list[str], context: int, length: int,
                    args: argparse.Namespace, reference: bool) -> dict:
    ctxs, cands = questions(genes, context, length, args.seed)
    k = len(cands[0])
    flat_ctx = [c for c, cs in zip(ctxs, cands, strict=True) for _ in cs]
    flat = [x for cs in cands for x in cs]
    t0 = time.perf_counter()
    ll, ll_se, ll_rows = llada(model, flat_ctx, flat, args.seed)
    t_llada = time.perf_counter() - t0
    ll = ll.reshape(-1, k)
    ll_choice = ll.argmax(1)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # budgets spent are counted below
        cmp = mptlml.compare(model, ctxs, cands, decide=True, max_masks=args.max_masks,
                             seed=args.seed)
    t_cmp = time.perf_counter() - t0
    choice = np.array(cmp.choice)
    out = {"length": length, "questions": len(ctxs), "llada_rows": ll_rows / len(ctxs),
           "mptlml_rows": float(np.mean(cmp.num_masked_rows)),
           "agree_llada": float(np.mean(choice == ll_choice)),
           "undecided": int(sum(not d for d in cmp.decided)),
           "true_chosen_mptlml": float(np.mean(choice == 0)),
           "true_chosen_llada": float(np.mean(ll_choice == 0)),
           "seconds_llada": t_llada, "seconds_mptlml": t_cmp}
    if reference:
        ex = exhaustive(model, flat_ctx, flat).reshape(-1, k)
        ex_choice = ex.argmax(1)
        scores = np.stack(cmp.scores)
        se = np.stack(cmp.stderr)
        out.update({"agree_exhaustive_mptlml": float(np.mean(choice == ex_choice)),
                    "agree_exhaustive_llada": float(np.mean(ll_choice == ex_choice)),
                    "mptlml_max_z_vs_exhaustive": float(np.max(
                        np.abs(scores - ex) / np.maximum(se, 1e-12))),
                    "llada_max_z_vs_exhaustive": float(np.max(np.abs(ll - ex) / ll_se.reshape(
                        -1, k)))})
    return out


def size_profile(model: MaskedLM, seqs: list[str], per: int, seed: int
                 ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per size M = 1..T of each sequence: mean and variance of a mask's score.

    A mask's score is the mean log-probability of its M tokens; ``per`` uniform
    masks at each M < T, and the one mask at M = T. Returns ``(S, var)`` per
    sequence, both ``(T,)``: S(M) estimated, the spread of one mask's score (0 at T).
    """
    ids, nctx = encode_with_context(model, [""] * len(seqs), seqs)
    g = torch.Generator().manual_seed(seed)
    masks = []
    for x, c in zip(ids, nctx, strict=True):
        n = len(x) - c
        counts = [m for m in range(1, n + 1) for _ in range(per if m < n else 1)]
        masks.append(torch.stack(random_masks(len(x), c, counts, g)))
    with torch.no_grad():
        sums = model.ragged_masked_log_prob(ids, masks, [None] * len(ids))
    out = []
    for x, c, s in zip(ids, nctx, sums, strict=True):
        n = len(x) - c
        y = s.double().numpy()
        body = (y[:-1] / np.repeat(np.arange(1, n), per)).reshape(n - 1, per)
        out.append((np.append(body.mean(1), y[-1] / n), np.append(body.var(1, ddof=1), 0.0)))
    return out


def llada_moments(mean: np.ndarray, var: np.ndarray, mc_num: int = 128, batch: int = 32
                  ) -> tuple[float, float]:
    """Variance and bias of LLaDA's estimate of sum_M S(M), given the size profile.

    Exact for its scheme: each batch's start k is uniform on 1..L, its counts
    :func:`llada_counts`, so the variance of a batch mean is the
    spread over k of ``mean_b L S(l_b)`` plus ``E_k sum_b L^2 var(l_b) / b^2``, and the
    bias is ``E_k mean_b L S(l_b) - sum_M S(M)`` (the rounding's uneven visits).
    """
    n = len(mean)
    means, within = [], []
    for k in range(1, n + 1):
        counts = llada_counts(k, n, batch) - 1
        means.append(np.mean(n * mean[counts]))
        within.append(np.sum(n * n * var[counts]) / batch ** 2)
    v = (np.var(means) + np.mean(within)) / (mc_num // batch)
    return float(v), float(np.mean(means) - mean.sum())


def single_bound(model: MaskedLM, genes: list[str], length: int, args: argparse.Namespace
                 ) -> dict:
    seqs = [g[:length] for g in genes]
    prof = size_profile(model, seqs, args.profile_masks, args.seed + 7)
    moments = np.array([llada_moments(m, v) for m, v in prof])
    v_llada, bias = moments[:, 0], moments[:, 1]
    truth = np.array([m.sum() for m, _ in prof])
    truth_se = np.array([math.sqrt(v.sum() / args.profile_masks) for _, v in prof])
    # LLaDA run as written (its SE from batch means) against its exact variance
    runs = [llada(model, [""] * len(seqs), seqs, args.seed + r) for r in range(args.repeats)]
    batch_var = np.mean([r[1] ** 2 for r in runs], axis=0)
    target = float(np.median(np.sqrt(v_llada)))

    def seeds(**kw: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        est, se, rows = [], [], []
        for k in range(args.bound_seeds):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                cmp = mptlml.compare(model, [""] * len(seqs), [[x] for x in seqs],
                                     seed=args.seed + 100 + k, **kw)
            est.append([float(x[0]) for x in cmp.scores])
            se.append([float(x[0]) for x in cmp.stderr])
            rows.append(cmp.num_masked_rows)
        return np.array(est), np.array(se), np.array(rows, dtype=float).mean(0)

    # LLaDA's budget, spent whole (max_masks alone: a fixed budget of masked inputs, the
    # whole sequence's row included; 127 in pairs)
    est_b, _, rows_b = seeds(max_masks=128)
    var_b = est_b.var(0, ddof=1)
    # LLaDA's precision as a target
    est, se, rows = seeds(target_se=target, max_masks=4096)
    var_m = est.var(0, ddof=1)  # mptlml's spread over seeds: its precision, not its own SE
    llada_cost = 128 * v_llada / target ** 2  # masked inputs LLaDA needs for the target
    sigma = [np.sqrt(v[:-1]) for _, v in prof]
    ceiling = np.array([sg.sum() ** 2 / target ** 2 + 1 for sg in sigma])
    z = np.abs(est.mean(0) - truth) / np.sqrt(var_m / len(est) + truth_se ** 2)
    return {"length": length, "sequences": len(seqs), "target_se": target,
            "seeds": len(est), "profile_masks": args.profile_masks,
            "llada_var": v_llada.tolist(), "llada_bias": bias.tolist(),
            "llada_batch_var_over_exact": float(batch_var.sum() / v_llada.sum()),
            # at LLaDA's budget: its variance over mptlml's (cost equal up to the full mask)
            "budget_rows": float(rows_b.mean()),
            "budget_var_ratio": float((v_llada * 128).sum() / (var_b * rows_b).sum()),
            "budget_var_ratio_each": (v_llada * 128 / (var_b * rows_b)).tolist(),
            "ceiling_total": float(llada_cost.sum() / ceiling.sum()),
            "ceiling": (llada_cost / ceiling).tolist(),
            "llada_rows_at_target": llada_cost.tolist(), "mptlml_rows": rows.tolist(),
            "ratio": (llada_cost / rows).tolist(),
            "ratio_total": float(llada_cost.sum() / rows.sum()),
            "achieved_var_over_target": float(var_m.mean() / target ** 2),
            "achieved_var_over_target_max": float(var_m.max() / target ** 2),
            "reported_se_over_spread": float(np.sqrt((se ** 2).mean() / var_m.mean())),
            "max_z_vs_profile": float(z.max())}


def table(mc: list[dict], bound: dict) -> str:
    lines = [f"| continuation ({mc[0]['questions']} questions) | masked inputs: LLaDA | "
             "mptlml | fewer | choice as LLaDA's | as exhaustive (mptlml / LLaDA) | undecided |",
             "|---|---|---|---|---|---|---|"]
    for r in mc:
        ex = (f"{r['agree_exhaustive_mptlml']:.0%} / {r['agree_exhaustive_llada']:.0%}"
              if "agree_exhaustive_mptlml" in r else "-")
        lines.append(
            f"| {r['length']} residues | {r['llada_rows']:.0f} | "
            f"{r['mptlml_rows']:.0f} | {r['llada_rows'] / r['mptlml_rows']:.1f}x | "
            f"{r['agree_llada']:.0%} | {ex} | {r['undecided']} |")
    b = bound
    lines += ["", "| one sequence's bound | sequences | variance at 128 masks: LLaDA / mptlml | "
              "best allocation over sizes | masked inputs to LLaDA's SE: LLaDA / mptlml | "
              "spread / target | reported SE / spread |",
              "|---|---|---|---|---|---|---|",
              f"| first {b['length']} residues | {b['sequences']} | "
              f"{b['budget_var_ratio']:.2f}x "
              f"({min(b['budget_var_ratio_each']):.1f}-{max(b['budget_var_ratio_each']):.1f}) | "
              f"{b['ceiling_total']:.2f}x ({min(b['ceiling']):.1f}-{max(b['ceiling']):.1f}) | "
              f"{np.sum(b['llada_rows_at_target']):.0f} / {np.sum(b['mptlml_rows']):.0f} "
              f"({b['ratio_total']:.2f}x) | "
              f"{math.sqrt(b['achieved_var_over_target']):.2f} | "
              f"{b['reported_se_over_spread']:.2f} |"]
    return "\n".join(lines)

# ---------------------------------------------------------------------- a trained small model
ADJ = ("big", "small", "red", "blue", "old", "new")
NOUN = ("cat", "dog", "house", "tree", "mat", "car")
VERB = ("sat", "ran", "was", "is")
PREP = ("on", "under", "over", "with")


def grammar(n: int, rng: np.random.Generator) -> list[list[str]]:
    """``n`` sentences "the A N V P the A N and the A N" with skewed, dependent choices.

    Each slot's word is drawn from a Zipf-like distribution whose order depends on the word
    before it, so continuations differ in probability by a spread of amounts.
    """
    def pick(words: tuple[str, ...], after: str) -> str:
        key = zlib.crc32(" ".join((after, *words)).encode())
        order = np.random.default_rng(key).permutation(len(words))
        p = 1.0 / (1.0 + np.arange(len(words))) ** 1.2
        return words[order[rng.choice(len(words), p=p / p.sum())]]

    out = []
    for _ in range(n):
        a = pick(ADJ, "the")
        noun = pick(NOUN, a)
        v = pick(VERB, noun)
        pr = pick(PREP, v)
        a2 = pick(ADJ, pr)
        n2 = pick(NOUN, a2)
        a3 = pick(ADJ, n2)
        n3 = pick(NOUN, a3)
        out.append(["the", a, noun, v, pr, "the", a2, n2, "and", "the", a3, n3])
    return out


def trained_model(folder: Path, steps: int, seed: int) -> MaskedLM:
    """A 2-layer BERT (hidden 64) trained by masked LM on :func:`grammar` for ``steps``."""
    from transformers import BertConfig, BertForMaskedLM, BertTokenizer

    words = sorted({*ADJ, *NOUN, *VERB, *PREP, "the", "and"})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = BertTokenizer(str(folder / "vocab.txt"), do_lower_case=True)
    torch.manual_seed(seed)
    net = BertForMaskedLM(BertConfig(vocab_size=len(vocab), hidden_size=64,
                                     num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=128, max_position_embeddings=32))
    rng = np.random.default_rng(seed)
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
    net.train()
    for _ in range(steps):
        ids = torch.tensor([tok(" ".join(x))["input_ids"] for x in grammar(32, rng)])
        mask = torch.rand(ids.shape) < torch.rand(ids.shape[0], 1)  # rates uniform in (0, 1)
        mask[:, 0] = mask[:, -1] = False
        labels = torch.where(mask, ids, -100)
        loss = net(input_ids=ids.masked_fill(mask, tok.mask_token_id), labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.eval()
    net.save_pretrained(folder)
    tok.save_pretrained(folder)
    return MaskedLM.from_pretrained(folder)


def trained_questions(model: MaskedLM, n: int, seed: int, easy: bool
                      ) -> tuple[list[str], list[list[str]], np.ndarray]:
    """Questions of four 5-word continuations given a 3-word context, and their exhaustive
    conditional sums ``(Q, 4)``: the grammar's own continuations (close questions), or one
    of them against three shuffles of it (``easy``: clear questions)."""
    rng = np.random.default_rng(seed + 1 + easy)
    ctxs, cands = [], []
    for x in grammar(n, rng):
        ctxs.append(" ".join(x[:3]))
        options = {" " + " ".join(x[3:8])}
        while len(options) < 4:  # the grammar's other continuations, or shuffles
            y = list(rng.permutation(x[3:8])) if easy else grammar(1, rng)[0][3:8]
            options.add(" " + " ".join(y))
        cands.append(sorted(options))
    flat_ctx = [c for c, cs in zip(ctxs, cands, strict=True) for _ in cs]
    ex = exhaustive(model, flat_ctx, [y for cs in cands for y in cs]).reshape(-1, 4)
    return ctxs, cands, ex


def score_set(model: MaskedLM, name: str, c: list[str], k: list[list[str]], e: np.ndarray,
              gap: np.ndarray, args: argparse.Namespace, variants: list[dict]
              ) -> list[dict]:
    """One question set: LLaDA's 128 draws per candidate and ``compare(decide=True)`` (at its
    defaults ``{}``, and with each other variant's options: a ``delta``, ``precision=False``),
    each over ``args.seeds`` seeds of the masks, against the exhaustive choice
    ``e.argmax(1)``; per variant one row of means over seeds."""
    flat_ctx = [x for x, ks in zip(c, k, strict=True) for _ in ks]
    flat = [y for ks in k for y in ks]
    best = e.argmax(1)
    agree_llada, llada_rows = [], 0.0
    for s in range(args.seeds):
        ll, _, ll_rows = llada(model, flat_ctx, flat, args.seed + s)
        agree_llada.append(float(np.mean(ll.reshape(len(c), -1).argmax(1) == best)))
        llada_rows = ll_rows / len(c)
    out = []
    for options in variants:
        per_seed = []
        for s in range(args.seeds):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                cmp = mptlml.compare(model, c, k, decide=True, seed=args.seed + s, **options)
            choice, stop = np.array(cmp.choice), np.array(cmp.stop_reason)
            per_seed.append({
                "mptlml_rows": float(np.mean(cmp.num_masked_rows)),
                "agree_exhaustive_mptlml": float(np.mean(choice == best)),
                "within_delta": float(np.mean(
                    e.max(1) - e[np.arange(len(c)), choice] <= cmp.extra["delta"])),
                "undecided": float(np.mean(stop == "budget")),
                "precision": float(np.mean(stop == "precision")),
                "tied": float(np.mean(stop == "tied")),
                "delta": cmp.extra["delta"]})
        row = {key: float(np.mean([r[key] for r in per_seed])) for key in per_seed[0]}
        row.update({"set": name, "questions": len(c), "default": not options,
                    "precision_stop": options.get("precision", True),
                    "seeds": args.seeds, "gap_range": (float(gap.min()), float(gap.max())),
                    "gaps_under_1.5": int(np.sum(gap < 1.5)), "llada_rows": llada_rows,
                    "agree_exhaustive_llada": float(np.mean(agree_llada)),
                    "agree_exhaustive_mptlml_min": min(r["agree_exhaustive_mptlml"]
                                                       for r in per_seed),
                    "agree_exhaustive_llada_min": min(agree_llada)})
        out.append(row)
    return out


def trained_sets(args: argparse.Namespace) -> list[dict]:
    """The easy (leader gap > 3 nats) and close (0.1-3 nats) sets on a trained small model,
    ``compare`` at its defaults (``decide=True``) against LLaDA's 128 draws per candidate;
    with ``--walk``, also at each delta of the walk."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        model = trained_model(Path(tmp), args.train_steps, args.seed)
        print(f"trained in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    out = []
    for name, easy in (("easy (gap > 3 nats)", True), ("close (gap 0.1-3 nats)", False)):
        ctxs, cands, ex = trained_questions(model, args.pool, args.seed, easy)
        top = np.sort(ex, 1)
        gap = top[:, -1] - top[:, -2]
        idx = np.flatnonzero(gap > 3 if easy else (gap >= 0.1) & (gap <= 3))[:args.questions]
        print(f"{name}: {len(idx)} of {len(ctxs)} questions", file=sys.stderr)
        if not len(idx):  # a short training (--smoke) may leave a set empty
            continue
        out += score_set(model, name, [ctxs[i] for i in idx], [cands[i] for i in idx],
                         ex[idx], gap[idx], args,
                         [{}, *({"delta": d} for d in args.walk), {"precision": False}])
    return out


# ---------------------------------------------------------------------- LLaDA's architecture
def llada_model(args: argparse.Namespace) -> MaskedLM:
    """A small model of LLaDA's architecture (``_llada_arch.TinyLLaDA``: RMSNorm, RoPE,
    SwiGLU, bidirectional attention, the mask an ordinary token) trained with LLaDA's
    objective (t ~ U(0, 1) per sentence, each token masked with probability t, loss
    ``sum_masked CE / t / L``) on :func:`grammar` for ``--llada-steps`` steps."""
    import torch.nn.functional as F
    from _llada_arch import SIZES, TinyLLaDA
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = sorted({*ADJ, *NOUN, *VERB, *PREP, "the", "and"})
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", *words, "<|mdm_mask|>"])}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]")
    mask_id = vocab["<|mdm_mask|>"]
    torch.manual_seed(args.seed)
    net = TinyLLaDA(len(vocab) + 8, **SIZES["small"])
    rng = np.random.default_rng(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3, weight_decay=0.0)
    net.train()
    for _ in range(args.llada_steps):
        ids = torch.tensor([tok.convert_tokens_to_ids(x) for x in grammar(64, rng)])
        t = torch.rand(len(ids), 1, generator=g).clamp_min(1e-3)
        masked = torch.rand(ids.shape, generator=g) < t
        logits = net(torch.where(masked, torch.full_like(ids, mask_id), ids))
        ce = F.cross_entropy(logits.transpose(1, 2), ids, reduction="none")
        loss = ((ce * masked / t).sum(1) / ids.shape[1]).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.eval()
    return MaskedLM(net, tok, mask_token_id=mask_id, name="tiny-llada-grammar")


def llada_set(args: argparse.Namespace) -> list[dict]:
    """The close set of a model of LLaDA's architecture: contexts of 3 words, four candidate
    continuations of 6-9 words (the sentence's own and, in every other question, three other
    sentences' words at the same positions, else three shuffles of its own: a spread of
    gaps), ``--questions`` of them taken from ``--llada-pool`` so that
    ``--near`` (12 of 40) have an exhaustive leader gap under 1.5 nats and the rest at
    least 1.5; ``compare`` at its defaults against LLaDA's 128 draws per candidate."""
    t0 = time.perf_counter()
    model = llada_model(args)
    print(f"LLaDA-architecture model trained in {time.perf_counter() - t0:.0f} s",
          file=sys.stderr)
    rng = np.random.default_rng(args.seed + 3)
    ctxs, cands = [], []
    for q, x in enumerate(grammar(args.pool, rng)):
        n = int(rng.integers(6, 10))
        options = {" " + " ".join(x[3:3 + n])}
        while len(options) < 4:  # the grammar's own (close), or shuffles (a spread of gaps)
            y = grammar(1, rng)[0][3:3 + n] if q % 2 else list(rng.permutation(x[3:3 + n]))
            options.add(" " + " ".join(y))
        ctxs.append(" ".join(x[:3]))
        cands.append(sorted(options))
    t0 = time.perf_counter()
    ex = exhaustive(model, [c for c, cs in zip(ctxs, cands, strict=True) for _ in cs],
                    [y for cs in cands for y in cs]).reshape(-1, 4)
    print(f"exhaustive sums in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    top = np.sort(ex, 1)
    gap = top[:, -1] - top[:, -2]
    near = int(round(args.questions * 12 / 40))
    idx = np.concatenate([np.flatnonzero(gap < 1.5)[:near],
                          np.flatnonzero(gap >= 1.5)[:args.questions - near]])
    print(f"LLaDA-architecture close set: {len(idx)} of {len(ctxs)} questions, "
          f"{int(np.sum(gap[idx] < 1.5))} under 1.5 nats", file=sys.stderr)
    name = (f"LLaDA-architecture close (gap 0-{gap[idx].max():.0f} nats, "
            f"{int(np.sum(gap[idx] < 1.5))} under 1.5)")
    return score_set(model, name,
                     [ctxs[i] for i in idx], [cands[i] for i in idx], ex[idx], gap[idx],
                     args, [{}, {"precision": False}])


def trained_table(rows: list[dict]) -> str:
    lines = ["| question set | delta (options) | masked inputs per question: LLaDA | mptlml | "
             "fewer | agreement with exhaustive: mptlml / LLaDA (worst seed) | within delta | "
             "undecided | precision | tied |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['set']}, {r['questions']} | {r['delta']:g}{' (default)' if r['default'] else ''}"
            f"{'' if r['precision_stop'] else ', precision=False'}"
            f" | {r['llada_rows']:.0f} | {r['mptlml_rows']:.0f} | "
            f"{r['llada_rows'] / r['mptlml_rows']:.1f}x | {r['agree_exhaustive_mptlml']:.1%} / "
            f"{r['agree_exhaustive_llada']:.1%} ({r['agree_exhaustive_mptlml_min']:.0%} / "
            f"{r['agree_exhaustive_llada_min']:.0%}) | {r['within_delta']:.0%} | "
            f"{r['undecided']:.1%} | {r['precision']:.1%} | {r['tied']:.1%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--genes", type=int, default=8)
    p.add_argument("--context", type=int, default=20)
    p.add_argument("--length", type=int, default=10)
    p.add_argument("--short", type=int, default=5)
    p.add_argument("--bound-length", type=int, default=40)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--profile-masks", type=int, default=24)
    p.add_argument("--bound-seeds", type=int, default=6)
    p.add_argument("--max-masks", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true",
                   help="2 genes, 1 repeat, 3 profile masks, 2 seeds")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--questions", type=int, default=40,
                   help="questions per set of the trained small model (easy and close)")
    p.add_argument("--pool", type=int, default=80,
                   help="questions drawn from the grammar, from which the sets are taken")
    p.add_argument("--train-steps", type=int, default=200)
    p.add_argument("--walk", type=float, nargs="*", default=[],
                   help="compare's delta values to run besides the default")
    p.add_argument("--trained-only", action="store_true",
                   help="only the question sets of the trained small models (easy, close, "
                        "LLaDA-architecture close)")
    p.add_argument("--seeds", type=int, default=3,
                   help="seeds of the masks per question set (mptlml and LLaDA alike)")
    p.add_argument("--llada-steps", type=int, default=150,
                   help="training steps of the LLaDA-architecture model")
    p.add_argument("--llada-pool", type=int, default=64,
                   help="questions drawn for the LLaDA-architecture close set")
    p.add_argument("--sets", nargs="*", default=["bert", "llada"], choices=["bert", "llada"],
                   help="which trained models' sets to run")
    args = p.parse_args(argv)
    if args.smoke:
        args.genes, args.repeats, args.profile_masks, args.bound_seeds = 2, 1, 3, 2
        args.questions, args.pool, args.train_steps = 4, 60, 20
        args.seeds, args.llada_steps, args.llada_pool = 1, 20, 16
    torch.set_num_threads(max(1, torch.get_num_threads()))
    rows = trained_sets(args) if "bert" in args.sets else []
    if "llada" in args.sets:
        pool, args.pool = args.pool, args.llada_pool
        rows += llada_set(args)
        args.pool = pool
    trained = trained_table(rows)
    print(trained)
    if args.trained_only:
        if args.out is not None:
            args.out.write_text(trained + "\n")
        return 0
    model = MaskedLM.antiberty()
    data = bundled_antibodies()
    step = max(1, len(data.texts) // args.genes)
    genes = [data.texts[i] for i in range(0, step * args.genes, step)]
    mc = [multiple_choice(model, genes, args.context, args.length, args, reference=False),
          multiple_choice(model, genes, args.context, args.short, args, reference=True)]
    bound = single_bound(model, genes, args.bound_length, args)
    text = table(mc, bound) + "\n\n" + trained
    print(table(mc, bound))
    print({"multiple_choice": mc, "bound": bound}, file=sys.stderr)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
