"""Beyond the paper: choosing a latent dimension by the held-out MPT estimate.

For each case (a data set, a model family and the largest K tried) every
K = 1..k_max is fitted on a training split and scored on held-out data by the
cumulative MPT estimate of the held-out LML (Proposition 1),

    L_hat(x) = sum_{M=1..D} (1/P) sum_p (1/M) sum_{j in mask_p} log p(x_j | x_R),

beside the exact held-out LML, BIC and (PPCA) Minka's PCA(n_components="mle");
see :func:`mptlml.selection.select_latent_dim`. The claim checked: MPT picks
the K that the exact held-out LML picks, and on synthetic data the true K.

Each case is what the job ``mptlml select`` (:mod:`mptlml.jobs.select`) does
for one data set; its warnings and plot are the job's.

Reference: Moreno-Munoz, Recasens, Hauberg (NeurIPS 2023), Proposition 1;
the use for model selection is ours.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ..jobs.select import choice_warnings, plot_scores
from ..runs.config import RunConfig, setting
from ..runs.rundir import RunDir
from ..selection import BUILTIN_DATASETS, FAMILIES, load_dataset, select_latent_dim
from .claims import claim
from .parts import Part

__all__ = ["PART", "Config", "captions", "claims", "run", "summary"]

_log = logging.getLogger(__name__)


@dataclass
class Config(RunConfig):
    """Cases of the model-selection experiment.

    Attributes
    ----------
    cases : tuple of str
        One ``"FAMILY:DATA:K_MAX"`` or ``"FAMILY:synthetic:K_MAX:TRUE_K"`` per case;
        FAMILY is ``ppca`` or ``bernoulli``, DATA a built-in data set.
    num_masks, max_num_masks : int
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
    max_num_masks: int = setting(640, "largest P while resolving near-ties", min=1)
    seed: int = setting(0, "seed of the splits, the synthetic data and the masks", min=0)

    @classmethod
    def quick(cls) -> Config:
        """Three cases that run in well under a minute on 2 cores."""
        return cls(cases=("ppca:synthetic:6:3", "ppca:wine:12", "bernoulli:synthetic:3:2"),
                   max_num_masks=160)

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
                                max_num_masks=cfg.max_num_masks, seed=cfg.seed)
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


PART = Part(
    title="Beyond the paper: model selection by the MPT estimate",
    paper=(
        "Not in the paper; the held-out LML estimated by MPT should choose the same latent "
        "dimension as the exact held-out LML."
    ),
    config=Config, run=run, summary=summary, claims=claims, captions=captions,
)
