"""Command-line interface: parses arguments and calls the library; nothing else.

    mptlml demo                      PPCA on scikit-learn digits: exact LML vs every estimator
    mptlml reproduce NAME [--quick]  one figure/table of the paper into a run directory
    mptlml reproduce all [--quick]   every one of them, then report.html / report.md
    mptlml report RUN_DIR...         rebuild the report from run directories
    mptlml curve --model M --data D  MPT curve of any Hugging Face masked LM on texts
    mptlml select --data D --k-max K choose PPCA's latent dimension by held-out MPT

    mptlml reproduce NAME --show-config    every setting of NAME; change one with --set KEY=VALUE
    mptlml --quiet ...                     no progress bars, only warnings (or TQDM_DISABLE=1)
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import typing
import warnings
from collections.abc import Sequence
from typing import Any

from .runs.config import check_value, format_value, optional_inner, read_value, type_name

__all__ = ["build_parser", "configure_output", "main"]

_log = logging.getLogger(__name__)


def _seed(text: str) -> int:
    """``reproduce --seed``: a non-negative integer."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"--seed must be >= 0, got {text}")
    return value


def _show_config(names: list[str], quick: bool, overrides: dict[str, dict[str, Any]]) -> None:
    """Print every setting of each experiment: key, type, default, quick value, this run's value."""
    from .reproduce import get_part
    from .runs.config import apply_overrides, describe_settings
    from .runs.output import print_table

    for name in names:
        cls = get_part(name).config
        cfg = apply_overrides(cls.quick() if quick else cls(), overrides.get(name), name=name)
        rows = describe_settings(cls)
        for r in rows:
            r["this run"] = format_value(getattr(cfg, r["key"]))
        print_table(rows, ["key", "type", "default", "quick", "this run", "meaning"],
                    title=f"{name}: settings (mptlml reproduce {name} --set KEY=VALUE)")
        print()


def _add_run_dir_flags(p: argparse.ArgumentParser, default: str | None, *,
                       resume: str | None = None) -> None:
    """--out, --overwrite (and --resume): the run directory (a transaction, ``rundir``)."""
    where = "runs/NAME, runs/NAME-quick with --quick" if default is None else default
    p.add_argument("--out", default=default, help=f"run directory (default {where})")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run directory")
    if resume is not None:
        p.add_argument("--resume", action="store_true", help=resume)


def _mlm_overrides(args: argparse.Namespace, names: Sequence[str]) -> dict[str, dict]:
    """Config overrides from the MLM flags, for the experiments (``names``) that take them."""
    from .jobs.curve import DEVICE_SETTINGS, MLMRunConfig
    from .reproduce import get_part

    given = flag_overrides(args, MLMRunConfig, only=DEVICE_SETTINGS)
    if not given:
        return {}
    out = {n: given for n in names if issubclass(get_part(n).config, MLMRunConfig)}
    if not out:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        raise ValueError(f"{flags} apply to the masked-LM experiments (antibody, bert), not to "
                         f"{', '.join(names)}.")
    return out


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from . import reproduce
    from .report import build_report
    from .reproduce.driver import scoped_overrides

    names = list(reproduce.PARTS) if args.name == "all" else [args.name]
    overrides = scoped_overrides(names, list(args.set or []), seed=args.seed,
                                 reference=args.reference)
    for name, mlm in _mlm_overrides(args, list(overrides)).items():
        overrides[name] = {**overrides[name], **mlm}
    if args.show_config:
        _show_config(list(overrides), args.quick, overrides)
        return 0
    if args.name == "all":
        out = args.out or f"runs/all{'-quick' if args.quick else ''}"
        status = reproduce.run_all(out, quick=args.quick, overwrite=args.overwrite,
                                   resume=args.resume, overrides={n: o for n, o in
                                                                  overrides.items() if o},
                                   build_report=build_report)
        return 0 if all(not str(v).startswith("failed") for v in status.values()) else 1
    out = args.out or f"runs/{args.name}{'-quick' if args.quick else ''}"
    reproduce.run_part(args.name, out, quick=args.quick, overwrite=args.overwrite,
                   overrides=overrides[args.name], resume=getattr(args, "resume", False))
    return 0


def _cmd_curve(args: argparse.Namespace) -> int:
    from .jobs.curve import JOB
    from .runs import job

    cfg = JOB.config(**flag_overrides(args, JOB.config))
    job.run_job("curve", JOB, cfg, args.out, overwrite=args.overwrite, resume=args.resume)
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from .report import build_report

    rep = build_report(args.runs, args.out)
    out = args.out or args.runs[0]
    _log.info(f"report written to {out}/report.html and {out}/report.md: "
              f"{len(rep.sections)} parts; {rep.summary_line()}")
    for m in rep.missing:
        _log.warning(f"missing: {m} (run `mptlml reproduce {m}`)")
    for p in rep.problems:
        _log.warning(f"problem: {p}")
    return 0 if rep.sections else 1  # nothing could be read: not a success


def _cmd_demo(args: argparse.Namespace) -> int:
    from .jobs.demo import JOB
    from .runs import job

    job.run_job("demo", JOB, JOB.config(**flag_overrides(args, JOB.config)), args.out,
                overwrite=args.overwrite)
    return 0


def _cmd_select(args: argparse.Namespace) -> int:
    from .jobs.select import JOB
    from .runs import job

    job.run_job("select", JOB, JOB.config(**flag_overrides(args, JOB.config)), args.out,
                overwrite=args.overwrite)
    return 0


_COMMANDS: dict[str, dict[str, str]] = {  # help (the list of commands) and description
    "demo": {
        "help": "PPCA on scikit-learn digits: exact LML vs every estimator"},
    "reproduce": {
        "help": "reproduce one figure or table of the paper",
        "description": "Reproduce one figure or table of the paper into a run directory (or "
                       "all of them, then a report). Every setting of an experiment is a "
                       "--set KEY=VALUE; --show-config lists them."},
    "curve": {
        "help": "MPT curve of any Hugging Face masked LM on texts",
        "description": "MPT curve (mean log-prob of masked tokens vs masking rate), its area "
                       "and per-sequence LML estimates. Runs under torchrun / accelerate "
                       "launch for data-parallel scoring."},
    "report": {
        "help": "build report.html/report.md from run directories"},
    "select": {
        "help": "choose a latent dimension K by held-out MPT",
        "description": "Choose the latent dimension K of PPCA (or of the Bernoulli latent "
                       "linear model, K <= 3) by the held-out log-marginal likelihood "
                       "estimated with MPT, beside the exact held-out LML, BIC and, for PPCA, "
                       "scikit-learn's PCA(n_components='mle') (Minka)."},
}


def build_parser() -> argparse.ArgumentParser:
    """The ``mptlml`` argument parser."""
    from . import __version__
    from .jobs.curve import DEVICE_SETTINGS, CurveConfig, MLMRunConfig
    from .jobs.demo import DemoConfig
    from .jobs.select import SelectConfig
    from .reproduce import PARTS as EXPERIMENTS

    parser = argparse.ArgumentParser(prog="mptlml", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"mptlml {__version__}")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress bars and only warnings and errors on stderr (also "
                             "after the command; TQDM_DISABLE=1 turns the bars off too)")
    # --quiet is also accepted after the command; SUPPRESS keeps a global one from being reset
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                        help="no progress bars; only warnings and errors on stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], **_COMMANDS[name])  # every one takes -q

    p = command("demo")
    _add_run_dir_flags(p, "runs/demo")
    add_flags(p, DemoConfig)
    p.set_defaults(func=_cmd_demo)

    p = command("reproduce")
    p.add_argument("name", choices=[*EXPERIMENTS, "all"],
                   help="which experiment ('all' runs every one and writes a report)")
    p.add_argument("--quick", action="store_true", help="small sizes (about a minute)")
    _add_run_dir_flags(p, None, resume="keep finished parts/chunks of an interrupted run")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a setting (repeatable), e.g. --set num_data=500; lists are "
                        "comma-separated (--set dims=5,50). With 'all': NAME.KEY=VALUE for one "
                        "experiment (--set training.num_inits=2), a bare KEY=VALUE for every "
                        "experiment that has KEY")
    p.add_argument("--seed", type=_seed, default=None,
                   help="the run's base seed (masks, initialisations): the setting 'seed' of "
                        "the experiment (of every experiment, with 'all')")
    p.add_argument("--show-config", action="store_true",
                   help="print every setting (key, type, default, quick value, this run's "
                        "value, meaning) and exit without running")
    p.add_argument("--reference", default=None,
                   help="published BERT curves CSV (bert and all; default: the authors' "
                        "curves shipped in the package, mptlml/data/bert_mpt_curves.csv)")
    add_flags(p, MLMRunConfig, only=DEVICE_SETTINGS)
    p.set_defaults(func=_cmd_reproduce)

    p = command("curve")
    add_flags(p, CurveConfig, required=("model", "data"))
    _add_run_dir_flags(p, "runs/curve", resume="continue an interrupted run")
    p.set_defaults(func=_cmd_curve)

    p = command("report")
    p.add_argument("runs", nargs="+", help="run directories (or a `reproduce all` directory)")
    p.add_argument("--out", default=None, help="where to write the report (default: first RUN)")
    p.set_defaults(func=_cmd_report)
    p = command("select")
    add_flags(p, SelectConfig, required=("data", "k_max"))
    _add_run_dir_flags(p, "runs/select")
    p.set_defaults(func=_cmd_select)
    return parser


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_flags(parser: Any, cls: type, *, only: Sequence[str] | None = None,
              required: Sequence[str] = ()) -> None:
    """Add one command-line flag per setting of ``cls`` (``num_masks`` -> ``--num-masks``).

    The flags are the settings: same names, the same reading as ``--set``
    (:func:`parse_setting`), the help and bounds of :func:`setting`, the
    default of ``cls``. A boolean is ``--NAME/--no-NAME``. A flag not given
    leaves the setting at its default; :func:`flag_overrides` collects the given
    ones and checks them, naming the flag.

    Parameters
    ----------
    parser : argparse.ArgumentParser
    cls : a Config dataclass
    only : the settings to expose (default: every one)
    required : settings the command line must give
    """
    import argparse

    hints, default = typing.get_type_hints(cls), cls()
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name in only if only is not None else list(fields):
        f, typ = fields[name], hints.get(name, str)
        meta, value = f.metadata, getattr(default, name)
        text = meta.get("help", "")
        if name not in required and "default" not in text:
            text += f" (default {format_value(value) if value is not None else 'none'})"
        text = text.replace("%", "%%")
        inner = optional_inner(typ) or typ
        if inner is bool:
            parser.add_argument(_flag(name), dest=name, action=argparse.BooleanOptionalAction,
                                default=argparse.SUPPRESS, help=text)
            continue

        def read(raw: str, typ: Any = typ) -> Any:
            return read_value(raw.strip(), typ)

        read.__name__ = type_name(inner)  # argparse names the type in its messages
        parser.add_argument(_flag(name), dest=name, type=read, default=argparse.SUPPRESS,
                            required=name in required, help=text,
                            choices=meta.get("choices") if inner is str else None,
                            metavar=None if meta.get("choices") and inner is str
                            else name.upper())


def flag_overrides(args: Any, cls: type, *, only: Sequence[str] | None = None
                   ) -> dict[str, Any]:
    """The settings of ``cls`` given as flags (see :func:`add_flags`), checked, naming the flag."""
    hints, out = typing.get_type_hints(cls), {}
    for f in dataclasses.fields(cls):
        if (only is None or f.name in only) and hasattr(args, f.name):
            value = getattr(args, f.name)
            check_value(_flag(f.name), value, hints.get(f.name, Any), dict(f.metadata), value)
            out[f.name] = value
    return out


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
    from ._progress import set_quiet

    logger = logging.getLogger("mptlml")
    for h in [h for h in logger.handlers if isinstance(h, _StderrHandler)]:
        logger.removeHandler(h)
    logger.addHandler(_StderrHandler())
    logger.setLevel(logging.WARNING if quiet else logging.INFO)
    set_quiet(quiet)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mptlml`` command.

    Bare ``mptlml`` (no command) prints the help to stdout and returns 0, like
    ``mptlml --help``; a wrong argument is a usage error with exit code 2
    (argparse's convention), an invalid setting or input exits with 2 too.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error (argparse printed it)
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2
    if args.command is None:
        parser.print_help()
        return 0
    configure_output(quiet=getattr(args, "quiet", False))
    from .estimation.distributed import shutdown_distributed
    from .estimation.results import NonFiniteWarning
    from .settings import keep_heap

    keep_heap()  # the command line opts in to glibc's larger heap thresholds (mptlml.settings)

    ok = False
    try:
        with warnings.catch_warnings():
            # a non-finite result fails the run: nothing is written with NaN cells
            warnings.simplefilter("error", NonFiniteWarning)
            code = int(args.func(args) or 0)
        ok = True
        return code
    except (NonFiniteWarning, ValueError, TypeError, OSError, NotImplementedError) as exc:
        # ValueError includes RunDirError (a locked or unusable --out) and CheckpointError;
        # a non-finite result (the model's fault, exit 1) fails the run before anything is kept
        nonfinite = isinstance(exc, NonFiniteWarning)
        tail = " Nothing was written: the run directory (if any) is unchanged." if nonfinite else ""
        print(f"mptlml: error: {exc}{tail}", file=sys.stderr)
        return 1 if nonfinite else 2
    except KeyboardInterrupt:
        print("mptlml: interrupted; the previous run directory (if any) is unchanged, and "
              "finished checkpoint chunks are kept for --resume.", file=sys.stderr)
        return 130
    finally:
        shutdown_distributed(synchronise=ok)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
