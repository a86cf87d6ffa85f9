"""``mptlml eval``: lm-evaluation-harness's command line with the ``mptlml`` model registered.

Every argument after ``eval`` is lm-eval's own (``--model mptlml``,
``--model_args``, ``--tasks``, ``--include_path``, ``--output_path``, ...), passed
through unchanged to :func:`mptlml.lm_eval.main`; ``mptlml eval --help`` prints
the model's ``--model_args`` (:data:`mptlml.lm_eval.command.HELP`), then lm-eval's
help. ``python -m mptlml.lm_eval`` is the same command.
"""

from __future__ import annotations

import click

from .._optional import require

__all__ = ["evaluate"]


def evaluate() -> click.Command:
    """The ``eval`` command: lm-eval's arguments, untouched."""

    @click.command(name="eval", add_help_option=False,
                   context_settings={"ignore_unknown_options": True,
                                     "allow_extra_args": True, "allow_interspersed_args": False},
                   short_help="run lm-evaluation-harness tasks with the model 'mptlml'",
                   help="Run lm-evaluation-harness with the model 'mptlml' registered: every "
                        "argument is lm-eval's (`mptlml eval --help` prints the model's "
                        "--model_args, then lm-eval's help). "
                        "Needs the lm-eval extra.")
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def command(args: tuple[str, ...]) -> int:
        try:
            require("lm_eval", "mptlml eval (the lm-evaluation-harness command line)")
        except ModuleNotFoundError as exc:
            raise click.UsageError(str(exc)) from exc
        from ..lm_eval import main

        return main(list(args))

    return command
