"""``inferwire trace``: its options; what it does is :mod:`inferwire.observe.traces.command`'s."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Final

from inferwire._runtime import arguments
from inferwire._runtime.arguments import Commands
from inferwire.observe.traces import command

DESCRIPTION: Final = """\
Collect OpenTelemetry spans (`collect`: an OTLP/HTTP receiver writing OTLP JSON lines) and
turn them into per-stage tables and an icicle plot (`report FILE`): where a request's time to
its first token goes (client serialize, send, network, server parse, queue, compute, server
serialize, write, network, client parse) and where a token's goes. Spans come from `inferwire
serve --trace` and `inferwire load --trace`."""


def _collect(args: argparse.Namespace) -> int:
    return command.collect(args.listen, args.out)


def _report(args: argparse.Namespace) -> int:
    return command.report(args.file, plot=args.plot, transport=args.transport)


def add_commands(commands: Commands) -> None:
    """``trace collect`` and ``trace report``."""
    trace = commands.add_parser(
        "trace",
        help="collect OpenTelemetry spans; per-stage tables and an icicle plot from them",
        description=DESCRIPTION,
    )
    sub = trace.add_subparsers(dest="trace_command", required=True, metavar="COMMAND")
    collect = sub.add_parser(
        "collect",
        help="an OTLP/HTTP receiver appending the spans it gets to a file",
        description=(
            "Receives OTLP/HTTP protobuf exports on POST /v1/traces and appends each to --out "
            "as one line of OTLP JSON (the OpenTelemetry Collector's file exporter format), "
            "until SIGINT or SIGTERM. The first line on stdout is 'listening on HOST:PORT "
            "endpoint=URL'."
        ),
    )
    collect.add_argument(
        "--listen",
        type=arguments.listen_address,
        default="127.0.0.1:4318",
        help="HOST:PORT to listen on (4318: OTLP/HTTP's port; 0: any free port)",
    )
    collect.add_argument("--out", type=Path, required=True, help="the file to append to")
    collect.set_defaults(run=_collect)
    report = sub.add_parser(
        "report",
        help="per-stage tables (and an icicle plot) from a file of spans",
        description=(
            "Reads a file of OTLP JSON lines (from `inferwire trace collect` or an "
            "OpenTelemetry Collector's file exporter), joins client and server spans by trace "
            "id and prints, per stage of a request and of a token, the median, P90, P99, its "
            "share of the whole and the count."
        ),
    )
    report.add_argument("file", type=Path, help="OTLP JSON lines, one export a line")
    report.add_argument("--plot", type=Path, metavar="PNG", help="draw the icicle plot here")
    report.add_argument(
        "--transport",
        help="only the traces of this transport (default: each transport's tables, then all)",
    )
    report.set_defaults(run=_report)
