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
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from .experiments.config import check_value

__all__ = ["build_parser", "configure_output", "main"]

_log = logging.getLogger(__name__)


def _arg(typ: type, **bounds: Any) -> Callable[[str], Any]:
    """An argparse ``type=`` reading ``typ``, whose ``bounds`` (Config metadata keys:
    ``min``, ``gt``, ...) :func:`_check_bounds` checks after parsing, naming the flag."""

    def read(text: str) -> Any:
        return typ(text)

    read.__name__ = typ.__name__  # argparse names the type in its messages
    read.bounds = (typ, bounds)  # type: ignore[attr-defined]
    return read


def _check_bounds(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Check every bounded option of the chosen command, as the Configs check their fields."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for action in sub.choices[args.command]._actions:
        typ, bounds = getattr(action.type, "bounds", (None, None))
        value = getattr(args, action.dest, None)
        if typ is not None and value is not None:
            check_value(action.option_strings[-1], value, typ, bounds, value)


_COUNT = _arg(int, min=1)  # a count: a positive integer (negative ones would slice)
_SEED = _arg(int, min=0)


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
    where = "runs/NAME" if default is None else default
    p.add_argument("--out", default=default, help=f"run directory (default {where})")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run directory")
    if resume is not None:
        p.add_argument("--resume", action="store_true", help=resume)


_MLM_FLAGS = ("device", "dtype", "autocast", "batch_size")


def _add_mlm_flags(p: argparse.ArgumentParser) -> None:
    """--device, --dtype, --autocast/--no-autocast, --batch-size: where and how an MLM runs."""
    p.add_argument("--device", default=None,
                   help="cpu, cuda, cuda:1, ... (default: the rank's CUDA device when "
                        "available, else cpu; under torchrun each rank takes cuda:LOCAL_RANK)")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16", "float64"),
                   default=None, help="model dtype (default: the checkpoint's)")
    p.add_argument("--autocast", action=argparse.BooleanOptionalAction, default=None,
                   help="mixed-precision forward (bfloat16; float16 on GPUs without it); "
                        "default off; recorded in results.json")
    p.add_argument("--batch-size", type=_COUNT, default=None,
                   help="most inputs per forward pass, besides --token-budget (default: none)")


def _mlm_overrides(args: argparse.Namespace, names: Sequence[str]) -> dict[str, dict]:
    """Config overrides from the MLM flags, for the experiments (``names``) that take them."""
    given = {k: getattr(args, k) for k in _MLM_FLAGS if getattr(args, k, None) is not None}
    if not given:
        return {}
    from .experiments import get_experiment

    out = {n: given for n in names  # the MLM experiments: their Config has every MLM flag
           if set(_MLM_FLAGS) <= {f.name for f in dataclasses.fields(get_experiment(n).Config)}}
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
    from .experiments.mlm import run_curve

    limit = args.num_sequences
    if args.limit is not None:
        warnings.warn("--limit is deprecated; use --num-sequences (the key of the bert and "
                      "antibody experiments).", FutureWarning, stacklevel=1)
        if limit is not None and limit != args.limit:
            raise ValueError(f"--limit {args.limit} and --num-sequences {limit} disagree; "
                             "give --num-sequences only.")
        limit = args.limit
    run_curve(args.model, args.data, args.out, random_init=args.random_init, column=args.column,
              split=args.split, limit=limit, rates=args.rates, num_masks=args.num_masks,
              seed=args.seed, nominal_length=args.nominal_length, exact=args.exact,
              with_pll=args.pll, truncate=args.truncate, corruption=args.corruption,
              token_budget=args.token_budget, chunk_size=args.chunk_size,
              batch_size=args.batch_size, device=args.device, dtype=args.dtype,
              autocast=args.autocast, tokenizer=args.tokenizer,
              allow_unknown=args.allow_unknown, overwrite=args.overwrite, resume=args.resume,
              progress=not args.no_progress, whole_word=args.whole_word,
              pll_variant=args.pll_variant, target_se=args.target_se)
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
    from .experiments.demo import run_demo

    run_demo(args.out, overwrite=args.overwrite, num_masks=args.num_masks, seed=args.seed)
    return 0


def _cmd_select(args: argparse.Namespace) -> int:
    from .experiments.select import run_selection

    std = None if args.standardise is None else args.standardise == "yes"
    run_selection(args.data, args.k_max, args.out, true_k=args.true_k, standardise=std,
                  overwrite=args.overwrite, num_masks=args.num_masks,
                  max_masks=args.max_masks, seed=args.seed, family=args.family)
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
    p.add_argument("--num-masks", type=_COUNT, default=10, help="P masks per size (default 10)")
    p.add_argument("--seed", type=_SEED, default=0)
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
    p.add_argument("--seed", type=_SEED, default=None,
                   help="the run's base seed (masks, initialisations): the setting 'seed' of "
                        "the experiment (of every experiment, with 'all')")
    p.add_argument("--show-config", action="store_true",
                   help="print every setting (key, type, default, quick value, this run's "
                        "value, meaning) and exit without running")
    p.add_argument("--reference", default=None,
                   help="published BERT curves CSV (bert and all; default: "
                        "../shared/reference/bert_mpt_curves.csv when it exists)")
    _add_mlm_flags(p)
    p.set_defaults(func=_cmd_reproduce)

    p = command("curve")
    p.add_argument("--model", required=True,
                   help="hub name, local directory (save_pretrained) or 'antiberty'")
    p.add_argument("--data", required=True,
                   help="a .txt/.csv/.tsv/.parquet/.jsonl/.fasta file, glue:TASK, or "
                        "'antibodies'")
    p.add_argument("--column", default=None,
                   help="column/field with the text; A,B joins a sentence pair; 0-based "
                        "positions for a header-less CSV/TSV")
    p.add_argument("--split", default=None,
                   help="GLUE split (default validation; ax: test); not for files")
    p.add_argument("--num-sequences", type=_COUNT, default=None, metavar="N",
                   help="score the first N texts (default all)")
    p.add_argument("--limit", type=_COUNT, default=None, help=argparse.SUPPRESS)  # deprecated
    p.add_argument("--random-init", action="store_true",
                   help="score a randomly initialised model of the same config")
    p.add_argument("--rates", default=None,
                   help="START:STOP:STEP or a comma list (default 0.01:0.99:0.01)")
    p.add_argument("--num-masks", type=_COUNT, default=1, help="P masks per rate (default 1)")
    p.add_argument("--target-se", type=_arg(float, gt=0), default=None, metavar="NATS",
                   help="allocate masks per rate (Neyman) for this Monte Carlo standard error "
                        "of the mean LML; --num-masks is then the pilot")
    p.add_argument("--seed", type=_SEED, default=0)
    p.add_argument("--nominal-length", type=_arg(float, gt=0), default=None,
                   help="L of the area (L/100)*sum (paper: 512; default mean length)")
    p.add_argument("--exact", action="store_true",
                   help="also the exact cumulative sum over M=1..D_i (D_i*P pairs)")
    p.add_argument("--pll", action="store_true",
                   help="also the pseudo-log-likelihood, per token in pll_tokens.csv")
    p.add_argument("--pll-variant", choices=("original", "word_l2r"), default="original",
                   help="PLL masking: one token at a time, or word_l2r (Kauf & Ivanova 2023: "
                        "a word's later sub-tokens masked too)")
    p.add_argument("--whole-word", action="store_true",
                   help="mask whole words (fast tokenizer's word_ids), curve and PLL: D_i "
                        "counts words")
    p.add_argument("--truncate", action="store_true",
                   help="cut sequences longer than the model maximum instead of failing")
    p.add_argument("--corruption", choices=("mask", "bert"), default="mask",
                   help="pure [MASK] (default) or BERT's 80/10/10")
    p.add_argument("--token-budget", type=_COUNT, default=8192,
                   help="padded tokens per forward pass (default 8192)")
    p.add_argument("--chunk-size", type=_COUNT, default=8,
                   help="sequences per checkpointed chunk (default 8)")
    _add_mlm_flags(p)
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer name or directory, for a model directory saved without one")
    p.add_argument("--allow-unknown", action="store_true",
                   help="accept more than 5%% unknown tokens (an error by default)")
    _add_run_dir_flags(p, "runs/curve", resume="continue an interrupted run")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_curve)

    p = command("report")
    p.add_argument("runs", nargs="+", help="run directories (or a `reproduce all` directory)")
    p.add_argument("--out", default=None, help="where to write the report (default: first RUN)")
    p.set_defaults(func=_cmd_report)
    p = command("select")
    p.add_argument("--data", required=True,
                   help="a .npy/.csv matrix (N, D), or digits, wine, breast_cancer, synthetic")
    p.add_argument("--k-max", type=_COUNT, required=True, help="largest K to try (>= 1, < D)")
    _add_run_dir_flags(p, "runs/select")
    p.add_argument("--family", choices=("ppca", "bernoulli"), default="ppca",
                   help="model family: ppca (continuous data, default) or bernoulli (0/1 data, "
                        "K <= 3)")
    p.add_argument("--true-k", type=_COUNT, default=None,
                   help="latent dimension of --data synthetic")
    p.add_argument("--standardise", choices=("yes", "no"), default=None,
                   help="z-score columns (default: yes for the built-in real data sets)")
    p.add_argument("--num-masks", type=_COUNT, default=10, help="initial P masks per size")
    p.add_argument("--max-masks", type=_COUNT, default=640,
                   help="largest P while resolving near-ties (default 640)")
    p.add_argument("--seed", type=_SEED, default=0)
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
    from .estimation.runner import shutdown_distributed
    from .settings import keep_heap

    keep_heap()  # the command line opts in to glibc's larger heap thresholds (mptlml.settings)

    ok = False
    try:
        _check_bounds(parser, args)
        code = int(args.func(args) or 0)
        ok = True
        return code
    except (ValueError, TypeError, OSError, NotImplementedError) as exc:
        # ValueError includes RunDirError (a locked or unusable --out) and CheckpointError
        print(f"mptlml: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mptlml: interrupted; the previous run directory (if any) is unchanged, and "
              "finished checkpoint chunks are kept for --resume.", file=sys.stderr)
        return 130
    finally:
        shutdown_distributed(synchronise=ok)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
