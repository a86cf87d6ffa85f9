"""Per-token and per-word scores: PLL per token, whole-word masking, PLL-word-l2r.

Every score is checked against a direct computation on a tiny local BERT whose
WordPiece vocabulary splits some words into several sub-tokens: the masked
input is built by hand from the expected word split, run through the raw
Hugging Face model, log-softmaxed and gathered (per-token PLL and
PLL-word-l2r, minicons' ``token_score`` metrics ``original`` and
``within_word_l2r``, by their definitions, with no third-party scorer).
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from mptlml import TokenScores, estimate_lml, mpt_curve, pll
from mptlml.estimators.rates import mask_sizes

from .mlm_helpers import WORDS, make_tiny_bert

pytestmark = pytest.mark.usefixtures("one_thread")

PIECES = ("un", "##happy", "happy", "walk", "##ed", "slow", "##ly", "re", "##play", "##s")
# each text with its expected words, as WordPiece sub-tokens
SPLITS = {
    "the unhappy cat walked slowly": [["the"], ["un", "##happy"], ["cat"], ["walk", "##ed"],
                                      ["slow", "##ly"]],
    "a dog replayed cats": [["a"], ["dog"], ["re", "##play", "##ed"], ["cat", "##s"]],
    "the cat sat": [["the"], ["cat"], ["sat"]],
}
TEXTS = list(SPLITS)
ONE_PIECE = ["the cat sat on a mat", "a big dog ran far away"]  # every word one token


@pytest.fixture(scope="module")
def wp_dir(tmp_path_factory):
    return make_tiny_bert(tmp_path_factory.mktemp("wordpiece") / "bert",
                          words=(*WORDS, *PIECES))


@pytest.fixture(scope="module")
def wp(wp_dir):
    from mptlml.models import MaskedLM

    return MaskedLM.from_pretrained(wp_dir)


@pytest.fixture(scope="module")
def raw(wp_dir):
    """The same model and tokenizer, straight from transformers."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    return AutoModelForMaskedLM.from_pretrained(wp_dir).eval(), AutoTokenizer.from_pretrained(
        wp_dir)


def direct(raw, text: str, hide: list[int], score: list[int]) -> float:
    """sum_{j in score} log p(x_j | x with the content positions ``hide`` masked)."""
    model, tok = raw
    ids = tok(text)["input_ids"]  # [CLS] content [SEP]
    x = torch.tensor(ids)[None].clone()
    for h in hide:
        x[0, 1 + h] = tok.mask_token_id
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=x).logits[0].float(), dim=-1)
    return sum(float(lp[1 + j, ids[1 + j]]) for j in score)


def word_positions(text: str) -> list[list[int]]:
    """Content positions of each word of ``text`` from its expected split."""
    out, k = [], 0
    for w in SPLITS[text]:
        out.append(list(range(k, k + len(w))))
        k += len(w)
    return out


def test_vocabulary_splits_words(wp):
    ids, words, texts = wp.encode_words(TEXTS)
    for t, i, w, wt in zip(TEXTS, ids, words, texts, strict=True):
        split = SPLITS[t]
        assert wp.token_strings(i) == [p for word in split for p in word]
        assert w.tolist() == [k for k, word in enumerate(split) for _ in word]
        assert wt == t.split()
    assert any(len(w) == 3 for w in SPLITS[TEXTS[1]])  # a word of three sub-tokens


def test_per_token_pll_equals_direct(wp, raw):
    res = pll(wp, TEXTS, per_token=True)
    assert isinstance(res, TokenScores) and res.unit == "token" and res.variant == "original"
    assert res.words is None
    for t, lp, toks in zip(TEXTS, res.log_probs, res.tokens, strict=True):
        d = len(toks)
        assert toks == [p for word in SPLITS[t] for p in word]
        want = [direct(raw, t, [j], [j]) for j in range(d)]
        np.testing.assert_allclose(lp, want, atol=1e-5, rtol=0)
    # the totals are pll() without per_token, bit for bit
    assert torch.equal(res.total, pll(wp, TEXTS))
    assert torch.equal(res.total, torch.tensor([v.sum() for v in res.log_probs],
                                               dtype=torch.float64))


def test_word_l2r_equals_direct(wp, raw):
    res = pll(wp, TEXTS, per_token=True, variant="word_l2r")
    assert res.unit == "token" and res.variant == "word_l2r"
    for t, lp, w, wlp in zip(TEXTS, res.log_probs, res.words, res.word_log_probs(),
                             strict=True):
        want_tok, want_word = [], []
        for pos in word_positions(t):
            vals = [direct(raw, t, [p for p in pos if p >= j], [j]) for j in pos]
            want_tok += vals
            want_word.append(sum(vals))
        np.testing.assert_allclose(lp, want_tok, atol=1e-5, rtol=0)
        np.testing.assert_allclose(wlp, want_word, atol=1e-5, rtol=0)
        assert w.tolist() == [k for k, pos in enumerate(word_positions(t)) for _ in pos]
    # a word's first sub-token sees fewer tokens than in the original PLL: they differ there
    orig = pll(wp, TEXTS, per_token=True)
    assert abs(res.log_probs[0][1] - orig.log_probs[0][1]) > 1e-3  # "un" of "unhappy"
    np.testing.assert_array_equal(res.log_probs[0][2], orig.log_probs[0][2])  # "##happy": last
    assert torch.allclose(pll(wp, TEXTS, variant="word_l2r"), res.total, atol=0, rtol=0)


def test_whole_word_pll_equals_direct(wp, raw):
    res = pll(wp, TEXTS, per_token=True, whole_word=True)
    assert res.unit == "word" and res.variant == "whole_word"
    for t, lp, toks in zip(TEXTS, res.log_probs, res.tokens, strict=True):
        assert toks == t.split()
        want = [direct(raw, t, pos, pos) for pos in word_positions(t)]
        np.testing.assert_allclose(lp, want, atol=1e-5, rtol=0)
    np.testing.assert_allclose(pll(wp, TEXTS, whole_word=True).numpy(),
                               [sum(direct(raw, t, pos, pos) for pos in word_positions(t))
                                for t in TEXTS], atol=1e-5, rtol=0)
    for wl, lp in zip(res.word_log_probs(), res.log_probs, strict=True):
        np.testing.assert_array_equal(wl, lp)


def test_one_piece_words_reduce_to_tokens(wp):
    """When every word is one token, all three variants are the original PLL, bit for bit."""
    base = pll(wp, ONE_PIECE, per_token=True)
    for kw in ({"whole_word": True}, {"variant": "word_l2r"}):
        other = pll(wp, ONE_PIECE, per_token=True, **kw)
        for a, b in zip(base.log_probs, other.log_probs, strict=True):
            np.testing.assert_array_equal(a, b)
    a = mpt_curve(wp, ONE_PIECE, rates=[0.2, 0.5, 0.9], num_masks=3, seed=4, cumulative=True)
    b = mpt_curve(wp, ONE_PIECE, rates=[0.2, 0.5, 0.9], num_masks=3, seed=4, cumulative=True,
                  whole_word=True)
    assert torch.equal(a.per_sample, b.per_sample) and torch.equal(a.sizes, b.sizes)
    assert torch.equal(a.lml_cumulative, b.lml_cumulative)
    assert a.extra == {} and b.extra == {"unit": "word"}


def test_whole_word_curve_counts_words(wp, raw, monkeypatch):
    seen = []
    inner = wp.ragged_masked_log_prob

    def spy(ids, masks, generators, **kw):
        seen.extend((len(t), m.clone()) for t, m in zip(ids, masks, strict=True))
        return inner(ids, masks, generators, **kw)

    monkeypatch.setattr(wp, "ragged_masked_log_prob", spy)
    rates = [0.2, 0.5, 0.99]
    res = mpt_curve(wp, TEXTS, rates=rates, num_masks=4, seed=1, whole_word=True)
    nw = [len(SPLITS[t]) for t in TEXTS]
    assert res.num_tokens.tolist() == nw
    assert res.sizes.tolist() == [mask_sizes(w, np.array(rates)).tolist() for w in nw]
    # every mask hides whole words, as many as the size says
    by_len = {sum(len(w) for w in SPLITS[t]): t for t in TEXTS}
    assert len(seen) == len(TEXTS)
    for d, m in seen:
        t = by_len[d]
        sizes = res.sizes[TEXTS.index(t)].repeat_interleave(4)
        for row, size in zip(m, sizes, strict=True):
            hidden = [k for k, pos in enumerate(word_positions(t)) if row[pos].all()]
            assert all(not row[pos].any() for k, pos in enumerate(word_positions(t))
                       if k not in hidden)
            assert len(hidden) == int(size)
    # at rate 0.99 every word is masked: S = (1/W) sum_t log p(x_t | all masked), exactly
    for i, t in enumerate(TEXTS):
        d = sum(len(w) for w in SPLITS[t])
        assert int(res.sizes[i, -1]) == nw[i]
        want = direct(raw, t, list(range(d)), list(range(d))) / nw[i]
        np.testing.assert_allclose(float(res.per_sample[i, -1]), want, atol=1e-5, rtol=0)


def test_tokens_rows_and_checkpoints(wp, tmp_path):
    a = pll(wp, TEXTS, per_token=True, variant="word_l2r", checkpoint_dir=tmp_path)
    b = pll(wp, TEXTS, per_token=True, variant="word_l2r", checkpoint_dir=tmp_path)
    c = pll(wp, TEXTS, per_token=True, whole_word=True, checkpoint_dir=tmp_path)
    o = pll(wp, TEXTS, per_token=True, checkpoint_dir=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pll", "pll_whole_word",
                                                          "pll_word_l2r"]
    assert torch.equal(a.total, b.total) and c.unit == "word" and o.words is None
    rows = a.to_pandas(ids=["x", "y", "z"]).to_dict("records")
    assert len(rows) == sum(len(t) for t in a.tokens)
    assert rows[1] == {"datum": 0, "id": "x", "position": 1, "token": "un",
                       "log_prob": float(a.log_probs[0][1]), "word": 1, "model": a.model,
                       "variant": "word_l2r", "unit": "token"}
    assert list(o.to_pandas()) == ["datum", "position", "token", "log_prob", "model",
                                   "variant", "unit"]
    with pytest.raises(ValueError, match="no word map"):
        o.word_log_probs()


# ----------------------------------------------------------------------- refusals
def test_refusals(wp, wp_dir):
    from transformers import BertTokenizerLegacy

    from mptlml.models import MaskedLM

    with pytest.raises(ValueError, match="variant must be one of"):
        pll(wp, TEXTS, variant="l2r")
    with pytest.raises(ValueError, match="Pass one of the two"):
        pll(wp, TEXTS, whole_word=True, variant="word_l2r")
    with pytest.raises(TypeError, match="must be bool"):
        pll(wp, TEXTS, whole_word="yes")
    with pytest.raises(TypeError, match="must be bool"):
        mpt_curve(wp, TEXTS, whole_word=1)
    ids = [t.tolist() for t in wp.encode(TEXTS)]
    for kw in ({"whole_word": True}, {"variant": "word_l2r"}):
        with pytest.raises(TypeError, match="carry no word boundaries"):
            pll(wp, ids, **kw)
    with pytest.raises(TypeError, match="carry no word boundaries"):
        mpt_curve(wp, ids, whole_word=True)
    assert pll(wp, ids, per_token=True).tokens == pll(wp, TEXTS, per_token=True).tokens
    # a slow tokenizer has no word_ids(): refused, not guessed
    slow = BertTokenizerLegacy(str(wp_dir / "vocab.txt"), do_lower_case=True)
    assert not slow.is_fast
    lm = MaskedLM(wp.model, slow)
    for call in (lambda: pll(lm, TEXTS, whole_word=True),
                 lambda: pll(lm, TEXTS, variant="word_l2r"),
                 lambda: mpt_curve(lm, TEXTS, whole_word=True)):
        with pytest.raises(ValueError, match="needs a fast tokenizer"):
            call()
    # tokens need no words: per-token output works with the slow tokenizer
    assert torch.allclose(pll(lm, TEXTS, per_token=True).total, pll(wp, TEXTS), atol=1e-6)
    # whole_word on dense data or in the LML estimators does not apply
    with pytest.raises(TypeError, match="unexpected arguments"):
        mpt_curve(_dense(), torch.zeros(2, 3), whole_word=True)
    with pytest.raises(TypeError, match="do not apply"):
        estimate_lml(wp, TEXTS, "riemann", whole_word=True)


def _dense():
    from mptlml.models import PPCA

    return PPCA(torch.ones(3, 1))


class _Bare:
    """A ragged masked model with no token strings or words."""

    name = "bare"

    def __init__(self, inner):
        self.inner = inner

    def encode(self, s):
        return self.inner.encode(s)

    def ragged_masked_log_prob(self, *a, **k):
        return self.inner.ragged_masked_log_prob(*a, **k)

    def fingerprint(self):
        return self.inner.fingerprint()


def test_protocol_refusals(wp):
    bare = _Bare(wp)
    assert torch.equal(pll(bare, TEXTS), pll(wp, TEXTS))
    for kw in ({"per_token": True}, {"whole_word": True}, {"variant": "word_l2r"}):
        with pytest.raises(TypeError, match="WordMaskedModel"):
            pll(bare, TEXTS, **kw)
    with pytest.raises(TypeError, match="WordMaskedModel"):
        mpt_curve(bare, TEXTS, whole_word=True)
    d = len(wp.encode(TEXTS[:1])[0])
    m = torch.zeros(1, d, dtype=torch.bool)
    t = m.clone()
    t[0, 0] = True
    with pytest.raises(ValueError, match="leaves visible"):
        wp.ragged_target_log_prob(wp.encode(TEXTS[:1]), [m], [t], [None])
    # targets = masks: the ragged protocol's sums, bit for bit
    m[0, :3] = True
    a = wp.ragged_target_log_prob(wp.encode(TEXTS[:1]), [m], [m.clone()], [None])
    b = wp.ragged_masked_log_prob(wp.encode(TEXTS[:1]), [m], [None])
    assert torch.equal(a[0], b[0])


# ----------------------------------------------------------------------- CLI
def test_cli_curve_pll_tokens_csv(wp_dir, tmp_path):
    data = tmp_path / "texts.txt"
    data.write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "mptlml", "curve", "--model", str(wp_dir), "--data",
           str(data), "--out", str(out), "--rates", "0.5,0.99", "--pll", "--whole-word",
           "--no-progress"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    rows = list(csv.DictReader((out / "pll_tokens.csv").open()))
    assert [r["token"] for r in rows] == [w for t in TEXTS for w in t.split()]
    assert list(rows[0]) == ["model", "weights", "datum", "id", "position", "token", "log_prob",
                             "word", "variant", "unit"]  # TokenScores.to_pandas()'s columns
    res = json.loads((out / "results.json").read_text())
    assert res["config"]["whole_word"] is True
    seq = list(csv.DictReader((out / "per_sequence.csv").open()))
    assert [int(r["num_tokens"]) for r in seq] == [len(SPLITS[t]) for t in TEXTS]
    by_id: dict[str, float] = {}
    for r in rows:
        by_id[r["id"]] = by_id.get(r["id"], 0.0) + float(r["log_prob"])
    for r in seq:
        assert float(r["pll"]) == pytest.approx(by_id[r["id"]], abs=1e-9)
