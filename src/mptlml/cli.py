"""Command-line interface: parses arguments and calls the library; nothing else.

    mptlml demo                      PPCA on scikit-learn digits: exact LML vs every estimator
    mptlml reproduce NAME [--quick]  one figure/table of the paper into a run directory
    mptlml reproduce all [--quick]   every one of them, then report.html / report.md
    mptlml report RUN_DIR...         rebuild the report from run directories
    mptlml curve --model M --data D  MPT curve of any Hugging Face masked LM on texts
    mptlml select --data D --k-max K choose PPCA's latent dimension by held-out MPT
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from collections.abc import Sequence

__all__ = ["main"]


def _parse_override(cfg_cls: type, text: str) -> tuple[str, typing.Any]:
    if "=" not in text:
        raise ValueError(f"--set expects KEY=VALUE, got {text!r}.")
    key, value = text.split("=", 1)
    fields = {f.name: f for f in dataclasses.fields(cfg_cls)}
    if key not in fields:
        raise ValueError(f"unknown setting {key!r}; valid settings: {', '.join(sorted(fields))}.")
    hints = typing.get_type_hints(cfg_cls)
    typ = hints.get(key, str)
    origin = typing.get_origin(typ)
    args = typing.get_args(typ)
    try:
        if typ is bool:
            low = value.lower()
            if low not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(value)
            return key, low in ("true", "1", "yes")
        if origin in (tuple, list):
            elem = args[0] if args else float
            parts = [p for p in value.split(",") if p]
            return key, (tuple if origin is tuple else list)(elem(p) for p in parts)
        if typ in (int, float, str):
            return key, typ(value)
        if type(None) in args:  # Optional[T]
            inner = next(a for a in args if a is not type(None))
            return key, None if value.lower() == "none" else inner(value)
    except ValueError as exc:
        raise ValueError(f"cannot read {key}={value!r} as {typ}.") from exc
    return key, value


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from .experiments import EXPERIMENTS, get_experiment, run_all, run_experiment
    from .report import build_report

    if args.name == "all":
        if args.set:
            raise ValueError("--set applies to one experiment; use `mptlml reproduce NAME --set`.")
        overrides = {}
        if getattr(args, "reference", None):
            for name in EXPERIMENTS:
                cfg = get_experiment(name).Config
                if "reference" in {f.name for f in dataclasses.fields(cfg)}:
                    overrides[name] = {"reference": args.reference}
        out = args.out or f"runs/all{'-quick' if args.quick else ''}"
        status = run_all(out, quick=args.quick, overwrite=args.overwrite, resume=args.resume,
                         overrides=overrides, build_report=build_report)
        return 0 if all(not str(v).startswith("failed") for v in status.values()) else 1
    mod = get_experiment(args.name)
    overrides = dict(_parse_override(mod.Config, s) for s in args.set or [])
    if args.reference:
        if "reference" not in {f.name for f in dataclasses.fields(mod.Config)}:
            raise ValueError(f"--reference does not apply to {args.name}; it is for bert.")
        overrides["reference"] = args.reference
    out = args.out or f"runs/{args.name}{'-quick' if args.quick else ''}"
    run_experiment(args.name, out, quick=args.quick, overwrite=args.overwrite,
                   overrides=overrides, resume=getattr(args, "resume", False))
    return 0


def _cmd_curve(args: argparse.Namespace) -> int:
    from .experiments.mlm import run_curve

    run_curve(args.model, args.data, args.out, random_init=args.random_init, column=args.column,
              split=args.split, limit=args.limit, rates=args.rates, num_masks=args.num_masks,
              seed=args.seed, nominal_length=args.nominal_length, exact=args.exact,
              with_pll=args.pll, truncate=args.truncate, corruption=args.corruption,
              token_budget=args.token_budget, chunk_size=args.chunk_size,
              overwrite=args.overwrite, resume=args.resume, progress=not args.no_progress)
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from .report import build_report

    rep = build_report(args.runs, args.out)
    out = args.out or args.runs[0]
    print(f"report written to {out}/report.html and {out}/report.md: "
          f"{len(rep.sections)} parts, {rep.num_holding} of {rep.num_claims} checked claims hold")
    for m in rep.missing:
        print(f"missing: {m} (run `mptlml reproduce {m}`)")
    for p in rep.problems:
        print(f"problem: {p}")
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


def build_parser() -> argparse.ArgumentParser:
    """The ``mptlml`` argument parser."""
    from .experiments import EXPERIMENTS

    parser = argparse.ArgumentParser(prog="mptlml", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="PPCA on scikit-learn digits: exact LML vs every estimator")
    p.add_argument("--out", default="runs/demo", help="run directory (default runs/demo)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run directory")
    p.add_argument("--num-masks", type=int, default=10, help="P masks per size (default 10)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("reproduce", help="reproduce one figure or table of the paper")
    p.add_argument("name", choices=[*sorted(EXPERIMENTS), "all"],
                   help="which experiment ('all' runs every one and writes a report)")
    p.add_argument("--quick", action="store_true", help="small sizes (about a minute)")
    p.add_argument("--out", default=None, help="run directory (default runs/NAME)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run directory")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a config setting (repeatable), e.g. --set seeds=3")
    p.add_argument("--resume", action="store_true",
                   help="keep finished parts/chunks of an interrupted run")
    p.add_argument("--reference", default=None,
                   help="published BERT curves CSV (bert and all; default: "
                        "../shared/reference/bert_mpt_curves.csv when it exists)")
    p.set_defaults(func=_cmd_reproduce)

    p = sub.add_parser("curve", help="MPT curve of any Hugging Face masked LM on texts",
                       description="MPT curve (mean log-prob of masked tokens vs masking rate), "
                       "its area and per-sequence LML estimates. Runs under torchrun / "
                       "accelerate launch for data-parallel scoring.")
    p.add_argument("--model", required=True,
                   help="hub name, local directory (save_pretrained) or 'antiberty'")
    p.add_argument("--data", required=True,
                   help="a .txt/.csv/.tsv/.jsonl/.fasta file, glue:TASK, or 'antibodies'")
    p.add_argument("--column", default=None, help="CSV/TSV column or JSONL field with the text")
    p.add_argument("--split", default=None, help="GLUE split (default validation; ax: test)")
    p.add_argument("--limit", type=int, default=None, help="use the first N texts")
    p.add_argument("--random-init", action="store_true",
                   help="score a randomly initialised model of the same config")
    p.add_argument("--rates", default=None,
                   help="START:STOP:STEP or a comma list (default 0.01:0.99:0.01)")
    p.add_argument("--num-masks", type=int, default=1, help="P masks per rate (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--nominal-length", type=float, default=None,
                   help="L of the area (L/100)*sum (paper: 512; default mean length)")
    p.add_argument("--exact", action="store_true",
                   help="also the exact cumulative sum over M=1..D_i (D_i*P pairs)")
    p.add_argument("--pll", action="store_true", help="also the pseudo-log-likelihood")
    p.add_argument("--truncate", action="store_true",
                   help="cut sequences longer than the model maximum instead of failing")
    p.add_argument("--corruption", choices=("mask", "bert"), default="mask",
                   help="pure [MASK] (default) or BERT's 80/10/10")
    p.add_argument("--token-budget", type=int, default=8192,
                   help="padded tokens per forward pass (default 8192)")
    p.add_argument("--chunk-size", type=int, default=8,
                   help="sequences per checkpointed chunk (default 8)")
    p.add_argument("--out", default="runs/curve", help="run directory (default runs/curve)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run directory")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_curve)

    p = sub.add_parser("report", help="build report.html/report.md from run directories")
    p.add_argument("runs", nargs="+", help="run directories (or a `reproduce all` directory)")
    p.add_argument("--out", default=None, help="where to write the report (default: first RUN)")
    p.set_defaults(func=_cmd_report)
    p = sub.add_parser("select", help="choose a latent dimension K by held-out MPT",
                       description="Choose the latent dimension K of PPCA (or of the Bernoulli "
                       "latent linear model, K <= 3) by the held-out log-marginal likelihood "
                       "estimated with MPT, beside the exact held-out LML, BIC and, for PPCA, "
                       "scikit-learn's PCA(n_components='mle') (Minka).")
    p.add_argument("--data", required=True,
                   help="a .npy/.csv matrix (N, D), or digits, wine, breast_cancer, synthetic")
    p.add_argument("--k-max", type=int, required=True, help="largest K to try (>= 1, < D)")
    p.add_argument("--out", default="runs/select", help="run directory (default runs/select)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run directory")
    p.add_argument("--family", choices=("ppca", "bernoulli"), default="ppca",
                   help="model family: ppca (continuous data, default) or bernoulli (0/1 data, "
                        "K <= 3)")
    p.add_argument("--true-k", type=int, default=None, help="latent dimension of --data synthetic")
    p.add_argument("--standardise", choices=("yes", "no"), default=None,
                   help="z-score columns (default: yes for the built-in real data sets)")
    p.add_argument("--num-masks", type=int, default=10, help="initial P masks per size")
    p.add_argument("--max-masks", type=int, default=640,
                   help="largest P while resolving near-ties (default 640)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_cmd_select)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mptlml`` command."""
    parser = build_parser()
    args = parser.parse_args(argv)
    from .estimation.runner import shutdown_distributed
    from .settings import keep_heap

    keep_heap()  # the command line opts in to glibc's larger heap thresholds (mptlml.settings)

    ok = False
    try:
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
