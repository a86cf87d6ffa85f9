"""One validation of the Monte Carlo options at every door, and compare's bad inputs.

Every wrong-typed or out-of-range option of ``estimate_lml`` (dense and ragged),
``mpt_curve`` (dense and ragged), ``compare``, ``pll`` and the lm-eval model ``MPTLM``
(its model_args strings first read as lm-eval reads them) is refused before any
work, by one table (:data:`mptlml._validation.MONTE_CARLO_OPTIONS`), with an
error (a ValueError and a TypeError) naming the door and the option. Strings
are never read as bools or numbers (``decide="false"``, ``seed="12"``), bools
never as numbers (``target_se=True``).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import mptlml
from mptlml._validation import SEED_INT, InvalidOptionError, check_options
from mptlml.models import PPCA

pytestmark = pytest.mark.usefixtures("one_thread")

CONTEXT = "the cat sat on"
CANDS = [" a mat", " the big red tree and"]

#: option -> wrong values (wrong type, or right type out of range)
BAD = {
    "num_masks": [2.5, "4", True, 0, -2],
    "seed": ["12", 1.5, -1, True],
    "target_se": [True, "0.1", 0.0, -1.0, float("nan"), float("inf")],
    "max_masks": [64.0, "64", True, 0],
    "progress": ["false", 1, None],
    "token_budget": [1.5, "8192", 0],
    "batch_size": [2.5, "8", 0],
    "chunk_size": [2.5, "8", 0],
}
COMPARE_BAD = {
    **BAD,
    "seed": ["12", 1.5, -1, True, torch.Generator(), [0, "1"]],
    "decide": ["false", "no", 0, 1, None],
    "common_masks": ["no", 0, None],
    "alpha": ["0.05", 0.0, 1.0, True, -0.1],
    "delta": ["0.5", -0.1, True, float("nan")],
    "allocation": ["learned", None, 1],
}


def _cases(table: dict[str, list]) -> list[tuple[str, object]]:
    return [(k, v) for k, vs in table.items() for v in vs]


@pytest.fixture(scope="module")
def dense():
    model = PPCA.random(4, 2, sigma2=0.3, seed=0)
    return model, model.sample(5, generator=0)


@pytest.mark.parametrize(("name", "value"), _cases(COMPARE_BAD))
def test_compare_refuses_every_wrong_option_naming_it(tiny, name, value):
    with pytest.raises(InvalidOptionError, match=rf"^compare: {name} must be "):
        mptlml.compare(tiny, [CONTEXT], [CANDS], **{name: value})


@pytest.mark.parametrize(("name", "value"), _cases(
    {k: v for k, v in BAD.items() if k not in ("token_budget", "batch_size", "chunk_size")}))
def test_estimate_lml_dense_refuses_every_wrong_option_naming_it(dense, name, value):
    model, x = dense
    kw = {name: value}
    if name == "max_masks":
        kw["target_se"] = 0.5
    with pytest.raises(InvalidOptionError, match=rf"^estimate_lml: {name} must be "):
        mptlml.estimate_lml(model, x, **kw)


@pytest.mark.parametrize(("name", "value"), _cases(BAD))
def test_estimate_lml_ragged_refuses_every_wrong_option_naming_it(tiny, name, value):
    kw = {name: value}
    if name == "max_masks":
        kw["target_se"] = 0.5
    with pytest.raises(InvalidOptionError, match=rf"^estimate_lml: {name} must be "):
        mptlml.estimate_lml(tiny, ["the cat sat"], **{"num_masks": 2, "seed": 0, **kw})


@pytest.mark.parametrize(("name", "value"), _cases(
    {**{k: v for k, v in BAD.items() if k not in ("token_budget", "batch_size", "chunk_size")},
     "share_masks": ["yes", 1], "nested": ["no", 0], "allocation": ["learned", 1]}))
def test_mpt_curve_dense_refuses_every_wrong_option_naming_it(dense, name, value):
    model, x = dense
    kw = {name: value}
    if name in ("max_masks", "allocation"):
        kw["target_se"] = 0.5
    with pytest.raises(InvalidOptionError, match=rf"^mpt_curve: {name} must be "):
        mptlml.mpt_curve(model, x, **kw)


@pytest.mark.parametrize(("name", "value"), _cases(
    {**BAD, "num_masks": [2.5, "4", True, 0, [2, 0], [2, 2.5], "22"],
     "cumulative": ["yes", 1], "whole_word": ["no", 1], "nominal_length": ["512", True, 0.0]}))
def test_mpt_curve_ragged_refuses_every_wrong_option_naming_it(tiny, name, value):
    kw = {name: value}
    if name == "max_masks":
        kw["target_se"] = 0.5
    with pytest.raises(InvalidOptionError, match=rf"^mpt_curve: {name} must be "):
        mptlml.mpt_curve(tiny, ["the cat sat"], **{"seed": 0, **kw})


@pytest.mark.parametrize(("name", "value"), _cases(
    {"per_token": ["yes", 1], "whole_word": ["no", 0], "progress": ["false"],
     "token_budget": [1.5, 0], "batch_size": ["8", 0], "chunk_size": [2.5, 0]}))
def test_pll_refuses_every_wrong_option_naming_it(tiny, name, value):
    with pytest.raises(InvalidOptionError, match=rf"^pll: {name} must be "):
        mptlml.pll(tiny, ["the cat sat"], **{name: value})


def test_the_error_is_a_value_error_and_a_type_error_and_says_why():
    for kind in (ValueError, TypeError):
        with pytest.raises(kind, match="the string 'false' is not a bool: pass True or False"):
            check_options("compare", decide="false")
    with pytest.raises(ValueError, match="a bool is not a number here"):
        check_options("compare", target_se=True)
    with pytest.raises(ValueError, match=r"alpha must be a number in \(0, 1\), got '0.05' "
                                         r"\(a string is not a number"):
        check_options("compare", alpha="0.05")


def test_good_values_pass(tiny):
    check_options("estimate_lml", num_masks=np.int64(4), seed=np.int32(3), target_se=0.5,
                  progress=np.bool_(False), max_masks=None)
    check_options("compare", overrides={"seed": [SEED_INT, "int sequence"]}, seed=[0, np.int64(2)])
    with pytest.warns(RuntimeWarning, match="2 of 2 questions with fewer than 5 dof"):
        res = mptlml.compare(tiny, [CONTEXT, CONTEXT], [CANDS, CANDS], num_masks=2,
                             seed=np.array([3, 4]))
    assert len(res.scores) == 2


# ---------------------------------------------------------------- compare's doors
def test_a_string_where_the_candidates_go_is_refused_not_scored_letter_by_letter(tiny):
    with pytest.raises(TypeError, match=r"candidates\[0\] is the string 'GFTFS'.*\[\['GFTFS'\]\]"):
        mptlml.compare(tiny, [CONTEXT], ["GFTFS"])
    with pytest.raises(TypeError, match="got a single string"):
        mptlml.compare(tiny, CONTEXT, [CANDS])


def test_no_questions_is_said_as_such(tiny):
    with pytest.raises(ValueError, match="compare got no questions"):
        mptlml.compare(tiny, [], [])


def test_a_dense_model_is_refused_naming_the_conditional_door(dense):
    model, _ = dense
    with pytest.raises(TypeError, match=r"got PPCA.*estimate_lml\(model, x, context=...\)"):
        mptlml.compare(model, [CONTEXT], [CANDS])


def test_decide_with_a_target_se_is_refused_not_silently_ignored(tiny):
    with pytest.raises(ValueError, match="Pass one of the two"):
        mptlml.compare(tiny, [CONTEXT], [CANDS], decide=True, target_se=0.001)


def test_one_seed_per_question(tiny):
    with pytest.raises(ValueError, match="1 seeds for 2 questions"):
        mptlml.compare(tiny, [CONTEXT, CONTEXT], [CANDS, CANDS], seed=[0])


def test_compare_warns_once_per_call_in_one_line(tiny):
    """Undecided questions and few-dof SEs of one call: one RuntimeWarning, one line."""
    n = 6
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        res = mptlml.compare(tiny, [CONTEXT] * n, [[" the big red mat and"] * 2] * n,
                             num_masks=2, decide=True, delta=0.0, max_masks=8,
                             seed=list(range(n)))
    runtime = [w for w in got if issubclass(w.category, RuntimeWarning)]
    assert len(runtime) == 1, [str(w.message) for w in runtime]
    msg = str(runtime[0].message)
    assert "\n" not in msg
    assert msg.startswith(f"compare: {sum(s == 'budget' for s in res.stop_reason)} of {n} "
                          "questions undecided after max_masks=8")


# ---------------------------------------------------------------- the lm-eval door
LM_EVAL_BAD = {k: v for k, v in COMPARE_BAD.items()
               if k in ("num_masks", "target_se", "max_masks", "progress", "token_budget",
                        "batch_size", "decide")}
LM_EVAL_BAD["seed"] = ["12", 1.5, -1, True, torch.Generator()]  # one int per run


@pytest.mark.parametrize(("name", "value"), _cases(LM_EVAL_BAD))
def test_the_lm_eval_model_refuses_every_wrong_option_naming_it(tiny, name, value):
    """MPTLM's Monte Carlo options through the one table, before any work."""
    import mptlml.lm_eval as mle

    with pytest.raises(InvalidOptionError, match=rf"^mptlml model_args: {name} must be "):
        mle.MPTLM(tiny, **{name: value})


def test_the_lm_eval_model_reads_strings_as_lm_eval_does_then_checks_them(tiny, tiny_dir):
    """model_args strings become numbers and flags by lm-eval's rule (handle_arg_string),
    on the command line's string and in a dict alike; then counts must be integers and
    flags true or false."""
    import mptlml.lm_eval as mle

    lm = mle.MPTLM.create_from_arg_obj({"pretrained": tiny, "num_masks": "8", "max_masks": "16",
                                        "decide": "true", "seed": "3", "target_se": "0.5"})
    assert (lm.num_masks, lm.max_masks, lm.decide, lm.seed, lm.target_se) == (8, 16, True, 3, 0.5)
    for args, match in [("max_masks=64.0", "max_masks must be a positive integer"),
                        ("num_masks=4.5", "num_masks must be a positive integer"),
                        ("decide=maybe", "decide must be bool.*the string 'maybe' is not a bool"),
                        ("target_se=0", "target_se must be a positive number"),
                        ("seed=-1", "seed must be a non-negative int")]:
        with pytest.raises(InvalidOptionError, match=rf"^mptlml model_args: {match}"):
            mle.MPTLM.create_from_arg_string(f"pretrained={tiny_dir},{args}")
        k, v = args.split("=")
        with pytest.raises(InvalidOptionError, match=rf"^mptlml model_args: {match}"):
            mle.MPTLM.create_from_arg_obj({"pretrained": tiny, k: v})
