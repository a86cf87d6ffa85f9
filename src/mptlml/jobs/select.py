"""``mptlml select``: choose the latent dimension K of one data set by the held-out MPT estimate.

Every K = 1..k_max of a model family (PPCA, or the Bernoulli latent linear
model for 0/1 data) is fitted on a training split and scored on held-out data
by the cumulative MPT estimate of the held-out LML (Proposition 1), beside the
exact held-out LML, BIC and (PPCA) Minka's ``PCA(n_components="mle")``; see
:func:`mptlml.selection.select_latent_dim`. Writes ``scores.csv``, the scores
plot and ``results.json`` into a run directory. The part ``mptlml reproduce
select`` (:mod:`mptlml.reproduce.model_selection`) runs many such cases.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..runs.config import RunConfig, setting
from ..runs.job import Job
from ..runs.output import can_draw, print_table, pyplot
from ..runs.rundir import RunDir
from ..selection import (
    BUILTIN_DATASETS,
    FAMILIES,
    SelectionResult,
    load_dataset,
    load_matrix,
    select_latent_dim,
)

__all__ = ["JOB", "SelectConfig", "SelectInputs", "choice_warnings", "load_selection",
           "plot_scores", "run_selection"]

_log = logging.getLogger(__name__)


@dataclass
class SelectConfig(RunConfig):
    """``mptlml select``: one data set or matrix file (every flag is a setting)."""

    data: str = setting("", "a .npy/.csv/.tsv matrix (N, D), or digits, wine, breast_cancer, "
                        "synthetic", required=True)
    k_max: int = setting(1, "largest K to try (>= 1, < D)", min=1, required=True)
    family: str = setting("ppca", "model family: ppca (continuous data) or bernoulli (0/1 data, "
                          "K <= 3)", choices=tuple(FAMILIES))
    true_k: int | None = setting(None, "latent dimension of --data synthetic (only there)", min=1)
    standardise: bool | None = setting(None, "z-score the columns (default: yes for the "
                                       "built-in real data sets with ppca, else no)")
    num_masks: int = setting(10, "initial P, masks per size and held-out datum", min=1)
    max_num_masks: int = setting(640, "largest P while resolving near-ties", min=1)
    seed: int = setting(0, "seed of the split, the synthetic data and the masks", min=0)

    def validate(self) -> None:
        """Data given; --true-k only for synthetic data (a file or a real set has its own K)."""
        super().validate()
        if not self.data:
            raise ValueError("data is empty; give --data (a matrix file or "
                             f"{', '.join(BUILTIN_DATASETS)}).")
        if self.true_k is not None and self.data != "synthetic":
            raise ValueError(f"--true-k applies to --data synthetic only (it sets the latent "
                             f"dimension of the generated data); {self.data} has its own: drop "
                             "--true-k.")


@dataclass
class SelectInputs:
    """The data matrix, its description and whether it is standardised (checked up front)."""

    x: np.ndarray
    description: str
    standardised: bool


def load_selection(cfg: SelectConfig) -> SelectInputs:
    """Load the data and check it against the family and ``k_max`` before anything is written.

    Built-in real data sets are standardised for PPCA (``standardise=None``
    means: yes for digits, wine and breast_cancer, no for synthetic data,
    files and the bernoulli family).
    """
    data, family, k_max = cfg.data, cfg.family, cfg.k_max
    if data in BUILTIN_DATASETS:
        x, desc = load_dataset(data, true_k=cfg.true_k, seed=cfg.seed, family=family)
        real = data != "synthetic" and family == "ppca"
    else:
        x, desc, real = load_matrix(data), f"file {data}", False
        desc += f" (N={x.shape[0]}, D={x.shape[1]})"
    std = real if cfg.standardise is None else cfg.standardise
    if k_max >= x.shape[1]:
        raise ValueError(f"--k-max {k_max} must be smaller than D={x.shape[1]}.")
    if k_max > FAMILIES[family].max_k(x.shape[1]):
        raise ValueError(f"--k-max {k_max}: the {family} family allows K <= "
                         f"{FAMILIES[family].max_k(x.shape[1])}.")
    if family == "bernoulli":
        if std:
            raise ValueError("--standardise makes binary data continuous; the bernoulli family "
                             "needs 0/1 data: pass --no-standardise.")
        if not np.isin(x, (0.0, 1.0)).all():
            raise ValueError(f"--data {data}: the bernoulli family needs a 0/1 matrix; binarise "
                             "it first (e.g. x > 0.5) or use --family ppca.")
    return SelectInputs(x, desc, std)


def choice_warnings(res: SelectionResult, k_max: int) -> list[str]:
    """What a choice does not say by itself: a K at the edge of the search, Minka's outside it.

    A criterion that picks ``k_max``, the largest K searched, may have its
    optimum beyond the range (widen it); Minka's K comes from its own search
    over every K and may lie outside ``1..k_max``.
    """
    out = []
    for crit, k in res.choices.items():
        if crit == "Minka":
            if not 1 <= k <= k_max:
                out.append(f"Minka's K = {k} lies outside the searched range 1..{k_max} (it "
                           "searches every K); compare it with the others only after widening "
                           "--k-max")
        elif k == k_max and k_max > 1:
            out.append(f"{crit} picks K = {k}, the largest K searched: the optimum is at the "
                       "edge of the search range and may lie beyond it; widen it (--k-max)")
    return out


def run_selection(cfg: SelectConfig, run: RunDir, inputs: SelectInputs) -> dict[str, Any]:
    """``mptlml select``: select K, print the table and choices, write scores.csv and a plot."""
    x, desc, std = inputs.x, inputs.description, inputs.standardised
    _log.info(f"model selection on {desc}; {'standardised' if std else 'not standardised'}")
    res = select_latent_dim(x, cfg.k_max, standardise=std, num_masks=cfg.num_masks,
                            max_num_masks=cfg.max_num_masks, seed=cfg.seed, family=cfg.family)
    for note in res.notes:
        _log.info("note: %s", note)
    warned = choice_warnings(res, cfg.k_max)
    for w in warned:
        _log.warning(w)
    rows = res.rows()
    print_table(rows, ["K", "mpt_lml", "mpt_stderr", "exact_lml", "bic"],
                title=f"held-out log p(x) per datum (MPT, P={res.num_masks} masks per size; "
                      "exact) and training BIC")
    for crit, k in res.choices.items():
        edge = (f"  (outside the searched 1..{cfg.k_max})" if not 1 <= k <= cfg.k_max
                else "  (the largest K searched)" if k == cfg.k_max and cfg.k_max > 1 else "")
        print(f"{crit}: K = {k}{edge}")  # the answer of the command, on stdout beside the table
    run.write_csv("scores.csv", rows)
    if can_draw():  # else run_job said up front that the figure is left out
        plot_scores(res, desc, run)
    _log.info("files: results.json, scores.csv" + (", scores.png/.pdf" if can_draw() else ""))
    return {"data_description": desc, "standardised": std, **res.to_dict(), "warnings": warned}


def plot_scores(res: SelectionResult, desc: str, run: RunDir, stem: str = "scores") -> None:
    """Held-out LML per K (MPT with 2 SE bars, exact) beside training BIC (and Minka's K)."""
    fig, (ax, ax2) = pyplot().subplots(1, 2, figsize=(10, 3.8))
    ks = np.asarray(res.ks)
    mpt, se = np.asarray(res.mpt), np.asarray(res.mpt_stderr)
    ax.plot(ks, res.exact_lml, "k--o", ms=3, label=f"exact (K={res.choices['Exact']})")
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
    for a in (ax, ax2):  # K is an integer: one tick per K tried, never 1.25
        a.set_xticks(ks)
    fig.suptitle(desc, fontsize=9)
    fig.tight_layout()
    run.save_figure(fig, stem)


JOB = Job(config=SelectConfig, load=load_selection, run=run_selection, figures=True,
          help="choose a latent dimension K by held-out MPT",
          description="Choose the latent dimension K of PPCA (or of the Bernoulli latent linear "
                      "model, K <= 3) by the held-out log-marginal likelihood estimated with MPT, "
                      "beside the exact held-out LML, BIC and, for PPCA, scikit-learn's "
                      "PCA(n_components='mle') (Minka).")
