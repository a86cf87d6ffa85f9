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
import logging
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from .experiments.config import add_flags, flag_overrides

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
    from .experiments import get_experiment
    from .experiments.common import print_table
    from .experiments.config import apply_overrides, describe_settings, format_value

    for name in names:
        cls = get_experiment(name).Config
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
    from .experiments import get_experiment
    from .experiments.mlm import DEVICE_SETTINGS, MLMRunSettings

    given = flag_overrides(args, MLMRunSettings, only=DEVICE_SETTINGS)
    if not given:
        return {}
    out = {n: given for n in names if issubclass(get_experiment(n).Config, MLMRunSettings)}
    if not out:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        raise ValueError(f"{flags} apply to the masked-LM experiments (antibody, bert), not to "
                         f"{', '.join(names)}.")
    return out


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from .experiments import EXPERIMENTS, run_all, run_experiment
    from .experiments.config import scoped_overrides
    from .report import build_report

    names = list(EXPERIMENTS) if args.name == "all" else [args.name]
    overrides = scoped_overrides(names, list(args.set or []), seed=args.seed,
                                 reference=args.reference)
    for name, mlm in _mlm_overrides(args, list(overrides)).items():
        overrides[name] = {**overrides[name], **mlm}
    if args.show_config:
        _show_config(list(overrides), args.quick, overrides)
        return 0
    if args.name == "all":
        out = args.out or f"runs/all{'-quick' if args.quick else ''}"
        status = run_all(out, quick=args.quick, overwrite=args.overwrite, resume=args.resume,
                         overrides={n: o for n, o in overrides.items() if o and n in EXPERIMENTS},
                         build_report=build_report)
        return 0 if all(not str(v).startswith("failed") for v in status.values()) else 1
    out = args.out or f"runs/{args.name}{'-quick' if args.quick else ''}"
    run_experiment(args.name, out, quick=args.quick, overwrite=args.overwrite,
                   overrides=overrides[args.name], resume=getattr(args, "resume", False))
    return 0


def _cmd_curve(args: argparse.Namespace) -> int:
    from .experiments.driver import run_job
    from .experiments.mlm import CurveConfig, curve_summary, load_curve, run_curve

    cfg = CurveConfig(**flag_overrides(args, CurveConfig))
    run_job("curve", cfg, args.out, run=run_curve, load=load_curve, summary=curve_summary,
            overwrite=args.overwrite, resume=args.resume)
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
    from .experiments.demo import DemoConfig, run_demo
    from .experiments.driver import run_job

    run_job("demo", DemoConfig(**flag_overrides(args, DemoConfig)), args.out, run=run_demo,
            overwrite=args.overwrite)
    return 0


def _cmd_select(args: argparse.Namespace) -> int:
    from .experiments.driver import run_job
    from .experiments.select import SelectConfig, load_selection, run_selection

    run_job("select", SelectConfig(**flag_overrides(args, SelectConfig)), args.out,
            run=run_selection, load=load_selection, overwrite=args.overwrite)
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
    from .experiments import EXPERIMENTS
    from .experiments.demo import DemoConfig
    from .experiments.mlm import DEVICE_SETTINGS, CurveConfig, MLMRunSettings
    from .experiments.select import SelectConfig

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
    add_flags(p, MLMRunSettings, only=DEVICE_SETTINGS)
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
    from ._scoring.distributed import shutdown_distributed
    from .estimators.results import NonFiniteWarning
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
