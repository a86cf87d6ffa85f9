"""LLaDA's and Dream's lm-eval arguments through the model ``mptlml``; LLaDA's own scheme.

The arguments are those of LLaDA's ``eval_llada.py`` (``llada_dist``) and Dream's
``eval/eval.py`` (``dream``): each is taken with its meaning or refused before any
scoring with a message naming it.
"""

from __future__ import annotations

import logging

import pytest
import torch

import mptlml.lm_eval as mle

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
    lm = mle.MPTLM(tiny, mc_num=8)
    assert (lm.num_masks, lm.max_masks) == (8, 8)
    with caplog.at_level(logging.WARNING, logger="lm_eval.mptlml"):
        lm = mle.MPTLM(tiny, mc_num=1)
    assert (lm.num_masks, lm.max_masks) == (2, 2)
    assert "mc_num=1" in caplog.text and "in pairs" in caplog.text
    with pytest.raises(ValueError, match="num_masks=32 is more than mc_num=8"):
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


@pytest.mark.parametrize("arg", ["steps=1024", "gen_length=256", "block_length=32",
                                 "remasking=low_confidence", "max_new_tokens=128",
                                 "diffusion_steps=128", "temperature=0.0", "alg=entropy"])
def test_generation_options_are_refused_by_name(tiny_dir, arg):
    name = arg.split("=")[0]
    with pytest.raises(TypeError, match=rf"\['{name}'\]: generation options.*does not generate"):
        mle.MPTLM.create_from_arg_string(f"pretrained={tiny_dir},{arg}")


def test_one_argument_under_two_names_is_refused(tiny_dir):
    for args, match in [(f"pretrained={tiny_dir},model_path={tiny_dir}", "model_path and "
                         "pretrained are one argument"),
                        (f"pretrained={tiny_dir},is_check_greedy=false,greedy=true",
                         "is_check_greedy and greedy are one argument"),
                        (f"pretrained={tiny_dir},cfg=0.5,classifier_free_guidance=1.5",
                         "one guidance scale")]:
        with pytest.raises(TypeError, match=match):
            mle.MPTLM.create_from_arg_string(args)
    with pytest.raises(ValueError, match="cfg=-1.0.*>= 0"):
        mle.MPTLM.create_from_arg_string(f"pretrained={tiny_dir},cfg=-1")


def test_max_length_cuts_the_context_and_bos_leads_it(tmp_path):
    """max_length counts the specials; add_bos_token puts the BOS id before every context."""
    from .mlm_helpers import make_tiny_bert

    d = make_tiny_bert(tmp_path / "bert")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(d)
    tok.bos_token = tok.cls_token  # a tokenizer with a BOS token, as Dream's
    tok.save_pretrained(d)
    lm = mle.MPTLM.create_from_arg_string(f"pretrained={d},add_bos_token=true,max_length=9",
                                          {"device": "cpu"})
    assert lm._bos == [tok.cls_token_id] and lm._limit == 7
    ctx, cont = lm._pair_ids([mle.backend._Key("t", 0, 0, ("the cat sat", " on a mat"))])
    assert ctx[0].tolist() == [tok.cls_token_id, *tok("the cat sat",
                                                      add_special_tokens=False)["input_ids"]]
    assert cont[0].tolist() == tok(" on a mat", add_special_tokens=False)["input_ids"]
    assert torch.is_tensor(ctx[0])
