"""A job and how every job runs: settings -> inputs -> run directory -> results.json.

A :class:`Job` is what runs into a run directory: its settings (a ``Config``
dataclass, :mod:`.config`), an optional ``load(cfg)`` that reads and checks the
inputs (a model, texts, a matrix) before the run directory exists, and
``run(cfg, run_dir[, loaded])``, which computes and writes its files into the
run directory (a transaction, :class:`~.rundir.RunDir`). :func:`run_job` runs
one: it checks the settings, loads, runs, writes results.json (the settings,
the seed, the environment and the numbers) and swaps the run in. The user
jobs (:mod:`mptlml.jobs`: ``demo``, ``curve``, ``select``) are such jobs, and
so is every part of the paper (:class:`mptlml.reproduce.parts.Part`, a job
with a report section).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._optional import require
from .._scoring.distributed import barrier, distributed_context
from .config import validate_config
from .output import can_draw, print_table
from .rundir import RunDir

__all__ = ["Job", "check_needs", "prepare_run_dir", "run_job"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Job:
    """What runs into a run directory.

    Parameters
    ----------
    config : type
        The settings: a ``Config`` dataclass (:class:`~.config.RunConfig`);
        every field is a ``--set`` key of a part, or a flag of a job's command.
    run : callable ``(cfg, run_dir[, loaded]) -> results``
        Computes and writes the job's files into ``run_dir``; returns the
        numbers for results.json.
    load : callable ``cfg -> loaded``, optional
        Reads and checks the inputs before the run directory exists, so a bad
        input leaves nothing behind; its value is ``run``'s third argument.
    summary : callable ``results -> rows``, optional
        The table printed once the run is in place (stdout, even under ``-q``).
    help : str
        One line saying what the job does (the command line's list of commands).
    description : str
        More, for ``mptlml COMMAND --help`` (default: ``help``).
    resumable : bool
        An interrupted run continues from its checkpoint chunks (``--resume``).
    needs : tuple of str
        The optional packages (import names, keys of :data:`mptlml._optional.EXTRAS`)
        without which the job cannot run: :func:`run_job` refuses it up front,
        naming the extra, before any work and with nothing written.
    figures : bool
        The job draws figures, written when matplotlib (the ``report`` extra) is
        installed; without it the job still writes its numbers, and
        :func:`run_job` says up front which figures are left out.
    """

    config: type
    run: Callable[..., dict[str, Any]]
    load: Callable[[Any], Any] | None = None
    summary: Callable[[dict[str, Any]], list[dict[str, Any]]] | None = None
    help: str = ""
    description: str = ""
    resumable: bool = False
    needs: tuple[str, ...] = ()
    figures: bool = False


def check_needs(name: str, job: Job) -> None:
    """Refuse ``job`` if a package it needs is missing (naming the extra); warn of lost figures.

    Raises ``ModuleNotFoundError`` (:func:`mptlml._optional.require`) for the
    first package of ``job.needs`` that is not installed.
    """
    for module in job.needs:
        require(module, f"mptlml {name}")
    if job.figures and not can_draw():
        _log.warning(f"{name}: matplotlib is not installed, so no figures are drawn (the numbers "
                     "and CSVs are written as usual); for the figures: "
                     'pip install "mptlml[report]".')


def prepare_run_dir(out: str | os.PathLike, name: str, *, overwrite: bool,
                    resume: bool) -> RunDir:
    """The run directory on every rank: rank 0 stages it (and locks it), the others join.

    The staging directory starts empty unless ``resume`` (then from the
    finished checkpoint chunks), so ``overwrite`` never meets a stale checkpoint.
    """
    ctx = distributed_context()
    if ctx.main:
        rd = RunDir(out, name, overwrite=overwrite, resume=resume)
    barrier(ctx)
    if not ctx.main:
        rd = RunDir(out, name, worker=True)
    return rd


def run_job(name: str, job: Job, cfg: Any, out: str | os.PathLike, *, overwrite: bool = False,
            resume: bool = False, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run one job into ``out``; return the content of its results.json (``{}`` on a worker rank).

    Parameters
    ----------
    name : str
        The job's name, recorded in results.json (``experiment``).
    job : Job
        What runs (its ``run``, ``load`` and ``summary``).
    cfg : a Config dataclass
        The settings; checked (:func:`~.config.validate_config`) before anything is written.
    overwrite, resume : bool
        See :class:`~.rundir.RunDir`.
    extra : dict, optional
        Entries added to the results (e.g. ``quick``).
    """
    check_needs(name, job)  # an extra that is missing: refused before any work
    validate_config(cfg)  # before the run directory exists: a bad setting writes nothing
    loaded = job.load(cfg) if job.load is not None else None
    with prepare_run_dir(out, name, overwrite=overwrite, resume=resume) as run_dir:
        results = job.run(cfg, run_dir) if job.load is None else job.run(cfg, run_dir, loaded)
        if not distributed_context().main:  # a worker rank: rank 0 writes the results
            return {}
        for key, value in (extra or {}).items():
            results.setdefault(key, value)
        path = run_dir.write_results(cfg, results, seed=getattr(cfg, "seed", None))
    if job.summary is not None:
        print_table(job.summary(results), title=f"{name}: summary")
    _log.info(f"results written to {path.parent}/")
    return json.loads(path.read_text())
