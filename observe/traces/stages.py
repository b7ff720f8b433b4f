"""Where a request's and a token's time goes, from exported spans (``inferwire trace report``).

Spans are joined by trace id: a trace's client ``generate`` span (kind CLIENT) and the server's
(kind SERVER), each with its stage spans as children (the names and attributes of
:mod:`inferwire.transports.tracing`). A trace with one side only counts for that side's stages.

**A request**, to its first token, in the order it meets them: ``client serialize``, ``send``,
``network to server`` (derived: the server span's start - the end of ``send``), ``server
parse``, ``queue``, ``compute``, ``server serialize``, ``write``, ``network back`` (derived: the
first chunk received by the client - written by the server), ``client parse``. The two network
stages subtract stamps of two processes: meaningful on one host (one clock, converted to UNIX
time by each process's own offset, see the tracing module), not across hosts. "Written" is when
the server's write call returned, so on loopback, with the client on another core, the client
may have the bytes first: ``network back`` can be a little below zero.

**A token**, every chunk after the first (one token each on the paced simulated service):
``compute`` (the previous chunk written, or encoded when both left in one write, to this one
produced), ``server serialize``, ``write``, ``network`` (written to received), ``client
parse``.

Each stage: median, P90, P99 (nearest rank), ``share`` (its mean over the sum of the stages'
means: the shares add up to 100 %, as the stages add up to the whole) and the count of values.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from .otlp_json import SPAN_KIND_CLIENT, SPAN_KIND_SERVER, Span

ROOT: Final = "generate"
REQUEST_STAGES: Final = (
    "client serialize",
    "send",
    "network to server",
    "server parse",
    "queue",
    "compute",
    "server serialize",
    "write",
    "network back",
    "client parse",
)
TOKEN_STAGES: Final = ("compute", "server serialize", "write", "network", "client parse")
SIDE: Final = {
    "client serialize": "client",
    "send": "client",
    "network to server": "network",
    "network": "network",
    "server parse": "server",
    "queue": "server",
    "compute": "server",
    "server serialize": "server",
    "write": "server",
    "network back": "network",
    "client parse": "client",
}
"""Which process (or the wire between them) a stage belongs to: the icicle's middle row."""


@dataclass(frozen=True, slots=True)
class StageRow:
    stage: str
    median_ns: float
    p90_ns: float
    p99_ns: float
    mean_ns: float
    share: float
    count: int


@dataclass(frozen=True, slots=True)
class Breakdown:
    """The per-stage tables of one trace file."""

    traces: int
    joined: int
    """Traces with both a client and a server ``generate`` span."""
    parented: int
    """Joined traces whose server span's parent is the client's span."""
    request: list[StageRow]
    token: list[StageRow]


def _rows(values: dict[str, list[int]], order: Sequence[str]) -> list[StageRow]:
    present = [name for name in order if values.get(name)]
    means = {name: float(np.mean(values[name])) for name in present}
    total = sum(means.values())
    rows = []
    for name in present:
        array = np.asarray(values[name], dtype=np.float64)
        p50, p90, p99 = np.percentile(array, [50, 90, 99], method="inverted_cdf")
        share = means[name] / total if total > 0 else 0.0
        rows.append(StageRow(name, p50, p90, p99, means[name], share, len(array)))
    return rows


def breakdown(spans: Iterable[Span]) -> Breakdown:
    """The request and token tables of ``spans`` (see the module docstring)."""
    by_trace: dict[str, list[Span]] = defaultdict(list)
    for span in spans:
        by_trace[span.trace_id].append(span)
    request: dict[str, list[int]] = defaultdict(list)
    token: dict[str, list[int]] = defaultdict(list)
    joined = parented = 0
    for trace in by_trace.values():
        client = _root(trace, SPAN_KIND_CLIENT)
        server = _root(trace, SPAN_KIND_SERVER)
        if client is not None and server is not None:
            joined += 1
            parented += server.parent_span_id == client.span_id
        _request_stages(trace, client, server, request)
        _token_stages(client, server, token)
    return Breakdown(
        traces=len(by_trace),
        joined=joined,
        parented=parented,
        request=_rows(request, REQUEST_STAGES),
        token=_rows(token, TOKEN_STAGES),
    )


def transports(spans: Iterable[Span]) -> dict[str, list[Span]]:
    """The spans by the transport their trace's root spans name (``inferwire.transport``;
    ``""`` for a trace whose roots name none)."""
    by_trace: dict[str, list[Span]] = defaultdict(list)
    for span in spans:
        by_trace[span.trace_id].append(span)
    groups: dict[str, list[Span]] = defaultdict(list)
    for trace in by_trace.values():
        names = {
            str(s.attributes.get("inferwire.transport", ""))
            for s in trace
            if s.name == ROOT and s.kind in (SPAN_KIND_CLIENT, SPAN_KIND_SERVER)
        }
        groups[max(names, default="")] += trace
    return dict(groups)


def _root(trace: list[Span], kind: int) -> Span | None:
    return next((s for s in trace if s.name == ROOT and s.kind == kind), None)


def _children(trace: list[Span], root: Span | None) -> dict[str, Span]:
    if root is None:
        return {}
    return {s.name: s for s in trace if s.parent_span_id == root.span_id and s.name != ROOT}


def _ints(span: Span | None, name: str) -> list[int]:
    """A per-chunk attribute: comma-separated integers (or an integer array, as another
    tracer might record it); empty if absent or not numbers."""
    value = None if span is None else span.attributes.get(name)
    try:
        if isinstance(value, str):
            return [int(v) for v in value.split(",")] if value else []
        if isinstance(value, list):
            return [int(v) for v in value]
    except (TypeError, ValueError):
        pass
    return []


def _request_stages(
    trace: list[Span], client: Span | None, server: Span | None, out: dict[str, list[int]]
) -> None:
    stages = {**_children(trace, client), **_children(trace, server)}
    for name, span in stages.items():
        if name in SIDE and name not in ("network to server", "network back"):
            out[name].append(span.duration_ns)
    send = stages.get("send")
    if send is not None and server is not None:
        out["network to server"].append(server.start_ns - send.end_ns)
    write = stages.get("write")
    received = _ints(client, "inferwire.chunk.received_ns")
    if write is not None and client is not None and received:
        out["network back"].append(client.start_ns + received[0] - write.end_ns)


def _token_stages(client: Span | None, server: Span | None, out: dict[str, list[int]]) -> None:
    produced = _ints(server, "inferwire.chunk.produced_ns")
    serialize = _ints(server, "inferwire.chunk.serialize_ns")
    write = _ints(server, "inferwire.chunk.write_ns")
    count = min(len(produced), len(serialize), len(write))
    encoded = [produced[i] + serialize[i] for i in range(count)]
    written = [encoded[i] + write[i] for i in range(count)]
    for i in range(1, count):
        # a chunk produced after the previous write had returned waited for the model; one
        # produced before it left in the same write, right after the previous one's encode
        previous = written[i - 1] if produced[i] >= written[i - 1] else encoded[i - 1]
        out["compute"].append(produced[i] - previous)
        out["server serialize"].append(serialize[i])
        out["write"].append(write[i])
    received = _ints(client, "inferwire.chunk.received_ns")
    parse = _ints(client, "inferwire.chunk.parse_ns")
    for i in range(1, min(len(received), len(parse))):
        out["client parse"].append(parse[i])
    if client is not None and server is not None:
        for i in range(1, min(count, len(received))):
            out["network"].append((client.start_ns + received[i]) - (server.start_ns + written[i]))


def text(result: Breakdown) -> str:
    """The two tables, as ``inferwire trace report`` prints them."""
    lines = [
        f"{result.traces} traces, {result.joined} with client and server spans "
        f"({result.parented} of them parented across the processes)",
    ]
    for title, rows in (
        ("a request, to its first token", result.request),
        ("a token (every chunk after the first)", result.token),
    ):
        lines += ["", title]
        if not rows:
            lines.append("  (no spans of these stages)")
            continue
        lines.append(
            f"  {'stage':<20}{'median ms':>11}{'P90 ms':>10}{'P99 ms':>10}{'share':>8}{'count':>9}"
        )
        for row in rows:
            lines.append(
                f"  {row.stage:<20}{row.median_ns / 1e6:>11.3f}{row.p90_ns / 1e6:>10.3f}"
                f"{row.p99_ns / 1e6:>10.3f}{row.share:>8.1%}{row.count:>9}"
            )
        total = sum(row.mean_ns for row in rows)
        lines.append(f"  {'sum of the means':<20}{total / 1e6:>11.3f}")
    return "\n".join(lines)
