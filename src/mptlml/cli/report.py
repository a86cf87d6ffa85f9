"""``mptlml report RUN_DIR...``: report.html, report.md and report.json from run directories."""

from __future__ import annotations

import logging

import click

from .command import command

__all__ = ["report"]

_log = logging.getLogger(__name__)


def _run(runs: tuple[str, ...], out: str | None) -> int:
    from .._optional import require
    from ..report import build_report

    require("jinja2", "mptlml report")  # before any run directory is read
    rep = build_report(list(runs), out)
    where, n = rep.out, len(rep.sections)
    _log.info(f"report written to {where}/report.html and {where}/report.md: "
              f"{n} part{'' if n == 1 else 's'}; {rep.summary_line()}")
    quick = " --quick" if rep.mode == "quick" else ""  # the missing parts in the same mode
    for m in rep.missing:
        _log.warning(f"missing: {m} (run `mptlml reproduce {m}{quick}`)")
    for p in rep.problems:
        _log.warning(f"problem: {p}")
    if not rep.sections:  # nothing could be read: not a success
        _log.error("no part could be reported; see the problems above.")
        return 1
    return 0


def report() -> click.Command:
    """The command ``mptlml report RUN_DIR...``."""
    params = [click.Argument(["runs"], nargs=-1, required=True, metavar="RUN_DIR..."),
              click.Option(["--out"], default=None, metavar="DIR",
                           help="where to write the report (default: a `reproduce all` RUN_DIR "
                                "itself; RUN_DIR-report beside a single part's RUN_DIR)")]
    return command("report", _run, params,
                   help="build report.html/report.md from run directories",
                   description="Build report.html, report.md and report.json from run "
                               "directories (or a `reproduce all` directory).")
