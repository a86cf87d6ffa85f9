"""Command-line interface: parses arguments and calls the library; nothing else.

    mptlml demo                      PPCA on scikit-learn digits: exact LML vs every estimator
    mptlml reproduce NAME [--quick]  one figure/table of the paper into a run directory
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
    from .experiments import get_experiment, run_experiment

    mod = get_experiment(args.name)
    overrides = dict(_parse_override(mod.Config, s) for s in args.set or [])
    out = args.out or f"runs/{args.name}{'-quick' if args.quick else ''}"
    run_experiment(args.name, out, quick=args.quick, overwrite=args.overwrite,
                   overrides=overrides, resume=getattr(args, "resume", False))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    run_demo(args.out, overwrite=args.overwrite, num_masks=args.num_masks, seed=args.seed)
    return 0


def _cmd_select(args: argparse.Namespace) -> int:
    from .selection import run_selection

    std = None if args.standardise is None else args.standardise == "yes"
    run_selection(args.data, args.k_max, args.out, true_k=args.true_k, standardise=std,
                  overwrite=args.overwrite, num_masks=args.num_masks,
                  max_masks=args.max_masks, seed=args.seed)
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
    p.add_argument("name", choices=sorted(EXPERIMENTS), help="which experiment")
    p.add_argument("--quick", action="store_true", help="small sizes (about a minute)")
    p.add_argument("--out", default=None, help="run directory (default runs/NAME)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run directory")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a config setting (repeatable), e.g. --set seeds=3")
    p.set_defaults(func=_cmd_reproduce)

    p = sub.add_parser("select", help="choose PPCA's latent dimension K by held-out MPT",
                       description="Choose PPCA's latent dimension K by the held-out log-marginal "
                       "likelihood estimated with MPT, beside the exact held-out LML, BIC and "
                       "scikit-learn's PCA(n_components='mle') (Minka).")
    p.add_argument("--data", required=True,
                   help="a .npy/.csv matrix (N, D), or digits, wine, breast_cancer, synthetic")
    p.add_argument("--k-max", type=int, required=True, help="largest K to try (>= 1, < D)")
    p.add_argument("--out", default="runs/select", help="run directory (default runs/select)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run directory")
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
    try:
        return int(args.func(args) or 0)
    except (ValueError, TypeError, FileNotFoundError, NotImplementedError) as exc:
        print(f"mptlml: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
