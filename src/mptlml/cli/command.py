"""How a command of ``mptlml`` is built: flags from a Config, the run directory, ``-q``, output.

Every setting of a job's ``Config`` is a flag (:func:`setting_options`:
``num_masks`` is ``--num-masks``, a boolean ``--pll/--no-pll``), read as
``--set`` reads it and checked against the setting's bounds, naming the flag
(:func:`given_settings`); a flag not given leaves the setting at its default.
:func:`job_command` turns a :class:`~mptlml.runs.job.Job` into a command with
these flags and the run directory's (``--out runs/NAME``, ``--overwrite``,
``--resume`` when it can resume); :func:`command` adds ``-q/--quiet`` and sets
up the output before the command runs.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import typing
from collections.abc import Callable, Sequence
from typing import Any

import click
from click.core import ParameterSource

from ..runs.config import check_value, format_value, optional_inner, read_value, type_name

__all__ = ["command", "configure_output", "given_settings", "job_command", "run_dir_options",
           "setting_options"]


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


class _Setting(click.ParamType):
    """A flag's value read by the setting's type hint (as ``--set KEY=VALUE`` reads it)."""

    def __init__(self, typ: Any) -> None:
        self.typ = typ
        self.name = type_name(optional_inner(typ) or typ)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None
                ) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return read_value(value.strip(), self.typ)
        except ValueError:
            self.fail(f"cannot read {value!r} as {self.name}", param, ctx)


def setting_options(cls: type, *, only: Sequence[str] | None = None) -> list[click.Option]:
    """One flag per setting of ``cls`` (``num_masks`` -> ``--num-masks``; ``only``: a subset).

    The help and bounds are the setting's (:func:`mptlml.runs.config.setting`),
    the default is ``cls``'s; a setting declared ``required=True`` must be given.
    """
    hints, default = typing.get_type_hints(cls), cls()
    out = []
    for f in dataclasses.fields(cls):
        if only is not None and f.name not in only:
            continue
        typ, meta = hints.get(f.name, str), f.metadata
        inner = optional_inner(typ) or typ
        text = meta.get("help", "")
        value = getattr(default, f.name)
        if not meta.get("required") and "default" not in text:
            text += f" (default {format_value(value) if value is not None else 'none'})"
        if inner is bool:
            decls = [f"{_flag(f.name)}/--no-{_flag(f.name)[2:]}", f.name]
            out.append(click.Option(decls, default=None, help=text))
            continue
        choices = meta.get("choices") if inner is str else None
        given_only = {"required": True} if meta.get("required") else {"default": None}
        out.append(click.Option(
            [_flag(f.name), f.name], type=click.Choice(choices) if choices else _Setting(typ),
            help=text, metavar=None if choices else f.name.upper(), **given_only))
    return out


def given_settings(cls: type, params: dict[str, Any], *,
                   only: Sequence[str] | None = None) -> dict[str, Any]:
    """The settings of ``cls`` given as flags (see :func:`setting_options`), checked.

    A value out of bounds is a ``ValueError`` naming the flag, e.g.
    ``--num-masks must be >= 1, got -3``.
    """
    ctx = click.get_current_context()
    hints, out = typing.get_type_hints(cls), {}
    for f in dataclasses.fields(cls):
        if only is not None and f.name not in only:
            continue
        if f.name in params and ctx.get_parameter_source(f.name) is ParameterSource.COMMANDLINE:
            value = params[f.name]
            check_value(_flag(f.name), value, hints.get(f.name, Any), dict(f.metadata), value)
            out[f.name] = value
    return out


def run_dir_options(default: str | None, *, resume: str | None = None) -> list[click.Option]:
    """--out, --overwrite (and --resume): the run directory (a transaction, ``runs.rundir``)."""
    where = "runs/NAME, runs/NAME-quick with --quick" if default is None else default
    out = [click.Option(["--out"], default=default, metavar="DIR",
                        help=f"run directory (default {where})"),
           click.Option(["--overwrite"], is_flag=True,
                        help="replace an existing run directory")]
    if resume is not None:
        out.append(click.Option(["--resume"], is_flag=True, help=resume))
    return out


def command(name: str, run: Callable[..., int], params: Sequence[click.Parameter], *,
            help: str, description: str | None = None) -> click.Command:
    """A command of ``mptlml``: ``run(**params)`` with ``-q/--quiet`` and the output set up.

    ``help`` is its line in ``mptlml --help``, ``description`` its ``--help`` text.
    """
    def callback(quiet: bool, **kwargs: Any) -> int:
        from ..settings import keep_heap

        root = click.get_current_context().find_root()
        configure_output(quiet=quiet or bool(root.params.get("quiet")))
        keep_heap()  # the command line opts in to glibc's larger heap thresholds
        return int(run(**kwargs) or 0)

    quiet = click.Option(["-q", "--quiet"], is_flag=True,
                         help="no progress bars; only warnings and errors on stderr")
    return click.Command(name, callback=callback, params=[*params, quiet],
                         help=description or help, short_help=help)


def job_command(name: str, job: Any) -> click.Command:
    """The command that runs ``job`` (:class:`~mptlml.runs.job.Job`) into ``runs/NAME``."""
    def run(out: str, overwrite: bool, resume: bool = False, **flags: Any) -> int:
        from ..runs import job as jobs

        cfg = job.config(**given_settings(job.config, flags))
        jobs.run_job(name, job, cfg, out, overwrite=overwrite, resume=resume)
        return 0

    resume = "continue an interrupted run" if job.resumable else None
    params = [*setting_options(job.config), *run_dir_options(f"runs/{name}", resume=resume)]
    return command(name, run, params, help=job.help, description=job.description)


class _StderrHandler(logging.StreamHandler):
    """Writes to the current ``sys.stderr`` (which tests and notebooks may swap)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(_Formatter())

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        msg = super().format(record)
        return msg if record.levelno < logging.WARNING else \
            f"mptlml: {record.levelname.lower()}: {msg}"


def configure_output(quiet: bool = False) -> None:
    """Messages of the ``mptlml`` logger to stderr (INFO, or WARNING when quiet); bars per quiet.

    The command line calls this once per invocation; a library user configures
    ``logging.getLogger("mptlml")`` as they like (by default only warnings show).
    """
    from .._progress import set_quiet

    logger = logging.getLogger("mptlml")
    for h in [h for h in logger.handlers if isinstance(h, _StderrHandler)]:
        logger.removeHandler(h)
    logger.addHandler(_StderrHandler())
    logger.setLevel(logging.WARNING if quiet else logging.INFO)
    set_quiet(quiet)
