"""Results as tidy data frames: one row per datum, per size/rate, per K, per epoch."""

from __future__ import annotations

import numpy as np
import pytest

from mptlml import estimate_lml, mpt_curve
from mptlml.models import PPCA

pd = pytest.importorskip("pandas")


@pytest.fixture(scope="module")
def ppca():
    model = PPCA.random(6, 2, 0.5, seed=0)
    return model, model.sample(25, generator=1)


def test_lml_estimate_one_row_per_datum(ppca):
    model, x = ppca
    est = estimate_lml(model, x, "random-size", num_masks=3, seed=2)
    df = est.to_pandas()
    assert isinstance(df, pd.DataFrame) and len(df) == x.shape[0]
    assert list(df.columns[:3]) == ["datum", "lml", "lml_stderr"]
    np.testing.assert_array_equal(df["datum"], np.arange(x.shape[0]))
    np.testing.assert_allclose(df["lml"], est.per_sample.numpy())
    np.testing.assert_allclose(df["lml_stderr"], est.per_sample_stderr.numpy())
    assert df["lml"].mean() == pytest.approx(est.mean)
    assert (df["estimator"] == "random-size").all() and (df["num_masks"] == 3).all()


def test_dense_curve_one_row_per_size_and_long_form(ppca):
    model, x = ppca
    curve = mpt_curve(model, x, num_masks=2, seed=0)
    df = curve.to_pandas()
    assert len(df) == len(curve.sizes) == 6
    np.testing.assert_array_equal(df["size"], curve.sizes)
    np.testing.assert_allclose(df["rate"], curve.rates)
    np.testing.assert_allclose(df["mean"], curve.mean.numpy())
    np.testing.assert_allclose(df["stderr"], curve.stderr.numpy())
    assert df["mean"].sum() == pytest.approx(curve.area)  # the cumulative area
    long = curve.to_pandas(per_sample=True)
    assert len(long) == x.shape[0] * len(curve.sizes)
    assert set(long.columns) >= {"datum", "rate", "size", "score", "score_stderr"}
    np.testing.assert_allclose(long.groupby("size")["score"].mean().to_numpy(),
                               curve.mean.numpy())
    one = long[long["datum"] == 3]
    np.testing.assert_allclose(one["score"], curve.per_sample[3].numpy())


def test_masked_lm_curve_and_estimate(tmp_path):
    from mptlml import mpt_curve
    from mptlml.models.masked_lm import MaskedLM

    from .mlm_helpers import SENTENCES, make_tiny_bert

    lm = MaskedLM.from_pretrained(make_tiny_bert(tmp_path / "bert"))
    texts = SENTENCES[:3]
    curve = mpt_curve(lm, texts, rates=[0.3, 0.6], num_masks=2, seed=0, ids=["a", "b", "c"])
    df = curve.to_pandas()
    assert len(df) == 2 and df["size"].isna().all()  # ragged: sizes differ per sequence
    np.testing.assert_allclose(df["mean"], curve.mean.numpy())
    long = curve.to_pandas(per_sample=True)
    assert len(long) == 3 * 2 and list(long["id"].unique()) == ["a", "b", "c"]
    np.testing.assert_array_equal(long["size"], curve.sizes.numpy().reshape(-1))
    np.testing.assert_allclose(long["score_stderr"], curve.per_sample_stderr.numpy().reshape(-1))
    est = estimate_lml(lm, texts, "riemann", num_masks=2, seed=0)
    edf = est.to_pandas()
    assert len(edf) == 3 and edf["model"].notna().all()
    np.testing.assert_allclose(edf["lml"], est.per_sample.numpy())


def test_history_one_row_per_epoch(ppca, tmp_path):
    from mptlml.objectives import MPTLoss
    from mptlml.training import History, exact_lml, train

    model, x = ppca
    fit = PPCA.random(6, 2, 0.5, seed=3)
    hist = train(fit, MPTLoss(fit, "cumulative"), x, epochs=4, lr=0.05, seed=0,
                 monitors={"exact_lml": exact_lml(every=2)}, progress=False)
    df = hist.to_pandas()
    assert len(df) == len(hist.records) == 5  # epoch 0 and four epochs
    assert list(df.columns) == hist.columns
    assert df["epoch"].tolist() == [0, 1, 2, 3, 4]
    assert df["exact_lml"].isna().tolist() == [r.get("exact_lml") is None for r in hist.records]
    # the CSV written through pandas reads back as before
    back = History.load(hist.to_csv(tmp_path / "h.csv"))
    assert [r["epoch"] for r in back.records] == [0, 1, 2, 3, 4]
    assert back.records[2]["exact_lml"] == pytest.approx(hist.records[2]["exact_lml"])
    assert "exact_lml" not in back.records[1]


def test_selection_result_one_row_per_k():
    from mptlml.selection import select_latent_dim

    model = PPCA.random(5, 1, 0.3, seed=4)
    x = model.sample(120, generator=5)
    res = select_latent_dim(x.numpy(), 2, num_masks=2, max_num_masks=4, seed=0)
    df = res.to_pandas()
    assert df["K"].tolist() == res.ks == [1, 2]
    np.testing.assert_allclose(df["mpt_lml"], res.mpt)
    np.testing.assert_allclose(df["exact_lml"], res.exact_lml)


def test_run_dir_csv_through_pandas(tmp_path):
    from mptlml.runs.rundir import RunDir

    with RunDir(tmp_path / "r", "t") as run:  # files appear in OUT once the run is swapped in
        run.write_csv("a.csv", [{"a": 1, "b": None, "c": 0.1},
                                {"a": 2, "b": float("nan"), "d": [1, 2]}], columns=["a", "b", "d"])
        run.write_csv("e.csv", [])
        run.write_results({}, {})
    assert (tmp_path / "r" / "a.csv").read_text() == 'a,b,d\n1,,\n2,,"[1, 2]"\n'
    assert (tmp_path / "r" / "e.csv").read_text() == "\n"
