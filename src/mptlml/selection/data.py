"""Data for model selection: built-in data sets by name, matrix files, standardisation."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .._validation import check_positive_int
from ..models import PPCA
from .families import FAMILIES

__all__ = ["BUILTIN_DATASETS", "load_dataset", "load_matrix", "standardise_split"]

#: data sets ``load_dataset`` knows by name.
BUILTIN_DATASETS = ("digits", "wine", "breast_cancer", "synthetic")


def load_dataset(name: str, *, true_k: int | None = None, num_data: int = 500,
                 num_tokens: int = 20, sigma2: float = 1.0, seed: int = 0,
                 family: str = "ppca") -> tuple[np.ndarray, str]:
    """A built-in data set by name, and a one-line description.

    ``digits``, ``wine`` and ``breast_cancer`` come from scikit-learn (they are
    standardised later by :func:`select_latent_dim`). ``synthetic`` draws
    ``num_data`` observations of D = ``num_tokens`` from a PPCA with
    ``true_k`` latent dimensions, W with N(0, 1) entries and noise ``sigma2``.

    For ``family="bernoulli"`` the data are binary: ``digits`` binarised at
    half intensity (as the paper's images), and ``synthetic`` drawn from a
    Bernoulli latent linear model with W ~ N(0, 2^2) and b ~ N(0, 1).
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; choose one of {sorted(FAMILIES)}.")
    if name == "synthetic":
        if true_k is None:
            raise ValueError("the synthetic data set needs --true-k (its latent dimension K).")
        k = check_positive_int(true_k, "true_k")
        if k >= num_tokens:
            raise ValueError(f"--true-k must be smaller than D={num_tokens}; got {k}.")
        if family == "bernoulli":
            from ..models import BernoulliLVM

            if k > FAMILIES["bernoulli"].max_k(num_tokens):
                raise ValueError(f"--true-k {k}: the bernoulli family allows K <= 3.")
            lvm = BernoulliLVM.random(num_tokens, k, scale=2.0, seed=seed)
            x = lvm.sample(num_data, generator=seed + 1).numpy()
            return x, (f"synthetic binary data from a Bernoulli latent linear model: "
                       f"N={num_data}, D={num_tokens}, true K={k}, seed={seed}")
        model = PPCA.random(num_tokens, k, sigma2=sigma2, seed=seed)
        x = model.sample(num_data, generator=seed + 1).numpy()
        return x, (f"synthetic PPCA data: N={num_data}, D={num_tokens}, true K={k}, "
                   f"sigma2={sigma2}, seed={seed}")
    loaders = {"digits": "load_digits", "wine": "load_wine", "breast_cancer": "load_breast_cancer"}
    if name not in loaders:
        raise ValueError(
            f"unknown data set {name!r}; pass a .npy/.csv file or one of "
            f"{', '.join(BUILTIN_DATASETS)}."
        )
    if family == "bernoulli":
        if name != "digits":
            raise ValueError(f"{name} is continuous; the bernoulli family needs binary data: "
                             "use digits, synthetic or a 0/1 matrix file, or --family ppca.")
        from ..data import load_images

        x = load_images("digits", binarized=True).numpy()
        return x, f"scikit-learn digits binarised at 0.5 (N={x.shape[0]}, D={x.shape[1]})"
    import sklearn.datasets

    x = getattr(sklearn.datasets, loaders[name])().data.astype(np.float64)
    return x, f"scikit-learn {name} (N={x.shape[0]}, D={x.shape[1]})"


def load_matrix(path: str) -> np.ndarray:
    """Read an ``(N, D)`` matrix from a ``.npy`` or ``.csv`` file (a header row is skipped)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(
            f"--data {path}: no such file; pass a .npy/.csv matrix or one of "
            f"{', '.join(BUILTIN_DATASETS)}."
        )
    if p.suffix == ".npy":
        x = np.load(p, allow_pickle=False)
    elif p.suffix == ".csv":
        try:
            x = np.loadtxt(p, delimiter=",", ndmin=2)
        except ValueError:
            x = np.loadtxt(p, delimiter=",", ndmin=2, skiprows=1)
    else:
        raise ValueError(f"--data {path}: unsupported file type {p.suffix!r}; use .npy or .csv.")
    if x.ndim != 2:
        raise ValueError(f"--data {path}: expected a 2-D matrix (N, D), got shape {x.shape}.")
    return x.astype(np.float64)


def standardise_split(x_train: np.ndarray, x_test: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Drop columns constant on the training split, then z-score with training statistics.

    Returns ``(x_train, x_test, notes)``; the notes say what was done (for results.json).
    """
    notes = []
    sd = x_train.std(0)
    keep = sd > 1e-12 * max(1.0, float(np.abs(x_train).max()))
    if not keep.all():
        notes.append(f"dropped {int((~keep).sum())} column(s) constant on the training split")
    x_train, x_test = x_train[:, keep], x_test[:, keep]
    mean, sd = x_train.mean(0), x_train.std(0)
    notes.append("standardised each column with the training split's mean and sd")
    return (x_train - mean) / sd, (x_test - mean) / sd, notes
