"""Running jobs: one into its run directory, or every reproduction one after another.

Every job is run the same way, by :func:`run_job`: its settings are a Config
dataclass (:mod:`.config`), checked before anything is written; an optional
``load(cfg)`` reads and checks the inputs (a model, texts, a matrix), still
before the run directory exists; ``run(cfg, run_dir[, loaded])`` computes and
writes its files into the run directory (a transaction, :class:`~.common.RunDir`),
and :func:`run_job` writes results.json (the settings, the seed, the
environment and the numbers) and swaps the run in. The reproductions
(:func:`run_experiment`), ``mptlml curve``, ``select`` and ``demo`` are such
jobs.

:func:`run_all` runs every registered experiment into ``out/NAME``, keeps going
past a failed part, and hands the finished directory to a report builder if one
is given (``mptlml reproduce all`` passes :func:`mptlml.report.build_report`;
this module does not import the report, which sits above the experiments).
"""

from __future__ import annotations

import json
import logging
import os
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .._io import atomic_write_text, jsonable
from .._scoring.distributed import barrier, distributed_context
from .common import RunDir, load_results, print_table
from .config import apply_overrides, validate_config
from .registry import EXPERIMENTS, get_experiment
from .rundir import locked

__all__ = ["prepare_run_dir", "run_all", "run_experiment", "run_job"]

_log = logging.getLogger(__name__)


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


def run_job(name: str, cfg: Any, out: str | os.PathLike, *, run: Callable[..., dict[str, Any]],
            load: Callable[[Any], Any] | None = None,
            summary: Callable[[dict[str, Any]], list[dict[str, Any]]] | None = None,
            overwrite: bool = False, resume: bool = False,
            extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run one job into ``out``; return the content of its results.json (``{}`` on a worker rank).

    Parameters
    ----------
    name : str
        The job's name, recorded in results.json (``experiment``).
    cfg : a Config dataclass
        The settings; checked (:func:`~.config.validate_config`) before anything is written.
    run : callable ``(cfg, run_dir[, loaded]) -> results``
        Computes and writes the job's files into ``run_dir``.
    load : callable ``cfg -> loaded``, optional
        Reads and checks the inputs before the run directory exists, so a bad
        input leaves nothing behind; its value is ``run``'s third argument.
    summary : callable ``results -> rows``, optional
        A table printed once the run is in place.
    overwrite, resume : bool
        See :class:`~.common.RunDir`.
    extra : dict, optional
        Entries added to the results (e.g. ``quick``).
    """
    validate_config(cfg)  # before the run directory exists: a bad setting writes nothing
    loaded = load(cfg) if load is not None else None
    with prepare_run_dir(out, name, overwrite=overwrite, resume=resume) as run_dir:
        results = run(cfg, run_dir) if load is None else run(cfg, run_dir, loaded)
        if not distributed_context().main:  # a worker rank: rank 0 writes the results
            return {}
        for key, value in (extra or {}).items():
            results.setdefault(key, value)
        path = run_dir.write_results(cfg, results, seed=getattr(cfg, "seed", None))
    if summary is not None:
        print_table(summary(results), title=f"{name}: summary")
    _log.info(f"results written to {path.parent}/")
    return json.loads(path.read_text())


def run_experiment(name: str, out: str | Path, *, quick: bool = False, overwrite: bool = False,
                   overrides: dict[str, Any] | None = None, resume: bool = False) -> dict[str, Any]:
    """Run one reproduction into ``out`` (:func:`run_job`) and return its results.json."""
    mod = get_experiment(name)
    cfg = experiment_config(name, quick=quick, overrides=overrides)
    return run_job(name, cfg, out, run=mod.run, load=getattr(mod, "load", None),
                   summary=getattr(mod, "summary", None), overwrite=overwrite, resume=resume,
                   extra={"quick": quick})


def experiment_config(name: str, *, quick: bool = False,
                      overrides: dict[str, Any] | None = None) -> Any:
    """The Config of reproduction ``name``: the paper's (or ``quick()``) with ``overrides``."""
    cls = get_experiment(name).Config
    return apply_overrides(cls.quick() if quick else cls(), overrides, name=name)


def run_all(out: str | Path, *, quick: bool = False, overwrite: bool = False,
            resume: bool = False, only: list[str] | None = None,
            overrides: dict[str, dict[str, Any]] | None = None,
            build_report: Callable[[Sequence[str | Path], str | Path], Any] | None = None,
            ) -> dict[str, Any]:
    """Run every experiment into ``out/NAME``; return ``{name: status}``.

    Each part is its own run directory (a transaction: see
    :class:`~.common.RunDir`), and the whole of ``out`` is locked while this
    runs. A part that fails keeps its previous directory untouched; its
    traceback goes to ``out/NAME.error.txt``, which marks that directory as
    stale for :func:`mptlml.report.collect_runs` (until a later run of the part
    succeeds and deletes it), and the other parts go on. ``out/status.json``
    holds every part's latest status, updated after each part. With
    ``resume``, parts that finished with the same settings (and did not fail
    since) are kept; a part that finished with other settings (another
    ``--set``, ``--seed`` or mode) is run again from scratch, and a warning
    names the settings that changed.

    Parameters
    ----------
    build_report : callable ``(paths, out) -> Report``, optional
        Called as ``build_report([out], out)`` once every part ran, e.g.
        :func:`mptlml.report.build_report` (what ``mptlml reproduce all`` passes),
        to write ``report.html``/``report.md`` beside the parts.
    """
    out = Path(out)
    with locked(out):
        if out.is_dir() and any(out.iterdir()) and not (overwrite or resume):
            raise ValueError(
                f"output directory {out} exists and is not empty; pass --overwrite to replace "
                "it, --resume to keep finished parts, or choose another --out."
            )
        out.mkdir(parents=True, exist_ok=True)
        return _run_parts(out, only or list(EXPERIMENTS), quick=quick, resume=resume,
                          overrides=overrides or {}, build_report=build_report)


def _run_parts(out: Path, names: list[str], *, quick: bool, resume: bool,
               overrides: dict[str, dict[str, Any]],
               build_report: Callable[[Sequence[str | Path], str | Path], Any] | None,
               ) -> dict[str, Any]:
    status: dict[str, Any] = {}
    status_path = out / "status.json"
    try:
        recorded = json.loads(status_path.read_text())
        recorded = recorded if isinstance(recorded, dict) else {}
    except (OSError, ValueError):
        recorded = {}

    def record(name: str, value: str) -> None:
        status[name] = recorded[name] = value
        atomic_write_text(status_path, json.dumps(recorded, indent=2) + "\n")

    for name in names:
        part, error_file = out / name, out / f"{name}.error.txt"
        part_resume = resume
        if resume and not error_file.exists():
            try:
                earlier = load_results(part)
            except (FileNotFoundError, ValueError):
                earlier = None
            if earlier is not None:
                changed = _changed_settings(name, earlier, quick=quick,
                                            overrides=overrides.get(name))
                if not changed:
                    status[name] = "kept"
                    _log.info(f"[{name}] finished earlier with the same settings: kept")
                    continue
                part_resume = False  # its checkpoint chunks belong to the other settings
                _log.warning(f"[{name}] finished earlier with other settings ({changed}); "
                             "running it again with this run's settings")
        _log.info(f"[{name}] running{' (quick)' if quick else ''} ...")
        t0 = time.perf_counter()
        try:
            run_experiment(name, part, quick=quick, overwrite=True,
                           overrides=overrides.get(name), resume=part_resume)
        except Exception as exc:  # keep going: the report lists the failed part as failed
            atomic_write_text(error_file, traceback.format_exc())
            record(name, f"failed: {exc}")
            _log.error(f"[{name}] FAILED: {exc}")
            continue
        error_file.unlink(missing_ok=True)
        record(name, f"ok in {time.perf_counter() - t0:.1f} s")
    if build_report is not None:
        rep = build_report([out], out)
        _log.info(f"report: {out / 'report.html'} and {out / 'report.md'} "
                  f"({rep.summary_line()})")
    return status


def _changed_settings(name: str, earlier: dict[str, Any], *, quick: bool,
                      overrides: dict[str, Any] | None) -> str:
    """How a finished part's settings differ from this run's (``""``: the same).

    Compares every setting of results.json's ``config`` and the quick mode
    with the Config this run would use, e.g. ``"num_data: 500 -> 50"``.
    """
    now = jsonable(experiment_config(name, quick=quick, overrides=overrides))
    before = earlier.get("config")
    if not isinstance(before, dict):
        return "its results.json records no settings"
    diffs = [f"{k}: {_short(before.get(k, '(unset)'))} -> {_short(v)}"
             for k, v in now.items() if before.get(k, "(unset)") != v]
    diffs += [f"{k}: no longer a setting" for k in before if k not in now]
    was_quick = (earlier.get("results") or {}).get("quick")
    if was_quick is not None and bool(was_quick) != quick:
        diffs.insert(0, f"quick: {str(bool(was_quick)).lower()} -> {str(quick).lower()}")
    return "; ".join(diffs)


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."
