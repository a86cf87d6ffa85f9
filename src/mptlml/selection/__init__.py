"""Model selection by masked pre-training: choose a model's latent dimension K.

Each K = 1..k_max is fitted on a training split and the held-out data are
scored by the cumulative MPT estimate of the log-marginal likelihood
(Proposition 1 of the paper), beside the exact held-out LML, BIC and, for
PPCA, Minka's ``PCA(n_components="mle")``; masks are added until the choice
is clear. See :func:`select_latent_dim`.

- :mod:`.families`: what a model family provides (``fit``, ``num_params``,
  ``max_k``); PPCA (closed form) and the Bernoulli latent linear model (K <= 3);
- :mod:`.data`: built-in data sets by name, ``.npy``/``.csv`` matrices,
  standardisation with training statistics;
- :mod:`.latent_dim`: :class:`SelectionResult` and :func:`select_latent_dim`.

The ``mptlml select`` job (run directory, table, plot) is
:mod:`mptlml.jobs.select`; this package does not import the jobs.

References
----------
Moreno-Munoz, Recasens, Hauberg (NeurIPS 2023), Proposition 1, Sec. 3.
Tipping & Bishop (1999); Minka (2000), "Automatic choice of dimensionality for PCA".
"""

from __future__ import annotations

from .data import BUILTIN_DATASETS, load_dataset, load_matrix, standardise_split
from .families import FAMILIES, BernoulliFamily, ModelFamily, PPCAFamily
from .latent_dim import SelectionResult, select_latent_dim

__all__ = [
    "BUILTIN_DATASETS",
    "FAMILIES",
    "BernoulliFamily",
    "ModelFamily",
    "PPCAFamily",
    "SelectionResult",
    "load_dataset",
    "load_matrix",
    "select_latent_dim",
    "standardise_split",
]
