"""``inferwire trace``: collect OpenTelemetry spans, and read them back as per-stage tables
(:mod:`inferwire.cli.trace` parses the options).

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

import sys
from pathlib import Path

from inferwire._runtime import arguments, signals
from inferwire._runtime.arguments import CommandError, split_address
from inferwire._runtime.extras import needs_extras

from . import otlp_json, stages


def collect(listen: str, out: Path) -> int:
    """Receives spans on ``listen`` (HOST:PORT) and appends them to ``out`` until SIGINT or
    SIGTERM, then closes the socket and the file: exit status 0."""
    host, port = split_address(listen)
    arguments.check_can_listen(host, port)
    with needs_extras("inferwire trace collect"):
        from .collector import Collector
    try:
        collector = Collector(out, host, port)
    except OSError as exc:
        raise CommandError(f"cannot listen on {host}:{port} or open {out}: {exc}") from None
    try:
        with signals.handled():
            print(
                f"listening on {arguments.authority(*collector.address)} "
                f"endpoint={collector.endpoint}"
            )
            print(f"appending to {out}", flush=True)
            collector.serve_forever()
    except signals.Stopped:
        pass
    finally:
        collector.close()
        print(f"{collector.exports} exports, {collector.spans} spans", file=sys.stderr)
    return 0


def report(file: Path, *, plot: Path | None = None, transport: str | None = None) -> int:
    """Prints the per-stage tables of the spans in ``file`` (only ``transport``'s if given),
    and draws the icicle plot to ``plot`` if given."""
    try:
        spans = otlp_json.read_spans(file)
    except otlp_json.TraceFileError as exc:
        raise CommandError(str(exc)) from None
    except OSError as exc:
        raise CommandError(f"cannot read {file}: {exc.strerror or exc}") from None
    if not spans:
        raise CommandError(f"{file} holds no spans")
    groups = stages.transports(spans)
    if transport is not None:
        if transport not in groups:
            named = ", ".join(sorted(name for name in groups if name)) or "none"
            raise CommandError(f"no trace of {transport} in {file} (it has: {named})")
        spans = groups[transport]
    elif len(groups) > 1:  # one table per transport first, then all of them together
        for name, group in sorted(groups.items()):
            print(f"== {name or 'transport not named'}: ", end="")
            print(stages.text(stages.breakdown(group)), end="\n\n")
        print("== all transports: ", end="")
    result = stages.breakdown(spans)
    print(stages.text(result))
    if plot is not None:
        with needs_extras("plotting the trace"):
            from . import figures

            written = figures.plot(result, plot)
        print(f"wrote {written}")
    return 0
