"""``inferwire trace``: collect OpenTelemetry spans, and read them back as per-stage tables.

    inferwire trace collect --listen 127.0.0.1:4318 --out spans.jsonl
    inferwire serve --transport http2 --trace --decode-ms 1
    inferwire load --transport http2 --address HOST:PORT --trace --rate 20 --duration 10
    inferwire trace report spans.jsonl --plot where.png

``collect`` is a small OTLP/HTTP receiver (:mod:`.collector`) that appends each export to a file
as a line of OTLP JSON, the format of the OpenTelemetry Collector's file exporter, so
``report`` reads either's files. ``report`` joins client and server spans by trace id and
prints where a request's time to its first token goes, and a token's (:mod:`.stages`); with
``--plot``, draws both as an icicle (:mod:`.figures`).
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Final

from inferwire._runtime import arguments
from inferwire._runtime.arguments import CommandError, Commands, split_address
from inferwire._runtime.extras import needs_extras

from . import otlp_json, stages

DESCRIPTION: Final = """\
Collect OpenTelemetry spans (`collect`: an OTLP/HTTP receiver writing OTLP JSON lines) and
turn them into per-stage tables and an icicle plot (`report FILE`): where a request's time to
its first token goes (client serialize, send, network, server parse, queue, compute, server
serialize, write, network, client parse) and where a token's goes. Spans come from `inferwire
serve --trace` and `inferwire load --trace`."""


def _collect(args: argparse.Namespace) -> int:
    host, port = split_address(args.listen)
    arguments.check_can_listen(host, port)
    with needs_extras("inferwire trace collect"):
        from .collector import Collector
    try:
        collector = Collector(args.out, host, port)
    except OSError as exc:
        raise CommandError(f"cannot listen on {host}:{port} or open {args.out}: {exc}") from None
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"listening on {arguments.authority(*collector.address)} endpoint={collector.endpoint}")
    print(f"appending to {args.out}", flush=True)
    try:
        collector.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        collector.close()
        print(f"{collector.exports} exports, {collector.spans} spans", file=sys.stderr)
    return 0


def _report(args: argparse.Namespace) -> int:
    try:
        spans = otlp_json.read_spans(args.file)
    except otlp_json.TraceFileError as exc:
        raise CommandError(str(exc)) from None
    except OSError as exc:
        raise CommandError(f"cannot read {args.file}: {exc.strerror or exc}") from None
    if not spans:
        raise CommandError(f"{args.file} holds no spans")
    groups = stages.transports(spans)
    if args.transport is not None:
        if args.transport not in groups:
            named = ", ".join(sorted(name for name in groups if name)) or "none"
            raise CommandError(f"no trace of {args.transport} in {args.file} (it has: {named})")
        spans = groups[args.transport]
    elif len(groups) > 1:  # one table per transport first, then all of them together
        for name, group in sorted(groups.items()):
            print(f"== {name or 'transport not named'}: ", end="")
            print(stages.text(stages.breakdown(group)), end="\n\n")
        print("== all transports: ", end="")
    result = stages.breakdown(spans)
    print(stages.text(result))
    if args.plot is not None:
        with needs_extras("plotting the trace"):
            from . import figures

            written = figures.plot(result, args.plot)
        print(f"wrote {written}")
    return 0


def add_commands(commands: Commands) -> None:
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
