"""Shared pieces of the PPCA parts on synthetic data: settings, data, exact fixed-rate scores.

:class:`SyntheticPPCAConfig` holds the settings every such part has (N,
sigma2, the noise generator, seeds, dtype) and draws the data;
:class:`PPCATrainingConfig` adds those of training a PPCA by the MPT loss (D, K,
learning rate, masks per step). Each part's ``Config`` subclasses one of
them, so ``--set`` reaches the shared fields too. Every field is declared with
:func:`~mptlml.runs.config.setting` (help line, bounds, choices): the
convention is documented in :mod:`mptlml.runs.config`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..masks import all_masks
from ..models import PPCA
from ..runs.config import RunConfig, setting

__all__ = ["PPCATrainingConfig", "SyntheticPPCAConfig", "exact_fixed_rate", "mean_lml",
           "synthetic_ppca"]

_DTYPES = {"float64": torch.float64, "float32": torch.float32}

#: above this many masks of one size, the fixed-rate score is a seeded Monte Carlo average.
MAX_EXACT_MASKS = 2000


def dtype_of(name: str) -> torch.dtype:
    """``"float64"`` / ``"float32"`` to a torch dtype, with a clear error otherwise."""
    if name not in _DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, got {name!r}.")
    return _DTYPES[name]


@dataclass
class SyntheticPPCAConfig(RunConfig):
    """Settings shared by the PPCA experiments on data drawn from a PPCA (Figs. 1, 2, 4, 5).

    Attributes
    ----------
    num_data : int
        N observations drawn from the generating PPCA.
    sigma2 : float
        Noise variance of the generating model (1 / beta).
    noise : str
        ``"independent"`` (faithful: eps ~ N(0, sigma2 I)) or ``"shared"`` (the
        authors' generator: one noise value per observation, sd sigma2).
    data_seed : int
        Seed of the generating W (N(0, 1) entries) and of the data.
    seed : int
        Base seed of the masks (and of initialisations, where there are any).
    dtype : str
        ``"float64"`` or ``"float32"``.
    """

    num_data: int = setting(1000, "N, observations drawn from the generating PPCA", min=1)
    sigma2: float = setting(0.2, "noise variance of the generating PPCA (1 / beta)", gt=0)
    noise: str = setting("independent", "noise generator: independent (faithful, N(0, sigma2 I)) "
                         "or shared (the authors' code: one value per observation)",
                         choices=("independent", "shared"))
    data_seed: int = setting(0, "seed of the generating W and of the data", min=0)
    seed: int = setting(0, "base seed of the masks (and initialisations)", min=0)
    dtype: str = setting("float64", "floating-point precision", choices=tuple(_DTYPES))

    def synthetic(self, num_tokens: int, latent_dim: int, *,
                  seed: int | None = None) -> tuple[PPCA, torch.Tensor]:
        """The generating PPCA and its N draws (``seed`` defaults to ``data_seed``)."""
        return synthetic_ppca(num_tokens, latent_dim, self.sigma2, self.num_data,
                              seed=self.data_seed if seed is None else seed, noise=self.noise,
                              dtype=dtype_of(self.dtype))


@dataclass
class PPCATrainingConfig(SyntheticPPCAConfig):
    """Settings shared by the experiments that train a PPCA by the MPT loss (Figs. 2, 5).

    Attributes
    ----------
    num_tokens, latent_dim : int
        D and K, of the generating and of the trained model.
    lr : float
        Adam learning rate.
    num_masks : int
        P of the training objective, masks per size (or per datum) per epoch.
    seed : int
        Seed of the initialisations and of the masks (default 1).
    """

    num_tokens: int = setting(10, "D, tokens of the generating and of the trained PPCA", min=2)
    latent_dim: int = setting(2, "K, latent dimension (< num_tokens)", min=1)
    seed: int = setting(1, "seed of the initialisations and of the masks", min=0)
    lr: float = setting(1e-2, "Adam learning rate", gt=0)
    num_masks: int = setting(1, "P of the training objective, masks per size per epoch", min=1)

    def validate(self) -> None:
        """Raise ``ValueError`` on inconsistent settings (before anything is written)."""
        super().validate()
        if self.latent_dim >= self.num_tokens:
            raise ValueError(f"latent_dim={self.latent_dim} must be smaller than "
                             f"num_tokens={self.num_tokens}.")

    def data(self) -> tuple[PPCA, torch.Tensor]:
        """The generating PPCA of D tokens and K latent dimensions, and its N draws."""
        return self.synthetic(self.num_tokens, self.latent_dim)

    def init(self, seed: int) -> PPCA:
        """A random initialisation of the trained PPCA (W0 with N(0, 1) entries, sigma2 fixed)."""
        return PPCA.random(self.num_tokens, self.latent_dim, self.sigma2, seed=seed,
                           dtype=dtype_of(self.dtype))


def synthetic_ppca(num_tokens: int, latent_dim: int, sigma2: float, num_data: int, *,
                   seed: int, noise: str = "independent",
                   dtype: torch.dtype = torch.float64) -> tuple[PPCA, torch.Tensor]:
    """The generating PPCA (W with N(0, 1) entries, mu = 0) and N draws from it."""
    true = PPCA.random(num_tokens, latent_dim, sigma2, seed=seed, dtype=dtype)
    x = true.sample(num_data, generator=seed + 1, noise=noise)
    return true, x


def mean_lml(model: PPCA, x: torch.Tensor) -> float:
    """The exact mean log-marginal likelihood (1/N) sum_n log p(x_n), without gradients."""
    with torch.no_grad():
        return float(model.log_marginal(x).double().mean())


def exact_fixed_rate(model: PPCA, x: torch.Tensor, mask_size: int,
                     masks: torch.Tensor | None = None) -> float:
    """Mean over data of D * S(x; M), the expectation of the fixed-rate MPT objective.

    Uses every one of the C(D, M) masks of size M when there are at most
    ``MAX_EXACT_MASKS`` of them (then it is exact), else ``MAX_EXACT_MASKS``
    uniform masks drawn with a fixed seed (the same at every call, so that
    changes over training come from the parameters only).
    """
    d = model.num_tokens
    if masks is None:
        masks = fixed_rate_masks(d, mask_size)
    with torch.no_grad():
        lp = model.masked_log_prob(x, masks.to(x.device), None).double()  # (B, N)
    return float(d * lp.mean() / mask_size)


def fixed_rate_masks(num_tokens: int, mask_size: int) -> torch.Tensor:
    """All masks of size M, or ``MAX_EXACT_MASKS`` seeded uniform ones when there are more."""
    from ..masks import sample_masks

    if math.comb(num_tokens, mask_size) <= MAX_EXACT_MASKS:
        return all_masks(num_tokens, mask_size)
    return sample_masks(num_tokens, mask_size, num_masks=MAX_EXACT_MASKS, generator=12345)
