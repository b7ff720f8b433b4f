"""Where a request's and a token's time goes, from exported spans (``inferwire trace report``).

Spans are joined by trace id: a trace's client ``generate`` span (kind CLIENT) and the server's
(kind SERVER), each with its stage spans as children (the names and attributes of
:mod:`inferwire.transports.tracing`). A trace with one side only counts for that side's stages.

**A request**, to its first token, in the order it meets them: ``client serialize``,
``client dispatch`` (derived: encoded -> the start of ``send``, just before the write call: a
connection taken, with any wait for it, and the protocol's request head built), ``network to
server`` (derived: the start of ``send`` -> the server span's start, the request read whole),
``server parse``, ``queue``, ``compute``, ``server serialize``, ``network back`` (derived: the
start of the server's ``write``, just before its write call -> the first chunk received, the
client's read returned), ``client parse``. Each stage ends where the next begins, so they add up
to the start of ``client serialize`` -> the first chunk decoded.

The network stages run from a stamp the sender took *before* its write call to one the receiver
took *after* its read returned: in causal order, so on one host they are never below zero. The
``send`` and ``write`` spans (the write calls, until they returned) lie inside them and are no
stages here: a write call's return is not in causal order with the peer's read (the woken
reader may run first). The network stages subtract stamps of two processes: on the host's one
monotonic clock where both root spans carry it (``inferwire.monotonic_start_ns``, see the
tracing module), else their UNIX times, each converted by its process's own offset (off by
that offsets' difference); across hosts they mean nothing (:func:`text` marks a median below
zero).

**A token**, every chunk after the first (one token each on the paced simulated service):
``compute`` (the previous chunk written, or encoded when both left in one write, to this one
produced), ``server serialize``, ``network`` (encoded, before the write call, to received:
the write call is in it), ``client parse``.

Each stage: median, P90, P99 (nearest rank), ``share`` (its mean over the sum of the stages'
means: the shares add up to 100 %, as the stages add up to the whole) and the count of values.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from inferwire.transports.tracing import MONOTONIC_START

from .otlp_json import SPAN_KIND_CLIENT, SPAN_KIND_SERVER, Span

ROOT: Final = "generate"
REQUEST_STAGES: Final = (
    "client serialize",
    "client dispatch",
    "network to server",
    "server parse",
    "queue",
    "compute",
    "server serialize",
    "network back",
    "client parse",
)
TOKEN_STAGES: Final = ("compute", "server serialize", "network", "client parse")
DERIVED: Final = ("client dispatch", "network to server", "network back", "network")
"""The stages computed from two spans' stamps; the rest are spans of their own."""
SIDE: Final = {
    "client serialize": "client",
    "client dispatch": "client",
    "network to server": "network",
    "network": "network",
    "server parse": "server",
    "queue": "server",
    "compute": "server",
    "server serialize": "server",
    "network back": "network",
    "client parse": "client",
}
"""Which process (or the wire between them) a stage belongs to: the icicle's middle row."""
NEGATIVE_NOTE: Final = (
    "A median below zero is no duration: its stamps were not on one clock (spans of two hosts, "
    "or roots without inferwire.monotonic_start_ns) or not in causal order."
)


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


def _monotonic(client: Span, server: Span) -> tuple[int, int]:
    """What turns each side's UNIX span times back into the host's monotonic clock: exact
    across the two processes where both roots carry :data:`MONOTONIC_START`; else (0, 0), the
    UNIX times as they are."""
    client_start = client.attributes.get(MONOTONIC_START)
    server_start = server.attributes.get(MONOTONIC_START)
    if isinstance(client_start, int) and isinstance(server_start, int):
        return client_start - client.start_ns, server_start - server.start_ns
    return 0, 0


def _request_stages(
    trace: list[Span], client: Span | None, server: Span | None, out: dict[str, list[int]]
) -> None:
    stages = {**_children(trace, client), **_children(trace, server)}
    for name, span in stages.items():
        if name in SIDE and name not in DERIVED:
            out[name].append(span.duration_ns)
    serialize, send = stages.get("client serialize"), stages.get("send")
    if serialize is not None and send is not None:
        out["client dispatch"].append(send.start_ns - serialize.end_ns)
    if client is None or server is None:
        return
    client_clock, server_clock = _monotonic(client, server)
    before_send = _before_write(stages, "send", "client serialize")
    if before_send is not None:
        out["network to server"].append(
            (server.start_ns + server_clock) - (before_send + client_clock)
        )
    before_write = _before_write(stages, "write", "server serialize")
    received = _ints(client, "inferwire.chunk.received_ns")
    if before_write is not None and received:
        out["network back"].append(
            (client.start_ns + received[0] + client_clock) - (before_write + server_clock)
        )


def _before_write(stages: dict[str, Span], call: str, encode: str) -> int | None:
    """Just before a side's write call: where the span of the call starts, else (none) where
    the encode before it ended; None without either."""
    if call in stages:
        return stages[call].start_ns
    return stages[encode].end_ns if encode in stages else None


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
    received = _ints(client, "inferwire.chunk.received_ns")
    parse = _ints(client, "inferwire.chunk.parse_ns")
    for i in range(1, min(len(received), len(parse))):
        out["client parse"].append(parse[i])
    if client is not None and server is not None:
        client_clock, server_clock = _monotonic(client, server)
        client_start = client.start_ns + client_clock
        server_start = server.start_ns + server_clock
        for i in range(1, min(count, len(received))):
            out["network"].append((client_start + received[i]) - (server_start + encoded[i]))


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
                + ("  < 0: not a duration" if row.median_ns < 0 else "")
            )
        total = sum(row.mean_ns for row in rows)
        lines.append(f"  {'sum of the means':<20}{total / 1e6:>11.3f}")
    if any(row.median_ns < 0 for row in (*result.request, *result.token)):
        lines += ["", NEGATIVE_NOTE]
    return "\n".join(lines)
