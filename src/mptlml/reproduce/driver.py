"""Running the paper's parts: one into its run directory, or all of them one after another.

:func:`run_part` runs one part (:class:`~.parts.Part`) like every job
(:func:`mptlml.runs.job.run_job`), with the paper's settings, ``quick()`` ones
or ``--set`` overrides (:func:`part_config`, :func:`scoped_overrides`).

:func:`run_all` runs every registered part into ``out/NAME``, keeps going
past a failed part, and hands the finished directory to a report builder if one
is given (``mptlml reproduce all`` passes :func:`mptlml.report.build_report`;
this module does not import the report, which sits above the parts).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .._io import atomic_write_text, jsonable
from .._optional import require
from ..runs.config import apply_overrides, execution_settings, parse_setting
from ..runs.job import check_needs, run_job
from ..runs.rundir import load_results, locked
from .parts import PARTS, get_part

__all__ = ["part_config", "run_all", "run_part", "scoped_overrides"]

_log = logging.getLogger(__name__)


def run_part(name: str, out: str | Path, *, quick: bool = False, overwrite: bool = False,
             overrides: dict[str, Any] | None = None, resume: bool = False) -> dict[str, Any]:
    """Run one part into ``out`` (:func:`~mptlml.runs.job.run_job`) and return its results.json."""
    check_needs(f"reproduce {name}", get_part(name))  # a missing extra before anything
    cfg = part_config(name, quick=quick, overrides=overrides)
    return run_job(name, get_part(name), cfg, out, overwrite=overwrite, resume=resume,
                   extra={"quick": quick})


def part_config(name: str, *, quick: bool = False,
                overrides: dict[str, Any] | None = None) -> Any:
    """The Config of part ``name``: the paper's (or ``quick()``) with ``overrides``."""
    cls = get_part(name).config
    return apply_overrides(cls.quick() if quick else cls(), overrides, name=name)


def run_all(out: str | Path, *, quick: bool = False, overwrite: bool = False,
            resume: bool = False, only: list[str] | None = None,
            overrides: dict[str, dict[str, Any]] | None = None,
            build_report: Callable[[Sequence[str | Path], str | Path], Any] | None = None,
            ) -> dict[str, Any]:
    """Run every part into ``out/NAME``; return ``{name: status}``.

    Each part is its own run directory (a transaction: see
    :class:`~mptlml.runs.rundir.RunDir`), and the whole of ``out`` is locked while this
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
    out, names = Path(out), only or list(PARTS)
    for name in names:  # a missing extra is refused before any part runs
        check_needs(f"reproduce {name}", get_part(name))
    if build_report is not None:
        require("jinja2", "the report of mptlml reproduce all")
    with locked(out):
        if out.is_dir() and any(out.iterdir()) and not (overwrite or resume):
            raise ValueError(
                f"output directory {out} exists and is not empty; pass --overwrite to replace "
                "it, --resume to keep finished parts, or choose another --out."
            )
        out.mkdir(parents=True, exist_ok=True)
        return _run_parts(out, names, quick=quick, resume=resume,
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
            run_part(name, part, quick=quick, overwrite=True,
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
    with the Config this run would use, e.g. ``"num_data: 500 -> 50"``; the
    execution-only settings (:func:`~mptlml.runs.config.execution_settings`:
    threads, workers, ...) change no number, so they do not count.
    """
    cfg = part_config(name, quick=quick, overrides=overrides)
    skip = execution_settings(type(cfg))
    now = {k: v for k, v in jsonable(cfg).items() if k not in skip}
    before = earlier.get("config")
    if not isinstance(before, dict):
        return "its results.json records no settings"
    diffs = [f"{k}: {_short(before.get(k, '(unset)'))} -> {_short(v)}"
             for k, v in now.items() if before.get(k, "(unset)") != v]
    diffs += [f"{k}: no longer a setting" for k in before if k not in now and k not in skip]
    was_quick = (earlier.get("results") or {}).get("quick")
    if was_quick is not None and bool(was_quick) != quick:
        diffs.insert(0, f"quick: {str(bool(was_quick)).lower()} -> {str(quick).lower()}")
    return "; ".join(diffs)


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def scoped_overrides(names: list[str], texts: list[str], *, seed: int | None = None,
                     reference: str | None = None) -> dict[str, dict[str, Any]]:
    """``reproduce``'s ``--set`` / ``--seed`` / ``--reference`` as ``{part: {key: value}}``.

    For one part every ``KEY=VALUE`` must be one of its settings. For
    ``all``, ``NAME.KEY=VALUE`` sets KEY of part NAME and a bare
    ``KEY=VALUE`` sets KEY of every part that has it (refused when none has).
    """
    configs = {n: get_part(n).config for n in names}
    out: dict[str, dict[str, Any]] = {n: {} for n in names}
    texts = list(texts)
    if seed is not None:
        texts.append(f"seed={seed}")
    if reference:
        with_ref = [n for n in names if "reference" in _keys(configs[n])]
        if not with_ref:
            raise ValueError(f"--reference does not apply to {names[0]}; it is for bert.")
        texts += [f"{n}.reference={reference}" for n in with_ref] if len(names) > 1 else \
            [f"reference={reference}"]
    for text in texts:
        key = text.split("=", 1)[0]
        target, _, bare = key.partition(".")
        if bare and target in configs:
            scope, text = [target], text[len(target) + 1:]
        elif len(names) > 1:
            scope = [n for n in names if key in _keys(configs[n])]
            if not scope:
                raise ValueError(f"no part has a setting {key!r}; use NAME.KEY=VALUE with "
                                 "a NAME of `mptlml reproduce --help`, or see --show-config.")
        else:
            scope = names
        for n in scope:
            where = f" for {n}" if len(names) > 1 else ""
            k, v = parse_setting(configs[n], text, where=where)
            if k in out[n] and out[n][k] != v:
                raise ValueError(f"{k}{where} is set twice ({out[n][k]!r} and {v!r}); "
                                 "give it once.")
            out[n][k] = v
    return out


def _keys(cfg_cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cfg_cls)}
