"""The lm-eval doors of rounds 47-49: the peers' model names, group rows, flip probabilities,
the accuracy's Monte Carlo SE against its spread over seeds, and what is refused up front.

References are independent of the code under test where a value is claimed: lm-eval's own
group accuracy (its weighting), the exhaustive choice (every mask scored), the accuracy's
spread over seeds, the ids a tokenizer gives, a forward hook counting passes.
"""

from __future__ import annotations

import json
import math
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest

import mptlml
import mptlml.lm_eval as mle

from .mlm_helpers import WORDS
from .test_lm_eval import MC_DOCS, read_records, write_tasks

pytestmark = pytest.mark.usefixtures("one_thread")

#: multiple-choice documents whose choices are too long to be scored exactly (5 tokens)
LONG_DOCS = [{"context": c, "choices": ch, "label": 0} for c, ch in [
    ("the cat sat on", ["a mat and the dog", "the big red house", "far away under a tree"]),
    ("a big dog ran", ["far away with the cat", "over the small mat", "and the blue tree is"]),
    ("the small red", ["house was under a tree", "cat sat on a mat", "dog ran far away big"]),
    ("blue tree and", ["the cat sat on a", "a dog ran far away", "the red house is big"]),
]]


def _manager(root: Path):
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(root), include_defaults=False)


# ---------------------------------------------------------------------- the peers' model names
@pytest.mark.slow
def test_peer_model_names_run_published_command_lines(tiny_dir, tmp_path, own_tasks_only):
    """`--model llada_dist` (LLaDA's eval_llada line, lm-eval's --batch_size 8) through
    `mptlml eval`, and `model="dream"` (Dream's arguments) through simple_evaluate: each
    runs unchanged, with the adapter's default mc_num=128 and its arguments' meaning."""
    import lm_eval

    from mptlml.cli import main as mptlml_main

    tasks = write_tasks(tmp_path / "tasks", mc_docs=LONG_DOCS[:2])
    out = tmp_path / "out"
    with pytest.warns(UserWarning, match="batch_size=8 .* does not apply to mptlml"):
        assert mptlml_main([
            "eval", "--model", "llada_dist", "--model_args",
            f"model_path={tiny_dir},cfg=0.,is_check_greedy=False,mc_num=16",
            "--tasks", "toy_mc", "--include_path", str(tasks), "--batch_size", "8",
            "--device", "cpu", "--output_path", str(out)]) == 0
    (res_file,) = out.rglob("results_*.json")
    res = json.loads(res_file.read_text())
    config = res["config"]["mptlml"]
    assert (config["mc_num"], config["max_masks"], config["greedy"]) == (16, 16, False)
    assert "acc_mc_stderr,none" in res["results"]["toy_mc"]
    res = lm_eval.simple_evaluate(
        model="dream", model_args=f"pretrained={tiny_dir},nll_type=mc,log_type=ftb,"
        "classifier_free_guidance=1.0,add_bos_token=false", tasks=["toy_mc"],
        task_manager=_manager(tasks), device="cpu")
    config = res["config"]["mptlml"]
    assert (config["mc_num"], config["max_masks"], config["cfg"]) == (128, 128, 0.0)
    assert res["config"]["model"] == "dream"
    for model, bad in (("llada_dist", "remasking=entropy"), ("dream", "sampling_eps=0.001")):
        with pytest.raises((TypeError, ValueError), match=bad.split("=")[0]):
            lm_eval.simple_evaluate(model=model, model_args=f"pretrained={tiny_dir},{bad}",
                                    tasks=["toy_mc"], task_manager=_manager(tasks))


# ---------------------------------------------------------------------- group rows
def _group_tasks(root: Path) -> Path:
    sizes = {"ga": 1, "gb": 3, "gc": 1, "gd": 3}
    for name, n in sizes.items():
        write_tasks(root, mc_docs=LONG_DOCS[:n], prefix=name)
    for group, members, by_size in (("grp_size", ("ga", "gb"), "true"),
                                    ("grp_flat", ("gc", "gd"), "false")):
        (root / f"{group}.yaml").write_text(
            f"group: {group}\ntask:\n" + "".join(f"  - {m}_mc\n" for m in members)
            + "aggregate_metric_list:\n  - metric: acc\n    aggregation: mean\n"
            f"    weight_by_size: {by_size}\n")
    return root


def test_group_rows_carry_the_mc_stderr_as_lm_eval_aggregates_the_metric(tiny, tmp_path):
    """mmlu-style groups: acc_mc_stderr on the group row is sqrt(sum w^2 se^2) / sum w over
    its tasks, w their sizes where the YAML weights by size, 1 where not; the weights are
    the ones lm-eval's own group acc was taken with (checked on the acc itself)."""
    import lm_eval

    root = _group_tasks(tmp_path / "tasks")
    lm = mle.MPTLM(tiny, num_masks=2, greedy=False, mc_log=tmp_path / "mc.jsonl")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # 2 masks: few dof, said elsewhere
        res = lm_eval.simple_evaluate(model=lm, tasks=["grp_size", "grp_flat"],
                                      task_manager=_manager(root))
    mle.add_monte_carlo_stderr(res, model=lm)
    rows = res["results"]
    for group, members, by_size in (("grp_size", ("ga_mc", "gb_mc"), True),
                                    ("grp_flat", ("gc_mc", "gd_mc"), False)):
        w = np.array([len(LONG_DOCS[:1 if m in ("ga_mc", "gc_mc") else 3]) if by_size else 1
                      for m in members], dtype=float)
        acc = np.array([rows[m]["acc,none"] for m in members])
        se = np.array([rows[m]["acc_mc_stderr,none"] for m in members])
        assert rows[group]["acc,none"] == pytest.approx(float(w @ acc / w.sum()), abs=1e-12)
        want = math.sqrt(float((w ** 2) @ (se ** 2))) / w.sum()
        assert rows[group]["acc_mc_stderr,none"] == pytest.approx(want, rel=1e-12)
        assert (se > 0).any()  # 5-token choices at 2 masks: a Monte Carlo error to carry


# ---------------------------------------------------------------------- flip probabilities
def test_flip_probability_is_in_each_questions_record(tiny, tmp_path):
    import lm_eval
    from scipy.stats import norm

    from mptlml.lm_eval.records import flip_probability

    tasks = write_tasks(tmp_path / "tasks", mc_docs=LONG_DOCS)
    lm = mle.MPTLM(tiny, num_masks=4, greedy=False, mc_log=tmp_path / "mc.jsonl")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        lm_eval.simple_evaluate(model=lm, tasks=["toy_mc"], task_manager=_manager(tasks))
    records, _ = read_records(tmp_path / "mc.jsonl")
    qs = [r["question"] for r in records if r["idx"] == 0]
    assert len(qs) == len(LONG_DOCS)
    for q in qs:
        assert q["flip_probability"] == pytest.approx(float(norm.sf(q["margin_z"])), abs=1e-12)
    assert flip_probability(math.inf) == 0.0 and flip_probability(None) == 0.0
    assert flip_probability(0.0) == 0.5


def _near_tie_set(seed: int = 0) -> tuple[list[str], list[list[str]]]:
    """24 three-way questions of 5-token candidates from the tiny vocabulary: leader gaps from
    a near tie (0.2 nats) to clear (14 nats) under the tiny BERT."""
    rng = np.random.default_rng(seed)
    ctx = [" ".join(rng.choice(WORDS, 3)) for _ in range(24)]
    cands = [[" " + " ".join(rng.choice(WORDS, 5)) for _ in range(3)] for _ in range(24)]
    return ctx, cands


@pytest.mark.slow
def test_flip_probabilities_add_up_to_the_flips_and_the_accuracy_se_to_its_spread(tiny):
    """Over 20 seeds of 24 questions (near ties to clear) at num_masks=8: the flip
    probabilities add up to the choices that differ from the exhaustive one (every mask
    scored), within 3 sd of a sum of independent coins; and the accuracy's spread over the
    seeds matches the mean reported acc_mc_stderr (measured: 72 flips against 69.7; spread
    0.063 against 0.065)."""
    from mptlml.lm_eval.records import flip_probability

    ctx, cands = _near_tie_set()
    exhaustive = mptlml.compare(tiny, ctx, cands, num_masks=32)  # 2^5 - 2 = 30: every mask
    assert all(e.all() for e in exhaustive.exact)
    best = np.array(exhaustive.choice)
    expected, var, observed, accuracy, reported = 0.0, 0.0, 0, [], []
    for seed in range(20):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            res = mptlml.compare(tiny, ctx, cands, num_masks=8, seed=seed)
        p = np.array([flip_probability(z) for z in res.margin_z])
        expected, var = expected + p.sum(), var + (p * (1 - p)).sum()
        observed += int((np.array(res.choice) != best).sum())
        accuracy.append(float(np.mean(np.array(res.choice) == 0)))
        reported.append(math.sqrt(float((p * (1 - p)).sum())) / len(ctx))
    assert observed > 10  # the set has flips to count
    assert abs(observed - expected) <= 3 * math.sqrt(var), (observed, expected)
    ratio = float(np.std(accuracy, ddof=1)) / float(np.mean(reported))
    assert 0.7 < ratio < 1.4, ratio  # the sd of an sd over 20 seeds: about 16%


# ---------------------------------------------------------------------- refused up front
def test_guidance_is_refused_before_any_scoring_where_it_cannot_apply(tiny, tmp_path):
    """cfg with a perplexity task in the run: refused before the multiple-choice task is
    scored (no forward pass), whichever task comes first; cfg with an empty prompt: refused
    at compare's door and through lm-eval, before any forward pass."""
    import lm_eval

    tasks = write_tasks(tmp_path / "tasks", mc_docs=MC_DOCS[:2], ppl_texts=["the cat sat"])
    calls = []
    hook = tiny.model.register_forward_hook(lambda *a: calls.append(1))
    try:
        for order in (["toy_mc", "toy_ppl"], ["toy_ppl", "toy_mc"]):
            lm = mle.MPTLM(tiny, cfg=0.5, greedy=False)
            with pytest.raises(ValueError, match=r"cfg: guidance needs a context.*\['toy_ppl'\]"
                                                 ".*nothing was scored"):
                lm_eval.simple_evaluate(model=lm, tasks=order, task_manager=_manager(tasks))
        ids = tiny.encode(["the cat", "sat on", "a mat", "ran"])
        for contexts, candidates in ((["", "the cat"], [[" sat on", " a mat"], [" ran"]]),
                                     ([[], ids[0].tolist()], [[ids[1].tolist(),
                                                                ids[2].tolist()],
                                                               [ids[3].tolist()]])):
            with pytest.raises(ValueError, match="continuation 0 has no token"):
                mptlml.compare(tiny, contexts, candidates, cfg_scale=0.5)
        empty = write_tasks(tmp_path / "empty", mc_docs=[{"context": "", "choices": [
            "the cat", "a dog"], "label": 0}], prefix="bare")
        lm = mle.MPTLM(tiny, cfg=0.5, is_check_greedy=False)
        with pytest.raises(ValueError, match="has no token"):
            lm_eval.simple_evaluate(model=lm, tasks=["bare_mc"], task_manager=_manager(empty))
    finally:
        hook.remove()
    assert not calls


def test_messages_name_the_argument_as_the_user_spelt_it(tiny):
    """LLaDA's is_check_greedy and Dream's classifier_free_guidance are named as such."""
    with pytest.raises(ValueError, match="cfg=0.5 with the greedy check.*is_check_greedy=false"):
        mle.MPTLM(tiny, cfg=0.5, is_check_greedy=True)
    with pytest.raises(ValueError, match="classifier_free_guidance=1.5 with the greedy check"):
        mle.MPTLM(tiny, classifier_free_guidance=1.5)
    for value in ("yes", 1):
        with pytest.raises(TypeError, match="is_check_greedy must be true or false"):
            mle.MPTLM(tiny, is_check_greedy=value)
    lm = mle.MPTLM(tiny, is_check_greedy=False)
    with pytest.warns(UserWarning, match="is_check_greedy=false: every is_greedy is False"):
        lm._greedy([], [])


def test_mc_log_is_made_or_refused_before_any_request(tiny, tmp_path):
    """The Monte Carlo log is created when the model is built: a path that cannot be made is
    refused then (no model run), and a second run into the same file, concurrent or later,
    is refused before its first request; the first run's records are whole."""
    for bad in ("/proc/mptlml_mc.jsonl", "/proc/self/mptlml/mc.jsonl"):
        with pytest.raises(ValueError, match=f"mc_log={bad}"):
            mle.MPTLM(tiny, mc_log=bad)
    path = tmp_path / "mc.jsonl"
    built, refused = [], []

    def build() -> None:
        try:
            built.append(mle.MPTLM(tiny, mc_log=path, greedy=False))
        except FileExistsError as exc:
            refused.append(str(exc))

    threads = [threading.Thread(target=build) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(built) == 1 and len(refused) == 1 and "exists" in refused[0]
    assert path.exists() and path.read_text() == ""  # made at construction, before requests


def test_the_greedy_check_gets_the_context_as_scored(tiny, tmp_path, monkeypatch):
    """is_greedy is asked of greedy_reproduces with each pair's whole context (none of its
    tokens masked or dropped) and the continuation after it: the tokenizer's own ids."""
    import lm_eval
    from transformers import AutoTokenizer

    import mptlml.lm_eval.backend as backend

    seen = []
    real = backend.greedy_reproduces

    def spy(model, ids, num_context, **kw):
        seen.extend(zip([t.tolist() for t in ids], num_context, strict=True))
        return real(model, ids, num_context, **kw)

    monkeypatch.setattr(backend, "greedy_reproduces", spy)
    tasks = write_tasks(tmp_path / "tasks", mc_docs=MC_DOCS[:2])
    lm = mle.MPTLM(tiny, num_masks=4)
    lm_eval.simple_evaluate(model=lm, tasks=["toy_mc"], task_manager=_manager(tasks))
    tok = AutoTokenizer.from_pretrained(tiny.tokenizer.name_or_path)
    want = []
    for doc in MC_DOCS[:2]:
        ctx = tok(doc["context"], add_special_tokens=False)["input_ids"]
        for choice in doc["choices"]:
            cont = tok(" " + choice, add_special_tokens=False)["input_ids"]
            want.append((ctx + cont, len(ctx)))
    assert sorted(seen) == sorted(want) and len(seen) == 6
