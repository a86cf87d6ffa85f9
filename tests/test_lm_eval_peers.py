"""LLaDA's and Dream's lm-eval arguments through the model ``mptlml``; LLaDA's own scheme.

The arguments are those of LLaDA's ``eval_llada.py`` (``llada_dist``) and Dream's
``eval/eval.py`` (``dream``): each is taken with its meaning or refused before any
scoring with a message naming it.
"""

from __future__ import annotations

import itertools
import logging
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import mptlml
import mptlml.lm_eval as mle
from mptlml.estimators.sequential import round_seed
from mptlml.seeds import spawn

from .diffusion_helpers import MASK_WORD, make_word_tokenizer, save_remote_code_model

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def mdm(tmp_path_factory):
    """A remote-code masked-diffusion checkpoint (a plain vocabulary entry as mask) and its id."""
    root = tmp_path_factory.mktemp("mdm")
    tok = make_word_tokenizer()
    return save_remote_code_model(root / "mdm", len(tok)), tok.convert_tokens_to_ids(MASK_WORD)


def test_llada_command_line_arguments_run_unchanged(mdm):
    """eval_llada_lm_eval.sh's model_args (model_path, cfg=0., is_check_greedy, mc_num)."""
    ckpt, mask_id = mdm
    lm = mle.MPTLM.create_from_arg_string(
        f"model_path={ckpt},mask_id={mask_id},trust_remote_code=true,add_special_tokens=false,"
        "cfg=0.,is_check_greedy=False,mc_num=128", {"device": "cpu"})
    assert lm.model.mask_token_id == mask_id and lm.greedy is False
    assert (lm.num_masks, lm.max_masks, lm.mc_num, lm.cfg) == (16, 128, 128, 0.0)
    # LLaDA's MMLU line: mc_num=1 (compare draws masks in pairs: 2, announced)
    with pytest.raises(TypeError, match="mc_num=.* and max_masks=.* are one budget"):
        mle.MPTLM.create_from_arg_string(f"model_path={ckpt},mask_id={mask_id},"
                                         "trust_remote_code=true,mc_num=8,max_masks=8")


def test_mc_num_is_a_fixed_budget(tiny, caplog):
    # mc_num masked inputs per request, as max_masks: the whole continuation's row and
    # mc_num - 1 draws, in pairs (6 of 8)
    lm = mle.MPTLM(tiny, mc_num=8)
    assert (lm.num_masks, lm.max_masks) == (6, 8)
    with caplog.at_level(logging.WARNING, logger="lm_eval.mptlml"):
        lm = mle.MPTLM(tiny, mc_num=1)
    assert (lm.num_masks, lm.max_masks) == (2, 3)
    assert "mc_num=1" in caplog.text and "in pairs" in caplog.text
    with pytest.raises(ValueError, match="num_masks=32 draws and the whole continuation's row "
                                         "are more than mc_num=8"):
        mle.MPTLM(tiny, mc_num=8, num_masks=32)
    with pytest.raises(ValueError, match="mc_num must be"):
        mle.MPTLM(tiny, mc_num=0)


def test_dream_arguments(tiny, tiny_dir, mdm):
    """Dream's eval_dream_mc.sh: pretrained, add_bos_token; its loglikelihood options."""
    lm = mle.MPTLM.create_from_arg_string(
        f"pretrained={tiny_dir},nll_type=mc,log_type=ftb,parallelize=false,"
        "classifier_free_guidance=1.0,mc_num=16,max_length=10", {"device": "cpu"})
    assert lm.cfg == 0.0 and lm.max_masks == 16 and lm._limit == 10 - 2  # [CLS] .. [SEP]
    for arg, match in [("nll_type=ar_ftb", "nll_type='ar_ftb'.*only"),
                       ("log_type=union", "log_type='union'.*only"),
                       ("parallelize=true", "parallelize=True"),
                       ("sampling_eps=0.001", "sampling_eps.*Dream's own"),
                       ("classifier_free_guidance=0.5", "guides from 1 up"),
                       ("max_length=2", "max_length=2 leaves no room")]:
        with pytest.raises(ValueError, match=match):
            mle.MPTLM.create_from_arg_string(f"pretrained={tiny_dir},{arg}")
    with pytest.raises(ValueError, match="add_bos_token=true: this tokenizer has no BOS"):
        mle.MPTLM(tiny, add_bos_token=True)


def test_generation_options_are_taken_under_llada_s_and_dream_s_names(tiny_dir):
    from mptlml.lm_eval.generation import GenerationSettings

    lm = mle.MPTLM.create_from_arg_string(
        f"pretrained={tiny_dir},gen_length=8,steps=4,block_length=4,remasking=random,"
        "temperature=0.5")
    assert lm.settings.generation == GenerationSettings(8, 4, 4, "random", 0.5)
    lm = mle.MPTLM.create_from_arg_obj({"pretrained": str(tiny_dir), "max_new_tokens": "6",
                                        "diffusion_steps": "3"})
    assert lm.settings.generation == GenerationSettings(6, 3)
    for arg, err, match in [
            ("alg=entropy", TypeError, r"\['alg'\]: options of Dream's own sampler"),
            ("top_p=0.9", TypeError, "Dream's own sampler"),
            ("gen_length=8,max_new_tokens=8", TypeError, "given already under another name"),
            ("remasking=entropy", ValueError, "remasking='entropy'"),
            ("steps=0", ValueError, "steps must be a positive integer")]:
        with pytest.raises(err, match=match):
            mle.MPTLM.create_from_arg_string(f"pretrained={tiny_dir},{arg}")


def test_one_argument_under_two_names_is_refused(tiny_dir):
    for args, match in [(f"pretrained={tiny_dir},model_path={tiny_dir}", "model_path and "
                         "pretrained are one argument"),
                        (f"pretrained={tiny_dir},is_check_greedy=false,greedy=true",
                         "is_check_greedy and greedy are one argument"),
                        (f"pretrained={tiny_dir},cfg=0.5,classifier_free_guidance=1.5",
                         "classifier_free_guidance and cfg are one argument")]:
        with pytest.raises(TypeError, match=match):
            mle.MPTLM.create_from_arg_string(args)
    with pytest.raises(ValueError, match="cfg=-1.*>= 0"):
        mle.MPTLM.create_from_arg_string(f"pretrained={tiny_dir},cfg=-1")


def test_max_length_cuts_the_context_and_bos_leads_it(tmp_path):
    """max_length counts the specials; add_bos_token puts the BOS id before every context."""
    from .mlm_helpers import make_tiny_bert

    d = make_tiny_bert(tmp_path / "bert")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(d)
    tok.bos_token = tok.cls_token  # the frame leads with this BOS already: nothing added
    tok.save_pretrained(d)
    lm = mle.MPTLM.create_from_arg_string(f"pretrained={d},add_bos_token=true",
                                          {"device": "cpu"})
    assert lm.model.prefix == [tok.cls_token_id] and lm._bos == []
    tok.bos_token = tok.sep_token  # a BOS the frame does not lead with: the frame's, after [CLS]
    tok.save_pretrained(d)
    lm = mle.MPTLM.create_from_arg_string(f"pretrained={d},add_bos_token=true,max_length=9",
                                          {"device": "cpu"})
    assert lm._bos == [tok.sep_token_id] and lm.model.prefix == [tok.cls_token_id, tok.sep_token_id]
    assert lm._limit == 9 - 3  # max_length counts the frame: [CLS], the BOS, [SEP]
    ctx, cont = lm._pair_ids([mle.backend._Key("t", 0, 0, ("the cat sat", " on a mat"))])
    assert ctx[0].tolist() == tok("the cat sat", add_special_tokens=False)["input_ids"]
    assert cont[0].tolist() == tok(" on a mat", add_special_tokens=False)["input_ids"]
    assert torch.is_tensor(ctx[0])
    from lm_eval.api.instance import Instance  # scored: the [SEP] BOS is not refused as content

    (ll, _), = lm.loglikelihood([Instance("loglikelihood", {}, ("the cat sat", " on a mat"), 0,
                                          ("t", 0, 1))])
    assert math.isfinite(ll)


# ---------------------------------------------------------------------- LLaDA's scheme
def _exact_profile(tiny_dir, context: list[int], target: list[int]
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Per count l = 1..L: mean and population variance over every mask of l tokens of the
    continuation of (1/l) sum_{masked} log p(x_j | rest), by BertForMaskedLM directly."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    model = AutoModelForMaskedLM.from_pretrained(tiny_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    seq = [tok.cls_token_id, *context, *target, tok.sep_token_id]
    off = 1 + len(context)
    n = len(target)
    mean, var = np.zeros(n), np.zeros(n)
    for size in range(1, n + 1):
        subsets = list(itertools.combinations(range(n), size))
        x = torch.tensor([seq] * len(subsets))
        for r, sub in enumerate(subsets):
            x[r, [off + j for j in sub]] = tok.mask_token_id
        with torch.no_grad():
            lp = torch.log_softmax(model(input_ids=x).logits.double(), -1)
        v = np.array([sum(float(lp[r, off + j, target[j]]) for j in sub) / size
                      for r, sub in enumerate(subsets)])
        mean[size - 1], var[size - 1] = v.mean(), v.var()
    return mean, var


def _llada_counts(k: int, n: int, b: int) -> np.ndarray:
    """LLaDA's formula in numpy: float32 linspace, round half to even, wrapped into 1..n."""
    c = np.round(np.linspace(np.float32(k), np.float32(k + (b - 1) * (n / b)), b,
                             dtype=np.float32)).astype(np.int64)
    return (c - 1) % n + 1


def test_llada_scheme_has_the_mean_and_variance_derived_for_it(tiny, tiny_dir):
    """Over seeds, LLaDA's estimate has its closed-form mean and variance.

    A batch of b copies from start k has mean m_k = (1/b) sum_j L S(l_j) and, given k,
    variance (1/b^2) sum_j L^2 var(l_j) (independent uniform positions); k ~ U{1..L}:
    E = mean_k m_k, Var(batch) = var_k m_k + mean_k (1/b^2) sum_j L^2 var(l_j); the
    estimate averages mc_num / b independent batches. L = 5, b = 4: j L / b hits 2.5, so
    round-half-to-even makes the counts uneven and E differs from the MPT sum.
    """
    from mptlml.estimators import llada_scores

    enc = tiny.encode(["the cat", "sat on a big mat"])
    context, target = enc[0].tolist(), enc[1].tolist()
    n, b, mc_num, pairs = len(target), 4, 8, 400
    assert n == 5
    mean, var = _exact_profile(tiny_dir, context, target)
    m_k, within = [], []
    for k in range(1, n + 1):
        c = _llada_counts(k, n, b) - 1
        m_k.append(np.mean(n * mean[c]))
        within.append(np.sum(n * n * var[c]) / b ** 2)
    want_mean = float(np.mean(m_k))
    want_var = (float(np.var(m_k)) + float(np.mean(within))) / (mc_num // b)
    assert abs(want_mean - mean.sum()) > 1e-3  # the rounding's bias: not the MPT sum
    res = llada_scores(tiny, [context] * pairs, [target] * pairs, mc_num=mc_num, batch=b,
                       seed=11)
    got = res.scores
    assert (res.masked_inputs == mc_num).all() and res.batches == 2
    assert abs(got.mean() - want_mean) < 4 * math.sqrt(want_var / pairs)
    assert 0.7 < got.var(ddof=1) / want_var < 1.4  # chi2_399 / 399: sd 0.07
    assert 0.7 < np.mean(res.stderr ** 2) / want_var < 1.4  # its SE from the batch means
    # the registered estimator draws the same masks from the same seeds: sequence i's round
    # 0 of its engine stream (11, i), given to llada_scores as pair i's own seed
    with pytest.warns(RuntimeWarning, match="effective degrees of freedom"):
        est = mptlml.estimate_lml(tiny, [target] * 3, "llada", num_masks=mc_num, batch=b,
                                  context=[context] * 3, seed=11)
    same = llada_scores(tiny, [context] * 3, [target] * 3, mc_num=mc_num, batch=b,
                        seed=[spawn(round_seed((11, i), 0), 0) for i in range(3)])
    np.testing.assert_allclose(est.per_sample.numpy(), same.scores, rtol=0, atol=1e-9)
    np.testing.assert_allclose(est.per_sample_stderr.numpy(), same.stderr, rtol=0, atol=1e-9)
    assert est.estimator == "llada" and est.num_masked_rows == 3 * mc_num


def test_llada_scheme_refuses_partial_batches(tiny):
    with pytest.raises(ValueError, match="mc_num\\) = 12 is not a multiple of batch = 8"):
        mptlml.estimate_lml(tiny, ["the cat sat"], "llada", num_masks=12, batch=8)
    with pytest.raises(ValueError, match="target_se= needs an unbiased estimator"):
        mptlml.estimate_lml(tiny, ["the cat sat"], "llada", target_se=0.1)


def _mc_tasks(tmp_path, docs):
    from lm_eval.tasks import TaskManager

    from .test_lm_eval import write_tasks

    tasks = write_tasks(tmp_path / "tasks", mc_docs=docs, ppl_texts=["the cat sat"])
    return TaskManager(include_path=str(tasks), include_defaults=False)


def test_estimator_llada_through_lm_eval_is_compares(tiny, tmp_path):
    """estimator=llada is compare(estimator=LLaDA(mc_num, batch), num_masks=mc_num,
    common_masks=False): lm-eval's --batch_size is LLaDA's batch, and the records are compare's
    numbers at the question's seed (one paired SE, one threshold, through both doors)."""
    import lm_eval

    from mptlml.estimators import LLaDA
    from mptlml.lm_eval.backend import _content_seed

    from .test_lm_eval import MC_DOCS, read_records

    manager = _mc_tasks(tmp_path, MC_DOCS[:3])
    lm = mle.MPTLM.create_from_arg_obj({"pretrained": tiny, "estimator": "llada", "mc_num": 8,
                                        "mc_log": tmp_path / "mc.jsonl"}, {"batch_size": 4})
    assert (lm.mc_num, lm.batch) == (8, 4)
    with pytest.warns(RuntimeWarning, match="fewer than 5 dof"):  # 2 batch means: 1 dof
        lm_eval.simple_evaluate(model=lm, tasks=["toy_mc"], task_manager=manager)
    records, _ = read_records(tmp_path / "mc.jsonl")
    assert len(records) == 9 and all(r["masked_inputs"] == 8 for r in records)
    for d, doc in enumerate(MC_DOCS[:3]):
        rs = sorted((r for r in records if r["doc_id"] == d), key=lambda r: r["idx"])
        args = [(doc["context"], " " + c) for c in doc["choices"]]
        ctx, cont = lm._pair_ids([mle.backend._Key("toy_mc", d, i, a)
                                  for i, a in enumerate(args)])
        with pytest.warns(RuntimeWarning, match="fewer than 5 dof"):
            want = mptlml.compare(tiny, [ctx[0].tolist()], [[c.tolist() for c in cont]],
                                  estimator=LLaDA(8, batch=4), num_masks=8, common_masks=False,
                                  seed=[_content_seed(0, args)])
        np.testing.assert_array_equal([r["loglikelihood"] for r in rs], want.scores[0])
        np.testing.assert_array_equal([r["stderr"] for r in rs], want.stderr[0])
        np.testing.assert_array_equal([r["paired_stderr"] for r in rs], want.paired_stderr[0])
        q = rs[0]["question"]
        # a missing SE (a 0 from drawn masks) gives margin_z NaN, written as null in JSON
        got_z = math.nan if q["margin_z"] is None else q["margin_z"]
        assert (q["choice"], q["decided"]) == (want.choice[0], want.decided[0])
        assert got_z == want.margin_z[0] or (math.isnan(got_z) and math.isnan(want.margin_z[0]))
    for bad, match in [({"decide": True}, r"\['decide'\] are mptlml's rate draw's"),
                       ({"mc_num": 12, "batch": 8}, "mc_num=12 is not two or more whole"),
                       ({"estimator": "dream"}, "estimator='dream'")]:
        with pytest.raises(ValueError, match=match):
            mle.MPTLM(tiny, **{"estimator": "llada", **bad})
    with pytest.raises(ValueError, match="batch=8 is LLaDA's masks per batch"):
        mle.MPTLM(tiny, batch=8)
    with pytest.raises(TypeError, match="unknown \\['scheme'\\]"):  # renamed: estimator
        mle.MPTLM(tiny, scheme="llada")


@pytest.mark.parametrize("args", [{"mc_num": 4, "batch_size": 4}, {"mc_num": 32},
                                  {"mc_num": 6, "batch_size": 4}])
def test_llada_scheme_without_two_whole_batches_is_refused_at_every_door(tiny, args):
    """One batch has no spread of batch means (a NaN SE that read as a decision, and an
    acc_mc_stderr 0.0); a partial batch drew more than it said. Refused before any work,
    through lm-eval (mc_num == --batch_size) and through compare."""
    from mptlml.estimators import LLaDA

    size = args.get("batch_size")
    with pytest.raises(ValueError, match=f"mc_num={args['mc_num']} is not two or more whole "):
        mle.MPTLM.create_from_arg_obj({"pretrained": tiny, "estimator": "llada",
                                       "mc_num": args["mc_num"]},
                                      {"batch_size": size} if size else {})
    est = LLaDA(8 * (size or 32), batch=size or 32)
    with pytest.raises(ValueError, match=f"num_masks={args['mc_num']} is "
                                         "(one batch|not a multiple)"):
        mptlml.compare(tiny, ["the cat"], [[" sat on a big mat", " ran far away"]],
                       estimator=est, num_masks=args["mc_num"], common_masks=False)


def test_compare_llada_default_draws_no_lone_batch(tiny):
    """compare(estimator="llada") at its default num_masks=16 (half a batch of 32), 8 (a
    quarter, reported as 8) and 32 (one batch) is refused; and with decide a cap whose last
    round would be one batch stops before it: every SE finite, a decision never on NaN."""
    q = (["the cat"], [[" sat on a big mat", " sat on a big cat"]])
    for num_masks in (16, 8, 32):
        with pytest.raises(ValueError, match=f"num_masks={num_masks} is"):
            mptlml.compare(tiny, *q, estimator="llada", common_masks=False,
                           num_masks=num_masks)
    for max_masks in (96, 160):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            res = mptlml.compare(tiny, *q, estimator="llada", common_masks=False, num_masks=64,
                                 decide=True, max_masks=max_masks)
        assert np.isfinite(res.stderr[0]).all() and np.isfinite(res.paired_stderr[0]).all()
        assert res.candidate_masked_rows[0].tolist() == [64, 64] or max_masks == 160
        assert math.isfinite(res.margin_z[0]) and res.stderr_dof[0] >= 1


def test_llada_scheme_under_the_masked_input_cap_is_refused_before_any_work(tiny, tmp_path):
    """max_masked_inputs(10): LLaDA's 8 masks per candidate of 3 candidates pass it; refused
    by compare and by lm-eval's estimator=llada alike, before any forward pass."""
    import lm_eval

    from mptlml.estimators import LLaDA

    from .test_lm_eval import MC_DOCS

    manager = _mc_tasks(tmp_path, MC_DOCS[:2])
    calls = []
    hook = tiny.model.register_forward_hook(lambda *a: calls.append(1))
    try:
        with mptlml.settings.max_masked_inputs(10):
            with pytest.raises(ValueError, match="masked inputs"):
                mptlml.compare(tiny, ["the cat"], [[" sat on a mat", " ran far away"]],
                               estimator=LLaDA(8, batch=4), num_masks=8, common_masks=False)
            for mc_num, batch in ((8, 4), (16, 8)):
                lm = mle.MPTLM(tiny, estimator="llada", mc_num=mc_num, batch=batch,
                               greedy=False)
                with pytest.raises(ValueError, match="masked inputs"):
                    lm_eval.simple_evaluate(model=lm, tasks=["toy_mc"], task_manager=manager)
    finally:
        hook.remove()
    assert not calls


def test_llada_scores_reads_a_seed_as_one_int(tiny):
    from mptlml.estimators import llada_scores

    for seed in ("12", ["1", "2"], 1.5):
        with pytest.raises((TypeError, ValueError), match="seed"):
            llada_scores(tiny, ["the cat"] * 2, [" sat on", " a mat"], mc_num=8, batch=4,
                         seed=seed)
    with pytest.warns(RuntimeWarning, match="one batch"):
        res = llada_scores(tiny, ["the cat"], [" sat on a mat"], mc_num=4, batch=4)
    assert np.isnan(res.stderr).all()


def test_llada_guided_arguments_score_the_guided_sums(tiny, tmp_path):
    """cfg=0.5,is_check_greedy=False (LLaDA's ARC line): short candidates score to the guided
    exhaustive sum by direct forwards; Dream's classifier_free_guidance=1.5 is the same scale."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    from .test_guidance import guided_exhaustive
    from .test_lm_eval import MC_DOCS, read_records, write_tasks

    docs = MC_DOCS[:3]
    tasks = write_tasks(tmp_path / "tasks", mc_docs=docs, ppl_texts=["the cat sat"])
    lm = mle.MPTLM.create_from_arg_obj({"pretrained": tiny, "cfg": 0.5,
                                        "is_check_greedy": False,
                                        "mc_log": tmp_path / "mc.jsonl"})
    assert lm.cfg == 0.5 and mle.MPTLM(tiny, classifier_free_guidance=1.5, greedy=False).cfg == 0.5
    with pytest.warns(UserWarning, match="greedy=false"):
        lm_eval.simple_evaluate(model=lm, tasks=["toy_mc"],
                                task_manager=TaskManager(include_path=str(tasks),
                                                         include_defaults=False))
    records, _ = read_records(tmp_path / "mc.jsonl")
    assert len(records) == 9 and all(r["exact"] for r in records)
    for r in records:
        doc = docs[r["doc_id"]]
        want = guided_exhaustive(tiny, doc["context"], " " + doc["choices"][r["idx"]], 0.5)
        assert r["loglikelihood"] == pytest.approx(want, abs=1e-4), r
    with pytest.raises(ValueError, match="cfg=0.5 with the greedy check"):
        mle.MPTLM(tiny, cfg=0.5)
    lm = mle.MPTLM(tiny, cfg=0.5, greedy=False)
    with pytest.raises(ValueError, match="guidance needs a context"):
        lm_eval.simple_evaluate(model=lm, tasks=["toy_ppl"],
                                task_manager=TaskManager(include_path=str(tasks),
                                                         include_defaults=False))


# ---------------------------------------------------------------------- Monte Carlo SE in results
def _independent_mc_stderr(records: list[dict], docs: list[dict], texts: list[str]
                           ) -> dict[str, float]:
    """The Monte Carlo SEs of acc, acc_norm and the perplexity metrics, from the records."""
    from scipy.stats import norm

    mc = [r for r in records if r["request"] == "loglikelihood"]
    p_acc, p_norm = [], []
    for d, doc in enumerate(docs):
        rs = sorted((r for r in mc if r["doc_id"] == d), key=lambda r: r["idx"])
        ll = np.array([r["loglikelihood"] for r in rs])
        lead = int(np.argmax(ll))
        z = min((ll[lead] - ll[k]) / rs[k]["paired_stderr"] for k in range(len(rs)) if k != lead)
        p_acc.append(norm.cdf(-z))
        n = np.array([len(c) for c in doc["choices"]], dtype=float)
        se = np.array([r["stderr"] for r in rs]) / n
        v = ll / n
        lead = int(np.argmax(v))
        z = min((v[lead] - v[k]) / (se[lead] + se[k]) for k in range(len(rs)) if k != lead)
        p_norm.append(norm.cdf(-z))
    roll = [r for r in records if r["request"] == "loglikelihood_rolling"]
    se_ll = math.sqrt(sum(r["stderr"] ** 2 for r in roll))
    ll = sum(r["loglikelihood"] for r in roll)
    words = sum(len(t.split()) for t in texts)
    nbytes = sum(len(t.encode()) for t in texts)
    acc = lambda p: math.sqrt(sum(q * (1 - q) for q in p)) / len(p)  # noqa: E731
    return {"acc": acc(p_acc), "acc_norm": acc(p_norm),
            "word_perplexity": math.exp(-ll / words) * se_ll / words,
            "byte_perplexity": math.exp(-ll / nbytes) * se_ll / nbytes,
            "bits_per_byte": se_ll / (nbytes * math.log(2))}


PPL_LONG = ["the dog was under the big tree and the cat sat on the mat",
            "a small red house far away"]


def test_monte_carlo_stderr_in_lm_evals_results_table_and_files(tiny_dir, tmp_path, capsys,
                                                                own_tasks_only):
    """mptlml eval: METRIC_mc_stderr keys beside lm-eval's, equal to their computation from the
    per-request records; rows in the printed table; the records beside results_<ts>.json."""
    import glob
    import json

    from mptlml.cli import main as mptlml_main

    from .test_lm_eval import LONG_MC_DOCS, read_records, write_tasks

    tasks = write_tasks(tmp_path / "tasks", mc_docs=LONG_MC_DOCS, ppl_texts=PPL_LONG)
    (tasks / "toy_mc.yaml").write_text((tasks / "toy_mc.yaml").read_text() + (
        "  - metric: acc_norm\n    aggregation: mean\n    higher_is_better: true\n"))
    (tasks / "toy_ppl.yaml").write_text((tasks / "toy_ppl.yaml").read_text() + (
        "  - metric: byte_perplexity\n    aggregation: weighted_perplexity\n"
        "    higher_is_better: false\n"))
    out = tmp_path / "out"
    for _ in range(2):  # two runs into one --output_path: two pairs of files, never shared
        assert mptlml_main(["eval", "--model", "mptlml", "--model_args",
                            f"pretrained={tiny_dir},num_masks=4,greedy=false",
                            "--tasks", "toy_mc,toy_ppl", "--include_path", str(tasks),
                            "--device", "cpu", "--output_path", str(out)]) == 0
    results = sorted(glob.glob(str(out / "*" / "results_*.json")))
    logs = sorted(glob.glob(str(out / "*" / "mptlml_monte_carlo_*.jsonl")))
    assert len(results) == len(logs) == 2 and not glob.glob(str(out / "*.jsonl"))
    for res_file, log in zip(results, logs, strict=True):
        stamp = Path(res_file).stem.removeprefix("results_")
        assert Path(log) == Path(res_file).with_name(f"mptlml_monte_carlo_{stamp}.jsonl")
        res = json.loads(Path(res_file).read_text())
        assert res["config"]["mptlml"]["mc_log"] == log
        records, summary = read_records(Path(log))
        want = _independent_mc_stderr(records, LONG_MC_DOCS, PPL_LONG)
        assert want["acc"] > 0 and want["word_perplexity"] > 0
        got = {**res["results"]["toy_mc"], **res["results"]["toy_ppl"]}
        for metric, value in want.items():
            assert got[f"{metric}_mc_stderr,none"] == pytest.approx(value, rel=1e-9), metric
        assert "acc_stderr,none" in got  # lm-eval's own, over documents, beside it
    table = capsys.readouterr().out
    for metric in want:
        row = next(s for s in table.splitlines() if f"|{metric}_mc_stderr " in s)
        assert f"{got[f'{metric}_mc_stderr,none']:.4f}" in row


def test_add_monte_carlo_stderr_for_the_python_route():
    from mptlml.lm_eval import add_monte_carlo_stderr

    res = {"results": {"mc": {"acc,none": 0.5, "acc_stderr,none": 0.1, "alias": "mc"},
                       "ppl": {"word_perplexity,none": 20.0, "bits_per_byte,none": 1.5},
                       "other": {"acc,none": 1.0}},
           "config": {"mptlml": {"monte_carlo": {
               "mc": {"accuracy_mc_stderr": 0.02},
               "ppl": {"word_perplexity_mc_rel_stderr": 0.01, "bits_per_byte_mc_stderr": 0.003},
           }}}}
    assert add_monte_carlo_stderr(res) is res
    assert res["results"]["mc"]["acc_mc_stderr,none"] == 0.02
    assert res["results"]["ppl"]["word_perplexity_mc_stderr,none"] == pytest.approx(0.2)
    assert res["results"]["ppl"]["bits_per_byte_mc_stderr,none"] == 0.003
    assert "acc_mc_stderr,none" not in res["results"]["other"]  # no records, nothing claimed
    from mptlml.lm_eval.command import table_with_monte_carlo

    shown = table_with_monte_carlo(res)["results"]["mc"]
    assert shown["acc_mc_stderr ,none"] == 0.02 and "acc_mc_stderr,none" not in shown
    assert res["results"]["mc"]["acc_mc_stderr,none"] == 0.02  # the results untouched


def test_one_mc_log_holds_one_run(tiny, tmp_path):
    log = tmp_path / "mc.jsonl"
    log.write_text("{}\n")
    with pytest.raises(FileExistsError, match="one file holds one run"):
        mle.MPTLM(tiny, mc_log=log)
    lm = mle.MPTLM(tiny, mc_log=tmp_path / "new.jsonl", num_masks=4, greedy=False)
    lm.log.add([{"request": "loglikelihood", "task": "t", "doc_id": 0, "idx": 0,
                 "loglikelihood": -1.0, "stderr": 0.1, "masked_inputs": 4}])
    lm.get_model_info()
    with pytest.raises(RuntimeError, match="holds a finished run"):
        lm.loglikelihood([])


def test_pretrained_antiberty_as_in_curve(antiberty):
    lm = mle.MPTLM.create_from_arg_string("pretrained=antiberty,num_masks=4", {"device": "cpu"})
    assert lm.model.name == antiberty.name and lm.model.vocab_size == antiberty.vocab_size
    with pytest.raises(TypeError, match=r"\['tokenizer'\] do not apply to pretrained=antiberty"):
        mle.MPTLM.create_from_arg_string("pretrained=antiberty,tokenizer=x")


def test_the_summary_reaches_results_where_lm_eval_does_not_ask_for_it(tiny):
    """lm-eval 0.4.8 calls get_model_info() for its hf model only: given the model, the
    function puts the run's summary into the results' config first."""
    from mptlml.lm_eval import add_monte_carlo_stderr

    lm = mle.MPTLM(tiny, num_masks=4, greedy=False)
    q = {"id": 1, "decided": False, "margin_z": 1.0, "z_threshold": 2.0}
    lm.log.add([{"request": "loglikelihood", "task": "mc", "doc_id": 0, "idx": i,
                 "loglikelihood": -1.0 - i, "stderr": 0.5, "masked_inputs": 4, "question": q}
                for i in range(2)])
    res = add_monte_carlo_stderr({"results": {"mc": {"acc,none": 1.0}}}, model=lm)
    p = 0.5 * math.erfc(1.0 / math.sqrt(2.0))
    assert res["results"]["mc"]["acc_mc_stderr,none"] == pytest.approx(math.sqrt(p * (1 - p)))
    assert res["config"]["mptlml"]["monte_carlo"]["mc"]["questions"] == 1


def test_add_bos_token_scores_as_dreams_evaluation_with_a_bos_the_frame_lacks():
    """add_bos_token on a Dream-style model framed without its BOS (add_special_tokens=False):
    the BOS joins the model's frame (visible, never masked, never scored, never cut), and the
    loglikelihood of a short continuation (every mask, exact) equals Dream's evaluation
    written out by hand: direct forwards of the module on BOS + context + continuation,
    Dream's shift, the exhaustive MPT sum; the rolling bound of a short text likewise. A
    special token inside the content is still refused."""
    from lm_eval.api.instance import Instance

    from mptlml.models import MaskedLM

    from .diffusion_helpers import TinyDiffusionLM
    from .mlm_helpers import exhaustive_masked_sum
    from .test_conventions import Shifted, family_tokenizer

    tok = family_tokenizer()
    module = Shifted(TinyDiffusionLM(len(tok), seed=3).double(), model_type="Dream")
    bare = MaskedLM(module, tok, add_special_tokens=False)  # Dream's convention, no frame
    assert bare.prefix == [] and bare.shift_logits

    def dream(context: str, cont: str) -> float:
        c = tok(context, add_special_tokens=False)["input_ids"] if context else []
        full = tok(context + cont, add_special_tokens=False)["input_ids"]
        ids = torch.tensor([tok.bos_token_id, *full])

        def log_probs(x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                logits = module(x).double()
            return torch.log_softmax(torch.cat([logits[:, :1], logits[:, :-1]], dim=1), -1)

        return exhaustive_masked_sum(ids, range(1 + len(c), 1 + len(full)), tok.mask_token_id,
                                     log_probs)

    lm = mle.MPTLM(bare, add_bos_token=True)
    assert lm.model.prefix == [tok.bos_token_id] and bare.prefix == []  # a view: bare kept
    conts = [" a mat", " the red house"]
    reqs = [Instance("loglikelihood", {}, ("the cat sat on", x), i, ("t", 0, 1))
            for i, x in enumerate(conts)]
    got = [ll for ll, _ in lm.loglikelihood(reqs)]
    want = [dream("the cat sat on", x) for x in conts]
    assert np.abs(np.array(got) - np.array(want)).max() < 1e-6
    rolled = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, ("the big dog",),
                                                0, ("p", 0, 1))])
    assert abs(rolled[0] - dream("", "the big dog")) < 1e-6
    with pytest.raises(ValueError, match="special token '<eos>'"):
        lm.loglikelihood([Instance("loglikelihood", {}, ("the cat", " <eos> sat"), 0,
                                   ("t", 1, 1))])
