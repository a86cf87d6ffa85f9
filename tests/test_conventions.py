"""Model families as conventions (``mptlml.models.conventions``): each reproduced by a small module.

References: the same module unshifted, scored plainly (a shifted head scored with
``shift_logits=True`` must give the same numbers, on every mask of short continuations);
Dream's evaluation written out here (BOS + context + continuation + EOS, logits moved one
place right, log-softmax at the masked positions), by direct forwards; the families'
published mask ids.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

import mptlml
from mptlml.models import MaskedLM
from mptlml.models.conventions import CONVENTIONS, convention_of, conventions_table

from .diffusion_helpers import WORDS, IndependentLM, TinyDiffusionLM
from .mlm_helpers import exhaustive_masked_sum

pytestmark = pytest.mark.usefixtures("one_thread")

CONTEXT = "the cat sat on"
SHORT = [" a mat", " the red house", " a big blue tree"]  # exact in compare: every mask


def family_tokenizer():
    """A word-level tokenizer with BOS, EOS and a mask token it does not add by itself (Qwen's)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "<bos>", "<eos>", "<mask>"]
    vocab = {w: i for i, w in enumerate([*specials, *WORDS])}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]",
                                   bos_token="<bos>", eos_token="<eos>", mask_token="<mask>")


class Shifted(nn.Module):
    """A module whose output at position i - 1 is its inner module's at i (Dream's head)."""

    def __init__(self, inner: nn.Module, model_type: str | None = None) -> None:
        super().__init__()
        self.inner = inner
        if model_type is not None:
            self.config = SimpleNamespace(model_type=model_type, vocab_size=inner.head.out_features)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out = self.inner(input_ids)
        return torch.cat([out[:, 1:], torch.randn_like(out[:, :1])], dim=1)  # last: junk


class ShiftedBase(nn.Module):
    """An encoder whose hidden state at i - 1 is the wrapped encoder's at i."""

    def __init__(self, base: nn.Module) -> None:
        super().__init__()
        self.base = base

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
        h = self.base(input_ids=input_ids, attention_mask=attention_mask)[0]
        return (torch.cat([h[:, 1:], torch.zeros_like(h[:, :1])], dim=1),)


class ShiftedBert(nn.Module):
    """A BERT masked LM with a separable head that predicts position i from hidden state i - 1."""

    base_model_prefix = "bert"

    def __init__(self, mlm: nn.Module) -> None:
        super().__init__()
        self.config = mlm.config
        self.bert = ShiftedBase(mlm.bert)
        self.cls = mlm.cls

    def forward(self, input_ids, attention_mask=None):
        return SimpleNamespace(logits=self.cls(self.bert(input_ids, attention_mask)[0]))


def scores_of(lm: MaskedLM) -> tuple[np.ndarray, np.ndarray]:
    """Exhaustive compare sums of SHORT and their PLL, given CONTEXT."""
    res = mptlml.compare(lm, [CONTEXT], [SHORT])
    assert bool(res.exact[0].all())
    return res.scores[0], mptlml.pll(lm, SHORT, context=CONTEXT).numpy()


def test_a_shifted_module_scored_with_shift_logits_equals_the_unshifted_one():
    tok = family_tokenizer()
    inner = TinyDiffusionLM(len(tok), seed=1).double()
    plain = MaskedLM(inner, tok, mask_token_id=tok.mask_token_id, add_special_tokens=False)
    shifted = MaskedLM(Shifted(inner), tok, mask_token_id=tok.mask_token_id,
                       add_special_tokens=False, shift_logits=True)
    for a, b in zip(scores_of(plain), scores_of(shifted), strict=True):
        assert np.abs(a - b).max() < 1e-6
    wrong = MaskedLM(Shifted(inner), tok, mask_token_id=tok.mask_token_id,
                     add_special_tokens=False)  # the shift ignored: other numbers, silently
    assert np.abs(scores_of(wrong)[0] - scores_of(plain)[0]).max() > 1e-2


def test_a_shifted_separable_head_still_runs_only_at_masked_positions(tiny):
    shifted_model = ShiftedBert(tiny.model)
    shifted = MaskedLM(shifted_model, tiny.tokenizer, shift_logits=True)
    assert shifted._split  # encoder, gather at position - 1, head
    rows = []
    hook = shifted_model.cls.register_forward_hook(lambda m, i, o: rows.append(i[0].shape[0]))
    try:
        got = scores_of(shifted)
    finally:
        hook.remove()
    ref = scores_of(tiny)
    for a, b in zip(ref, got, strict=True):
        assert np.abs(a - b).max() < 1e-5  # float32 BERT
    lengths = [len(t) - 4 for t in shifted.encode([CONTEXT + c for c in SHORT])]
    masked = sum(k * 2 ** (n - 1) for n in lengths for k in [n])  # exhaustive: n 2^(n-1)
    assert sum(rows) == masked + sum(lengths)  # compare's every mask, then the PLL's


def dream_reference(module: nn.Module, tok, context: str, cont: str) -> float:
    """Dream's evaluation, written out: every mask of the continuation, exhaustive MPT sum."""
    c = tok(context, add_special_tokens=False)["input_ids"]
    full = tok(context + cont, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([tok.bos_token_id, *full, tok.eos_token_id])
    scored = list(range(1 + len(c), 1 + len(full)))

    def log_probs(x: torch.Tensor) -> torch.Tensor:
        logits = module(x).double()
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)  # Dream's shift
        return torch.log_softmax(logits, -1)

    return exhaustive_masked_sum(ids, scored, tok.mask_token_id, log_probs)


def test_dream_is_recognised_from_its_model_type_and_scored_as_its_evaluation_scores():
    tok = family_tokenizer()
    module = Shifted(TinyDiffusionLM(len(tok), seed=3).double(), model_type="Dream")
    lm = MaskedLM(module, tok)  # nothing said: the family comes from config.model_type
    assert lm.convention.name == "Dream" and lm.shift_logits
    assert lm.mask_token_id == tok.mask_token_id
    assert (lm.prefix, lm.suffix) == ([tok.bos_token_id], [tok.eos_token_id])
    res = mptlml.compare(lm, [CONTEXT], [SHORT])
    ref = [dream_reference(module, tok, CONTEXT, c) for c in SHORT]
    assert np.abs(res.scores[0] - np.array(ref)).max() < 1e-6
    # no context and no BOS: position 0 has nothing before it, refused before any work
    bare = MaskedLM(module, tok, add_special_tokens=False)
    with pytest.raises(ValueError, match="position 0"):
        mptlml.pll(bare, ["the cat sat"])


@pytest.mark.parametrize("model_type, family, vocab, mask", [
    ("llada", None, 126464, 126336),   # LLaDA: a plain vocabulary entry, 128 ids below the top
    ("mdlm", None, 50258, 50257),      # MDLM: the vocabulary's last id
    (None, "smdm", 32001, 32000),      # SMDM: after TinyLlama's 32000 ids
])
def test_families_set_their_mask_id(model_type, family, vocab, mask):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "<bos>", "<eos>", *WORDS])}
    tk = Tokenizer(models.WordLevel(vocab=words, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]",
                                  bos_token="<bos>", eos_token="<eos>")
    module = IndependentLM(vocab)
    if model_type is not None:
        module.config = SimpleNamespace(model_type=model_type, vocab_size=vocab)
    lm = MaskedLM(module, tok, family=family)
    assert lm.mask_token_id == mask and not lm.shift_logits
    # the independent module's conditionals are one joint: the PLL is its log-likelihood
    ids = lm.encode(["the cat sat"])[0]
    assert float(mptlml.pll(lm, ["the cat sat"])[0]) == pytest.approx(module.log_prob(ids),
                                                                      abs=1e-9)
    assert MaskedLM(module, tok, family=family, mask_token_id=5).mask_token_id == 5  # user wins


def test_bert_style_is_the_default_and_refusals(tiny):
    assert convention_of(tiny.model.config) is None and tiny.convention is None
    assert not tiny.shift_logits and tiny.prefix == [tiny.tokenizer.cls_token_id]
    with pytest.raises(ValueError, match="unknown family"):
        MaskedLM(tiny.model, tiny.tokenizer, family="gpt")
    with pytest.raises(TypeError, match="shift_logits"):
        MaskedLM(tiny.model, tiny.tokenizer, shift_logits=1)
    with pytest.raises(ValueError, match="BOS"):
        MaskedLM(tiny.model, tiny.tokenizer, family="dream")  # BERT's tokenizer has no BOS


def test_the_guide_shows_the_table_of_conventions():
    guide = (Path(__file__).parents[1] / "docs" / "guides" / "masked-lm.md").read_text()
    assert conventions_table() in guide
    assert sum(not c.is_block for c in CONVENTIONS.values()) == 5
