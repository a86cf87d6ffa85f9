"""What a part of the paper is (:class:`Part`), and the registry of parts (:data:`PARTS`).

A part is one figure or table of the paper (or a study beyond it): a job
(:class:`~mptlml.runs.job.Job`: a ``Config``, ``run``, optional ``load`` and
``summary``) with a section of the report: its title, the paper's statement,
the claims its results are checked against, figure captions and extra
tables. Each part is one module of this package that ends with ``PART =
Part(...)``; :data:`PARTS` names the module, so a new part is its module plus
one line here. ``mptlml reproduce NAME``, ``reproduce all``, ``--show-config``
and the report find it there.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..runs.job import Job

__all__ = ["PARTS", "Part", "get_part"]


@dataclass(frozen=True, kw_only=True)
class Part(Job):
    """One figure or table of the paper: a :class:`~mptlml.runs.job.Job` with a report section.

    Parameters
    ----------
    config, run, load, summary
        As for every job (:class:`~mptlml.runs.job.Job`). ``config``'s defaults
        follow the paper; its ``quick()`` classmethod gives small sizes for
        tests and ``--quick``.
    title : str
        The report's heading: the figure or table (``"Figure 4: ..."``).
    paper : str
        The paper's statement that ``claims`` checks, set beside our numbers.
    claims : callable ``results -> list of dict``
        The checks the report shows, each built by
        :func:`mptlml.reproduce.claims.claim` (with a status).
    captions : callable ``(config, results) -> {figure stem: caption}``, optional
        What each figure plots, its setting and the paper's figure it matches.
    tables : callable ``results -> list of dict``, optional
        Extra tables of the report (``title``, ``rows``, ``caption``).
    needs : tuple of str
        As for every job; a part draws the figures of its report section, so
        matplotlib by default, and ``transformers`` (``antiberty``) for a masked LM's part.
    """

    title: str
    paper: str
    claims: Callable[[dict[str, Any]], list[dict[str, Any]]]
    captions: Callable[[dict[str, Any], dict[str, Any]], dict[str, str]] | None = None
    tables: Callable[[dict[str, Any]], list[dict[str, Any]]] | None = None
    needs: tuple[str, ...] = ("matplotlib",)


#: ``mptlml reproduce NAME`` -> the module (in this package) whose ``PART`` it runs, in the
#: paper's reading order (the report's and ``reproduce all``'s order); imported lazily so
#: that the command line starts fast.
PARTS: dict[str, str] = {
    "convergence": "fig1_convergence",
    "training": "fig2_training",
    "latent": "fig3_vae",
    "area": "fig4_area",
    "curve-evolution": "fig5_curve_evolution",
    "bert": "table2_bert",
    "antibody": "antibody",
    "select": "model_selection",
    "mlm-training": "mlm_training",
}


def get_part(name: str) -> Part:
    """The part that ``mptlml reproduce NAME`` runs."""
    if name not in PARTS:
        raise ValueError(f"unknown part {name!r}; choose one of {', '.join(sorted(PARTS))}.")
    part = importlib.import_module(f"{__package__}.{PARTS[name]}").PART
    if not isinstance(part, Part):
        raise TypeError(f"{PARTS[name]}.PART is a {type(part).__name__}, not a Part.")
    return part
