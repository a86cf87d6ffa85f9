"""The ``mptlml`` command line: one command per job, from :func:`commands`.

Each user job (:mod:`mptlml.jobs`) becomes a command with one line
(:func:`~.command.job_command`: its settings are its flags); ``reproduce``
(:mod:`.reproduce`), ``report`` (:mod:`.report`) and ``eval`` (:mod:`.evaluate`,
lm-eval's command line) are one module each. A new
command is its module plus one line in :func:`commands`. :func:`main` runs a
command line and turns errors into one line on stderr and an exit code.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence

import click

from .command import configure_output

__all__ = ["app", "commands", "configure_output", "main"]

#: what ``mptlml --help`` opens with
DESCRIPTION = ("Estimate a model's log-marginal likelihood (LML) by masked pre-training (MPT), "
               "and reproduce the paper.")

_EPILOG = ("Run `mptlml COMMAND --help` for a command's flags; `mptlml reproduce NAME "
           "--show-config` lists every setting of a part (change one with --set KEY=VALUE).")


def commands() -> list[click.Command]:
    """Every command of ``mptlml``: one line each."""
    from ..jobs import curve, demo, select
    from .command import job_command
    from .evaluate import evaluate
    from .report import report
    from .reproduce import reproduce

    return [
        job_command("demo", demo.JOB),
        reproduce(),
        job_command("curve", curve.JOB),
        report(),
        job_command("select", select.JOB),
        evaluate(),
    ]


def app() -> click.Group:
    """The ``mptlml`` command group (its commands: :func:`commands`)."""
    from .. import __version__

    @click.group(name="mptlml", help=DESCRIPTION, epilog=_EPILOG,
                 invoke_without_command=True,
                 context_settings={"help_option_names": ["-h", "--help"]})
    @click.version_option(__version__, "--version", prog_name="mptlml",
                          message="%(prog)s %(version)s")
    @click.option("-q", "--quiet", is_flag=True,
                  help="no progress bars and only warnings and errors on stderr (also after "
                       "the command; TQDM_DISABLE=1 turns the bars off too)")
    @click.pass_context
    def group(ctx: click.Context, quiet: bool) -> int:
        if ctx.invoked_subcommand is None:  # bare `mptlml`: the help, like --help
            click.echo(ctx.get_help())
        return 0

    for cmd in commands():
        group.add_command(cmd)
    return group


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mptlml`` command; returns the exit code.

    Bare ``mptlml`` prints the help to stdout and returns 0, like ``mptlml
    --help``; a wrong argument is a usage error with exit code 2, and so is an
    invalid setting or input (one line, ``mptlml: error: ...``). A non-finite
    result fails the run with exit code 1 before anything is written; Ctrl-C
    exits with 130.
    """
    from .._scoring.checkpoints import CheckpointError
    from .._scoring.distributed import shutdown_distributed
    from ..estimators.results import NonFiniteWarning

    args = list(sys.argv[1:] if argv is None else argv)
    ok = False
    try:
        with warnings.catch_warnings():
            # a non-finite result fails the run: nothing is written with NaN cells
            warnings.simplefilter("error", NonFiniteWarning)
            code = app().main(args, prog_name="mptlml", standalone_mode=False)
        ok = True
        return int(code or 0)
    except click.ClickException as exc:  # a usage error: the command line itself is wrong
        exc.show()
        return exc.exit_code
    except (NonFiniteWarning, ValueError, TypeError, OSError, NotImplementedError) as exc:
        # ValueError includes RunDirError (a locked or unusable --out) and CheckpointError;
        # a non-finite result (the model's fault, exit 1) fails the run before anything is kept
        nonfinite = isinstance(exc, NonFiniteWarning)
        tail = " Nothing was written: the run directory (if any) is unchanged." if nonfinite else ""
        if isinstance(exc, CheckpointError):  # the library's advice, said as the CLI's flags
            tail = " On the command line: pass --overwrite to start afresh."
        print(f"mptlml: error: {exc}{tail}", file=sys.stderr)
        return 1 if nonfinite else 2
    except ModuleNotFoundError as exc:
        if "pip install" not in str(exc):  # not a missing extra (mptlml._optional.require)
            raise
        print(f"mptlml: error: {exc}", file=sys.stderr)  # refused up front: nothing written
        return 2
    except (KeyboardInterrupt, click.exceptions.Abort):
        print("mptlml: interrupted; the previous run directory (if any) is unchanged, and "
              "finished checkpoint chunks are kept for --resume.", file=sys.stderr)
        return 130
    finally:
        shutdown_distributed(synchronise=ok)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
