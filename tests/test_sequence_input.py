"""Sequences are what they look like: one normalisation of sequence input (issue 23).

Every ragged entry point (pll, mpt_curve, estimate_lml on a masked LM, the
collator, the text loaders) refuses input that would be scored as something
else: special-token strings in texts, dicts and BatchEncodings, float ids,
list-valued text fields.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

from mptlml import estimate_lml, mpt_curve, pll
from mptlml.data.text import load_texts
from mptlml.hf import DataCollatorForMPT
from mptlml.models import MaskedLM
from mptlml.models.sequence_input import normalise_sequences

from .mlm_helpers import make_tiny_bert


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoTokenizer, BertForMaskedLM

    path = make_tiny_bert(tmp_path_factory.mktemp("seq") / "bert", seed=2)
    tok = AutoTokenizer.from_pretrained(path)
    return MaskedLM(BertForMaskedLM.from_pretrained(path), tok), tok


ENTRY_POINTS = {
    "pll": lambda m, s: pll(m, s),
    "pll-word": lambda m, s: pll(m, s, whole_word=True),
    "mpt_curve": lambda m, s: mpt_curve(m, s, rates=[0.5], num_masks=1),
    "estimate_lml": lambda m, s: estimate_lml(m, s, "cumulative", num_masks=1),
    "chain-rule": lambda m, s: estimate_lml(m, s, "chain-rule", num_masks=2),
}


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize("text, token", [("the [MASK] sat", "[MASK]"),
                                         ("[CLS] [SEP]", "[CLS]"),
                                         ("the cat [PAD]", "[PAD]")])
def test_special_token_strings_in_texts_are_refused(tiny, entry, text, token):
    """Before: "the [MASK] sat" was scored with [MASK] as a content token."""
    mlm, _ = tiny
    with pytest.raises(ValueError, match=rf"special token '\{token[:-1]}\]'.*from the text"):
        ENTRY_POINTS[entry](mlm, ["the cat sat", text])


def test_special_ids_are_handled_the_same_on_both_paths(tiny):
    mlm, tok = tiny
    with pytest.raises(ValueError, match=r"special token '\[MASK\]'.*from the ids"):
        pll(mlm, [tok.convert_tokens_to_ids(["the", "[MASK]", "sat"])])
    # the unknown token is content on both paths: the same score from the text and the ids
    text = "the xyzzy dog was under the big tree and the cat sat on the red mat and a cat sat"
    with pytest.warns(UserWarning, match="unknown token"):
        ids = mlm.encode([text])[0]
    assert int((ids == tok.unk_token_id).sum()) == 1 and len(ids) == 20
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a, b = pll(mlm, [text]), pll(mlm, [ids.tolist()])
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize("entry", ["pll", "mpt_curve", "estimate_lml"])
def test_dicts_and_batch_encodings_are_refused(tiny, entry):
    """Before: pll(mlm, tokenizer(texts)) scored the key names 'input_ids', ... as texts."""
    mlm, tok = tiny
    for batch in (tok(["the cat sat", "a dog"]), {"input_ids": [[5, 6]]}):
        with pytest.raises(TypeError, match="key names"):
            ENTRY_POINTS[entry](mlm, batch)


@pytest.mark.parametrize("bad, match", [
    ([[5.0, 6.0, 7.0]], "never truncated"),
    ([[5, 6.7, 7]], "never truncated"),
    (torch.tensor([[5.0, 6.0]]), "never truncated"),
    ([np.array([5.0, 6.0])], "never truncated"),
    ([[True, False]], "not a token id"),
    ([[[5, 6], [7, 8]]], "nested"),
    ([["the cat", "a dog"]], "list of 2 strings"),
    ([None], "NoneType"),
    (["the cat", [5, 6]], "mix texts and token ids"),
    ("the cat", "single string"),
    ([], "no sequences"),
])
def test_malformed_sequences_are_refused_by_every_entry_point(tiny, bad, match):
    """Before: float ids were truncated to ints and scored."""
    mlm, _ = tiny
    for entry in ("pll", "mpt_curve", "estimate_lml"):
        with pytest.raises((TypeError, ValueError), match=match):
            ENTRY_POINTS[entry](mlm, bad)
    with pytest.raises((TypeError, ValueError), match=match):
        mlm.encode(bad)


def test_integer_ids_of_every_kind_are_one_sequence(tiny):
    mlm, _ = tiny
    ids = [5, 6, 7]
    forms = [[ids], [tuple(ids)], [torch.tensor(ids)], [np.array(ids, dtype=np.int32)],
             torch.tensor([ids]), np.array([ids]), [[np.int64(i) for i in ids]]]
    for f in forms:
        out = normalise_sequences(f)
        assert len(out) == 1 and out[0].dtype == torch.long and out[0].tolist() == ids
    torch.testing.assert_close(pll(mlm, forms[2]), pll(mlm, forms[0]))


def test_the_collator_refuses_float_ids_and_mask_tokens(tiny):
    _, tok = tiny
    coll = DataCollatorForMPT(tok, seed=0)
    with pytest.raises(TypeError, match="never truncated"):
        coll([{"input_ids": [2.0, 5.0, 6.0, 3.0]}])
    with pytest.raises(ValueError, match=r"mask token '\[MASK\]'"):
        coll([dict(tok("the [MASK] sat"))])
    with pytest.raises(TypeError, match="single BatchEncoding"):
        coll(tok(["the cat"]))


@pytest.mark.parametrize("value", [["the cat", "sat"], {"a": "the cat"}])
def test_list_or_dict_text_fields_are_refused_with_file_and_line(tmp_path, value):
    """Before: the field's Python repr "['the cat', 'sat']" was scored as the text."""
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps({"text": "the cat"}) + "\n" + json.dumps({"text": value}) + "\n")
    with pytest.raises(ValueError, match=rf"data.jsonl: line 2, field 'text' holds a "
                                         rf"{type(value).__name__}"):
        load_texts(path)


def test_sampling_refuses_float_allowed_ids(tiny):
    from mptlml.hf import sample_random_order

    mlm, _ = tiny
    with pytest.raises(TypeError, match="allowed_ids, position 0: 5.5"):
        sample_random_order(mlm, 2, 3, allowed_ids=[5.5, 6])
