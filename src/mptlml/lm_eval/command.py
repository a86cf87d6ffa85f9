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
import textwrap
from pathlib import Path

from .._optional import require
from .._scoring.distributed import shutdown_distributed
from .backend import _LOADING, _SETTINGS, MPTLM
from .peers import PEER_ARGUMENTS

__all__ = ["HELP", "main"]


def _names(names: tuple[str, ...]) -> str:
    return textwrap.fill(", ".join(names), width=88, initial_indent="  ",
                         subsequent_indent="  ")


#: printed before lm-eval's own help (``mptlml eval --help``)
HELP = f"""mptlml eval: lm-evaluation-harness with the model 'mptlml' registered.

Every argument is lm-eval's; the model is `--model mptlml`, configured by --model_args:
  pretrained=DIR_OR_ID: a masked LM, or a masked-diffusion LM with mask_token_id=ID
the Monte Carlo estimate (mptlml.compare's; decide=true: multiple choice stopped once
decided; target_se=NATS: a precision):
{_names(_SETTINGS)}
loading (MaskedLM.from_pretrained) and placement:
{_names(("device", *_LOADING))}
LLaDA's (eval_llada.py) and Dream's (eval/eval.py) arguments, with their meaning
(mc_num=N: N masks per request; generation options are refused):
{_names(PEER_ARGUMENTS)}

Example:
  mptlml eval run --model mptlml --model_args pretrained=DIR,decide=true \\
      --tasks TASK --include_path TASKS_DIR --output_path OUT

Each request's Monte Carlo record goes to OUT/mptlml_monte_carlo_<date>.jsonl.
lm-eval's own help follows.
"""


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

    if not args or any(a in ("-h", "--help") for a in args):
        print(HELP)
    out = output_dir(args)
    saved = sys.argv
    MPTLM.default_mc_dir = None if out is None else str(out)
    sys.argv = ["mptlml eval", *args]
    try:
        cli_evaluate()
    finally:
        sys.argv = saved
        MPTLM.default_mc_dir = None
        shutdown_distributed()
    return 0
