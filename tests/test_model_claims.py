"""The model is what it claims (issue 23): masked LMs only, the model's own length limit,
paths and devices that say what is wrong."""

from __future__ import annotations

import warnings

import pytest
import torch

from mptlml import pll
from mptlml.models import MaskedLM
from mptlml.models.hf_loading import position_limit

from .mlm_helpers import SENTENCES, make_tiny_bert


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoTokenizer

    path = make_tiny_bert(tmp_path_factory.mktemp("claims") / "bert", seed=1,
                          max_position_embeddings=16)
    return path, AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def gpt2(tiny, tmp_path_factory):
    """A tiny causal LM with the BERT tokenizer's vocabulary (so every tokenizer check passes)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    _, tok = tiny
    path = tmp_path_factory.mktemp("claims") / "gpt2"
    cfg = GPT2Config(vocab_size=len(tok), n_embd=16, n_layer=1, n_head=2, n_positions=32,
                     bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path, model


def test_a_causal_lm_is_refused_by_maskedlm_and_mpttrainer(tiny, gpt2, tmp_path):
    """Before: MaskedLM(GPT2LMHeadModel) was scored and MPTTrainer trained it."""
    from transformers import TrainingArguments

    from mptlml.hf import DataCollatorForMPT, MPTTrainer

    _, tok = tiny
    _, model = gpt2
    with pytest.raises(TypeError, match="GPT2LMHeadModel is a causal LM"):
        MaskedLM(model, tok)
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    with pytest.raises(TypeError, match="MPTTrainer needs a masked language model"):
        MPTTrainer(model=model, args=args, data_collator=DataCollatorForMPT(tok))


def test_a_bert_configured_as_a_decoder_is_refused(tiny):
    from transformers import BertForMaskedLM

    path, tok = tiny
    model = BertForMaskedLM.from_pretrained(path)
    model.config.is_decoder = True
    with pytest.raises(TypeError, match="is_decoder"):
        MaskedLM(model, tok)


def test_from_pretrained_of_a_causal_lm_says_so(gpt2):
    """Before: "neither a local directory nor a loadable hub model (... hub not reachable)"."""
    path, _ = gpt2
    with pytest.raises(ValueError, match=r"not a masked language model: its checkpoint is "
                                         r"GPT2LMHeadModel") as err:
        MaskedLM.from_pretrained(path)
    assert "hub" not in str(err.value) and "cache" not in str(err.value)


@pytest.mark.parametrize("kind", ["absolute", "relative", "file"])
def test_a_missing_model_directory_is_no_such_directory(tmp_path, monkeypatch, kind):
    """Before: "Repo id must be in the form 'repo_name'..." inside a hub-cache message."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "weights.bin").write_text("x")
    src = {"absolute": str(tmp_path / "no" / "model"), "relative": "./models/bert",
           "file": "weights.bin"}[kind]
    with pytest.raises(ValueError, match="no such directory" if kind != "file"
                       else "is a file, not a directory") as err:
        MaskedLM.from_pretrained(src)
    assert "cache" not in str(err.value)
    with pytest.raises(ValueError, match="tokenizer .*(no such directory|is a file)"):
        MaskedLM.from_pretrained(tmp_path, tokenizer=src)


def test_the_length_limit_is_the_models(tiny):
    """A tokenizer claiming 512 positions on a model with 16: limit 16, said so; truncate to 14.

    Before: max_length came from the tokenizer (512); a 20-token sequence went
    into the model and crashed inside its position embeddings.
    """
    from transformers import AutoTokenizer, BertForMaskedLM

    path, _ = tiny
    tok = AutoTokenizer.from_pretrained(path, model_max_length=512)
    model = BertForMaskedLM.from_pretrained(path)
    with pytest.warns(UserWarning, match=r"model_max_length \(512\) exceeds the model's "
                                         r"position table \(16 positions\)"):
        mlm = MaskedLM(model, tok)
    assert mlm.max_length == 16 and mlm.max_content_length == 14
    long_text = " ".join(SENTENCES[-1].split() + ["cat"] * 6)  # 21 tokens
    with pytest.raises(ValueError, match="more than the model's maximum of 14"):
        pll(mlm, [long_text])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cut = MaskedLM(model, tok, truncate=True)
    assert len(cut.encode([long_text])[0]) == 14
    assert torch.isfinite(pll(cut, [long_text])).all()


def test_position_limit_counts_roberta_offsets():
    from transformers import RobertaConfig, RobertaForMaskedLM

    cfg = RobertaConfig(vocab_size=30, hidden_size=16, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=32,
                        max_position_embeddings=20, pad_token_id=1)
    assert position_limit(RobertaForMaskedLM(cfg)) == 18  # positions start at pad + 1


@pytest.mark.parametrize("device, match", [("gpu", "unknown device 'gpu'"),
                                           ("cuda:99", "cuda:99"),
                                           ("meta", "not one this package runs on")])
def test_device_strings_name_the_valid_choices(tiny, device, match):
    """Before: a RuntimeError or AssertionError from torch after loading the model."""
    from mptlml._scoring.distributed import resolve_device

    path, _ = tiny
    with pytest.raises(ValueError, match=match + ".*valid choices: 'cpu'"):
        MaskedLM.from_pretrained(path, device=device)
    with pytest.raises(ValueError, match="valid choices"):
        resolve_device(device)  # what the CLI's --device goes through
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available.*valid choices"):
            MaskedLM.from_pretrained(path, device="cuda")
