"""Beyond the paper: choosing a latent dimension by the held-out MPT estimate.

For each case (a data set, a model family and the largest K tried) every
K = 1..k_max is fitted on a training split and scored on held-out data by the
cumulative MPT estimate of the held-out LML (Proposition 1),

    L_hat(x) = sum_{M=1..D} (1/P) sum_p (1/M) sum_{j in mask_p} log p(x_j | x_R),

beside the exact held-out LML, BIC and (PPCA) Minka's PCA(n_components="mle");
see :func:`mptlml.selection.select_latent_dim`. The claim checked: MPT picks
the K that the exact held-out LML picks, and on synthetic data the true K.

The ``mptlml select`` job (:func:`run_selection`: one data set or matrix file
into a run directory) lives here too, beside the reproduction that runs many.

Reference: Moreno-Munoz, Recasens, Hauberg (NeurIPS 2023), Proposition 1;
the use for model selection is ours.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..selection import (
    BUILTIN_DATASETS,
    FAMILIES,
    SelectionResult,
    load_dataset,
    load_matrix,
    select_latent_dim,
)
from ._claims import claim
from .common import RunDir, print_table, pyplot
from .config import ExperimentConfig, setting

__all__ = ["PAPER", "TITLE", "Config", "SelectConfig", "SelectInputs", "captions",
           "choice_warnings", "claims", "load_selection", "plot_scores", "run", "run_selection",
           "summary"]

_log = logging.getLogger(__name__)


@dataclass
class Config(ExperimentConfig):
    """Cases of the model-selection experiment.

    Attributes
    ----------
    cases : tuple of str
        One ``"FAMILY:DATA:K_MAX"`` or ``"FAMILY:synthetic:K_MAX:TRUE_K"`` per case;
        FAMILY is ``ppca`` or ``bernoulli``, DATA a built-in data set.
    num_masks, max_masks : int
        Initial and largest P (masks per size) of the adaptive MPT estimate.
    seed : int
        Seed of the splits, the synthetic data and the masks.
    """

    cases: tuple[str, ...] = setting((
        "ppca:synthetic:8:1", "ppca:synthetic:8:3", "ppca:synthetic:8:5",
        "ppca:wine:12", "ppca:breast_cancer:20", "ppca:digits:20",
        "bernoulli:synthetic:3:1", "bernoulli:synthetic:3:2", "bernoulli:synthetic:3:3",
        "bernoulli:digits:3",
    ), "one FAMILY:DATA:K_MAX[:TRUE_K] per case (e.g. ppca:synthetic:8:3)")
    num_masks: int = setting(10, "initial P, masks per size and held-out datum", min=1)
    max_masks: int = setting(640, "largest P while resolving near-ties", min=1)
    seed: int = setting(0, "seed of the splits, the synthetic data and the masks", min=0)

    @classmethod
    def quick(cls) -> Config:
        """Three cases that run in well under a minute on 2 cores."""
        return cls(cases=("ppca:synthetic:6:3", "ppca:wine:12", "bernoulli:synthetic:3:2"),
                   max_masks=160)

    def parsed(self) -> list[tuple[str, str, int, int | None]]:
        """``cases`` as (family, data, k_max, true_k), checked."""
        out = []
        for c in self.cases:
            parts = str(c).split(":")
            try:
                fam, data, k_max = parts[0], parts[1], int(parts[2])
                true_k = int(parts[3]) if len(parts) > 3 else None
            except (IndexError, ValueError):
                raise ValueError(f"a case is 'FAMILY:DATA:K_MAX[:TRUE_K]' (e.g. "
                                 f"'ppca:synthetic:8:3'), got {c!r}.") from None
            if fam not in FAMILIES:
                raise ValueError(f"case {c!r}: unknown family {fam!r}; use {sorted(FAMILIES)}.")
            if data not in BUILTIN_DATASETS:
                raise ValueError(f"case {c!r}: unknown data set {data!r}; use one of "
                                 f"{', '.join(BUILTIN_DATASETS)}.")
            if (data == "synthetic") != (true_k is not None):
                raise ValueError(f"case {c!r}: synthetic data need TRUE_K, others must not "
                                 "have it.")
            if k_max < 1:
                raise ValueError(f"case {c!r}: K_MAX must be >= 1.")
            out.append((fam, data, k_max, true_k))
        return out

    def validate(self) -> None:
        """Check every case before anything is written."""
        self.parsed()


def run(cfg: Config, run_dir: RunDir) -> dict[str, Any]:
    """Select K in every case; write one scores CSV and one plot per case."""
    cases = []
    for fam, data, k_max, true_k in cfg.parsed():
        x, desc = load_dataset(data, true_k=true_k, seed=cfg.seed, family=fam)
        std = fam == "ppca" and data != "synthetic"
        name = f"{fam}-{data}" + (f"-k{true_k}" if true_k is not None else "")
        _log.info("[select] %s: %s", name, desc)
        res = select_latent_dim(x, k_max, standardise=std, family=fam, num_masks=cfg.num_masks,
                                max_masks=cfg.max_masks, seed=cfg.seed)
        warned = choice_warnings(res, k_max)
        for w in warned:
            _log.warning("[select] %s: %s", name, w)
        run_dir.write_csv(f"scores_{name}.csv", res.rows())
        plot_scores(res, desc, run_dir, stem=f"scores_{name}")
        cases.append({"case": name, "family": fam, "data": data, "description": desc,
                      "true_k": true_k, "k_max": k_max, **res.to_dict(), "warnings": warned})
    return {"cases": cases}


def summary(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per case: each criterion's choice."""
    return [{"case": c["case"], "true K": c["true_k"] if c["true_k"] is not None else "-",
             **{k: v for k, v in c["choices"].items()}, "P": c["num_masks"]}
            for c in results["cases"]]


#: the report's section: the figure or table, and the paper's statement that ``claims`` checks.
TITLE = "Beyond the paper: model selection by the MPT estimate"
PAPER = (
    "Not in the paper; the held-out LML estimated by MPT should choose the same latent "
    "dimension as the exact held-out LML."
)


def claims(results: dict[str, Any]) -> list[dict[str, Any]]:
    """MPT chooses the exact held-out LML's K; on synthetic data, the true K."""
    out = []
    for c in results["cases"]:
        ch = c["choices"]
        out.append(claim(f"{c['case']}: MPT picks the exact held-out LML's K",
                         "(not in the paper) the MPT estimate is the LML, so it should "
                         "select as the LML does",
                         f"MPT K={ch['MPT']}, exact K={ch['Exact']} (P={c['num_masks']}, "
                         f"{'resolved' if c['resolved'] else 'not resolved'})",
                         ch["MPT"] == ch["Exact"]))
        if c["true_k"] is not None:
            out.append(claim(f"{c['case']}: MPT recovers the true K", f"true K = {c['true_k']}",
                             f"MPT K={ch['MPT']}", ch["MPT"] == c["true_k"]))
    return out


@dataclass
class SelectConfig(ExperimentConfig):
    """``mptlml select``: one data set or matrix file (every flag is a setting)."""

    data: str = setting("", "a .npy/.csv/.tsv matrix (N, D), or digits, wine, breast_cancer, "
                        "synthetic")
    k_max: int = setting(1, "largest K to try (>= 1, < D)", min=1)
    family: str = setting("ppca", "model family: ppca (continuous data) or bernoulli (0/1 data, "
                          "K <= 3)", choices=tuple(FAMILIES))
    true_k: int | None = setting(None, "latent dimension of --data synthetic (only there)", min=1)
    standardise: bool | None = setting(None, "z-score the columns (default: yes for the "
                                       "built-in real data sets with ppca, else no)")
    num_masks: int = setting(10, "initial P, masks per size and held-out datum", min=1)
    max_masks: int = setting(640, "largest P while resolving near-ties", min=1)
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
                            max_masks=cfg.max_masks, seed=cfg.seed, family=cfg.family)
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
    plot_scores(res, desc, run)
    _log.info("files: results.json, scores.csv, scores.png/.pdf")
    return {"data_description": desc, "standardised": std, **res.to_dict(), "warnings": warned}


def plot_scores(res: SelectionResult, desc: str, run: RunDir, stem: str = "scores") -> None:
    """Held-out LML per K (MPT with 2 SE bars, exact) beside training BIC (and Minka's K)."""
    fig, (ax, ax2) = pyplot().subplots(1, 2, figsize=(10, 3.8))
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
    for a in (ax, ax2):  # K is an integer: one tick per K tried, never 1.25
        a.set_xticks(ks)
    fig.suptitle(desc, fontsize=9)
    fig.tight_layout()
    run.save_figure(fig, stem)


_FAMILY_NAMES = {"ppca": "PPCA", "bernoulli": "Bernoulli latent linear"}


def captions(config: dict[str, Any], results: dict[str, Any]) -> dict[str, str]:
    """What each figure shows, its setting and the paper's figure it corresponds to."""
    out = {}
    for c in results.get("cases", []):
        out[f"scores_{c['case']}"] = (
            "Beyond the paper: choosing the latent dimension K of a "
            f"{_FAMILY_NAMES[c['family']]} model on {c['description']}. Left: held-out "
            "log p(x) per datum by the MPT estimate (±2 SE) and exactly, for K = 1.."
            f"{c['k_max']}; right: the training BIC"
            + (f"; the true K is {c['true_k']}" if c["true_k"] is not None else "") + ".")
    return out
