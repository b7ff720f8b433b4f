"""The ``inferwire`` command: every subcommand's options are in one module of this package
(:mod:`.bench`: ``bench``, ``report``; :mod:`.serve`: ``serve``, ``proxy``; :mod:`.engine`;
:mod:`.watch`; :mod:`.load`: ``load``, ``load-report``; :mod:`.trace`), each calling its
layer's function.

Ordinary mistakes are one line on stderr and exit status 2 (:mod:`inferwire._runtime.arguments`).
On a base install (no extras) ``--help`` works, and a subcommand whose libraries are missing
says which extra installs them.

A subcommand's module is imported only when it is needed: ``inferwire serve ...`` imports
the server's and nothing of the load generator's or the bench's, so a server that a
benchmark starts as a child (``python -m inferwire.cli serve``) starts as fast as one started
from its own module.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Final

from inferwire._runtime import extras
from inferwire._runtime.arguments import Commands, Parser, run

DESCRIPTION: Final = """\
How much of your inference latency is serialization and transport: benchmarks of codecs and
transports for AI serving, and the servers, proxy and load generator they use."""

GROUPS: Final = (
    # (module of inferwire.cli, its subcommands, what it needs when the base install has not
    # all of it: what the missing-extra message names, the summary its stub shows, the extra
    # that installs it), in --help's order
    ("bench", ("bench", "report"), None),
    ("serve", ("serve", "proxy"), None),
    ("engine", ("engine",), ("the engine", "the simulated engine behind ZeroMQ", "engine")),
    ("watch", ("watch",), None),
    (
        "load",
        ("load", "load-report"),
        ("the load generator", "open-loop load against one server", "bench"),
    ),
    ("trace", ("trace",), None),
)


def _unavailable(
    commands: Commands, name: str, summary: str, missing: extras.MissingExtraError
) -> None:
    """``name`` as a subcommand that only says which extra it needs."""

    def refuse(args: argparse.Namespace) -> int:
        raise missing

    unavailable = commands.add_parser(
        name, help=f"{summary} (needs inferwire[{missing.extra}])", description=str(missing)
    )
    unavailable.set_defaults(run=refuse, any_arguments=True)


def _add_group(commands: Commands, module: str, needs: tuple[str, str, str] | None) -> None:
    if needs is None:
        importlib.import_module(f"inferwire.cli.{module}").add_commands(commands)
        return
    what, summary, extra = needs
    try:
        with extras.needs_extras(what):
            group = importlib.import_module(f"inferwire.cli.{module}")
    except extras.MissingExtraError as missing:
        # the extra of the whole command, not of whichever of its libraries was met first
        _unavailable(
            commands, module, summary, extras.MissingExtraError(what, missing.name or "", extra)
        )
    else:
        group.add_commands(commands)


def build_parser(command: str | None = None) -> Parser:
    """The ``inferwire`` command's parser: with ``command`` one of its subcommands, that
    subcommand's group only (the others' modules are not imported); else every subcommand."""
    parser = Parser(prog="inferwire", description=DESCRIPTION)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    groups = [group for group in GROUPS if command in group[1]] or GROUPS
    for module, _, needs in groups:
        _add_group(commands, module, needs)
    return parser


def _command(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names (the top level has no option that takes a value)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    return run(build_parser(_command(arguments)), arguments)


if __name__ == "__main__":
    sys.exit(main())
