"""Image data as ``(N, D)`` tensors: scikit-learn digits, MNIST, Fashion-MNIST.

Images are scaled to [0, 1] and, by default, binarised with a threshold of
0.5 (pixel > 0.5 -> 1), as in Fig. 3 of Moreno-Munoz, Recasens & Hauberg,
"On Masked Pre-training and the Marginal Likelihood" (NeurIPS 2023).

Sources, in order:

- ``"digits"``: scikit-learn's 8x8 handwritten digits (1797 images, D = 64),
  shipped with scikit-learn, always available offline. Pixels are 0..16.
- ``"mnist"`` / ``"fashion_mnist"`` (28x28, D = 784): from local files when
  ``path`` is given (a directory with the standard IDX files
  ``train-images-idx3-ubyte[.gz]``, or one ``.gz``/IDX, ``.npz`` or ``.npy``
  file), otherwise from the Hugging Face hub through ``datasets.load_dataset``
  (needs network or a populated cache). No torchvision.
"""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._validation import check_positive_int

__all__ = ["IMAGE_DATASETS", "binarize", "load_images", "read_idx"]

#: dataset name -> (Hugging Face hub ids to try, image side, IDX file stem of each split)
IMAGE_DATASETS: dict[str, dict[str, Any]] = {
    "digits": {"side": 8},
    "mnist": {"side": 28, "hub": ("ylecun/mnist", "mnist")},
    "fashion_mnist": {"side": 28, "hub": ("zalando-datasets/fashion_mnist", "fashion_mnist")},
}
_IDX_STEMS = {"train": "train-images-idx3-ubyte", "test": "t10k-images-idx3-ubyte"}
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
               0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


def binarize(x: Any, threshold: float = 0.5) -> torch.Tensor:
    """Binarise intensities in [0, 1]: ``1.0 where x > threshold else 0.0`` (float64)."""
    t = torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x)
    return (t > threshold).to(torch.float64)


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (LeCun's MNIST format), gzip-compressed or not.

    The header is two zero bytes, a type code (0x08 = uint8, ...), the number
    of dimensions, then each size as a big-endian uint32.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        raw = fh.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(
            f"{path} is not an IDX file (bad magic number); pass the MNIST-format "
            "'train-images-idx3-ubyte.gz', or a .npz/.npy array of images."
        )
    dtype, ndim = np.dtype(_IDX_DTYPES[raw[2]]), raw[3]
    dims = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=dtype, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{path} is truncated: header says {dims}, found {data.size} values.")
    return data.reshape(dims)


def _read_array(path: Path, split: str) -> np.ndarray:
    """Images from one local file or a directory of IDX files."""
    if path.is_dir():
        stem = _IDX_STEMS[split]
        for cand in (path / f"{stem}.gz", path / stem, path / stem.replace("-idx3", ".idx3")):
            if cand.is_file():
                return read_idx(cand)
        raise FileNotFoundError(
            f"no '{stem}.gz' (or '{stem}') in {path}; download the IDX files of the dataset into "
            "that directory, or pass a .npz/.npy file of images instead."
        )
    if not path.is_file():
        raise FileNotFoundError(
            f"data file {path} does not exist; pass a directory holding "
            f"'{_IDX_STEMS[split]}.gz', or an existing IDX/.npz/.npy file of images."
        )
    name = path.name.lower()
    if name.endswith(".npy"):
        return np.load(path, allow_pickle=False)
    if name.endswith(".npz"):
        with np.load(path, allow_pickle=False) as z:
            keys = list(z.keys())
            for key in (f"x_{split}", split, "x", "images", "data", "arr_0"):
                if key in z:
                    return z[key]
            if len(keys) == 1:
                return z[keys[0]]
        raise ValueError(
            f"{path} holds arrays {keys}; name the image array 'x_{split}', 'images' or 'x'."
        )
    return read_idx(path)


def _from_hub(name: str, split: str) -> np.ndarray:
    hub_ids = IMAGE_DATASETS[name]["hub"]
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - datasets is a dependency
        why = f"'datasets' is not installed: {exc}"
        raise FileNotFoundError(_missing_message(name, why)) from exc
    errors = []
    for hub_id in hub_ids:
        try:
            ds = datasets.load_dataset(hub_id, split=split)
        except Exception as exc:  # noqa: BLE001 - any hub failure means "not available"
            errors.append(f"{hub_id}: {type(exc).__name__}: {str(exc)[:200]}")
            continue
        col = "image" if "image" in ds.column_names else ds.column_names[0]
        return np.stack([np.asarray(im, dtype=np.uint8) for im in ds[col]])
    raise FileNotFoundError(_missing_message(name, "; ".join(errors)))


def _missing_message(name: str, why: str) -> str:
    return (
        f"dataset {name!r} is not available ({why}). Without network, download the IDX files "
        f"(train-images-idx3-ubyte.gz, t10k-images-idx3-ubyte.gz) on another machine and pass "
        f"their directory as path=... (CLI: --set data_dir=DIR), or pass a .npz/.npy file of "
        f"shape (N, 28, 28) or (N, 784); or use name='digits', which ships with scikit-learn."
    )


def _scale(arr: np.ndarray, max_value: float | None) -> np.ndarray:
    a = arr.astype(np.float64)
    if max_value is None:
        max_value = 255.0 if (np.issubdtype(arr.dtype, np.integer) or a.max() > 1.0) else 1.0
    if a.size and (a.min() < 0 or a.max() > max_value):
        raise ValueError(
            f"image intensities must lie in [0, {max_value}]; got [{a.min()}, {a.max()}]."
        )
    return a / max_value


def load_images(name: str = "digits", *, num_data: int | None = None, path: Any = None,
                split: str = "train", binarized: bool = True, threshold: float = 0.5,
                seed: int = 0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Load images as an ``(N, D)`` tensor, scaled to [0, 1] and binarised by default.

    Parameters
    ----------
    name : {"digits", "mnist", "fashion_mnist"}
    num_data : int, optional
        Keep a random subset of this many images (without replacement, from
        ``seed``); all of them by default. The paper uses N = 2000.
    path : path-like, optional
        Local data: a directory holding the IDX files, or an IDX (``.gz``),
        ``.npz`` or ``.npy`` file of shape ``(N, side, side)`` or
        ``(N, side * side)``. Without it MNIST/Fashion-MNIST come from the
        Hugging Face hub.
    split : {"train", "test"}
    binarized : bool
        Threshold the [0, 1] intensities: ``x > threshold`` -> 1 (else 0).
    threshold : float
        0.5 as in the paper.
    seed : int
        Seed of the subset draw.
    dtype : torch.dtype

    Returns
    -------
    torch.Tensor, (N, D)

    Raises
    ------
    FileNotFoundError
        When the dataset is neither local nor reachable; the message says how
        to supply the files.
    ValueError
        For an unknown name, or a file whose arrays have the wrong shape.
    """
    if name not in IMAGE_DATASETS:
        raise ValueError(
            f"unknown image dataset {name!r}; choose one of {', '.join(IMAGE_DATASETS)}."
        )
    if split not in _IDX_STEMS:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}.")
    side = IMAGE_DATASETS[name]["side"]
    if name == "digits":
        if path is not None:
            raise ValueError("the digits ship with scikit-learn; do not pass path for them.")
        from sklearn.datasets import load_digits

        arr = _scale(load_digits().data, 16.0)
    else:
        raw = _read_array(Path(path), split) if path is not None else _from_hub(name, split)
        if raw.ndim == 3 and raw.shape[1:] == (side, side):
            raw = raw.reshape(raw.shape[0], side * side)
        if raw.ndim != 2 or raw.shape[1] != side * side or raw.shape[0] == 0:
            raise ValueError(
                f"{name} images must have shape (N, {side}, {side}) or (N, {side * side}); "
                f"got {tuple(raw.shape)}" + (f" from {path}" if path is not None else "") + "."
            )
        arr = _scale(raw, None)
    if num_data is not None:
        n = check_positive_int(num_data, "num_data")
        if n > arr.shape[0]:
            raise ValueError(f"num_data={n} exceeds the {arr.shape[0]} images of {name!r}.")
        idx = np.random.default_rng(seed).choice(arr.shape[0], size=n, replace=False)
        arr = arr[np.sort(idx)]
    x = torch.from_numpy(np.ascontiguousarray(arr))
    if binarized:
        x = binarize(x, threshold)
    return x.to(dtype)
