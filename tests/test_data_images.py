"""Image loaders: digits offline, local IDX/npz/npy files, clear errors."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest
import torch

from mptlml.data import binarize, load_images, read_idx


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


def test_missing_dataset_offline_says_how_to_supply(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(FileNotFoundError, match="path=") as info:
        load_images("mnist")
    assert "train-images-idx3-ubyte.gz" in str(info.value)
    assert "digits" in str(info.value)


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown image dataset"):
        load_images("cifar")
    with pytest.raises(ValueError, match="exceeds"):
        load_images("digits", num_data=5000)
    with pytest.raises(ValueError, match="split"):
        load_images("digits", split="valid")
    assert binarize(torch.tensor([0.2, 0.5, 0.51])).tolist() == [0.0, 0.0, 1.0]
