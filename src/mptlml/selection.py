"""Model selection by masked pre-training: choose PPCA's latent dimension K.

For each K = 1..k_max a model is fitted by maximum likelihood on a training
split and scored on the held-out split by

- **MPT**: the cumulative MPT estimate of the held-out log-marginal likelihood
  (Proposition 1 of the paper), mean over held-out data::

      L_hat(x) = sum_{M=1..D} (1/P) sum_p (1/M) sum_{j in mask_p} log p(x_j | x_R);

- **Exact**: the exact held-out log p(x) (PPCA is tractable), the reference
  that MPT must agree with;
- **BIC** on the training split, ``-2 sum_n log p(x_n) + p_K log N_train`` with
  ``p_K = D K - K (K - 1) / 2 + D + 1`` free parameters (W up to rotation, mu,
  sigma2); smallest wins;
- **Minka**: scikit-learn's ``PCA(n_components="mle")`` (Minka, 2000) on the
  training split; it chooses K itself (possibly outside 1..k_max).

The MPT scores of all K use the *same* masks (common random numbers): the
noise largely cancels in the differences that decide the choice. The number
of masks P is doubled (new masks appended) until the best K leads every other
by more than ``z`` paired standard errors, or until ``max_masks``; the result
says whether the choice was resolved.

Model families (:data:`FAMILIES`; a family is a :class:`ModelFamily` with
``fit``, ``num_params`` and ``max_k``):

- ``"ppca"``: PPCA fitted in closed form; continuous data.
- ``"bernoulli"``: the Bernoulli latent linear model p(x|z) = Bernoulli(sigmoid(W z + b)),
  K <= 3, fitted by Adam on its quadrature LML (tensor Gauss-Hermite rule);
  binary data. "Exact" is then the quadrature LML, the quantity the
  exhaustive MPT sum reproduces to rounding error; BIC counts
  ``D K - K (K - 1) / 2 + D`` parameters; Minka applies to PCA only.

References
----------
Moreno-Munoz, Recasens, Hauberg (NeurIPS 2023), Proposition 1, Sec. 3.
Tipping & Bishop (1999); Minka (2000), "Automatic choice of dimensionality for PCA".
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from ._validation import check_data, check_positive_int
from .estimators import BLOCK_ELEMENTS
from .masks import sample_masks
from .models import PPCA
from .models.base import MaskedModel

__all__ = [
    "BUILTIN_DATASETS",
    "FAMILIES",
    "ModelFamily",
    "SelectionResult",
    "load_dataset",
    "load_matrix",
    "run_selection",
    "select_latent_dim",
]

#: data sets ``load_dataset`` knows by name.
BUILTIN_DATASETS = ("digits", "wine", "breast_cancer", "synthetic")


# ---------------------------------------------------------------------- model families
class ModelFamily(Protocol):
    """What model selection needs of a family of latent-variable models."""

    name: str

    def fit(self, x: torch.Tensor, k: int, *, seed: int = 0) -> MaskedModel:
        """Fit the model with latent dimension ``k`` to training data ``(N, D)``."""

    def num_params(self, d: int, k: int) -> int:
        """Free parameters (for BIC)."""

    def max_k(self, d: int) -> int:
        """Largest latent dimension the family supports for D tokens."""


class _PPCAFamily:
    """PPCA fitted in closed form (Tipping & Bishop 1999)."""

    name = "ppca"

    def fit(self, x: torch.Tensor, k: int, *, seed: int = 0) -> MaskedModel:
        return PPCA.fit(x, k)

    def num_params(self, d: int, k: int) -> int:
        return d * k - k * (k - 1) // 2 + d + 1

    def max_k(self, d: int) -> int:
        return d - 1


class _BernoulliFamily:
    """Bernoulli latent linear model, maximum likelihood by Adam on the quadrature LML.

    The quadrature is a tensor Gauss-Hermite rule with ``points[K]`` nodes per
    axis (40, 20, 10 for K = 1, 2, 3: at most 1000 nodes). Initialisation:
    small random W (seeded by the selection's ``seed`` + K) and b at the logits of the column
    means, so every K starts from the same independent-Bernoulli fit.
    """

    name = "bernoulli"
    points = {1: 40, 2: 20, 3: 10}

    def __init__(self, epochs: int = 300, lr: float = 0.05) -> None:
        self.epochs, self.lr = epochs, lr

    def fit(self, x: torch.Tensor, k: int, *, seed: int = 0) -> MaskedModel:
        from .models import BernoulliLVM
        from .objectives import ExactLML
        from .training import train

        d = x.shape[1]
        g = torch.Generator().manual_seed(seed + k)
        w = 0.1 * torch.randn(d, k, generator=g, dtype=torch.float64)
        mean = x.double().mean(0).clamp(0.5 / x.shape[0], 1.0 - 0.5 / x.shape[0])
        model = BernoulliLVM(w, torch.logit(mean), quadrature="gauss-hermite",
                             num_points=self.points[k])
        model.validate_data(x)
        train(model, ExactLML(model), x, epochs=self.epochs, lr=self.lr, seed=seed,
              progress=False, record_initial=False)
        return model

    def num_params(self, d: int, k: int) -> int:
        return d * k - k * (k - 1) // 2 + d

    def max_k(self, d: int) -> int:
        return min(3, d - 1)


#: family name -> implementation.
FAMILIES: dict[str, ModelFamily] = {"ppca": _PPCAFamily(), "bernoulli": _BernoulliFamily()}


# ---------------------------------------------------------------------- result
@dataclass
class SelectionResult:
    """Per-K scores and each criterion's choice of K.

    Attributes
    ----------
    ks : list of int
    mpt, mpt_stderr : list of float
        MPT estimate of the mean held-out log p(x) per datum, and its Monte
        Carlo standard error.
    exact : list of float
        Exact mean held-out log p(x) per datum.
    bic : list of float
        BIC on the training split (smaller is better).
    choices : dict
        ``{"MPT": k, "Exact": k, "BIC": k, "Minka": k}`` (Minka only for PPCA).
    resolved : bool
        Whether the MPT choice leads every other K by more than ``z`` paired
        standard errors.
    num_masks : int
        P, masks per size and held-out datum, finally used.
    """

    ks: list[int]
    mpt: list[float]
    mpt_stderr: list[float]
    exact: list[float]
    bic: list[float]
    choices: dict[str, int]
    resolved: bool
    min_paired_z: float
    num_masks: int
    family: str
    n_train: int
    n_test: int
    num_tokens: int
    seed: int
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dictionary."""
        return asdict(self)

    def rows(self) -> list[dict[str, Any]]:
        """One row per K (for scores.csv and the printed table)."""
        return [{"K": k, "mpt_lml": m, "mpt_stderr": s, "exact_lml": e, "bic": b}
                for k, m, s, e, b in zip(self.ks, self.mpt, self.mpt_stderr, self.exact,
                                         self.bic, strict=True)]


# ---------------------------------------------------------------------- data
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
            from .models import BernoulliLVM

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
        from .data import load_images

        x = load_images("digits", binarized=True).numpy()
        return x, f"scikit-learn digits binarised at 0.5 (N={x.shape[0]}, D={x.shape[1]})"
    import sklearn.datasets

    x = getattr(sklearn.datasets, loaders[name])().data.astype(np.float64)
    return x, f"scikit-learn {name} (N={x.shape[0]}, D={x.shape[1]})"


def _standardise(x_train: np.ndarray, x_test: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Drop columns constant on the training split, then z-score with training statistics."""
    notes = []
    sd = x_train.std(0)
    keep = sd > 1e-12 * max(1.0, float(np.abs(x_train).max()))
    if not keep.all():
        notes.append(f"dropped {int((~keep).sum())} column(s) constant on the training split")
    x_train, x_test = x_train[:, keep], x_test[:, keep]
    mean, sd = x_train.mean(0), x_train.std(0)
    notes.append("standardised each column with the training split's mean and sd")
    return (x_train - mean) / sd, (x_test - mean) / sd, notes


# ---------------------------------------------------------------------- selection
def _mpt_samples(models: list[MaskedModel], x: torch.Tensor, p: int, seed: int,
                 share_masks: bool) -> torch.Tensor:
    """Per-mask cumulative estimates averaged over data, same masks for every model: (K, P).

    The masks are drawn once and scored by every model (common random numbers).
    """
    n, d = x.shape
    rows = torch.arange(1, d + 1).repeat_interleave(p)
    masks = sample_masks(d, rows, num_data=None if share_masks else n,
                         generator=torch.Generator().manual_seed(seed))
    out = []
    with torch.no_grad():
        for model in models:
            per = max(1, BLOCK_ELEMENTS // max(1, model.block_cost(n, share_masks)))
            s = torch.cat([model.masked_log_prob(x, masks[i:i + per], None).double()
                           for i in range(0, masks.shape[0], per)])  # (D * P, N)
            s = s / rows[:, None].double()
            out.append(s.view(d, p, n).sum(0).mean(1))
    return torch.stack(out)


def select_latent_dim(x: Any, k_max: int, *, x_test: Any = None, test_fraction: float = 0.3,
                      standardise: bool = False, family: str = "ppca", num_masks: int = 10,
                      max_masks: int = 640, z: float = 4.0, share_masks: bool = True,
                      seed: int = 0,
                      verbose: bool = False) -> SelectionResult:
    """Choose the latent dimension K by the held-out LML estimated with MPT.

    Parameters
    ----------
    x : array-like, (N, D)
        Data; split into training and held-out parts unless ``x_test`` is given.
    k_max : int
        Largest K tried (``1 <= k_max <= D - 1`` for PPCA).
    x_test : array-like, optional
        Held-out data (then ``x`` is used whole for training).
    test_fraction : float
        Held-out share of the rows when ``x_test`` is None.
    standardise : bool
        Drop columns constant on the training split and z-score every column
        with the training split's statistics (recommended for real data).
    family : str
        Model family, a key of :data:`FAMILIES`.
    num_masks : int
        Initial P, masks per size and held-out datum.
    max_masks : int
        Largest P the adaptive doubling may reach.
    share_masks : bool
        Share each mask across the held-out data (default: far cheaper for
        PPCA, whose shared-mask path is a few GEMMs) rather than one mask per
        datum.
    z : float
        Paired standard errors by which the chosen K must lead every other K.
    seed : int
        Seed of the split and of the masks.

    Returns
    -------
    SelectionResult
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; choose one of {sorted(FAMILIES)}.")
    fam = FAMILIES[family]
    if isinstance(k_max, bool) or not isinstance(k_max, numbers.Integral):
        raise TypeError(f"k_max must be an integer >= 1, got {k_max!r}.")
    if k_max < 1:
        raise ValueError(f"k_max must be >= 1 (the largest latent dimension to try), got {k_max}.")
    p0 = check_positive_int(num_masks, "num_masks")
    p_max = check_positive_int(max_masks, "max_masks")
    xa = check_data(x, dtype=torch.float64).numpy()
    notes: list[str] = []
    if x_test is None:
        if not 0.0 < test_fraction < 1.0:
            raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction}.")
        perm = np.random.default_rng(seed).permutation(xa.shape[0])
        n_test = int(round(test_fraction * xa.shape[0]))
        if n_test < 2 or xa.shape[0] - n_test < 2:
            raise ValueError(f"too few rows ({xa.shape[0]}) to hold out {test_fraction:.0%}; "
                             "pass more data or x_test.")
        x_tr, x_te = xa[perm[n_test:]], xa[perm[:n_test]]
        notes.append(f"held out {n_test} of {xa.shape[0]} rows at random (seed {seed})")
    else:
        x_tr, x_te = xa, check_data(x_test, xa.shape[1], dtype=torch.float64).numpy()
    if standardise and family == "bernoulli":
        raise ValueError("standardise=True makes binary data continuous; the bernoulli family "
                         "needs 0/1 data: pass standardise=False.")
    if standardise:
        x_tr, x_te, more = _standardise(x_tr, x_te)
        notes.extend(more)
    n_tr, d = x_tr.shape
    if k_max > fam.max_k(d):
        raise ValueError(f"k_max={k_max} is too large for D={d}: {family} allows K <= "
                         f"{fam.max_k(d)}; pass --k-max {fam.max_k(d)} or less.")
    xtr_t, xte_t = torch.from_numpy(x_tr), torch.from_numpy(x_te)
    ks = list(range(1, k_max + 1))
    models = [fam.fit(xtr_t, k, seed=seed) for k in ks]
    with torch.no_grad():
        exact = [float(m.log_marginal(xte_t).double().mean()) for m in models]
        train_ll = [float(m.log_marginal(xtr_t).double().sum()) for m in models]
    bic = [-2.0 * ll + fam.num_params(d, k) * math.log(n_tr)
           for ll, k in zip(train_ll, ks, strict=True)]

    # MPT with common random numbers across K, P doubled until the choice is clear
    samples = _mpt_samples(models, xte_t, p0, seed, share_masks)
    rnd = 1
    while True:
        mean = samples.mean(1)
        best = int(mean.argmax())
        diff = samples[best][None] - samples  # (K, P) paired differences
        p = samples.shape[1]
        se = diff.std(1, correction=1) / math.sqrt(p) if p > 1 else torch.full_like(mean, math.inf)
        zs = [float(diff[i].mean() / se[i]) if se[i] > 0 else math.inf
              for i in range(len(ks)) if i != best]
        min_z = min(zs) if zs else math.inf
        if verbose:
            print(f"  P={p}: MPT picks K={ks[best]}, smallest lead {min_z:.1f} paired SE")
        if min_z > z or 2 * p > p_max:
            break
        more = _mpt_samples(models, xte_t, p, seed + 7919 * rnd, share_masks)
        samples = torch.cat([samples, more], 1)
        rnd += 1
    p = samples.shape[1]
    mpt = samples.mean(1)
    mpt_se = (samples.std(1, correction=1) / math.sqrt(p) if p > 1
              else torch.full_like(mpt, float("nan")))
    choices = {"MPT": ks[int(mpt.argmax())], "Exact": ks[int(np.argmax(exact))],
               "BIC": ks[int(np.argmin(bic))]}
    if family == "ppca":
        from sklearn.decomposition import PCA

        choices["Minka"] = int(PCA(n_components="mle").fit(x_tr).n_components_)
        if not 1 <= choices["Minka"] <= k_max:
            notes.append(f"Minka's choice K={choices['Minka']} lies outside 1..{k_max}")
    if not min_z > z:
        notes.append(f"MPT choice not resolved at P={p}: the best K leads the runner-up by "
                     f"only {min_z:.1f} paired SE (raise max_masks)")
    return SelectionResult(
        ks=ks, mpt=mpt.tolist(), mpt_stderr=mpt_se.tolist(), exact=exact, bic=bic,
        choices=choices, resolved=bool(min_z > z), min_paired_z=float(min_z), num_masks=p,
        family=family, n_train=n_tr, n_test=x_te.shape[0], num_tokens=d, seed=seed,
        notes=notes,
    )


# ---------------------------------------------------------------------- files and CLI
def load_matrix(path: str) -> np.ndarray:
    """Read an ``(N, D)`` matrix from a ``.npy`` or ``.csv`` file (a header row is skipped)."""
    from pathlib import Path

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


def run_selection(data: str, k_max: int, out: str, *, true_k: int | None = None,
                  standardise: bool | None = None, overwrite: bool = False, num_masks: int = 10,
                  max_masks: int = 640, seed: int = 0, family: str = "ppca"
                  ) -> SelectionResult:
    """``mptlml select``: load data, select K, write results.json, scores.csv and a plot.

    Built-in real data sets are standardised for PPCA (``standardise=None``
    means: yes for digits, wine and breast_cancer, no for synthetic data,
    files and the bernoulli family).
    """
    from .experiments.common import RunDir, print_table

    if isinstance(k_max, int) and not isinstance(k_max, bool) and k_max < 1:
        raise ValueError(f"--k-max must be >= 1 (the largest latent dimension to try), got "
                         f"{k_max}.")
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; choose one of {sorted(FAMILIES)}.")
    if data in BUILTIN_DATASETS:
        x, desc = load_dataset(data, true_k=true_k, seed=seed, family=family)
        real = data != "synthetic" and family == "ppca"
    else:
        x, desc, real = load_matrix(data), f"file {data}", False
        desc += f" (N={x.shape[0]}, D={x.shape[1]})"
    std = real if standardise is None else standardise
    # validate everything before the run directory is created
    if k_max >= x.shape[1]:
        raise ValueError(f"--k-max {k_max} must be smaller than D={x.shape[1]}.")
    if k_max > FAMILIES[family].max_k(x.shape[1]):
        raise ValueError(f"--k-max {k_max}: the {family} family allows K <= "
                         f"{FAMILIES[family].max_k(x.shape[1])}.")
    if family == "bernoulli":
        if std:
            raise ValueError("--standardise yes makes binary data continuous; the bernoulli "
                             "family needs 0/1 data: pass --standardise no.")
        if not np.isin(x, (0.0, 1.0)).all():
            raise ValueError(f"--data {data}: the bernoulli family needs a 0/1 matrix; binarise "
                             "it first (e.g. x > 0.5) or use --family ppca.")
    run = RunDir(out, "select", overwrite=overwrite)
    print(f"model selection on {desc}; {'standardised' if std else 'not standardised'}")
    res = select_latent_dim(x, k_max, standardise=std, num_masks=num_masks,
                            max_masks=max_masks, seed=seed, family=family)
    for note in res.notes:
        print(f"  note: {note}")
    rows = res.rows()
    print_table(rows, ["K", "mpt_lml", "mpt_stderr", "exact_lml", "bic"],
                title=f"held-out log p(x) per datum (MPT, P={res.num_masks} masks per size; "
                      "exact) and training BIC")
    for crit, k in res.choices.items():
        print(f"{crit}: K = {k}")
    run.write_csv("scores.csv", rows)
    _plot(res, desc, run)
    run.write_results({"data": data, "family": family, "k_max": k_max, "true_k": true_k,
                       "standardise": std,
                       "num_masks": num_masks, "max_masks": max_masks, "seed": seed},
                      {"data_description": desc, "standardised": std, **res.to_dict()},
                      seed=seed)
    print(f"results written to {run.path}/ (results.json, scores.csv, scores.png/.pdf)")
    return res


def _plot(res: SelectionResult, desc: str, run: Any, stem: str = "scores") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    ks = np.asarray(res.ks)
    mpt, se = np.asarray(res.mpt), np.asarray(res.mpt_stderr)
    ax.plot(ks, res.exact, "k--o", ms=3, label=f"exact (K={res.choices['Exact']})")
    ax.errorbar(ks, mpt, yerr=2 * np.nan_to_num(se), color="C0", marker="s", ms=3, capsize=2,
                label=f"MPT, P={res.num_masks} (K={res.choices['MPT']})")
    ax.set_xlabel("latent dimension K")
    ax.set_ylabel("held-out log p(x) per datum")
    ax.legend(fontsize=8)
    ax2.plot(ks, res.bic, "C2-o", ms=3, label=f"BIC, training (K={res.choices['BIC']})")
    if "Minka" in res.choices:
        ax2.axvline(res.choices["Minka"], color="C3", ls=":",
                    label=f"Minka PCA mle (K={res.choices['Minka']})")
    ax2.set_xlabel("latent dimension K")
    ax2.set_ylabel("BIC (smaller is better)")
    ax2.legend(fontsize=8)
    fig.suptitle(desc, fontsize=9)
    fig.tight_layout()
    run.save_figure(fig, stem)
