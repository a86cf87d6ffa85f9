"""``python -m mptlml.lm_eval``: lm-eval's own command line, with the ``mptlml`` model registered.

Every argument is lm-eval's (``--model``, ``--model_args``, ``--tasks``,
``--include_path``, ``--output_path``, ``--log_samples``, ``--limit``, ...); the
model ``mptlml`` is registered before lm-eval parses them, and each request's
Monte Carlo record goes to ``mptlml_monte_carlo_<date>.jsonl`` in the
``--output_path`` directory unless ``--model_args mc_log=PATH`` says where.
Under ``accelerate launch -m mptlml.lm_eval ...`` every process runs this, and
the process group is closed at the end.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .._optional import require
from .._scoring.distributed import shutdown_distributed
from .backend import MPTLM

__all__ = ["main"]


def output_dir(argv: list[str]) -> Path | None:
    """The directory of lm-eval's ``--output_path`` (``-o``) in ``argv``, if any.

    lm-eval takes a directory, or a ``.json`` file whose directory it writes into.
    """
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--output_path", "-o", default=None)
    known, _ = parser.parse_known_args(argv)
    if not known.output_path:
        return None
    p = Path(known.output_path)
    return p.parent if p.suffix == ".json" else p


def main(argv: list[str] | None = None) -> int:
    """Run lm-eval's command line on ``argv`` (default ``sys.argv[1:]``); 0 when it finishes.

    lm-eval reads ``sys.argv``, so it is set to ``argv`` for the run and put back after.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    require("lm_eval", "mptlml eval (the lm-evaluation-harness command line)")
    from lm_eval.__main__ import cli_evaluate

    out = output_dir(args)
    saved = sys.argv
    MPTLM.default_mc_dir = None if out is None else str(out)
    sys.argv = ["lm-eval", *args]
    try:
        cli_evaluate()
    finally:
        sys.argv = saved
        MPTLM.default_mc_dir = None
        shutdown_distributed()
    return 0
