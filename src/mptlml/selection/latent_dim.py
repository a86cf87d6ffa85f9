"""Choosing the latent dimension K by the held-out LML estimated with MPT.

For each K = 1..k_max a model of the family is fitted on a training split and
scored on the held-out split by

- **MPT**: the cumulative MPT estimate of the held-out log-marginal likelihood
  (Proposition 1 of the paper), mean over held-out data::

      L_hat(x) = sum_{M=1..D} (1/P) sum_p (1/M) sum_{j in mask_p} log p(x_j | x_R);

- **Exact**: the exact held-out log p(x) (for the Bernoulli family the quadrature
  LML, which the exhaustive MPT sum reproduces to rounding error), the reference
  that MPT must agree with;
- **BIC** on the training split, ``-2 sum_n log p(x_n) + p_K log N_train``
  (``p_K`` from :meth:`~.families.ModelFamily.num_params`); smallest wins;
- **Minka** (PPCA only): scikit-learn's ``PCA(n_components="mle")`` (Minka, 2000)
  on the training split; it chooses K itself (possibly outside 1..k_max).

The MPT scores of all K use the *same* masks (common random numbers): the
noise largely cancels in the differences that decide the choice. The number
of masks P is doubled (new masks appended) until the best K leads every other
by more than ``z`` paired standard errors, or until ``max_num_masks``; the result
says whether the choice was resolved.

References
----------
Moreno-Munoz, Recasens, Hauberg (NeurIPS 2023), Proposition 1, Sec. 3.
Tipping & Bishop (1999); Minka (2000), "Automatic choice of dimensionality for PCA".
"""

from __future__ import annotations

import logging
import math
import numbers
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from .._optional import require
from .._validation import check_data, check_positive_int
from ..estimators import Cumulative
from ..estimators.stats import mean_stderr
from ..models.base import MaskedModel
from .data import standardise_split
from .families import FAMILIES

__all__ = ["SelectionResult", "select_latent_dim"]

_log = logging.getLogger(__name__)


@dataclass
class SelectionResult:
    """Per-K scores and each criterion's choice of K.

    Attributes
    ----------
    ks : list of int
    mpt, mpt_stderr : list of float
        MPT estimate of the mean held-out log p(x) per datum, and its Monte
        Carlo standard error.
    exact_lml : list of float
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
    exact_lml: list[float]
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

    def to_pandas(self) -> Any:
        """A ``pandas.DataFrame`` with one row per K (the columns of :meth:`rows`)."""
        require("pandas", "SelectionResult.to_pandas()")
        import pandas as pd

        return pd.DataFrame(self.rows())

    def rows(self) -> list[dict[str, Any]]:
        """One row per K (for scores.csv and the printed table)."""
        return [{"K": k, "mpt_lml": m, "mpt_stderr": s, "exact_lml": e, "bic": b}
                for k, m, s, e, b in zip(self.ks, self.mpt, self.mpt_stderr, self.exact_lml,
                                         self.bic, strict=True)]


def _mpt_samples(models: list[MaskedModel], x: torch.Tensor, p: int, seed: int,
                 share_masks: bool) -> torch.Tensor:
    """Per-draw cumulative estimates averaged over data, same masks for every model: (K, P).

    The cumulative estimator's draws (:meth:`mptlml.estimators.Estimator.draws`)
    from one seed: every model scores the same masks (common random numbers).
    """
    est = Cumulative(p, share_masks=share_masks)
    with torch.no_grad():
        return torch.stack([est.draws(model, x, generator=seed).mean(1) for model in models])


def _lead(z: float) -> str:
    """The lead of the best K in paired standard errors, in words."""
    return "unknown (one mask per size: no SE)" if math.isnan(z) else f"{z:.1f} paired SE"


def select_latent_dim(x: Any, k_max: int, *, x_test: Any = None, test_fraction: float = 0.3,
                      standardise: bool = False, family: str = "ppca", num_masks: int = 10,
                      max_num_masks: int = 640, z: float = 4.0, share_masks: bool = True,
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
    max_num_masks : int
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
    p_max = check_positive_int(max_num_masks, "max_num_masks")
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
        x_tr, x_te, more = standardise_split(x_tr, x_te)
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
        if p > 1:
            se = mean_stderr(diff, axis=1)[1]
            zs = [float(diff[i].mean() / se[i]) if se[i] > 0 else math.inf
                  for i in range(len(ks)) if i != best]
            min_z = min(zs) if zs else math.inf
        else:  # one draw: the paired SE is unknown, so is the lead in SE
            min_z = math.nan if len(ks) > 1 else math.inf
        if verbose:
            _log.info("P=%d: MPT picks K=%d, smallest lead %s", p, ks[best], _lead(min_z))
        if min_z > z or 2 * p > p_max:
            break
        more = _mpt_samples(models, xte_t, p, seed + 7919 * rnd, share_masks)
        samples = torch.cat([samples, more], 1)
        rnd += 1
    mpt, mpt_se = mean_stderr(samples, axis=1)
    choices = {"MPT": ks[int(mpt.argmax())], "Exact": ks[int(np.argmax(exact))],
               "BIC": ks[int(np.argmin(bic))]}
    if family == "ppca":
        from sklearn.decomposition import PCA

        choices["Minka"] = int(PCA(n_components="mle").fit(x_tr).n_components_)
        if not 1 <= choices["Minka"] <= k_max:
            notes.append(f"Minka's choice K={choices['Minka']} lies outside 1..{k_max}")
    if not min_z > z:
        if math.isnan(min_z):
            notes.append(f"MPT choice not resolved at P={p}: with one mask per size the paired "
                         "SE of the lead over the runner-up is unknown (raise num_masks or "
                         "max_num_masks to at least 2)")
        else:
            notes.append(f"MPT choice not resolved at P={p}: the best K leads the runner-up "
                         f"by only {min_z:.1f} paired SE (raise max_num_masks)")
    return SelectionResult(
        ks=ks, mpt=mpt.tolist(), mpt_stderr=mpt_se.tolist(), exact_lml=exact, bic=bic,
        choices=choices, resolved=bool(min_z > z), min_paired_z=float(min_z), num_masks=p,
        family=family, n_train=n_tr, n_test=x_te.shape[0], num_tokens=d, seed=seed,
        notes=notes,
    )
