"""Tokenizers are checked by what they do: unknown-token floods, special ids, round trips."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest
import torch

import mptlml
from mptlml.cli import main
from mptlml.models import MaskedLM
from mptlml.models.tokenizer_checks import MAX_UNKNOWN_FRACTION

from .mlm_helpers import SENTENCES, WORDS


def _lowercasing_antiberty_tokenizer():
    import antiberty
    from transformers import BertTokenizer

    vocab = Path(antiberty.__file__).parent / "trained_models" / "vocab.txt"
    return BertTokenizer(str(vocab))  # do_lower_case=True by default: residues -> [UNK]


def test_lowercasing_tokenizer_on_antiberty_is_an_error(antiberty):
    tok = _lowercasing_antiberty_tokenizer()
    assert len(tok) == antiberty.vocab_size  # the old size-only check passed it
    with pytest.raises(ValueError, match=r"8 of 8 of its own vocabulary tokens.*\[UNK\]"
                                         r".*allow_unknown=True"):
        MaskedLM(antiberty.model, tok, preprocess=antiberty.preprocess)


def test_lowercasing_tokenizer_opt_out_scores_the_flood(antiberty):
    seq = ["EVQLVESGGGLVQPGGSLRLSCAAS"]
    with pytest.warns(UserWarning, match="unknown token"):
        bad = MaskedLM(antiberty.model, _lowercasing_antiberty_tokenizer(),
                       preprocess=antiberty.preprocess, allow_unknown=True)
    with pytest.warns(UserWarning, match=r"25 of 25 tokens \(100.0%\)"):
        flood = mptlml.pll(bad, seq)
    good = mptlml.pll(antiberty, seq)
    assert float(flood[0]) < float(good[0]) - 100  # what the check protects against


def test_unknown_token_flood_is_an_error_with_an_opt_out(tiny_dir, tiny):
    texts = ["the zebra and giraffe", "a cat"]  # 2 of 6 tokens unknown: 33%
    with pytest.raises(ValueError, match=r"2 of 6 tokens \(33.3%\).*\[UNK\].*sequence 0.*"
                                         r"allow_unknown=True"):
        tiny.encode(texts)
    with pytest.raises(ValueError, match="unknown token"):
        mptlml.pll(tiny, texts)
    lenient = MaskedLM.from_pretrained(tiny_dir, allow_unknown=True)
    with pytest.warns(UserWarning, match="allow_unknown=True"):
        got = mptlml.pll(lenient, texts)
    assert got.shape == (2,) and torch.isfinite(got).all()


def test_few_unknown_tokens_only_warn(tiny):
    texts = [" ".join(WORDS)] * 2 + ["the zebra"]  # 1 unknown in ~50 tokens: under 5%
    ids = tiny.tokenizer(texts, add_special_tokens=False)["input_ids"]
    assert 1 / sum(map(len, ids)) < MAX_UNKNOWN_FRACTION
    with pytest.warns(UserWarning, match="scored as such"):
        tiny.encode(texts)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tiny.encode(SENTENCES)  # no unknown token: no warning


def test_the_unknown_token_limit_is_exactly_five_percent_at_every_door(tiny):
    """1 [UNK] in 20 tokens (5%) is scored with a warning; 1 in 19 (5.3%) is refused, by
    ``encode``, a context of ``compare`` (counted though never scored) and an lm-eval
    request alike; the count is pooled over the sequences of a call."""
    base = "the cat sat on a mat " * 3  # 18 tokens
    at, over = base + "a zebra", base + "zebra"  # 20 and 19 tokens, one unknown each
    assert [len(t) for t in tiny.tokenizer([at, over], add_special_tokens=False)["input_ids"]
            ] == [20, 19]
    assert MAX_UNKNOWN_FRACTION == 0.05
    with pytest.warns(UserWarning, match=r"1 of 20 tokens \(5.0%\).*scored as such"):
        tiny.encode([at])
    with pytest.raises(ValueError, match=r"1 of 19 tokens \(5.3%\).*allow_unknown=True"):
        tiny.encode([over])
    with pytest.warns(UserWarning, match=r"1 of 38 tokens"):  # pooled: under 5% together
        tiny.encode([over, base + "a"])
    with pytest.raises(ValueError, match=r"1 of 19 tokens \(5.3%\)"):
        mptlml.compare(tiny, [over[:-len("zebra")] + "zebra"], [[" a"]])
    from lm_eval.api.instance import Instance

    import mptlml.lm_eval as mle

    req = Instance("loglikelihood", {}, (over, " a"), 0, ("t", 0, 1))
    with pytest.raises(ValueError, match=r"1 of 19 tokens \(5.3%\)"):
        mle.MPTLM(tiny).loglikelihood([req])


def test_special_token_ids_checked_against_the_config(tiny):
    from transformers import BertConfig, BertForMaskedLM

    for name, value in (("pad", 5), ("sep", 7), ("cls", 1)):
        cfg = BertConfig(vocab_size=len(tiny.tokenizer), hidden_size=8, num_hidden_layers=1,
                         num_attention_heads=1, intermediate_size=8)
        setattr(cfg, f"{name}_token_id", value)
        other = BertForMaskedLM(cfg)
        with pytest.raises(ValueError, match=rf"special-token mismatch \({name}: tokenizer "
                                             rf"\d+ .* vs model config {value}\)"):
            MaskedLM(other, tiny.tokenizer)


def test_missing_mask_token_is_an_error(tiny_dir, tiny):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    tok.mask_token = None
    with pytest.raises(ValueError, match="no mask token"):
        MaskedLM(tiny.model, tok)


def test_model_dir_without_tokenizer_files(tiny_dir, tiny, tmp_path):
    bare = tmp_path / "bare"
    tiny.model.save_pretrained(bare)
    assert not (bare / "vocab.txt").exists()
    with pytest.raises(ValueError, match=rf"no tokenizer files in {bare}.*pass tokenizer="):
        MaskedLM.from_pretrained(bare)
    code = main(["curve", "--model", str(bare), "--data", "antibodies", "--num-sequences", "1",
                 "--out", str(tmp_path / "run"), "--no-progress"])
    assert code == 2 and not (tmp_path / "run").exists()
    by_path = MaskedLM.from_pretrained(bare, tokenizer=str(tiny_dir))
    by_obj = MaskedLM.from_pretrained(bare, tokenizer=tiny.tokenizer)
    torch.testing.assert_close(mptlml.pll(by_path, SENTENCES), mptlml.pll(tiny, SENTENCES),
                               rtol=0, atol=0)
    assert by_obj.tokenizer is tiny.tokenizer


def test_same_size_permuted_vocabulary_is_not_detected(tiny_dir, tiny, tmp_path):
    """The documented limit: a vocabulary in another order passes every check."""
    perm = tmp_path / "perm"
    shutil.copytree(tiny_dir, perm)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (perm / f).unlink(missing_ok=True)
    vocab = (tiny_dir / "vocab.txt").read_text().split()
    i, j = vocab.index("cat"), vocab.index("dog")
    vocab[i], vocab[j] = vocab[j], vocab[i]
    (perm / "vocab.txt").write_text("\n".join(vocab) + "\n")
    swapped = MaskedLM.from_pretrained(perm)  # no error: nothing free can tell
    assert swapped.encode(["cat"])[0].tolist() == [j]
    assert not torch.equal(mptlml.pll(swapped, SENTENCES[:1]), mptlml.pll(tiny, SENTENCES[:1]))
