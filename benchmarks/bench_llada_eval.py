"""lm-eval on a model of LLaDA's architecture: ``mptlml eval``'s defaults against LLaDA's scheme.

Self-contained (nothing downloaded): a small masked-diffusion LM written here from
LLaDA's published configuration and description (Nie et al., "Large Language
Diffusion Models", 2025: a LLaMA-style Transformer without the causal mask), trained
briefly on data made here, then one local multiple-choice task run through
lm-evaluation-harness's own evaluator twice, with the model ``mptlml``:

- **mptlml**: ``decide=true`` (``mptlml.compare``'s defaults: 16 masks per round on
  stratified rates, common masks across a question's candidates, the whole
  continuation scored once, rounds while a question is undecided, at most
  ``max_masks`` = 128 masked inputs per candidate, the whole continuation's included);
- **LLaDA's scheme**: ``estimator=llada,mc_num=128`` with LLaDA's published
  ``--batch_size 8`` (``mptlml.estimators.llada_scores``: 128 masked copies per
  candidate, counts systematic per batch, weight L / l; each candidate its own masks).

Both with ``is_check_greedy=false`` (as LLaDA's published runs). The reference is
the exhaustive conditional MPT bound of every candidate (every mask of every size
inside the continuation): the choice that the bound makes.

**The model** (``TinyLLaDA``): pre-norm blocks of RMSNorm, bidirectional multi-head
self-attention with rotary position embeddings (RoPE, theta 500,000 as LLaDA's
config) and a SwiGLU MLP (hidden ~ 2.75 d, no biases), a final RMSNorm and an
untied output head; the mask token is an ordinary vocabulary entry (LLaDA's
126336), the logits wider than the tokenizer (LLaDA: 126,464). Trained with
LLaDA's objective: t ~ U(0, 1) per sequence, each token masked with probability t
(half the batches only the answer, as LLaDA's SFT), the loss
``sum_masked CE / t / L``.

**The data**: ``up x : x+1 .. x+n`` and ``down x : x-1 .. x-n`` over 16 symbols
(modulo 16), n in 3..7. **The task**: the context ``up x :``, four candidates of
n = 5..7 symbols: the run up (gold), it with one symbol changed, the run down, and
a run up from another symbol (n >= 5 tokens: mptlml draws masks).

Reported: accuracy, agreement with the exhaustive choice (over ``--seeds`` seeds of
the masks), masked inputs per question, forward calls, the scoring's wall time (the
time lm-eval spends in the model's ``loglikelihood``; the JSON also has the whole
evaluator call) and it per 1,000 requests::

    PYTHONPATH=src python benchmarks/bench_llada_eval.py                  # CPU, ~5 min
    PYTHONPATH=src python benchmarks/bench_llada_eval.py --smoke          # < 60 s
    PYTHONPATH=src python benchmarks/bench_llada_eval.py --size large --device cuda \\
        --dtype bfloat16 --out llada_gpu.json                             # one H100, < 6 min
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _llada_arch import SIZES, TinyLLaDA  # noqa: E402  LLaDA's architecture, small
from bench_conditional import exhaustive  # noqa: E402  the exhaustive conditional MPT bound

SYMBOLS = [f"s{i}" for i in range(16)]
MARKERS = ["up", "down", ":"]
MASK = "<|mdm_mask|>"
EXTRA_LOGITS = 8  # logits beyond the tokenizer's vocabulary, as LLaDA's
# ---------------------------------------------------------------------- data and tokenizer
def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", *MARKERS, *SYMBOLS, MASK])}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]")


def run_of(start: int, step: int, n: int) -> list[str]:
    """n symbols counting from ``start`` (exclusive) by ``step``, modulo 16."""
    return [SYMBOLS[(start + step * (i + 1)) % len(SYMBOLS)] for i in range(n)]


def example(rng: np.random.Generator) -> tuple[list[str], int]:
    """One training sequence (words) and where its answer starts."""
    n = int(rng.integers(3, 8))
    x = int(rng.integers(0, len(SYMBOLS)))
    op = "up" if rng.random() < 0.5 else "down"
    return [op, SYMBOLS[x], ":", *run_of(x, 1 if op == "up" else -1, n)], 3


def questions(num: int, seed: int) -> list[dict]:
    """Context ``up x :``; gold the next n symbols, one changed, the run down, another run."""
    rng = np.random.default_rng(seed)
    docs = []
    while len(docs) < num:
        n = int(rng.integers(5, 8))
        x = int(rng.integers(0, len(SYMBOLS)))
        gold = run_of(x, 1, n)
        change = list(gold)
        j = int(rng.integers(1, n))
        change[j] = SYMBOLS[int(rng.integers(0, len(SYMBOLS)))]
        other = run_of(int(rng.integers(0, len(SYMBOLS))), 1, n)
        cands = [gold, change, run_of(x, -1, n), other]
        if len({tuple(c) for c in cands}) < 4:
            continue
        docs.append({"context": " ".join(["up", SYMBOLS[x], ":"]),
                     "choices": [" ".join(c) for c in cands], "label": 0})
    return docs


def train(model: TinyLLaDA, tok, mask_id: int, args: argparse.Namespace,
          device: torch.device) -> dict:
    """LLaDA's pre-training objective for ``args.train_seconds`` (or ``args.steps``)."""
    rng = np.random.default_rng(args.seed)
    g = torch.Generator(device="cpu").manual_seed(args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    width = 3 + 7
    model.train()
    t0, step, losses = time.perf_counter(), 0, []
    while step < args.steps and time.perf_counter() - t0 < args.train_seconds:
        seqs, starts = zip(*(example(rng) for _ in range(args.train_batch)), strict=True)
        ids = torch.zeros(len(seqs), width, dtype=torch.long)
        keep = torch.zeros(len(seqs), width, dtype=torch.bool)
        answer = torch.zeros_like(keep)
        for i, (s, a) in enumerate(zip(seqs, starts, strict=True)):
            ids[i, :len(s)] = torch.tensor(tok.convert_tokens_to_ids(s))
            keep[i, :len(s)] = True
            answer[i, a:len(s)] = True
        t = torch.rand(len(seqs), 1, generator=g).clamp_min(1e-3)
        region = answer if step % 2 else keep  # half the batches: the answer only (SFT)
        masked = (torch.rand(ids.shape, generator=g) < t) & region
        x = torch.where(masked, torch.full_like(ids, mask_id), ids)
        x, ids, keep, masked, t = (v.to(device) for v in (x, ids, keep, masked, t))
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.dtype == "bfloat16"):
            logits = model(x, keep)
        ce = F.cross_entropy(logits.float().transpose(1, 2), ids, reduction="none")
        loss = ((ce * masked / t).sum(1) / region.to(device).sum(1)).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        step += 1
    model.eval()
    return {"steps": step, "seconds": time.perf_counter() - t0,
            "final_loss": float(np.mean(losses[-20:])) if losses else math.nan}


# ---------------------------------------------------------------------- evaluation
def write_task(root: Path, docs: list[dict]) -> None:
    data = root / "count_mc.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    (root / "count_mc.yaml").write_text(
        f"task: count_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
        "output_type: multiple_choice\ntest_split: test\ndoc_to_text: \"{{context}}\"\n"
        "doc_to_target: \"{{label}}\"\ndoc_to_choice: \"{{choices}}\"\nmetric_list:\n"
        "  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n")


class Forwards:
    """Counts the module's forward calls (a hook)."""

    def __init__(self, module: nn.Module) -> None:
        self.calls = 0
        module.register_forward_pre_hook(lambda *_: self._count())

    def _count(self) -> None:
        self.calls += 1


def task_manager(tasks: Path):
    """lm-eval's TaskManager of the local task only (indexing its built-in tasks takes ~30 s)."""
    from lm_eval.tasks import TaskManager

    try:
        return TaskManager(include_path=str(tasks), include_defaults=False)
    except TypeError:  # an lm-eval without include_defaults
        return TaskManager(include_path=str(tasks))


def run_scheme(lm, options: dict, tasks: Path, manager, seed: int, forwards: Forwards,
               device: torch.device) -> dict:
    """One lm-eval run of the local task; the records' choices, masked inputs, calls, time.

    ``seconds``: the time lm-eval spent in the model's ``loglikelihood`` (the scoring);
    ``harness_seconds``: the whole ``simple_evaluate`` call.
    """
    import lm_eval

    from mptlml.lm_eval import MPTLM

    log = tasks / f"mc_{options.get('estimator', 'mptlml')}_{seed}.jsonl"
    model = MPTLM(lm, seed=seed, greedy=False, mc_log=log, **options)
    scoring = model.loglikelihood
    spent = [0.0]

    def timed(requests, *a, **k):  # the scoring, synchronised
        t = time.perf_counter()
        out = scoring(requests, *a, **k)
        if device.type == "cuda":
            torch.cuda.synchronize()
        spent[0] += time.perf_counter() - t
        return out

    model.loglikelihood = timed
    before = forwards.calls
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = lm_eval.simple_evaluate(model=model, tasks=["count_mc"], task_manager=manager)
    harness = time.perf_counter() - t0
    seconds = spent[0]
    records = [json.loads(s) for s in log.read_text().splitlines()[:-1]]
    qs = {r["doc_id"]: r["question"] for r in records}
    return {"acc": res["results"]["count_mc"]["acc,none"],
            "choice": [qs[d]["choice"] for d in sorted(qs)],
            "undecided": sum(not q["decided"] for q in qs.values()),
            "masked_inputs": sum(q["masked_inputs"] for q in qs.values()) / len(qs),
            "forward_calls": forwards.calls - before, "seconds": seconds,
            "harness_seconds": harness, "requests": len(records)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=sorted(SIZES), default="small")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--questions", type=int, default=None, help="default 40 (large: 200)")
    p.add_argument("--seeds", type=int, default=3, help="seeds of the masks per scheme")
    p.add_argument("--train-seconds", type=float, default=None,
                   help="training time budget (default 45; large: 150)")
    p.add_argument("--steps", type=int, default=100000, help="most training steps")
    p.add_argument("--train-batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=None, help="default 3e-3 (large: 1e-3)")
    p.add_argument("--llada-batch", type=int, default=8,
                   help="LLaDA's masks per batch (its published runs: --batch_size 8)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    p.add_argument("--smoke", action="store_true",
                   help="< 60 s on a CPU: 8 s of training, 6 questions, 1 seed, mc_num 32")
    args = p.parse_args(argv)
    large = args.size == "large"
    args.questions = args.questions or (6 if args.smoke else 200 if large else 40)
    args.train_seconds = args.train_seconds or (8 if args.smoke else 150 if large else 45)
    args.lr = args.lr or (1e-3 if large else 3e-3)
    if args.smoke:
        args.seeds = 1
    mc_num = 32 if args.smoke else 128
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)

    from mptlml.models import MaskedLM

    tok = tokenizer()
    mask_id = tok.convert_tokens_to_ids(MASK)
    module = TinyLLaDA(len(tok) + EXTRA_LOGITS, **SIZES[args.size]).to(device)
    params = sum(q.numel() for q in module.parameters())
    fit = train(module, tok, mask_id, args, device)
    if args.dtype == "bfloat16":
        module = module.to(torch.bfloat16)
    forwards = Forwards(module)
    lm = MaskedLM(module, tok, mask_token_id=mask_id, name=f"tiny-llada-{args.size}")
    docs = questions(args.questions, args.seed + 1)
    with torch.no_grad():
        ref = exhaustive(lm, [d["context"] for d in docs for _ in d["choices"]],
                         [" " + c for d in docs for c in d["choices"]]).reshape(len(docs), -1)
    ref_choice = ref.argmax(1)
    schemes = {"mptlml (decide=true)": {"decide": True},
               f"LLaDA (mc_num={mc_num}, batch {args.llada_batch})": {
                   "estimator": "llada", "mc_num": mc_num, "batch": args.llada_batch}}
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        tasks = Path(tmp)
        write_task(tasks, docs)
        manager = task_manager(tasks)
        for name, options in schemes.items():
            runs = [run_scheme(lm, options, tasks, manager, args.seed + s, forwards, device)
                    for s in range(args.seeds)]
            n_req = sum(r["requests"] for r in runs)
            rows[name] = {
                "acc": float(np.mean([r["acc"] for r in runs])),
                "agree_exhaustive": float(np.mean([np.mean(np.array(r["choice"]) == ref_choice)
                                                   for r in runs])),
                "undecided": float(np.mean([r["undecided"] for r in runs])),
                "masked_inputs_per_question": float(np.mean([r["masked_inputs"]
                                                             for r in runs])),
                "forward_calls": float(np.mean([r["forward_calls"] for r in runs])),
                "seconds": float(np.mean([r["seconds"] for r in runs])),
                "harness_seconds": float(np.mean([r["harness_seconds"] for r in runs])),
                "seconds_per_1000_requests": 1000 * sum(r["seconds"] for r in runs) / n_req}
    out = {"size": args.size, "parameters": params, "device": str(device),
           "device_name": (torch.cuda.get_device_name(device) if device.type == "cuda"
                           else platform.processor() or platform.machine()),
           "dtype": args.dtype, "threads": args.threads, "training": fit,
           "questions": len(docs), "candidates": 4, "seeds": args.seeds,
           "exhaustive_acc": float(np.mean(ref_choice == 0)), "schemes": rows}
    lines = [f"{args.size} TinyLLaDA ({params:,} parameters), {out['device_name']} "
             f"{args.dtype}, trained {fit['steps']} steps in {fit['seconds']:.0f} s (loss "
             f"{fit['final_loss']:.3f}); {len(docs)} questions x 4 candidates, {args.seeds} "
             f"seed(s); exhaustive bound's accuracy {out['exhaustive_acc']:.0%}", "",
             "| scheme | accuracy | choice as exhaustive | undecided | masked inputs / question "
             "| forward calls | scoring time (s) | s / 1,000 requests |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['acc']:.1%} | {r['agree_exhaustive']:.1%} | "
                     f"{r['undecided']:.1f} | {r['masked_inputs_per_question']:.0f} | "
                     f"{r['forward_calls']:.0f} | {r['seconds']:.1f} | "
                     f"{r['seconds_per_1000_requests']:.2f} |")
    print("\n".join(lines))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({**out, "table": lines}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
