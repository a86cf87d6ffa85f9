"""Parse an ``mptlml`` command line without running it (click's own parsers)."""

from __future__ import annotations

from collections.abc import Sequence

import click

from mptlml.cli import app


def parse(argv: Sequence[str]) -> tuple[click.Context, click.Context | None]:
    """The group's and the command's parsed contexts (``params``) of ``mptlml ARGV``.

    Every flag, choice and argument is checked as ``main`` would, and nothing
    runs: a usage error raises ``click.UsageError``, ``--help`` and
    ``--version`` raise ``click.exceptions.Exit``. The command's context is
    None for a bare ``mptlml [-q]``.
    """
    group = app()
    argv = list(argv)
    ctx = group.make_context("mptlml", argv)
    rest = ctx.args  # after the command's name: the group's options take no values
    name = argv[len(argv) - len(rest) - 1] if len(argv) > len(rest) else "-"
    if name.startswith("-"):  # only the group's options: no command
        return ctx, None
    cmd = group.get_command(ctx, name)
    if cmd is None:
        raise click.UsageError(f"no such command {name!r}", ctx)
    return ctx, cmd.make_context(name, list(rest), parent=ctx)
