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
    with pytest.raises(ValueError, match="BOS"):  # forced: BERT's tokenizer has no BOS
        MaskedLM(tiny.model, tiny.tokenizer, family="dream", force_family=True)
    with pytest.raises(TypeError, match="force_family"):
        MaskedLM(tiny.model, tiny.tokenizer, force_family="yes")
    with pytest.raises(ValueError, match="force_family=True applies a family=, and none"):
        MaskedLM(tiny.model, tiny.tokenizer, force_family=True)


def typed(module: nn.Module, model_type: str, vocab: int) -> nn.Module:
    module.config = SimpleNamespace(model_type=model_type, vocab_size=vocab)
    return module


def test_a_family_that_contradicts_the_checkpoint_is_refused_unless_forced(tiny, tiny_dir):
    tok = family_tokenizer()
    llada = typed(IndependentLM(126464), "llada", 126464)
    dream = typed(Shifted(TinyDiffusionLM(len(tok), seed=2)), "Dream", len(tok))
    cases = [(tiny.model, tiny.tokenizer, "dream", "'bert', not the Dream"),  # shifted on BERT
             (tiny.model, tiny.tokenizer, "smdm", "'bert', a transformers masked LM"),
             (tiny.model, tiny.tokenizer, "llada", "'bert', not the LLaDA"),
             (llada, tok, "dream", "'llada', the LLaDA family's"),  # shifts an unshifted head
             (dream, tok, "bert", "'Dream', the Dream family's"),
             (dream, tok, "mdlm", "'Dream', the Dream family's")]
    for model, tk, family, found in cases:
        with pytest.raises(ValueError, match=f"family='{family}' contradicts the checkpoint: "
                                             f"config.model_type is {found}"):
            MaskedLM(model, tk, family=family)
    # a family matching the checkpoint, or none named: taken as before
    assert MaskedLM(llada, tok, family="llada").convention.name == "LLaDA"
    assert MaskedLM(dream, tok, family="DREAM").shift_logits
    # the user means it: the family's conventions, as named
    forced = MaskedLM(llada, tok, family="dream", force_family=True)
    assert forced.shift_logits and forced.convention.name == "Dream"
    # loading: refused from the config, before the weights are read
    import transformers

    def no_weights(*args, **kwargs):
        raise AssertionError("weights loaded before the family was checked")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(transformers.AutoModelForMaskedLM, "from_pretrained", no_weights)
        mp.setattr(transformers.AutoModel, "from_pretrained", no_weights)
        for family in ("dream", "mdlm"):
            with pytest.raises(ValueError, match=f"family='{family}' contradicts"):
                MaskedLM.from_pretrained(tiny_dir, family=family)


def word_tokenizer(extra: int = 0):
    """Words only (no mask token), plus ``extra`` ordinary filler words after them."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[PAD]", "[UNK]", "<bos>", "<eos>", *WORDS, *(f"w{i}" for i in range(extra))]
    tk = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)},
                                    unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]",
                                   bos_token="<bos>", eos_token="<eos>")


def test_a_family_mask_id_that_is_an_ordinary_token_is_refused(tiny):
    small = word_tokenizer()
    smdm_tok = word_tokenizer(extra=32001 - len(small))  # 32000 is the word "w..."
    last = small.convert_ids_to_tokens(len(small) - 1)
    sized = IndependentLM(len(small))
    sized.config = SimpleNamespace(vocab_size=len(small))  # no model_type: nothing contradicts
    cases = [(sized, small, "mdlm", f"the mask id of family='mdlm' "
              f"{len(small) - 1} is an ordinary token of the tokenizer \\('{last}'\\)"),
             (IndependentLM(len(smdm_tok)), smdm_tok, "smdm", "the mask id of family='smdm' 32000 "
              "is an ordinary token of the tokenizer \\('w"),
             (typed(IndependentLM(len(small)), "mdlm", len(small)), small, None,
              "the MDLM-style family's mask id \\(config.model_type 'mdlm'\\) "
              f"{len(small) - 1} is an ordinary token")]
    for module, tk, family, message in cases:
        with pytest.raises(ValueError, match=message):
            MaskedLM(module, tk, family=family)
        # the user's own mask id, or force_family: taken
        assert MaskedLM(module, tk, family=family, mask_token_id=2).mask_token_id == 2
        if family is not None:  # force_family applies a named family only
            assert MaskedLM(module, tk, family=family, force_family=True).mask_token_id == (
                len(tk) - 1 if family != "smdm" else 32000)
    # a mask id past the tokenizer (LLaDA's extra logits) or a special token: no complaint
    assert MaskedLM(typed(IndependentLM(126464), "llada", 126464), small).mask_token_id == 126336
    tok = family_tokenizer()
    assert MaskedLM(IndependentLM(len(tok)), tok, family="dream").mask_token_id == (
        tok.mask_token_id)


def test_a_family_mask_id_outside_the_vocabulary_is_blamed_on_the_family():
    tok = word_tokenizer()
    for module, family, who in [(IndependentLM(40), "smdm", "the mask id of family='smdm' 32000"),
                                (typed(IndependentLM(40), "llada", 40), None,
                                 "the LLaDA family's mask id \\(config.model_type 'llada'\\) "
                                 "126336")]:
        with pytest.raises(ValueError, match=f"{who} is outside the model's vocabulary") as e:
            MaskedLM(module, tok, family=family)
        assert "mask_token_id=126336" not in str(e.value)
        assert "mask_token_id=32000" not in str(e.value)
    with pytest.raises(ValueError, match="mask_token_id=99 is outside"):  # the user's: named so
        MaskedLM(IndependentLM(40), tok, mask_token_id=99)


def test_the_guide_shows_the_table_of_conventions():
    guide = (Path(__file__).parents[1] / "docs" / "guides" / "masked-lm.md").read_text()
    assert conventions_table() in guide
    assert sum(not c.is_block for c in CONVENTIONS.values()) == 5


def family_reference(module: nn.Module, tok, context: str, cont: str, *, mask_id: int,
                     shift: bool, bos_eos: bool) -> float:
    """A family's evaluation written out by direct forwards: its frame, mask id and shift."""
    c = tok(context, add_special_tokens=False)["input_ids"] if context else []
    full = tok(context + cont, add_special_tokens=False)["input_ids"]
    lead = [tok.bos_token_id] if bos_eos else []
    ids = torch.tensor([*lead, *full, *([tok.eos_token_id] if bos_eos else [])])

    def log_probs(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            logits = module(x)
        logits = (logits.logits if hasattr(logits, "logits") else logits).double()
        if shift:
            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        return torch.log_softmax(logits, -1)

    return exhaustive_masked_sum(ids, range(len(lead) + len(c), len(lead) + len(full)), mask_id,
                                 log_probs)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["dream", "llada"])
def test_family_conventions_apply_in_every_door_that_scores(family):
    """Dream (shifted logits, BOS/EOS frame, the tokenizer's mask) and LLaDA (a plain mask id
    past the tokenizer, no shift), recognised from config.model_type: estimate_lml, compare,
    the DPO bounds and lm-eval's loglikelihood each give the family's evaluation by direct
    forwards (every mask of short texts: exact)."""
    from lm_eval.api.instance import Instance

    import mptlml.lm_eval as mle
    from mptlml.hf.preference import preference_bounds

    tok = family_tokenizer()
    if family == "dream":
        module = Shifted(TinyDiffusionLM(len(tok), seed=3).double(), model_type="Dream")
        conv = {"mask_id": tok.mask_token_id, "shift": True, "bos_eos": True}
    else:
        vocab = 126464
        module = typed(TinyDiffusionLM(vocab, seed=4, hidden=8).double(), "llada", vocab)
        conv = {"mask_id": 126336, "shift": False, "bos_eos": False}
    lm = MaskedLM(module, tok)
    assert lm.mask_token_id == conv["mask_id"] and lm.shift_logits == conv["shift"]

    def ref(context: str, cont: str) -> float:
        return family_reference(module, tok, context, cont, **conv)

    texts = ["the cat sat", "a big red house"]
    est = mptlml.estimate_lml(lm, texts, estimator="exhaustive")
    assert np.abs(est.per_sample.numpy() - [ref("", t) for t in texts]).max() < 1e-6
    res = mptlml.compare(lm, [CONTEXT], [SHORT])
    assert np.abs(res.scores[0] - [ref(CONTEXT, c) for c in SHORT]).max() < 1e-6
    b = preference_bounds(lm, MaskedLM(module, tok), [CONTEXT] * 2, SHORT[:2], SHORT[1:],
                          exact_length=8)
    assert bool(b.exact.all())
    for got, conts in ((b.policy_chosen, SHORT[:2]), (b.ref_rejected, SHORT[1:])):
        assert np.abs(got.detach().numpy() - [ref(CONTEXT, c) for c in conts]).max() < 1e-6
    reqs = [Instance("loglikelihood", {}, (CONTEXT, c), i, ("t", 0, 1))
            for i, c in enumerate(SHORT)]
    got = [ll for ll, _ in mle.MPTLM(lm).loglikelihood(reqs)]
    assert np.abs(np.array(got) - [ref(CONTEXT, c) for c in SHORT]).max() < 1e-6
