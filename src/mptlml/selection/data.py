"""Data for model selection: built-in data sets by name, matrix files, standardisation."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .._optional import require
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
    """Read an ``(N, D)`` matrix from a ``.npy``, ``.csv`` or ``.tsv`` file.

    A text table is read the way its writer meant it:

    - the first row is a header when any of its cells is not a number, or when
      it is exactly ``0, 1, ..., D-1`` (the column names pandas writes for an
      unnamed frame: ``pd.DataFrame(x).to_csv()``), or ``1, 2, ..., D``
      (column numbers: skipped with a warning naming the file, since it
      could be data);
    - a file that is not UTF-8 text is an error naming the file and the byte;
    - a pandas index column, i.e. a first column whose header cell is empty
      (or ``Unnamed: 0``), as ``df.to_csv()`` writes by default, is dropped
      with a warning; without a header, a first column equal to 0..N-1 is
      refused as an ambiguous index (save with ``index=False``);
    - a cell that is not a number is an error naming the file, the line and
      the column.

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    ValueError
        For an unknown suffix, a non-numeric or empty cell, a table that is not
        2-D, or an ambiguous index column.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(
            f"--data {path}: no such file; pass a .npy/.csv matrix or one of "
            f"{', '.join(BUILTIN_DATASETS)}."
        )
    if p.suffix == ".npy":
        try:
            x = np.load(p, allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:
            raise ValueError(f"--data {path}: not a readable numeric .npy array ({exc}).") from None
    elif p.suffix in (".csv", ".tsv"):
        x = _read_table(p, "\t" if p.suffix == ".tsv" else ",")
    else:
        raise ValueError(f"--data {path}: unsupported file type {p.suffix!r}; use .npy or .csv.")
    if x.ndim != 2:
        raise ValueError(f"--data {path}: expected a 2-D matrix (N, D), got shape {x.shape}.")
    if np.iscomplexobj(x):
        raise ValueError(f"--data {path}: the matrix is complex ({x.dtype}); the models take "
                         "real data: pass its real part, its modulus, or real and imaginary "
                         "parts as separate columns.")
    if not np.issubdtype(x.dtype, np.number) and x.dtype != bool:
        raise ValueError(f"--data {path}: expected numbers, got an array of dtype {x.dtype}.")
    return x.astype(np.float64)


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _read_table(p: Path, sep: str) -> np.ndarray:
    """A numeric table through pandas, with header and index detection (see load_matrix)."""
    import warnings

    require("pandas", "reading a .csv or .tsv matrix")
    import pandas as pd

    try:
        raw = pd.read_csv(p, sep=sep, header=None, dtype=str, keep_default_na=False,
                          skip_blank_lines=True)
    except pd.errors.EmptyDataError:
        raise ValueError(f"--data {p}: the file is empty.") from None
    except pd.errors.ParserError as exc:
        raise ValueError(f"--data {p}: not a rectangular table ({exc}).") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"--data {p}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at "
                         f"offset {exc.start}); save the table as UTF-8 CSV or as .npy."
                         ) from None
    cells = [[c.strip() if isinstance(c, str) else "" for c in row]
             for row in raw.to_numpy().tolist()]
    if not cells:
        raise ValueError(f"--data {p}: the file is empty.")
    first, d = cells[0], len(cells[0])
    index_cell = first[0] in ("", "Unnamed: 0")
    named = first[1:] if index_cell else first
    pandas_names = named == [str(j) for j in range(len(named))]
    numbered = named == [str(j + 1) for j in range(len(named))]
    header = index_cell or not all(_is_number(c) for c in first) or pandas_names or numbered
    if numbered and len(cells) > 1:
        shown = (", ".join(named) if len(named) <= 4
                 else f"{named[0]}, {named[1]}, ..., {named[-1]}")
        warnings.warn(f"--data {p}: line 1 is {shown}: read as a header of column numbers and "
                      "skipped (it is not data); remove it if it was a data row.", stacklevel=3)
    names = first if header else [str(j + 1) for j in range(d)]
    body = cells[1:] if header else cells
    line0 = 2 if header else 1  # file line of the first data row (1-based)
    for r, row in enumerate(body):
        for j, cell in enumerate(row):
            if not _is_number(cell):
                what = "an empty cell" if cell == "" else f"{cell!r}, not a number"
                raise ValueError(f"--data {p}: line {line0 + r}, column {names[j] or j + 1!r} "
                                 f"(column {j + 1}) holds {what}.")
    x = np.array(body, dtype=np.float64).reshape(len(body), d)
    counting = len(body) > 1 and np.array_equal(x[:, 0], np.arange(len(body)))
    if index_cell:
        warnings.warn(f"--data {p}: dropped the first column, an unnamed pandas index "
                      "(written by df.to_csv() without index=False).", stacklevel=3)
        x = x[:, 1:]
    elif counting and not header:
        raise ValueError(f"--data {p}: the first column is 0, 1, ..., N-1, which looks like a "
                         "pandas index written with header=False; save the table with "
                         "index=False (or as .npy), or give it a header row.")
    return x


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
