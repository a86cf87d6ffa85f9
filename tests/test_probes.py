"""Bad, odd and adversarial inputs at the doors added last (issue 40's probes).

Each probe is an input and what must come of it: a clear error naming the argument and
what to pass, raised before any forward pass; or the right value, checked against a
reference (PPCA's closed form, a direct forward). Tiny models built offline.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import torch
from sklearn.decomposition import PCA

import mptlml
from mptlml.models import PPCA, MaskedLM
from mptlml.models.sequence_input import ContextBoundaryWarning

from .mlm_helpers import make_tiny_bert


@pytest.fixture(scope="module")
def net_tok(tiny_dir):
    from transformers import BertForMaskedLM, BertTokenizer

    return BertForMaskedLM.from_pretrained(tiny_dir).eval(), BertTokenizer.from_pretrained(tiny_dir)


class _Wrapped(torch.nn.Module):
    """A module of one's own around the tiny BERT; ``change`` alters its logits."""

    def __init__(self, net, change=lambda x: x):
        super().__init__()
        self.net, self.change = net, change

    def forward(self, input_ids=None, attention_mask=None):
        return self.change(self.net(input_ids=input_ids, attention_mask=attention_mask).logits)


def _calls(lm):
    """Count the forward passes of ``lm``'s module (none may run before a refusal)."""
    seen = []
    lm.model.register_forward_hook(lambda *a: seen.append(1))
    return seen


# ------------------------------------------------------------ the model's outputs and parts
def test_integer_logits_are_refused_naming_the_dtype(net_tok):
    net, tok = net_tok
    with pytest.raises(TypeError, match=r"logits of dtype torch.int64.*float logits"):
        MaskedLM(_Wrapped(net, lambda x: x.round().long()), tok,  # its first, probing forward
                 mask_token_id=tok.mask_token_id)
    ok = MaskedLM(_Wrapped(net), tok, mask_token_id=tok.mask_token_id)  # float logits: scored
    assert torch.allclose(mptlml.pll(ok, ["the cat sat"]), mptlml.pll(MaskedLM(net, tok),
                                                                      ["the cat sat"]))


def test_length_batch_logits_are_refused_naming_the_transpose(net_tok):
    net, tok = net_tok
    lm = MaskedLM(_Wrapped(net, lambda x: x.transpose(0, 1).contiguous()), tok,
                  mask_token_id=tok.mask_token_id)
    # 4 masked copies of a 6-token input: (4, 6) in, logits (6, 4, V) out
    with pytest.raises(ValueError, match=r"\(6, 4, \d+\) for input_ids of shape \(4, 6\) "
                                         r"\(length, batch, vocabulary\): transpose"):
        mptlml.pll(lm, ["the cat sat on"])


def test_a_module_without_parameters_or_tokenizer_is_refused_at_construction(net_tok):
    net, tok = net_tok

    class NoParams(torch.nn.Module):
        def forward(self, input_ids=None, attention_mask=None):
            return torch.zeros(*input_ids.shape, len(tok))

    with pytest.raises(TypeError, match="NoParams has no parameters.*nn.Parameter"):
        MaskedLM(NoParams(), tok, mask_token_id=tok.mask_token_id)
    for kwargs in ({}, {"mask_token_id": 4}):
        with pytest.raises(TypeError, match=r"tokenizer is None: MaskedLM needs the model's "
                                            r"tokenizer.*from_pretrained"):
            MaskedLM(net, None, **kwargs)


def test_a_position_table_shorter_than_the_input(net_tok):
    """Found by its name in a module of one's own (the length check, before any forward);
    a table the name does not give away fails in the forward with a ValueError naming it."""
    _, tok = net_tok

    class Own(torch.nn.Module):
        def __init__(self, table: str):
            super().__init__()
            self.emb = torch.nn.Embedding(len(tok), 8)
            self.table = table
            setattr(self, table, torch.nn.Embedding(8, 8))  # 8 positions
            self.out = torch.nn.Linear(8, len(tok))

        def forward(self, input_ids=None, attention_mask=None):
            positions = torch.arange(input_ids.shape[1])
            return self.out(self.emb(input_ids) + getattr(self, self.table)(positions))

    text = "the cat sat on a mat the dog ran far away"
    lm = MaskedLM(Own("pos"), tok, mask_token_id=tok.mask_token_id)
    seen = _calls(lm)
    with pytest.raises(ValueError, match=r"more than the model's maximum of 6.*truncate=True"):
        mptlml.pll(lm, [text])
    assert seen == []
    with pytest.raises(ValueError, match=r"failed on input_ids of shape \(\d+, 13\) "
                                         r"\(IndexError.*shorter than these inputs of 13"):
        mptlml.pll(MaskedLM(Own("where"), tok, mask_token_id=tok.mask_token_id), [text])


def test_the_too_long_error_says_where_truncate_works(tiny_dir):
    lm = MaskedLM.from_pretrained(tiny_dir)
    long = " ".join(["the cat"] * 40)
    with pytest.raises(ValueError, match=re.escape("load the model with truncate=True to cut "
                                                   "it (MaskedLM.from_pretrained(..., "
                                                   "truncate=True)")):
        mptlml.pll(lm, [long])
    cut = MaskedLM.from_pretrained(tiny_dir, truncate=True)  # where it works: the same PLL as
    assert torch.allclose(mptlml.pll(cut, [long]),  # the text cut by hand to 62 tokens
                          mptlml.pll(lm, [" ".join(long.split()[:62])]))


def test_a_mask_token_id_that_is_a_content_word_is_named(net_tok):
    net, tok = net_tok
    the = tok.convert_tokens_to_ids("the")
    lm = MaskedLM(net, tok, mask_token_id=the)
    seen = _calls(lm)
    with pytest.raises(ValueError, match=rf"contains 'the' \(id {the}\).*the id given as "
                                         rf"mask_token_id={the}.*mask_token_id is wrong"):
        mptlml.pll(lm, ["the cat sat"])
    assert seen == []


# ------------------------------------------------------------------------ contexts
def test_a_context_that_is_no_text_nor_list(tiny_dir):
    lm = MaskedLM.from_pretrained(tiny_dir)
    for bad in (123, 1.5, None if False else object()):
        with pytest.raises(TypeError, match=r"context must be a text \(one context for every "
                                            r"continuation\) or a list"):
            mptlml.pll(lm, ["the cat"], context=bad)


def test_ppca_with_an_empty_context_is_the_unconditional_lml():
    x = np.random.default_rng(0).normal(size=(20, 5)) @ np.diag([3, 2, 1, 1, 1])
    model = PPCA.from_sklearn(PCA(2).fit(x))
    empty = mptlml.estimate_lml(model, x, "exhaustive", context=[])
    exact = model.log_marginal(torch.as_tensor(x)).mean().item()  # the closed form
    assert empty.mean == pytest.approx(exact, abs=1e-9)


def test_a_missing_space_is_blamed_on_the_join_not_the_tokenizer(tiny_dir):
    lm = MaskedLM.from_pretrained(tiny_dir)
    with pytest.raises(ValueError, match=re.escape(
            "pair 0: the context 'the cat sat on the' and the continuation 'mat' are joined as "
            "written, 'the cat sat on themat'")) as err:
        mptlml.pll(lm, ["mat"], context=["the cat sat on the"])
    assert "Start the continuation with a space (' mat')" in str(err.value)
    assert "wrong tokenizer" not in str(err.value)
    # the spaced continuation is scored, and a part that fails alone keeps its own error
    assert torch.isfinite(mptlml.pll(lm, [" mat"], context=["the cat sat on the"])).all()
    with pytest.raises(ValueError, match="wrong tokenizer"):
        mptlml.pll(lm, [" zzz qqq"], context=["the cat sat on the"])


def test_a_continuation_that_completes_the_contexts_last_word_is_warned(tmp_path):
    wp = MaskedLM.from_pretrained(make_tiny_bert(
        tmp_path / "wp", words=["the", "cat", "sat", "on", "play", "##ing", "mat"]))
    with pytest.warns(ContextBoundaryWarning, match="'playing' spans the join"):
        mptlml.pll(wp, ["ing"], context=["the cat play"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", ContextBoundaryWarning)
        mptlml.pll(wp, [" mat"], context=["the cat sat on"])  # a new word: no warning


# ------------------------------------------------------------------- the lm-eval backend
@pytest.fixture(scope="module")
def lme():
    import mptlml.lm_eval as mle  # the lm-eval extra (installed by make's test set-up)

    return mle


def test_lm_eval_model_args_refused_at_construction(lme, tiny_dir, tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    for args, message in [
            (",max_masks=4,decide=true", r"max_masks=4 \(masked inputs per request\) is below "
                                         r"the first round's num_masks=16, mptlml.compare's "
                                         r"default draws and the whole continuation's row: "
                                         r"raise max_masks to at least 17"),
            (",num_masks=8,max_masks=8", r"max_masks=8 \(masked inputs per request\) is below "
                                         r"the first round's num_masks=8 draws"),
            (f",mc_log={tmp_path}", r"mc_log=.* is a directory"),
            (f",mc_log={not_a_dir / 'mc.jsonl'}", r"mc_log=.* cannot be written")]:
        with pytest.raises(ValueError, match=message):
            lme.MPTLM.create_from_arg_string(f"pretrained={tiny_dir}{args}")
    assert not (not_a_dir / "mc.jsonl").exists()


def test_lm_eval_requests_checked_text_by_text(lme, tiny_dir, tmp_path):
    """An all-unknown choice among many good ones is refused naming its task, document and
    choice (the run's pooled fraction is under 5%); an empty perplexity document is refused;
    a perplexity task's warnings speak of text windows, not questions."""
    from .test_lm_eval import _evaluate, write_tasks

    good = {"context": "the cat sat on", "choices": ["a mat", "the dog"], "label": 0}
    bad = {"context": "the cat sat on", "choices": ["a mat", "zzz qqq"], "label": 0}
    tasks = write_tasks(tmp_path / "unk", mc_docs=[good] * 12 + [bad], prefix="unk")
    lm = lme.MPTLM.create_from_arg_string(f"pretrained={tiny_dir},num_masks=4,greedy=false")
    with pytest.raises(ValueError, match=r"task 'unk_mc', document 12, choice 1 \(' zzz qqq'\): "
                                         r"2 of its 2 tokens map to the unknown token"):
        _evaluate(tasks, ["unk_mc"], lm)
    tasks = write_tasks(tmp_path / "empty", ppl_texts=["the cat sat", ""], prefix="empty")
    with pytest.raises(ValueError, match=r"task 'empty_ppl', document 1: the text is empty"):
        _evaluate(tasks, ["empty_ppl"], lm)
    tasks = write_tasks(tmp_path / "ppl", prefix="ppl", ppl_texts=[
        "the cat sat", "a big dog ran far away and the cat sat on the mat under the tree"])
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        _evaluate(tasks, ["ppl_ppl"], lm)
    runtime = [str(w.message) for w in said if issubclass(w.category, RuntimeWarning)]
    assert runtime and not any("question" in m for m in runtime), runtime
    assert any("text window" in m for m in runtime), runtime


@pytest.mark.slow
def test_python_m_mptlml_lm_eval_says_a_bad_argument_in_one_line(lme, tiny_dir, tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    from .test_lm_eval import write_tasks

    tasks = write_tasks(tmp_path / "t", mc_docs=[{"context": "the cat", "choices": ["sat", "a"],
                                                  "label": 0}], prefix="one")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "HF_HUB_OFFLINE": "1"}
    base = ["--model", "mptlml", "--tasks", "one_mc", "--include_path", str(tasks)]
    for argv, message in [
            ([*base, "--model_args", f"pretrained={tiny_dir},num_mask=4"],
             "mptlml eval: error: mptlml model_args: unknown ['num_mask']"),
            ([*base, "--model_args", f"pretrained={tiny_dir}", "--device", "cuda:7"],
             "mptlml eval: error: --device cuda:7:")]:
        run = subprocess.run([sys.executable, "-m", "mptlml.lm_eval", *argv], env=env,
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 2, run.stderr[-2000:]
        last = run.stderr.strip().splitlines()[-1]
        assert last.startswith(message) and "Traceback" not in run.stderr, run.stderr[-2000:]


def test_a_bad_model_arg_is_refused_before_lm_evals_command_line(lme, tiny_dir, capsys,
                                                                 monkeypatch):
    """A misspelt model_args name or Dream's sampler option is refused as MPTLM refuses it,
    before lm-eval's command line is imported (it indexes every task first: tens of seconds);
    names MPTLM takes (its own, LLaDA's, Dream's), other models' arguments and the JSON form
    pass."""
    import sys

    from mptlml.lm_eval.command import check_model_args_flag, run

    monkeypatch.setitem(sys.modules, "lm_eval.__main__", None)  # importing it now fails
    for args, message in [("num_mask=4", "mptlml model_args: unknown ['num_mask']"),
                          ("alg=entropy", "model_args ['alg']: options of Dream's own sampler")]:
        argv = ["--model", "mptlml", "--tasks", "t",
                "--model_args", f"pretrained={tiny_dir},{args}"]
        with pytest.raises(TypeError) as direct:
            lme.MPTLM.create_from_arg_string(f"pretrained={tiny_dir},{args}")
        assert str(direct.value).startswith(message)
        assert run(argv) == 2
        assert capsys.readouterr().err == f"mptlml eval: error: {direct.value}\n"
        assert run([*argv[:-1], f"pretrained={tiny_dir}", args]) == 2  # lm-eval 0.4.9+'s form
        assert capsys.readouterr().err == f"mptlml eval: error: {direct.value}\n"
    for argv in (["--model", "mptlml", "--model_args",
                  "pretrained=d,num_masks=4,mc_num=8,cfg=0.5,is_check_greedy=false,nll_type=mc,"
                  "classifier_free_guidance=1.5,mask_id=5,dtype=float32,seed=1"],
                 ["--model", "hf", "--model_args", "pretrained=gpt2,num_mask=4"],
                 ["--model", "mptlml", "--model_args", '{"num_mask": 4}']):
        check_model_args_flag(argv)


def test_eval_help_shows_the_guides_form():
    from mptlml.lm_eval.command import HELP

    assert "  mptlml eval --model mptlml --model_args" in HELP
    from pathlib import Path

    guide = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "lm-eval.md").read_text()
    assert "mptlml eval --model mptlml" in guide and "mptlml eval run" not in guide
