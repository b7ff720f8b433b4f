"""OpenTelemetry spans of a token stream's stages, on both sides (opt-in: ``--trace``).

Nothing here imports OpenTelemetry until :meth:`Tracer.open` is called, so a server or a load
run without ``--trace`` never loads it, and its only per-request work is one ``tracer is None``
check (a server's ``tracer`` attribute, a client's ``timing``).

**Export.** The OTel SDK: one ``TracerProvider`` per process (not installed as the global one),
a ``BatchSpanProcessor`` (spans leave in batches from its thread, never on the event loop) and
the OTLP/HTTP protobuf exporter. Endpoint: ``--trace-endpoint``, else the standard
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, else ``OTEL_EXPORTER_OTLP_ENDPOINT`` + ``/v1/traces``,
else ``http://127.0.0.1:4318/v1/traces``. ``service.name`` is ``inferwire-server`` or
``inferwire-load``. :meth:`Tracer.close` flushes what is queued.

**Clocks.** The stamps are the transports' own (``time.monotonic_ns``, see
:mod:`.timing`): spans are built from them after the fact, each converted to UNIX ns by one
offset taken when the tracer opens (``time.time_ns() - time.monotonic_ns()``). Durations within
a process are exact; between two processes of one host the offsets differ (by the time between
the two calls, and by any step of the wall clock between the two processes' starts), so each
root span also carries its start on the host's monotonic clock
(:data:`MONOTONIC_START`), and the derived network stages subtract those: exact on one host,
with no offset in them. Across hosts, only each side's own stages mean anything.

**Context.** The client's ``generate`` span (kind CLIENT) is the parent of the server's
(kind SERVER), carried as a W3C ``traceparent``: an HTTP/1.1 or HTTP/2 request header, gRPC
metadata, and on ``tcp`` a ``"traceparent"`` field of the request's JSON object (the request
format is a JSON object, so it has room; servers ignore fields they do not know). Not traced:
unary ``infer``, non-streamed HTTP answers, gRPC ``Session`` (one call carries many
requests, and metadata only comes once per call).

**Spans.** A request's path to its first token is one span per stage; the tokens after it are
aggregated into per-chunk arrays on the root span, so that where a token's time goes is
answerable for every token without a span per token (hundreds per request, which the exporter
could not keep up with at 1 ms a token).

Server (``inferwire-server``), ``generate`` (SERVER, from the request received whole to the
last byte written) with children, in order:

====================  =================================================================
``server parse``      request received whole -> parsed and checked (the service's ``open``)
``queue``             parsed -> the stream's first turn (handler scheduled, headers sent)
``compute``           -> first chunk produced (the prefill, on the simulated service)
``server serialize``  -> first chunk encoded
``write``             -> its bytes written (the write, or the flow-control wait, returned)
====================  =================================================================

Client (``inferwire-load``, or any process that opens a tracer), ``generate`` (CLIENT, from
before the request is built to the stream's end, its end marker read and checked) with
``client serialize`` (the request encoded), ``send`` (the write call: from just before it, the
connection in hand, to its return), ``client parse`` (the first chunk's bytes received ->
decoded).

**The network stages** are derived by ``inferwire trace report`` from stamps in causal order
(:mod:`.timing`): *network to server* from the start of ``send`` (before the client's write
call) to the server span's start (the server had read the whole request), *network back* from
the start of ``write`` (before the server's write call) to the first chunk received (the
client's read returned). The bytes cannot arrive before the write began, so on one host
neither is below zero. ``send`` and ``write`` lie inside them: a write call's return is not in
causal order with the peer's read (the woken reader may run before the writer is back), so
those two spans are shown as the calls they are, not as stages that add up.

The server's root span also carries vLLM's latency attributes (``vllm/tracing.py``'s
``SpanAttributes``, seconds, as vLLM sets them on its request span), from the request's stamps
(:mod:`~inferwire.transports.request_stamps`: the engine's with ``--engine``, else the
simulated service's), those it reached: ``gen_ai.latency.time_in_queue``,
``gen_ai.latency.time_in_model_prefill``, ``gen_ai.latency.time_in_model_decode``,
``gen_ai.latency.time_in_model_inference``, ``gen_ai.latency.time_to_first_token`` and
``gen_ai.latency.e2e`` (from the request received to the frontend holding its first and its
last token), with ``gen_ai.response.model`` and, on the OpenAI API, ``gen_ai.request.id`` (the
response's ``id``).

Root attributes: ``inferwire.transport``, ``inferwire.codec``, ``inferwire.workload``,
``inferwire.chunks``, ``inferwire.outcome`` (``ok``, ``cancelled``, ``error``),
``inferwire.monotonic_start_ns`` (see *Clocks*), and per chunk
(at most :data:`MAX_TRACED_CHUNKS`, in stream order; each a string of comma-separated decimal
integers, ns, not an OTel integer array: the SDK checks and the OTLP encoder builds an object
for every element of an array, and three arrays of 64 cost some 470 us a span to record and
encode where three strings cost 90 us): on the server,
``inferwire.chunk.produced_ns`` (offset from the span's start), ``inferwire.chunk.serialize_ns``,
``inferwire.chunk.write_ns``; on the client, ``inferwire.chunk.received_ns`` (offset from the
span's start) and ``inferwire.chunk.parse_ns``. ``inferwire trace report`` joins the two by
trace id and chunk index: per token, compute (the previous chunk written to this one
produced), server serialize, network (encoded, before the write call, to received) and client
parse (:mod:`inferwire.observe.traces.stages`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from inferwire._runtime.extras import needs_extras

from .request_stamps import RequestStamps
from .timing import ServerStamps, StreamTiming, now_ns

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

DEFAULT_ENDPOINT: Final = "http://127.0.0.1:4318/v1/traces"
SERVER_SERVICE: Final = "inferwire-server"
CLIENT_SERVICE: Final = "inferwire-load"
MAX_TRACED_CHUNKS: Final = 4096
"""Most chunks whose stamps one span carries (a 4096-element array is some 20 KB of OTLP)."""
ROOT: Final = "generate"
MONOTONIC_START: Final = "inferwire.monotonic_start_ns"
"""A root span's attribute: its start on the host's CLOCK_MONOTONIC (ns), for stages derived
across two processes of one host without their UNIX offsets."""
SERVER_STAGES: Final = ("server parse", "queue", "compute", "server serialize", "write")
CLIENT_STAGES: Final = ("client serialize", "send", "client parse")
GEN_AI_LATENCY: Final = {
    "queue": "gen_ai.latency.time_in_queue",
    "prefill": "gen_ai.latency.time_in_model_prefill",
    "decode": "gen_ai.latency.time_in_model_decode",
    "inference": "gen_ai.latency.time_in_model_inference",
    "ttft": "gen_ai.latency.time_to_first_token",
    "e2e": "gen_ai.latency.e2e",
}
"""vLLM's span attribute of each interval of :meth:`RequestStamps.intervals_s`."""


def default_endpoint(environ: Mapping[str, str] = os.environ) -> str:
    """The OTLP/HTTP traces URL the OpenTelemetry environment variables name, else the
    collector's default on loopback (the OTLP exporter specification's order)."""
    traces = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if traces:
        return traces
    base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if base:
        return base.rstrip("/") + "/v1/traces"
    return DEFAULT_ENDPOINT


class Tracer:
    """One process's span export; :meth:`open` it, :meth:`close` it on shutdown."""

    def __init__(self, provider: TracerProvider, endpoint: str, attributes: Mapping[str, str]):
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._trace = trace
        self._propagator = TraceContextTextMapPropagator()
        self.provider = provider
        self.endpoint = endpoint
        self.otel = provider.get_tracer("inferwire")
        self.attributes = dict(attributes)
        """Set on every root span (transport, codec)."""
        self.epoch_offset_ns = time.time_ns() - time.monotonic_ns()
        self.loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def open(cls, service_name: str, endpoint: str | None = None, **attributes: str) -> Tracer:
        """A tracer exporting to ``endpoint`` (None: :func:`default_endpoint`). Raises
        :class:`~inferwire.transports.MissingExtraError` without the ``trace`` extra."""
        with needs_extras("--trace"):
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        url = endpoint or default_endpoint()
        provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
        return cls(provider, url, {f"inferwire.{k}": v for k, v in attributes.items()})

    def close(self) -> None:
        """Export what is queued, then stop (the provider's shutdown flushes)."""
        self.provider.shutdown()

    def flush(self, timeout_ms: int = 30_000) -> bool:
        return self.provider.force_flush(timeout_ms)

    def unix_ns(self, monotonic_ns: int) -> int:
        return monotonic_ns + self.epoch_offset_ns

    # -- server -------------------------------------------------------------------------

    def server_request(
        self,
        traceparent: object,
        received_ns: int,
        stamps: ServerStamps | None,
        workload: str,
        request_stamps: RequestStamps | None = None,
        request_id: str = "",
    ) -> ServerTrace:
        """A stream the server is about to send: its stamps (``stamps``, the ones the client
        asked for, or new ones), and :meth:`ServerTrace.frames` to wrap its pieces with;
        ``request_stamps`` give the span vLLM's latency attributes, ``request_id`` its
        ``gen_ai.request.id``."""
        trace = ServerTrace(self, traceparent, received_ns, stamps, workload)
        trace.request_stamps = request_stamps
        trace.request_id = request_id
        return trace

    def _context(self, traceparent: object) -> Any:
        """The parent a ``traceparent`` names; None (a new trace) for none, or one that is
        not a string (the propagator drops a malformed one the same way)."""
        if not isinstance(traceparent, str) or not traceparent:
            return None
        return self._propagator.extract({"traceparent": traceparent})

    def _span(
        self, name: str, parent: Any, start_ns: int, end_ns: int, kind: Any = None, **kw: Any
    ) -> Any:
        span = self.otel.start_span(
            name,
            context=parent,
            kind=kind if kind is not None else self._trace.SpanKind.INTERNAL,
            start_time=self.unix_ns(start_ns),
            **kw,
        )
        span.end(end_time=self.unix_ns(max(end_ns, start_ns)))
        return span

    def _stages(self, root: Any, names: Sequence[str], stamps: Sequence[int]) -> None:
        """A child span of ``root`` per stage between consecutive ``stamps`` (0: unknown, the
        stage and the next are left out)."""
        parent = self._trace.set_span_in_context(root)
        for i, name in enumerate(names):
            start, end = stamps[i], stamps[i + 1]
            if start and end:
                self._span(name, parent, start, end)

    def _export_server(self, trace: ServerTrace, started_ns: int, end_ns: int) -> None:
        stamps = trace.stamps
        received, parsed = stamps.request_ns
        rows = stamps.rows[:MAX_TRACED_CHUNKS]
        attributes: dict[str, Any] = {
            **self.attributes,
            "inferwire.workload": trace.workload,
            "inferwire.chunks": len(stamps.rows),
            "inferwire.outcome": trace.outcome,
            MONOTONIC_START: received,
        }
        if rows:
            attributes["inferwire.chunk.produced_ns"] = _packed(p - received for p, _, _ in rows)
            attributes["inferwire.chunk.serialize_ns"] = _packed(e - p for p, e, _ in rows)
            attributes["inferwire.chunk.write_ns"] = _packed(w - e for _, e, w in rows)
        request_stamps = trace.request_stamps
        if request_stamps is not None:
            for interval, seconds in request_stamps.intervals_s(received).items():
                attributes[GEN_AI_LATENCY[interval]] = seconds
            if request_stamps.model:
                attributes["gen_ai.response.model"] = request_stamps.model
        if trace.request_id:
            attributes["gen_ai.request.id"] = trace.request_id
        root = self.otel.start_span(
            ROOT,
            context=self._context(trace.traceparent),
            kind=self._trace.SpanKind.SERVER,
            start_time=self.unix_ns(received),
            attributes=attributes,
        )
        first = rows[0] if rows else (0, 0, 0)
        self._stages(root, SERVER_STAGES, (received, parsed, started_ns, *first))
        if trace.outcome != "ok":
            root.set_status(self._trace.Status(self._trace.StatusCode.ERROR, trace.outcome))
        root.end(end_time=self.unix_ns(end_ns))

    # -- client -------------------------------------------------------------------------

    def client_request(self, workload: str) -> ClientTrace:
        """A request about to be sent: pass ``trace.timing`` to the client's ``generate``
        (it carries the ``traceparent`` and asks the server for no stamps), then
        :meth:`ClientTrace.finish`."""
        start_ns = now_ns()
        root = self.otel.start_span(
            ROOT,
            kind=self._trace.SpanKind.CLIENT,
            start_time=self.unix_ns(start_ns),
            attributes={
                **self.attributes,
                "inferwire.workload": workload,
                MONOTONIC_START: start_ns,
            },
        )
        context = root.get_span_context()
        traceparent = f"00-{context.trace_id:032x}-{context.span_id:016x}-01"
        timing = StreamTiming(traceparent=traceparent, server_stamps=False)
        return ClientTrace(self, root, timing, start_ns)

    def _export_client(self, trace: ClientTrace, outcome: str, end_ns: int) -> None:
        timing, root = trace.timing, trace.root
        start = timing.request_start_ns
        received = timing.received_ns[:MAX_TRACED_CHUNKS]
        decoded = timing.decoded_ns[:MAX_TRACED_CHUNKS]
        root.set_attribute("inferwire.chunks", len(timing.received_ns))
        root.set_attribute("inferwire.outcome", outcome)
        if received:
            start = trace.start_ns
            parse = zip(received, decoded, strict=True)
            root.set_attribute("inferwire.chunk.received_ns", _packed(r - start for r in received))
            root.set_attribute("inferwire.chunk.parse_ns", _packed(d - r for r, d in parse))
        encoded = timing.request_encoded_ns
        self._stages(root, CLIENT_STAGES[:1], (start, encoded))
        # the write call: inside "network to server", which starts where it starts
        self._stages(
            root, CLIENT_STAGES[1:2], (timing.request_write_ns or encoded, timing.request_sent_ns)
        )
        if received:
            self._stages(root, CLIENT_STAGES[2:], (received[0], decoded[0]))
        if outcome != "ok":
            root.set_status(self._trace.Status(self._trace.StatusCode.ERROR, outcome))
        root.end(end_time=self.unix_ns(end_ns))


def _packed(values: Iterable[int]) -> str:
    """Per-chunk values as one attribute: decimal integers, comma-separated."""
    return ",".join(map(str, values))


class ServerTrace:
    """One stream's trace on the server: the transport sends the pieces of :meth:`frames`,
    whose stamps are :attr:`stamps`."""

    __slots__ = (
        "outcome",
        "request_id",
        "request_stamps",
        "stamps",
        "traceparent",
        "tracer",
        "workload",
    )

    def __init__(
        self,
        tracer: Tracer,
        traceparent: object,
        received_ns: int,
        stamps: ServerStamps | None,
        workload: str,
    ) -> None:
        self.tracer = tracer
        self.traceparent = traceparent
        self.workload = workload
        if stamps is None:
            stamps = ServerStamps(received_ns)
            stamps.parsed()
        self.stamps = stamps
        self.outcome = "cancelled"
        self.request_stamps: RequestStamps | None = None
        self.request_id = ""

    async def frames(self, pieces: AsyncGenerator[bytes, None]) -> AsyncGenerator[bytes, None]:
        """``pieces`` as they are; each one's bytes are counted written when the transport
        asks for the next (it does so once its write returned). The spans are built on the
        loop's next turn, after the transport's last write, not before it."""
        stamps = self.stamps
        started_ns = now_ns()
        try:
            async with contextlib.aclosing(pieces):
                async for piece in pieces:
                    yield piece
                    stamps.written()
            self.outcome = "ok"
        except Exception:
            self.outcome = "error"
            raise
        finally:
            end_ns = now_ns()
            with contextlib.suppress(RuntimeError):  # no loop: the process is ending
                asyncio.get_running_loop().call_soon(
                    self.tracer._export_server, self, started_ns, end_ns
                )


class ClientTrace:
    """One request's trace on the client: ``timing`` goes to ``generate``; :meth:`finish`
    once the stream ended (or failed)."""

    __slots__ = ("root", "start_ns", "timing", "tracer")

    def __init__(self, tracer: Tracer, root: Any, timing: StreamTiming, start_ns: int) -> None:
        self.tracer = tracer
        self.root = root
        self.timing = timing
        self.start_ns = start_ns

    @property
    def traceparent(self) -> str:
        return self.timing.traceparent

    def finish(self, outcome: str = "ok") -> None:
        self.tracer._export_client(self, outcome, now_ns())
