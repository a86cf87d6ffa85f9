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

__all__ = ["PAPER", "TITLE", "Config", "captions", "claims", "plot_scores", "run", "run_selection",
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
        run_dir.write_csv(f"scores_{name}.csv", res.rows())
        plot_scores(res, desc, run_dir, stem=f"scores_{name}")
        cases.append({"case": name, "family": fam, "data": data, "description": desc,
                      "true_k": true_k, "k_max": k_max, **res.to_dict()})
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


def run_selection(data: str, k_max: int, out: str, *, true_k: int | None = None,
                  standardise: bool | None = None, overwrite: bool = False, num_masks: int = 10,
                  max_masks: int = 640, seed: int = 0, family: str = "ppca"
                  ) -> SelectionResult:
    """``mptlml select``: load data, select K, write results.json, scores.csv and a plot.

    Built-in real data sets are standardised for PPCA (``standardise=None``
    means: yes for digits, wine and breast_cancer, no for synthetic data,
    files and the bernoulli family).
    """
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
    with RunDir(out, "select", overwrite=overwrite) as run:
        _log.info(f"model selection on {desc}; {'standardised' if std else 'not standardised'}")
        res = select_latent_dim(x, k_max, standardise=std, num_masks=num_masks,
                                max_masks=max_masks, seed=seed, family=family)
        for note in res.notes:
            _log.info("note: %s", note)
        rows = res.rows()
        print_table(rows, ["K", "mpt_lml", "mpt_stderr", "exact_lml", "bic"],
                    title=f"held-out log p(x) per datum (MPT, P={res.num_masks} masks per size; "
                          "exact) and training BIC")
        for crit, k in res.choices.items():
            print(f"{crit}: K = {k}")  # the answer of the command, on stdout beside the table
        run.write_csv("scores.csv", rows)
        plot_scores(res, desc, run)
        run.write_results({"data": data, "family": family, "k_max": k_max, "true_k": true_k,
                           "standardise": std,
                           "num_masks": num_masks, "max_masks": max_masks, "seed": seed},
                          {"data_description": desc, "standardised": std, **res.to_dict()},
                          seed=seed)
    _log.info(f"results written to {run.path}/ (results.json, scores.csv, scores.png/.pdf)")
    return res


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
            f"{_FAMILY_NAMES.get(c.get('family', ''), c.get('family', '?'))} model on "
            f"{c.get('description', c.get('data', '?'))}. Left: held-out log p(x) per "
            "datum by the MPT estimate (±2 SE) and exactly, for K = 1.."
            f"{c.get('k_max', '?')}; right: the training BIC"
            + (f"; the true K is {c['true_k']}" if c.get("true_k") is not None else "") + ".")
    return out
