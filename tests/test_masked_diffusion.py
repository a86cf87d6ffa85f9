"""Any masked-diffusion-style module scored by ``MaskedLM(module, tokenizer, mask_token_id=...)``.

References: one direct forward per masked copy, written here with torch (``direct_log_probs``),
and the exact likelihood of a model whose tokens are independent (its conditionals come from
one joint, so the MPT sum equals it for every mask).
"""

from __future__ import annotations

import pytest
import torch

import mptlml
from mptlml.models import MaskedLM

from .diffusion_helpers import (
    EXTRA_LOGITS,
    MASK_WORD,
    IndependentLM,
    TinyDiffusionLM,
    direct_log_probs,
    make_word_tokenizer,
    save_old_remote_code_model,
    save_remote_code_model,
)

TEXTS = ["the cat sat on a mat", "a big dog ran far away", "red house", "blue tree"]


@pytest.fixture(scope="module")
def tok():
    return make_word_tokenizer()


@pytest.fixture(scope="module")
def mask_id(tok):
    return tok.convert_tokens_to_ids(MASK_WORD)


@pytest.fixture(scope="module")
def tiny_mdm(tok, mask_id):
    module = TinyDiffusionLM(len(tok) + EXTRA_LOGITS)
    return MaskedLM(module, tok, mask_token_id=mask_id)


def _pll_reference(module, ids, mask_id):
    return sum(float(direct_log_probs(module, ids, torch.arange(len(ids)) == j, mask_id).sum())
               for j in range(len(ids)))


def test_plain_module_pll_equals_direct_forwards(tiny_mdm, mask_id):
    ids = tiny_mdm.encode(TEXTS)
    got = mptlml.pll(tiny_mdm, TEXTS)
    ref = [_pll_reference(tiny_mdm.model, t, mask_id) for t in ids]
    torch.testing.assert_close(got, torch.tensor(ref, dtype=torch.float64), atol=1e-5, rtol=0)
    assert tiny_mdm.vocab_size == len(tiny_mdm.tokenizer) + EXTRA_LOGITS  # read off the logits
    assert tiny_mdm.prefix == [] and tiny_mdm.suffix == []  # no special tokens to frame


def test_plain_module_scores_masks_as_direct_forwards(tiny_mdm, mask_id):
    """Several tokens masked at once, different lengths in one call (no attention mask)."""
    ids = tiny_mdm.encode(TEXTS)
    g = torch.Generator().manual_seed(0)
    masks = [torch.rand(5, len(t), generator=g) < 0.5 for t in ids]
    got = tiny_mdm.ragged_masked_log_prob(ids, masks, [None] * len(ids), token_budget=64)
    for t, m, v in zip(ids, masks, got, strict=True):
        ref = [float(direct_log_probs(tiny_mdm.model, t, row, mask_id).sum()) for row in m]
        torch.testing.assert_close(v, torch.tensor(ref, dtype=torch.float64), atol=1e-5,
                                   rtol=0)


def test_with_special_tokens_frame(tiny_dir):
    """A BERT tokenizer's [CLS] ... [SEP] frame, a plain module with the tokenizer's [MASK] id."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    module = TinyDiffusionLM(len(tok), seed=1)
    lm = MaskedLM(module, tok, mask_token_id=tok.mask_token_id)
    assert lm.prefix == [tok.cls_token_id] and lm.suffix == [tok.sep_token_id]
    (ids,) = lm.encode(["the cat sat"])
    full = torch.tensor([tok.cls_token_id, *ids.tolist(), tok.sep_token_id])
    ref = sum(float(direct_log_probs(module, full, torch.arange(len(full)) == j + 1,
                                     tok.mask_token_id).sum()) for j in range(len(ids)))
    assert float(mptlml.pll(lm, ["the cat sat"])[0]) == pytest.approx(ref, abs=1e-5)
    bare = MaskedLM(module, tok, mask_token_id=tok.mask_token_id, add_special_tokens=False)
    assert bare.prefix == [] and bare.suffix == []


def test_independent_tokens_every_estimate_is_exact(tok, mask_id):
    """A consistent module: the PLL and the chain rule in any random order are log p(x)."""
    module = IndependentLM(len(tok) + EXTRA_LOGITS)
    lm = MaskedLM(module, tok, mask_token_id=mask_id)
    exact = torch.tensor([module.log_prob(t) for t in lm.encode(TEXTS)], dtype=torch.float64)
    torch.testing.assert_close(mptlml.pll(lm, TEXTS), exact, atol=1e-9, rtol=0)
    est = mptlml.estimate_lml(lm, TEXTS, "chain-rule", num_masks=2, seed=3)
    torch.testing.assert_close(est.per_sample, exact, atol=1e-9, rtol=0)


def test_token_ids_input(tiny_mdm, mask_id):
    ids = [t.tolist() for t in tiny_mdm.encode(TEXTS[:2])]
    torch.testing.assert_close(mptlml.pll(tiny_mdm, ids), mptlml.pll(tiny_mdm, TEXTS[:2]))


def test_mask_id_is_never_content(tiny_mdm, mask_id):
    with pytest.raises(ValueError, match="special token"):
        tiny_mdm.encode([f"the {MASK_WORD} sat"])
    with pytest.raises(ValueError, match="special token"):
        tiny_mdm.encode([[2, mask_id, 3]])


def test_train_mode_is_scored_without_dropout(tok, mask_id):
    """A module left in train mode is scored in eval mode, and left in train mode after."""
    module = TinyDiffusionLM(len(tok) + EXTRA_LOGITS, dropout=0.5)
    lm = MaskedLM(module, tok, mask_token_id=mask_id)
    ref = mptlml.pll(lm, TEXTS)
    module.train()
    torch.testing.assert_close(mptlml.pll(lm, TEXTS), ref, atol=1e-6, rtol=0)
    assert module.training and module.layer.dropout.training


def test_hf_masked_lm_in_train_mode_scored_in_eval_mode(tiny):
    texts = ["the cat sat on a mat", "a big dog ran far away"]
    ref = mptlml.pll(tiny, texts)
    tiny.model.train()
    try:
        torch.testing.assert_close(mptlml.pll(tiny, texts), ref, atol=1e-6, rtol=0)
        assert tiny.model.training
    finally:
        tiny.model.eval()


def test_from_pretrained_remote_code_checkpoint(tmp_path, mask_id):
    """AutoModel + trust_remote_code, a tuple output, no masked-LM class in the config."""
    path = save_remote_code_model(tmp_path / "mdm", vocab_size=len(make_word_tokenizer()) + 2)
    with pytest.raises(ValueError, match="mask_token_id"):
        MaskedLM.from_pretrained(path, trust_remote_code=True)  # not a masked LM: says why
    lm = MaskedLM.from_pretrained(path, mask_token_id=mask_id, trust_remote_code=True)
    assert type(lm.model).__name__ == "TinyMDM"
    ids = lm.encode(TEXTS)
    ref = [_pll_reference(_TupleToLogits(lm.model), t, mask_id) for t in ids]
    torch.testing.assert_close(mptlml.pll(lm, TEXTS), torch.tensor(ref, dtype=torch.float64),
                               atol=1e-5, rtol=0)


@pytest.mark.parametrize("variant", ["no_post_init", "old_tie_weights", "use_cache"])
def test_remote_code_older_than_transformers_5_works_or_names_the_pin(tmp_path, mask_id,
                                                                      variant):
    """LLaDA's code predates transformers 5: under 4.x it scores, under 5 our message names
    the pin (not transformers' internals), whether it fails loading or at its first forward."""
    import transformers

    path = save_old_remote_code_model(tmp_path / variant, variant)
    if int(transformers.__version__.split(".")[0]) >= 5:
        with pytest.raises(RuntimeError, match=r"written for transformers < 5 .*"
                           r"pip install 'transformers>=4\.46\.2,<5'"):
            MaskedLM.from_pretrained(path, mask_token_id=mask_id, trust_remote_code=True)
        return
    lm = MaskedLM.from_pretrained(path, mask_token_id=mask_id, trust_remote_code=True)
    ids = lm.encode(TEXTS)
    ref = [_pll_reference(_TupleToLogits(lm.model), t, mask_id) for t in ids]
    torch.testing.assert_close(mptlml.pll(lm, TEXTS), torch.tensor(ref, dtype=torch.float64),
                               atol=1e-5, rtol=0)


class _TupleToLogits(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids):
        return self.m(input_ids=input_ids)[0]


def test_refusals_name_the_problem(tok, mask_id):
    module = TinyDiffusionLM(len(tok) + EXTRA_LOGITS)
    with pytest.raises(ValueError, match="Pass mask_token_id"):
        MaskedLM(module, tok)  # no config, the tokenizer has no mask token
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        MaskedLM(module, tok, mask_token_id=10_000)
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        MaskedLM(TinyDiffusionLM(len(tok) - 2), tok, mask_token_id=2)
    with pytest.raises(TypeError, match="mask_token_id must be an int"):
        MaskedLM(module, tok, mask_token_id="5")

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.e = torch.nn.Embedding(len(tok), 4)

        def forward(self, input_ids):
            return {"hidden": self.e(input_ids)}

    with pytest.raises(TypeError, match="not logits"):
        MaskedLM(Hidden(), tok, mask_token_id=mask_id)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        MaskedLM(lambda input_ids: input_ids, tok, mask_token_id=mask_id)
