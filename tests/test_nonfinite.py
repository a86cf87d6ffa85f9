"""A NaN or inf never leaves a front door unannounced: estimates, curves and PLLs warn."""

from __future__ import annotations

import pytest
import torch

import mptlml
from mptlml.estimators import available
from mptlml.estimators.results import NonFiniteWarning
from mptlml.models import PPCA

_OPTIONS = {"fixed-rate": {"rate": 0.4}}


@pytest.fixture
def nan_model():
    model = PPCA.random(5, 2, sigma2=0.3, seed=0)
    x = model.sample(6, generator=0).detach()
    with torch.no_grad():
        model.W[0, 0] = float("nan")  # one NaN weight
    return model, x


@pytest.mark.parametrize("name", available(dense=True))
def test_every_dense_estimator_warns_on_nan(nan_model, name):
    model, x = nan_model
    with pytest.warns(NonFiniteWarning, match=r"not finite for \d+ of 6 data \(first: index 0"):
        est = mptlml.estimate_lml(model, x, name, num_masks=1 if name == "exhaustive" else 2,
                                  seed=0, **_OPTIONS.get(name, {}))
    assert not torch.isfinite(est.per_sample).all()


def test_dense_curve_warns_on_nan(nan_model):
    model, x = nan_model
    with pytest.warns(NonFiniteWarning, match="the MPT curve is not finite"):
        mptlml.mpt_curve(model, x, num_masks=2, seed=0)


def test_masked_lm_pll_and_curve_warn_on_nan(tiny_dir):
    from mptlml.models import MaskedLM

    mlm = MaskedLM.from_pretrained(tiny_dir)
    with torch.no_grad():
        next(iter(mlm.parameters())).fill_(float("nan"))
    seqs = ["the cat sat on a mat", "blue tree"]
    with pytest.warns(NonFiniteWarning, match="the PLL is not finite for 2 of 2 sequences"):
        mptlml.pll(mlm, seqs)
    with pytest.warns(NonFiniteWarning, match="the MPT curve is not finite"):
        mptlml.mpt_curve(mlm, seqs, rates=[0.3, 0.6], seed=0)
    with pytest.warns(NonFiniteWarning, match="estimate of log p"):
        mptlml.estimate_lml(mlm, seqs, "chain-rule", num_masks=2, seed=0)


def test_finite_results_do_not_warn(recwarn):
    model = PPCA.random(5, 2, sigma2=0.3, seed=0)
    mptlml.estimate_lml(model, model.sample(6, generator=0), num_masks=2, seed=0)
    assert not [w for w in recwarn if issubclass(w.category, NonFiniteWarning)]


@pytest.mark.slow  # the command line in its own process
def test_cli_curve_fails_on_nan_and_writes_nothing(tmp_path):
    """`mptlml curve` on a model with NaN weights exits 1, names the problem, writes no run."""
    import subprocess
    import sys

    from transformers import BertForMaskedLM

    from .mlm_helpers import make_tiny_bert

    path = make_tiny_bert(tmp_path / "nan_bert")
    model = BertForMaskedLM.from_pretrained(path)
    with torch.no_grad():
        model.bert.embeddings.word_embeddings.weight.fill_(float("nan"))
    model.save_pretrained(path)
    data = tmp_path / "texts.txt"
    data.write_text("the cat sat on a mat\nblue tree\n")
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "mptlml", "-q", "curve", "--model", str(path),
                           "--data", str(data), "--rates", "0.3,0.6", "--no-pll",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert "not finite" in proc.stderr and "Nothing was written" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()


def test_repeated_dense_sizes_are_refused():
    """sizes=[3, 1, 3] would count size 3 twice in the area: refused, naming it."""
    model = PPCA.random(5, 2, sigma2=0.3, seed=0)
    with pytest.raises(ValueError, match=r"repeat \[3\]"):
        mptlml.mpt_curve(model, model.sample(4, generator=0), sizes=[3, 1, 3], seed=0)


def test_a_run_too_big_for_memory_is_refused_up_front(tiny_dir):
    """num_masks=10**8 on sequences is refused with its cost before any mask is drawn."""
    from mptlml.models import MaskedLM

    mlm = MaskedLM.from_pretrained(tiny_dir)
    # 30 tokens: its 2^30 - 1 masks are more than the draws asked (shorter ones are enumerated)
    seqs = ["the cat sat on a mat " * 5, "blue tree"]
    with pytest.raises(ValueError, match="would score 200,000,000 masked inputs.*lower num_masks"):
        mptlml.mpt_curve(mlm, seqs, num_masks=10**8, rates=[0.5], seed=0)
    with pytest.raises(ValueError, match="max_masked_inputs"):
        mptlml.estimate_lml(mlm, seqs, "chain-rule", num_masks=10**8, seed=0)
    with pytest.raises(ValueError, match="max_masked_inputs"):
        mptlml.estimate_lml(mlm, seqs, "cumulative", num_masks=10**8, seed=0)
    from mptlml import settings

    with settings.max_masked_inputs(10**9), pytest.raises(ValueError, match="GiB of masks"):
        mptlml.mpt_curve(mlm, seqs, num_masks=10**8, rates=[0.5, 0.9], seed=0)
