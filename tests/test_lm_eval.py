"""mptlml as an lm-evaluation-harness backend, through lm-eval's own evaluator and command line.

Local tasks only: task YAMLs over JSON-lines files written into tmp dirs (a multiple-choice task
and a perplexity task). The references are written here with transformers directly: the
exhaustive MPT sum of a short continuation (every mask of every size inside it, the context
visible, one ``BertForMaskedLM`` forward per masked copy) and of a short text, and greedy
unmasking by direct forwards.
"""

from __future__ import annotations

import glob
import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import lm_eval
import numpy as np
import pytest
import torch
from lm_eval.api.registry import get_model
from lm_eval.tasks import TaskManager

import mptlml
import mptlml.lm_eval as mle
from mptlml.lm_eval.greedy import greedy_reproduces
from mptlml.lm_eval.records import summarize
from mptlml.models import MaskedLM
from mptlml.models.sequence_input import rolling_windows as _windows

from .mlm_helpers import make_tiny_bert

pytestmark = pytest.mark.usefixtures("one_thread")

PPL_TEXTS = ["the cat sat", "a big dog ran", "blue tree", "red house", "the mat",
             "the dog was under the big tree"]  # up to 4 tokens: exact sums; 7: drawn
MC_DOCS = [{"context": c, "choices": ch, "label": i % 3} for i, (c, ch) in enumerate([
    ("the cat sat on", ["was small", "is big", "under the tree"]),
    ("a big dog ran", ["is big", "over a dog", "a mat"]),
    ("the small red", ["was small", "is big", "over a dog"]),
    ("blue tree and", ["and the cat", "under the tree", "far away"]),
    ("a cat is", ["under the tree", "blue tree", "a mat"]),
    ("a small dog sat", ["far away", "blue tree", "a mat"]),
])]


# ---------------------------------------------------------------------- task files
def write_tasks(root: Path, *, mc_docs: list[dict] | None = None,
                ppl_texts: list[str] | None = None, prefix: str = "toy") -> Path:
    """Task YAMLs (``<prefix>_mc``, ``<prefix>_ppl``) over JSON-lines files in ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    if mc_docs is not None:
        data = root / f"{prefix}_mc.jsonl"
        data.write_text("".join(json.dumps(d) + "\n" for d in mc_docs))
        (root / f"{prefix}_mc.yaml").write_text(
            f"task: {prefix}_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
            f"    test: {data}\noutput_type: multiple_choice\ntest_split: test\n"
            "doc_to_text: \"{{context}}\"\ndoc_to_target: \"{{label}}\"\n"
            "doc_to_choice: \"{{choices}}\"\nmetric_list:\n"
            "  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n")
    if ppl_texts is not None:
        data = root / f"{prefix}_ppl.jsonl"
        data.write_text("".join(json.dumps({"text": t}) + "\n" for t in ppl_texts))
        (root / f"{prefix}_ppl.yaml").write_text(
            f"task: {prefix}_ppl\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
            f"    test: {data}\noutput_type: loglikelihood_rolling\ntest_split: test\n"
            "doc_to_text: \"\"\ndoc_to_target: \"{{text}}\"\nmetric_list:\n"
            "  - metric: word_perplexity\n    aggregation: weighted_perplexity\n"
            "    higher_is_better: false\n"
            "  - metric: bits_per_byte\n    aggregation: bits_per_byte\n"
            "    higher_is_better: false\n")
    return root


def read_records(path: Path) -> tuple[list[dict], dict]:
    lines = [json.loads(s) for s in Path(path).read_text().splitlines()]
    assert "summary" in lines[-1]
    return lines[:-1], lines[-1]["summary"]


# ---------------------------------------------------------------------- references
class Reference:
    """A masked LM called through transformers directly (no mptlml code on the path)."""

    def __init__(self, model_dir: Path | str) -> None:
        from transformers import AutoModelForMaskedLM, AutoTokenizer

        self.model = AutoModelForMaskedLM.from_pretrained(model_dir).eval()
        self.tok = AutoTokenizer.from_pretrained(model_dir)

    def ids(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """lm-eval's split: the joined text's tokens after the context's."""
        ctx = self.ids(context) if context.strip() else []
        full = self.ids(context + continuation)
        assert full[:len(ctx)] == ctx
        return ctx, full[len(ctx):]

    @torch.no_grad()
    def log_probs(self, rows: list[list[int]], masked: list[list[int]]) -> list[torch.Tensor]:
        """log p(x_j | rest) at the masked content positions of each row ([CLS] x [SEP])."""
        cls, sep, mask = self.tok.cls_token_id, self.tok.sep_token_id, self.tok.mask_token_id
        x = torch.tensor([[cls, *r, sep] for r in rows])
        for i, js in enumerate(masked):
            x[i, [j + 1 for j in js]] = mask
        lp = torch.log_softmax(self.model(input_ids=x).logits.double(), dim=-1)
        return [torch.stack([lp[i, j + 1, rows[i][j]] for j in js]) for i, js in enumerate(masked)]

    def mpt_sum(self, context: list[int], target: list[int]) -> float:
        """sum_{M=1..T} mean_{S in T, |S|=M} (1/M) sum_{j in S} log p(x_j | rest): every mask."""
        c, t = len(context), len(target)
        total = 0.0
        for m in range(1, t + 1):
            subsets = [[c + j for j in s] for s in itertools.combinations(range(t), m)]
            lps = self.log_probs([context + target] * len(subsets), subsets)
            total += float(np.mean([float(v.sum()) / m for v in lps]))
        return total

    @torch.no_grad()
    def greedy(self, context: list[int], target: list[int]) -> bool:
        """Unmask the most confident position with its argmax, one per step; do we get target?"""
        cls, sep, mask = self.tok.cls_token_id, self.tok.sep_token_id, self.tok.mask_token_id
        x = [cls, *context, *[mask] * len(target), sep]
        for _ in target:
            holes = [i for i, v in enumerate(x) if v == mask]
            p = torch.softmax(self.model(input_ids=torch.tensor([x])).logits[0].double(), -1)
            conf, arg = p[holes].max(-1)
            k = int(torch.argmax(conf))
            x[holes[k]] = int(arg[k])
        return x[1 + len(context):-1] == target


@pytest.fixture(scope="module")
def ref(tiny_dir):
    return Reference(tiny_dir)


@pytest.fixture(scope="module")
def ppl_tasks(tmp_path_factory):
    return write_tasks(tmp_path_factory.mktemp("ppl_tasks"), ppl_texts=PPL_TEXTS)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    return write_tasks(tmp_path_factory.mktemp("tasks"), mc_docs=MC_DOCS, ppl_texts=PPL_TEXTS)


@pytest.fixture(scope="module")
def mc_exact(ref):
    """The exhaustive conditional sum of every candidate (lm-eval joins with a space)."""
    return [np.array([ref.mpt_sum(*ref.pair(d["context"], " " + c)) for c in d["choices"]])
            for d in MC_DOCS]


def _evaluate(tasks_dir: Path, names: list[str], model: mle.MPTLM, **kw):
    """lm-eval's evaluator on local tasks, the model built once by the test (the Python route:
    then ``add_monte_carlo_stderr(results, model=)``, which lm-eval 0.4.8 needs for the run's
    summary, since it asks only its own ``hf`` model for its info)."""
    tm = TaskManager(include_path=str(tasks_dir), include_defaults=False)  # not its 1000s
    res = lm_eval.simple_evaluate(model=model, tasks=names, task_manager=tm, log_samples=True,
                                  **kw)
    return mle.add_monte_carlo_stderr(res, model=model)


# ---------------------------------------------------------------------- registration
def test_the_model_is_registered(tiny_dir):
    assert get_model("mptlml") is mle.MPTLM
    lm = mle.MPTLM.create_from_arg_string(f"pretrained={tiny_dir},seed=3", {"device": "cpu"})
    assert lm.seed == 3 and lm.device == torch.device("cpu") and lm.world_size == 1
    assert lm.generate_until([]) == []


def test_model_args_are_checked_before_any_work(tiny_dir):
    with pytest.raises(TypeError, match=r"unknown \['num_mask'\].*scoring takes"):
        mle.MPTLM.create_from_arg_string(f"pretrained={tiny_dir},num_mask=4")
    with pytest.raises(ValueError, match="num_masks must be even"):
        mle.MPTLM.create_from_arg_string(f"pretrained={tiny_dir},num_masks=5")
    with pytest.raises(ValueError, match="target_se must be a positive number"):
        mle.MPTLM.create_from_arg_string(f"pretrained={tiny_dir},target_se=-1")
    with pytest.raises(ValueError, match="max_masks must be"):
        mle.MPTLM.create_from_arg_string(f"pretrained={tiny_dir},max_masks=0")
    with pytest.raises(ValueError, match="need pretrained="):
        mle.MPTLM.create_from_arg_string("num_masks=4")
    # lm-eval's --device (default cuda:0) yields to model_args, and to no CUDA
    lm = mle.MPTLM.create_from_arg_string(f"pretrained={tiny_dir},device=cpu",
                                          {"device": "cuda:0"})
    assert lm.device == torch.device("cpu")
    if not torch.cuda.is_available():
        lm = mle.MPTLM.create_from_arg_string(f"pretrained={tiny_dir}", {"device": "cuda:0"})
        assert lm.device == torch.device("cpu")
    with pytest.raises(TypeError, match="greedy must be true or false"):
        mle.MPTLM.create_from_arg_string(f"pretrained={tiny_dir},greedy=yes")
    with pytest.warns(UserWarning, match="does not apply to mptlml.*token_budget"):
        lm = mle.MPTLM.create_from_arg_string(f"pretrained={tiny_dir},batch_size=16",
                                              {"batch_size": 8})
    assert lm.batch_size == 16  # masked inputs per forward pass: mptlml's own
    mle.MPTLM.create_from_arg_string(f"pretrained={tiny_dir}", {"batch_size": 1})  # lm-eval's


# ---------------------------------------------------------------------- multiple choice
def test_multiple_choice_equals_the_exhaustive_conditional_sums(tiny, tasks, mc_exact, tmp_path):
    gaps = [np.diff(np.sort(e))[-1] for e in mc_exact]
    assert min(gaps) > 1.0  # clear questions: at the target below no decision can flip
    target = 0.1
    log = tmp_path / "mc.jsonl"
    res = _evaluate(tasks, ["toy_mc"], mle.MPTLM(tiny, target_se=target, num_masks=256,
                                                 max_masks=16384, mc_log=log))
    records, summary = read_records(log)
    by_doc = {}
    for r in records:
        by_doc.setdefault(r["doc_id"], []).append(r)
    assert sorted(by_doc) == list(range(len(MC_DOCS)))
    for d, rs in by_doc.items():
        rs.sort(key=lambda r: r["idx"])
        got = np.array([r["loglikelihood"] for r in rs])
        se = np.array([r["stderr"] for r in rs])
        exact = np.array([r["exact"] for r in rs])
        assert (se <= target).all() and (se[~exact] > 0).all() and (se[exact] == 0).all()
        assert (np.abs(got - mc_exact[d]) < 4 * se + 1e-5).all(), (d, got, mc_exact[d], se)
        q = rs[0]["question"]
        assert all(r["question"] == q for r in rs) and q["candidates"] == 3
        assert q["choice"] == int(np.argmax(mc_exact[d])) and q["decided"]
        assert q["masked_inputs"] == sum(r["masked_inputs"] for r in rs)
        lead = q["choice"]
        assert rs[lead]["paired_stderr"] == 0
        assert all(r["paired_stderr"] > 0 for i, r in enumerate(rs)
                   if i != lead and not (r["exact"] and rs[lead]["exact"]))
    # the accuracy is the one the exhaustive sums give, with what MC noise owes stated
    want = np.mean([int(np.argmax(e)) == d["label"] for e, d in zip(mc_exact, MC_DOCS,
                                                                   strict=True)])
    assert res["results"]["toy_mc"]["acc,none"] == pytest.approx(want)
    s = summary["toy_mc"]
    assert s["questions"] == len(MC_DOCS) and s["undecided"] == 0
    assert s["accuracy_mc_stderr"] < 1e-3
    # lm-eval's logged responses are the records' log-likelihoods
    for sample in res["samples"]["toy_mc"]:
        rs = by_doc[sample["doc_id"]]
        assert [float(x[0][0]) for x in sample["resps"]] == pytest.approx(
            [r["loglikelihood"] for r in rs], rel=1e-12)


LONG_MC_DOCS = [{"context": c, "choices": ch, "label": 0} for c, ch in [
    ("the cat sat on", ["the big red mat and", "the the the the the", "a big red mat or"]),
    ("a big dog ran", ["far away with the cat", "far away with a cat", "is is is is is"]),
    ("the small red", ["house under the big tree", "house over the big tree", "a a a a a"]),
]]


def test_a_clear_question_stops_early(tiny, tmp_path):
    """Continuations of 5 tokens (beyond the exact ones): rounds only while undecided."""
    tasks = write_tasks(tmp_path / "tasks", mc_docs=LONG_MC_DOCS, ppl_texts=PPL_TEXTS)
    log = tmp_path / "mc.jsonl"
    with pytest.warns(UserWarning, match="greedy=false: every is_greedy is False"):
        _evaluate(tasks, ["toy_mc"], mle.MPTLM(tiny, decide=True, num_masks=8, max_masks=256,
                                               greedy=False, mc_log=log))
    records, summary = read_records(log)
    assert not any(r["exact"] for r in records)
    questions = {r["question"]["id"]: (r["question"], r) for r in records}
    assert len(questions) == len(LONG_MC_DOCS)
    for q, r in questions.values():
        assert q["decided"] == (r["stop_reason"] == "decided")
        # rounds of 8, 8, 16, 32, ... masks (the total doubles each round); a candidate
        # found behind stops drawing: the leader pays for every round, the others less
        lead = 8 * 2 ** (r["rounds"] - 1) + 1
        assert lead + 2 * (8 + 1) <= q["masked_inputs"] <= q["candidates"] * lead
    # clear questions stop before the budget (256 = 8 * 2^5: 6 rounds), the clearest soon
    assert all(q["decided"] and r["rounds"] < 6 for q, r in questions.values())
    assert min(r["rounds"] for _, r in questions.values()) <= 2
    questions = {k: q for k, (q, _) in questions.items()}
    assert all(r["is_greedy"] is None for r in records)  # not computed: greedy=false
    assert summary["toy_mc"]["undecided"] == sum(not q["decided"] for q in questions.values())


def test_a_request_does_not_depend_on_the_others(tiny, tasks, tmp_path):
    """Masks come from the seed and the question's own texts: --limit changes no number."""
    logs = [tmp_path / "all.jsonl", tmp_path / "two.jsonl"]
    for log, limit in zip(logs, (None, 2), strict=True):
        _evaluate(tasks, ["toy_mc"], mle.MPTLM(tiny, num_masks=4, mc_log=log), limit=limit)
    every, _ = read_records(logs[0])
    first, _ = read_records(logs[1])
    assert len(first) == 6 and first == every[:6]


# ---------------------------------------------------------------------- perplexity
def test_rolling_equals_the_exhaustive_full_sum(tiny, ref, ppl_tasks, tmp_path):
    target = 0.1
    log = tmp_path / "mc.jsonl"
    # num_masks=32: continuations of 5 tokens or fewer (2^T - 2 <= 32 masks) are exact sums
    res = _evaluate(ppl_tasks, ["toy_ppl"], mle.MPTLM(tiny, target_se=target, num_masks=32,
                                                      max_masks=16384, mc_log=log))
    records, summary = read_records(log)
    assert [r["doc_id"] for r in records] == list(range(len(PPL_TEXTS)))
    exact = np.array([ref.mpt_sum([], ref.ids(t)) for t in PPL_TEXTS])
    got = np.array([r["loglikelihood"] for r in records])
    se = np.array([r["stderr"] for r in records])
    is_exact = np.array([r["exact"] for r in records])
    assert is_exact.any() and not is_exact.all()
    assert (se[~is_exact] > 0).all() and (se[is_exact] == 0).all() and (se <= target).all()
    assert (np.abs(got - exact) < 4 * se + 1e-5).all(), (got, exact, se)
    # lm-eval's metrics are those of the logged log-likelihoods ...
    words = sum(len(t.split()) for t in PPL_TEXTS)
    nbytes = sum(len(t.encode()) for t in PPL_TEXTS)
    r = res["results"]["toy_ppl"]
    assert r["word_perplexity,none"] == pytest.approx(math.exp(-got.sum() / words), rel=1e-9)
    assert r["bits_per_byte,none"] == pytest.approx(-got.sum() / nbytes / math.log(2),
                                                    rel=1e-9)
    # ... which give the reference's within their Monte Carlo error, stated in the summary
    s = summary["toy_ppl"]
    assert s["loglikelihood_mc_stderr"] == pytest.approx(math.sqrt((se ** 2).sum()))
    assert abs(got.sum() - exact.sum()) < 4 * s["loglikelihood_mc_stderr"]
    assert s["word_perplexity_mc_rel_stderr"] == pytest.approx(
        s["loglikelihood_mc_stderr"] / words)
    assert res["config"]["mptlml"]["monte_carlo"] == summary
    # every request's standard error and cost are in the output
    samples = res["samples"]["toy_ppl"]
    assert {s["doc_id"] for s in samples} == {r["doc_id"] for r in records}
    assert all(r["masked_inputs"] > 0 and math.isfinite(r["stderr"]) for r in records)


def test_long_texts_are_scored_in_windows():
    assert _windows(0, 8) == [] and _windows(5, 8) == [(0, 0, 5)]
    w = _windows(21, 8)
    assert w[0] == (0, 0, 8)
    assert all(e - c <= 8 for c, _, e in w)  # each window fits with its context
    assert [s for _, s, _ in w][1:] == [e for _, _, e in w][:-1] and w[-1][2] == 21
    assert all(s - c == 8 - (e - s) for c, s, e in w[1:])  # as much context as fits


@pytest.mark.slow
def test_long_inputs_keep_the_last_context_and_window_long_texts(tmp_path):
    """A model of 8 content tokens: contexts cut on the left, texts scored in windows."""
    short = make_tiny_bert(tmp_path / "short", max_position_embeddings=10)
    lm = MaskedLM.from_pretrained(short)
    assert lm.max_content_length == 8
    ref = Reference(short)
    context = "the dog was under the big tree and the cat sat on"  # 12 tokens
    text = "the dog was under the big tree and the cat sat on the mat"  # 14 tokens
    tasks = write_tasks(tmp_path / "tasks", prefix="long",
                        mc_docs=[{"context": context, "choices": ["a mat", "the red house"],
                                  "label": 0}], ppl_texts=[text])
    log = tmp_path / "mc.jsonl"
    target = 0.1
    res = _evaluate(tasks, ["long_mc", "long_ppl"],
                    mle.MPTLM(lm, target_se=target, num_masks=256, max_masks=16384, mc_log=log))
    records, _ = read_records(log)
    mc = sorted((r for r in records if r["task"] == "long_mc"), key=lambda r: r["idx"])
    ctx = ref.ids(context)
    for r, cand in zip(mc, ["a mat", "the red house"], strict=True):
        c, t = ref.pair(context, " " + cand)
        kept = c[len(c) - (8 - 3):]  # room beside the longest candidate (3 tokens)
        assert r["context_tokens"] == 5 and r["context_tokens_dropped"] == len(ctx) - 5
        assert abs(r["loglikelihood"] - ref.mpt_sum(kept, t)) < 4 * r["stderr"] + 1e-5
    (roll,) = [r for r in records if r["task"] == "long_ppl"]
    ids = ref.ids(text)
    assert len(ids) == 14 and roll["windows"] == 3
    want = sum(ref.mpt_sum(ids[c:s], ids[s:e]) for c, s, e in _windows(len(ids), 8))
    assert roll["stderr"] < 2 * target
    assert abs(roll["loglikelihood"] - want) < 4 * roll["stderr"] + 1e-5
    assert res["results"]["long_ppl"]["word_perplexity,none"] == pytest.approx(
        math.exp(-roll["loglikelihood"] / 14))


# ---------------------------------------------------------------------- AntiBERTy
def _spaced(residues: str) -> str:
    return " ".join(residues)


def antibody_docs() -> tuple[list[dict], list[str]]:
    """Germline V genes of three families: their first 22 residues as context, the true next
    3 against an implausible triple and the reversal; and 4-residue fragments to score whole
    (residues spaced, as a saved AntiBERTy tokenizer reads them)."""
    from mptlml.data import bundled_antibodies

    seqs = [bundled_antibodies().texts[i] for i in (0, 40, 70)]
    docs = [{"context": _spaced(x[:22]),
             "choices": [_spaced(x[22:25]), _spaced("WCW"), _spaced(x[22:25][::-1])],
             "label": 0} for x in seqs]
    return docs, [_spaced(x[30:34]) for x in seqs]


@pytest.fixture(scope="module")
def antiberty_dir(antiberty, tmp_path_factory):
    """AntiBERTy saved with its tokenizer, the directory a command line names."""
    d = tmp_path_factory.mktemp("antiberty")
    antiberty.model.save_pretrained(d)
    antiberty.tokenizer.save_pretrained(d)
    return d


@pytest.mark.slow
def test_antiberty_through_the_evaluator_and_the_command_line(antiberty, antiberty_dir,
                                                              tmp_path):
    docs, texts = antibody_docs()
    tasks = write_tasks(tmp_path / "tasks", mc_docs=docs, ppl_texts=texts, prefix="ab")
    ref = Reference(antiberty_dir)
    settings = dict(target_se=0.5, num_masks=64, max_masks=2048, seed=2)
    log = tmp_path / "py.jsonl"
    res = _evaluate(tasks, ["ab_mc", "ab_ppl"], mle.MPTLM(antiberty, mc_log=log, **settings))
    records, summary = read_records(log)
    exact = {}
    for d, doc in enumerate(docs):
        for i, c in enumerate(doc["choices"]):
            exact[("ab_mc", d, i)] = ref.mpt_sum(*ref.pair(doc["context"], " " + c))
    for d, t in enumerate(texts):
        exact[("ab_ppl", d, 0)] = ref.mpt_sum([], ref.ids(t))
    assert {(r["task"], r["doc_id"], r["idx"]) for r in records} == set(exact)
    for r in records:
        assert (r["stderr"] == 0) == r["exact"] and r["stderr"] <= settings["target_se"]
        assert abs(r["loglikelihood"] - exact[(r["task"], r["doc_id"], r["idx"])]) < 4 * r[
            "stderr"] + 1e-4, r
    want = np.mean([max(range(3), key=lambda i: exact[("ab_mc", d, i)]) == 0
                    for d in range(len(docs))])
    assert res["results"]["ab_mc"]["acc,none"] == pytest.approx(want)
    assert summary["ab_mc"]["questions"] == len(docs)
    # the command line, AntiBERTy from its directory: the same numbers as the Python route
    out = tmp_path / "cli"
    args = ",".join(f"{k}={v}" for k, v in settings.items())
    assert mle.main(["--model", "mptlml", "--model_args", f"pretrained={antiberty_dir},{args}",
                     "--tasks", "ab_mc,ab_ppl", "--include_path", str(tasks),
                     "--output_path", str(out), "--log_samples"]) == 0
    cli, samples, cli_log = _results(out)
    cli_records, _ = read_records(cli_log)
    key = lambda r: (r["task"], r["doc_id"], r["idx"])  # noqa: E731
    for a, b in zip(sorted(records, key=key), sorted(cli_records, key=key), strict=True):
        assert b["loglikelihood"] == pytest.approx(a["loglikelihood"], abs=1e-4)
        assert b["masked_inputs"] == a["masked_inputs"]
    assert cli["results"]["ab_mc"]["acc,none"] == res["results"]["ab_mc"]["acc,none"]


def test_a_masked_diffusion_checkpoint_from_model_args(tmp_path):
    """mask_token_id, trust_remote_code and add_special_tokens reach MaskedLM.from_pretrained."""
    from .diffusion_helpers import MASK_WORD, make_word_tokenizer, save_remote_code_model

    tok = make_word_tokenizer()
    ckpt = save_remote_code_model(tmp_path / "mdm", len(tok))
    docs = [{"context": "the cat sat on", "choices": ["a mat", "the red house"], "label": 0},
            {"context": "a big dog", "choices": ["ran far away", "tree", "blue"], "label": 2}]
    tasks = write_tasks(tmp_path / "tasks", prefix="mdm", mc_docs=docs,
                        ppl_texts=["the cat sat", "a big dog ran"])
    mask_id = tok.convert_tokens_to_ids(MASK_WORD)
    lm = mle.MPTLM.create_from_arg_string(
        f"pretrained={ckpt},mask_token_id={mask_id},trust_remote_code=true,"
        f"add_special_tokens=false,num_masks=4,mc_log={tmp_path / 'mc.jsonl'}")
    assert lm.model.mask_token_id == mask_id and lm.model.prefix == []
    res = _evaluate(tasks, ["mdm_mc", "mdm_ppl"], lm)
    records, summary = read_records(tmp_path / "mc.jsonl")
    assert len(records) == 5 + 2 and all(math.isfinite(r["loglikelihood"]) for r in records)
    assert 0 <= res["results"]["mdm_mc"]["acc,none"] <= 1
    assert set(summary) == {"mdm_mc", "mdm_ppl"}


# ---------------------------------------------------------------------- greedy
def test_greedy_unmasking_equals_direct_forwards(tiny, ref):
    pairs = [("the cat", " sat on a mat"), ("a big", " dog"), ("the", " small red house"),
             ("", "blue tree")]
    ids, nctx = [], []
    for c, x in pairs:
        cc, t = ref.pair(c, x)
        ids.append(torch.tensor(cc + t))
        nctx.append(len(cc))
    # the model's own greedy continuations are greedy: decode them first
    decoded = []
    for t, c in zip(ids, nctx, strict=True):
        x = [ref.tok.cls_token_id, *t[:c].tolist(), *[ref.tok.mask_token_id] * (len(t) - c),
             ref.tok.sep_token_id]
        for _ in range(len(t) - c):
            with torch.no_grad():
                p = torch.softmax(ref.model(input_ids=torch.tensor([x])).logits[0], -1)
            holes = [i for i, v in enumerate(x) if v == ref.tok.mask_token_id]
            conf, arg = p[holes].max(-1)
            x[holes[int(torch.argmax(conf))]] = int(arg[int(torch.argmax(conf))])
        decoded.append(torch.tensor(x[1:-1]))
    got = greedy_reproduces(tiny, ids + decoded, nctx + nctx, token_budget=64)
    want = [ref.greedy(t[:c].tolist(), t[c:].tolist()) for t, c in zip(ids, nctx, strict=True)]
    assert got[:len(ids)] == want
    assert got[len(ids):] == [True] * len(ids)


def test_top_predictions_equal_direct_forwards(tiny, ref):
    x = [torch.tensor([2, 5, 4, 7, 3]), torch.tensor([2, 4, 9, 4, 11, 12, 3])]
    pos = [torch.tensor([2]), torch.tensor([1, 3])]
    got = tiny.top_predictions(x, pos, token_budget=8)  # one input per forward pass
    for t, p, (lp, tok) in zip(x, pos, got, strict=True):
        with torch.no_grad():
            logp = torch.log_softmax(ref.model(input_ids=t[None]).logits[0], -1)[p]
        torch.testing.assert_close(lp, logp.max(-1).values.double(), atol=1e-5, rtol=0)
        assert tok.tolist() == logp.argmax(-1).tolist()


# ---------------------------------------------------------------------- the summary
def test_summary_states_the_monte_carlo_share():
    q = [{"id": 1, "decided": True, "margin_z": 6.0, "z_threshold": 1.96},
         {"id": 2, "decided": False, "margin_z": 1.0, "z_threshold": 1.96},
         {"id": 3, "decided": False, "tied": True, "margin_z": 0.1, "z_threshold": 1.96}]
    recs = [{"request": "loglikelihood", "task": "mc", "doc_id": d, "idx": i,
             "loglikelihood": -1.0, "stderr": 0.1 * (i + 1), "masked_inputs": 10,
             "question": q[d]} for d in (0, 1) for i in (0, 1)]
    # a question stopped as a practical tie (compare's indifference zone) is settled
    tied = [{**r, "task": "tie", "question": q[2]} for r in recs[:2]]
    assert summarize(tied)["tie"]["undecided"] == 0 and summarize(tied)["tie"]["tied"] == 1
    recs += [{"request": "loglikelihood", "task": "lambada", "doc_id": d, "idx": 0,
              "loglikelihood": -2.0, "stderr": 0.2, "masked_inputs": 5} for d in range(4)]
    recs += [{"request": "loglikelihood_rolling", "task": "ppl", "doc_id": d, "idx": 0,
              "loglikelihood": -5.0, "stderr": 0.3, "masked_inputs": 7, "words": 4,
              "bytes": 10} for d in range(4)]
    s = summarize(recs)
    assert s["mc"]["questions"] == 2 and s["mc"]["undecided"] == 1
    assert s["mc"]["undecided_share"] == 0.5 and s["mc"]["masked_inputs"] == 40
    from scipy.stats import norm

    p = norm.cdf([-6.0, -1.0])
    assert s["mc"]["accuracy_mc_stderr"] == pytest.approx(np.sqrt((p * (1 - p)).sum()) / 2)
    assert s["mc"]["stderr_mean"] == pytest.approx(0.15) and s["mc"]["stderr_max"] == 0.2
    # exp(-mean ll): relative MC error sqrt(sum se^2) / N
    assert s["lambada"]["perplexity_mc_rel_stderr"] == pytest.approx(0.4 / 4)
    assert s["ppl"]["loglikelihood"] == -20.0
    assert s["ppl"]["loglikelihood_mc_stderr"] == pytest.approx(0.6)
    assert s["ppl"]["word_perplexity_mc_rel_stderr"] == pytest.approx(0.6 / 16)
    assert s["ppl"]["bits_per_byte_mc_stderr"] == pytest.approx(0.6 / 40 / math.log(2))


# ---------------------------------------------------------------------- command line
def _results(out: Path) -> tuple[dict, dict[str, list[dict]], Path]:
    res = json.loads(Path(glob.glob(str(out / "**" / "results_*.json"), recursive=True)[0])
                     .read_text())
    samples = {}
    for f in glob.glob(str(out / "**" / "samples_*.jsonl"), recursive=True):
        task = Path(f).name.removeprefix("samples_").rsplit("_", 1)[0]
        samples[task] = [json.loads(s) for s in Path(f).read_text().splitlines()]
    logs = glob.glob(str(out / "**" / "mptlml_monte_carlo_*.jsonl"), recursive=True)
    assert len(logs) == 1, logs  # beside the results file, with its timestamp
    assert Path(logs[0]).name.removeprefix("mptlml_monte_carlo_").removesuffix(".jsonl") == (
        Path(glob.glob(str(out / "**" / "results_*.json"), recursive=True)[0]).stem
        .removeprefix("results_"))
    return res, samples, Path(logs[0])


def test_command_line_runs_lm_eval_with_the_model_registered(tiny_dir, ppl_tasks, tmp_path,
                                                             capsys, own_tasks_only):
    from mptlml.cli import main as mptlml_main

    out = tmp_path / "out"  # `mptlml eval ...`: lm-eval's arguments passed through untouched
    assert mptlml_main(["eval", "--model", "mptlml", "--model_args",
                        f"pretrained={tiny_dir},num_masks=4",
                        "--tasks", "toy_ppl", "--include_path", str(ppl_tasks),
                        "--device", "cpu", "--output_path", str(out), "--log_samples"]) == 0
    assert "word_perplexity" in capsys.readouterr().out  # lm-eval's table
    res, samples, log = _results(out)
    records, summary = read_records(log)
    assert res["config"]["mptlml"]["mc_log"] == str(log)
    assert res["config"]["mptlml"]["monte_carlo"] == summary
    keyed = {(r["doc_id"], r["idx"]): r for r in records}
    for s in samples["toy_ppl"]:  # the logged response is the record's, with its SE beside it
        r = keyed[(s["doc_id"], 0)]
        assert float(s["resps"][0][0]) == pytest.approx(r["loglikelihood"], abs=0, rel=1e-12)
        assert math.isfinite(r["stderr"]) and r["stderr"] >= 0 and r["masked_inputs"] > 0


GEN_DOCS = [{"q": "the cat sat", "a": "on"}, {"q": "a big dog", "a": "ran"},
            {"q": "blue tree and the", "a": "cat"}]


def test_generate_until_through_the_command_line_is_llada_s_sampler(tiny_dir, ref, tmp_path,
                                                                     own_tasks_only):
    """A generate_until task over JSON lines: each answer is LLaDA's algorithm (written on the
    module, tests.test_generation) decoded and cut at the task's ``until``."""
    from mptlml.cli import main as mptlml_main

    from .test_generation import llada_reference

    data = tmp_path / "gen.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in GEN_DOCS))
    (tmp_path / "toy_gen.yaml").write_text(
        f"task: toy_gen\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {data}\noutput_type: generate_until\ntest_split: test\n"
        "doc_to_text: \"{{q}}\"\ndoc_to_target: \"{{a}}\"\n"
        "generation_kwargs:\n  until: [\"house\"]\n  max_gen_toks: 4\n"
        "metric_list:\n  - metric: exact_match\n    aggregation: mean\n"
        "    higher_is_better: true\n")
    out = tmp_path / "out"
    assert mptlml_main(["eval", "--model", "mptlml", "--model_args",
                        f"pretrained={tiny_dir},steps=4,block_length=2",
                        "--tasks", "toy_gen", "--include_path", str(tmp_path),
                        "--device", "cpu", "--output_path", str(out), "--log_samples"]) == 0
    f = glob.glob(str(out / "**" / "samples_toy_gen_*.jsonl"), recursive=True)[0]
    got = {json.loads(s)["doc_id"]: json.loads(s)["resps"][0][0]
           for s in Path(f).read_text().splitlines()}
    tok = ref.tok
    for i, d in enumerate(GEN_DOCS):  # max_gen_toks=4 tokens, two blocks of two, 4 steps
        x = torch.tensor([[tok.cls_token_id, *ref.ids(d["q"])]])
        ids = llada_reference(ref.model, x, torch.tensor([tok.sep_token_id]), 4, 4, 2,
                              tok.mask_token_id)[0]
        text = tok.decode(ids.tolist(), skip_special_tokens=False).split("house")[0]
        for special in tok.all_special_tokens:
            text = text.replace(special, "")
        assert got[i] == text


def test_help_names_the_model_and_its_model_args_before_lm_evals_own(capsys):
    from mptlml.cli import main as mptlml_main

    with pytest.raises(SystemExit) as exit_:  # argparse's --help exits 0
        mptlml_main(["eval", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "--model mptlml" in out and "pretrained=" in out
    for name in ("decide", "target_se", "max_masks", "mask_token_id", "device"):
        assert name in out
    assert out.index("model_args") < out.index("usage:")  # then lm-eval's own help


# ---------------------------------------------------------------------- data parallel
def _launch(args: list[str], *, processes: int) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(mptlml.__file__).resolve().parents[1]),
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if processes == 1:
        cmd = [sys.executable, "-m", "mptlml.lm_eval", *args]
    else:
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
               "--num_processes", str(processes), "--num_machines", "1", "--mixed_precision",
               "no", "--dynamo_backend", "no", "-m", "mptlml.lm_eval", *args]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]


@pytest.mark.slow
@pytest.mark.xdist_group("launchers")  # one launcher at a time (ports)
def test_two_processes_give_the_numbers_of_one(tiny_dir, tasks, tmp_path):
    """accelerate launch splits the documents; the numbers do not move, bit for bit on the CPU."""
    common = ["--model", "mptlml", "--model_args", f"pretrained={tiny_dir},num_masks=4,seed=5",
              "--tasks", "toy_mc,toy_ppl", "--include_path", str(tasks), "--device", "cpu",
              "--log_samples"]
    _launch([*common, "--output_path", str(tmp_path / "one")], processes=1)
    _launch([*common, "--output_path", str(tmp_path / "two")], processes=2)
    one, s1, log1 = _results(tmp_path / "one")
    two, s2, log2 = _results(tmp_path / "two")
    assert one["config"]["mptlml"]["world_size"] == 1
    assert two["config"]["mptlml"]["world_size"] == 2
    r1, sum1 = read_records(log1)
    r2, sum2 = read_records(log2)
    assert len(r1) == sum(len(d["choices"]) for d in MC_DOCS) + len(PPL_TEXTS)
    assert r1 == r2 and sum1 == sum2
    assert one["results"] == two["results"]
    # the responses lm-eval's metrics read (lm-eval pads a process's share with repeats of its
    # last request, whose resps then hold the same number twice)
    for task in ("toy_mc", "toy_ppl"):
        key = lambda s: s["doc_id"]  # noqa: E731
        assert [s["filtered_resps"] for s in sorted(s1[task], key=key)] == [
            s["filtered_resps"] for s in sorted(s2[task], key=key)]
