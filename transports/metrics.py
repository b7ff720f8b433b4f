"""A server's Prometheus metrics: what every ``inferwire serve`` records and exposes.

Each metric, as exposed, with its type, its labels and, where vLLM has a metric of the same
meaning, that metric's name (the names are fixed: the shipped alert rules and dashboard use
them):

``inferwire_requests_total``: counter; transport, codec, kind, outcome
    Requests finished; ``kind`` ``stream`` or ``unary``; ``outcome`` ``ok``, ``bad_request``,
    ``cancelled`` (the client went away), ``error``. vLLM: ``vllm:request_success_total``
    (``ok`` only).
``inferwire_time_to_first_token_seconds``: histogram; transport, codec
    Request received whole -> first chunk's bytes written. vLLM:
    ``vllm:time_to_first_token_seconds``.
``inferwire_inter_token_latency_seconds``: histogram; transport, codec
    Per token after the first: time since the previous token's write (tokens of one write: 0
    for all but the first of them). vLLM: ``vllm:inter_token_latency_seconds``.
``inferwire_e2e_request_latency_seconds``: histogram; transport, codec, kind
    Request received whole -> last byte written (requests answered ``ok``). vLLM:
    ``vllm:e2e_request_latency_seconds``.
``inferwire_encode_seconds``: histogram; codec
    Encode time per chunk (a batch's encode time over its chunks, counted n times). vLLM: none.
``inferwire_response_bytes_total``: counter; transport, codec
    Bytes of responses handed to the socket (codec bytes and the protocol's framing where the
    transport writes it). vLLM: none.
``inferwire_generation_tokens_total``: counter; transport, codec
    Tokens (chunks) streamed. vLLM: ``vllm:generation_tokens_total``.
``inferwire_streams_in_flight``: gauge; transport
    Streams and unary calls being served now. vLLM: ``vllm:num_requests_running``.

Latency buckets are :data:`~inferwire.transports.metrics_core.LATENCY_BUCKETS_S` (0.5 s is a
bound, so an alert on P99 > 500 ms reads an exact bucket), encode buckets
:data:`~inferwire.transports.metrics_core.ENCODE_BUCKETS_S`.

**vLLM's own names**, beside these, so that what reads a vLLM server's ``/metrics`` reads
inferwire's (``inferwire load``'s attribution does): vLLM V1's request histograms, with its
names, help texts, bucket bounds (``vllm/v1/metrics/loggers.py``) and labels, ``model_name``
(the model that served the request) and ``engine`` (vLLM's data-parallel rank: always ``0``
here). Observed once per request answered ``ok`` that streamed tokens (a non-streamed OpenAI
answer too), from the request's stamps (:mod:`~inferwire.transports.request_stamps`: the
engine's with ``--engine``, else the simulated service's):

``vllm:request_queue_time_seconds``
    Arrived in the engine -> first scheduled (0 for the simulated service: no queue).
``vllm:request_prefill_time_seconds``
    First scheduled -> first token.
``vllm:request_decode_time_seconds``
    First token -> last token.
``vllm:request_inference_time_seconds``
    First scheduled -> last token.
``vllm:e2e_request_latency_seconds``
    Request received whole by the frontend -> the frontend holds its last token.
``vllm:time_to_first_token_seconds``
    Request received whole by the frontend -> the frontend holds its first token.

The time to first token and end to end differ from ``inferwire_*``'s by the write: vLLM's stop
when its frontend has the token, inferwire's when its bytes are written.

**The labels.** ``transport`` is the server's (``tcp``, ``http1``, ``http2``, ``grpc``) and
``codec`` its ``--codec``, on every route it serves: the OpenAI API's JSON answers of a server
whose codec is binary, and the KServe v2 protocol's bodies, count under the server's codec,
since they are the requests that server answered. ``inferwire_encode_seconds`` alone names the
codec that did the encoding (there, the JSON codec that wrote the OpenAI chunks). Every series
exists from the start, at zero, so a rate or a ratio over them has data before the first
request.

**What counts.** Every request a server answers (each request of a gRPC ``Session`` or
``ModelStreamInfer`` call on its own), of kind ``stream`` when the answer is a token stream and
``unary`` for any other answer, a refused stream request included (it was answered with one
error). Its outcome: an HTTP status below 400 is ``ok``, 4xx ``bad_request``, 5xx ``error``; a
gRPC call refused with a status is ``bad_request``; an answer cut short because the peer went
away (a reset, a closed socket, a cancelled call, a peer that stopped reading) is
``cancelled``, any other failure ``error``. Not counted: a scrape (``GET /metrics``: it would
show as load), gRPC's health and reflection services, and what the protocols refuse below the
request (an HTTP/2 stream refused or a connection closed for abuse). Only a token stream
observes time to first token, inter-token latency and tokens; end-to-end latency is observed
for requests answered ``ok``. A token counts once the write that carries it returned.

**Where it is recorded.** Per request (:meth:`ServerMetrics.start`, :meth:`RequestMeter.finish`)
in each transport's request handling, and per batch of chunks (one write), not per chunk: the
stream's encoder reports a batch's encode time (:meth:`RequestMeter.encoded`, from
:class:`~inferwire.transports.streams.ChunkWriter`), the sender each write
(:meth:`RequestMeter.written`). Off (``--no-metrics``) a server holds ``None`` instead of a
:class:`ServerMetrics`, which costs an ``is None`` test per request and per write.

**Exposure.** :func:`exposition` is the text a scrape reads (``GET /metrics`` on the HTTP
transports' own port), :class:`MetricsServer` the side HTTP server of ``--metrics-port``.
Prometheus scrapes over HTTP/1.1 (or HTTP/2 negotiated by TLS): an ``http2`` server without TLS
speaks only HTTP/2 on its port (h2c with prior knowledge), so Prometheus scrapes it, as it
does ``tcp`` and ``grpc``, at ``--metrics-port``.
"""

from __future__ import annotations

import asyncio
from typing import Final

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest, start_http_server

from .metrics_core import (
    ENCODE_BUCKETS_S,
    VLLM_REQUEST_BUCKETS_S,
    VLLM_TTFT_BUCKETS_S,
    Histogram,
    HistogramFamily,
    MetricSet,
)
from .request_stamps import RequestStamps
from .timing import now_ns

KINDS: Final = ("stream", "unary")
OUTCOMES: Final = ("ok", "bad_request", "cancelled", "error")
SCRAPE_PATH: Final = "/metrics"
_NS: Final = 1e-9
VLLM_ENGINE: Final = "0"
"""The ``engine`` label of the vLLM-named histograms: one engine (vLLM's DP rank 0)."""
VLLM_HISTOGRAMS: Final = (
    (
        "queue",
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
    ),
    (
        "prefill",
        "vllm:request_prefill_time_seconds",
        "Histogram of time spent in PREFILL phase for request.",
    ),
    (
        "decode",
        "vllm:request_decode_time_seconds",
        "Histogram of time spent in DECODE phase for request.",
    ),
    (
        "inference",
        "vllm:request_inference_time_seconds",
        "Histogram of time spent in RUNNING phase for request.",
    ),
    ("e2e", "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."),
    ("ttft", "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds."),
)
"""(interval of :meth:`RequestStamps.intervals_s`, vLLM's name, vLLM's help text)."""


class ServerMetrics:
    """The metrics of one server (one transport, one codec), on their own registry
    (``registry``, what a scrape reads)."""

    def __init__(self, transport: str, codec: str, metric_set: MetricSet | None = None) -> None:
        self.transport = transport
        self.codec = codec
        self.metric_set = metric_set if metric_set is not None else MetricSet()
        self.registry = self.metric_set.registry
        add = self.metric_set
        requests = add.counter(
            "inferwire_requests",
            "Requests finished, by kind (stream, unary) and outcome (ok, bad_request, "
            "cancelled: the client went away, error).",
            ("transport", "codec", "kind", "outcome"),
        )
        ttft = add.histogram(
            "inferwire_time_to_first_token_seconds",
            "Request received whole to its first chunk's bytes written.",
            ("transport", "codec"),
        )
        itl = add.histogram(
            "inferwire_inter_token_latency_seconds",
            "Per token after the first, the time since the previous token's write (0 for all "
            "but the first token of one write).",
            ("transport", "codec"),
        )
        e2e = add.histogram(
            "inferwire_e2e_request_latency_seconds",
            "Request received whole to its last byte written, for requests answered ok.",
            ("transport", "codec", "kind"),
        )
        self._encode = add.histogram(
            "inferwire_encode_seconds",
            "Encode time per chunk (a batch's encode time over its chunks, counted n times), by "
            "the codec that encoded.",
            ("codec",),
            ENCODE_BUCKETS_S,
        )
        response_bytes = add.counter(
            "inferwire_response_bytes",
            "Bytes of responses handed to the socket: codec bytes and the protocol's framing "
            "where the transport writes it.",
            ("transport", "codec"),
        )
        tokens = add.counter(
            "inferwire_generation_tokens",
            "Tokens (chunks) streamed.",
            ("transport", "codec"),
        )
        in_flight = add.gauge(
            "inferwire_streams_in_flight",
            "Streams and unary calls being served now.",
            ("transport",),
        )
        # one server's labels never change: every child is resolved once, here
        labels = (transport, codec)
        self.requests = {
            (kind, outcome): requests.labels(*labels, kind, outcome)
            for kind in KINDS
            for outcome in OUTCOMES
        }
        self.time_to_first_token = ttft.labels(*labels)
        self.inter_token_latency = itl.labels(*labels)
        self.e2e = {kind: e2e.labels(*labels, kind) for kind in KINDS}
        self.response_bytes = response_bytes.labels(*labels)
        self.tokens = tokens.labels(*labels)
        self.in_flight = in_flight.labels(transport)
        self.encode_seconds(codec)
        self._vllm: dict[str, HistogramFamily] = {
            interval: add.histogram(
                name,
                documentation,
                ("model_name", "engine"),
                VLLM_TTFT_BUCKETS_S if interval == "ttft" else VLLM_REQUEST_BUCKETS_S,
            )
            for interval, name, documentation in VLLM_HISTOGRAMS
        }
        self._vllm_children: dict[str, dict[str, Histogram]] = {}

    def serve_models(self, models: tuple[str, ...]) -> None:
        """Make the vLLM-named series of ``models`` exist from the start, at zero."""
        for model in models:
            self.vllm_histograms(model)

    def vllm_histograms(self, model: str) -> dict[str, Histogram]:
        """The vLLM-named histograms of ``model``, by interval."""
        children = self._vllm_children.get(model)
        if children is None:
            children = self._vllm_children[model] = {
                interval: family.labels(model, VLLM_ENGINE)
                for interval, family in self._vllm.items()
            }
        return children

    def observe_stamps(self, stamps: RequestStamps, received_ns: int) -> None:
        """One request's vLLM intervals, from its stamps (those it reached)."""
        histograms = self.vllm_histograms(stamps.model)
        for interval, seconds in stamps.intervals_s(received_ns).items():
            histograms[interval].observe(seconds)

    def encode_seconds(self, codec: str) -> Histogram:
        """The encode histogram of ``codec`` (the one that encodes, not always the server's)."""
        return self._encode.labels(codec)

    def start(self, kind: str, received_ns: int = 0, encoder: str = "") -> RequestMeter:
        """A request received whole at ``received_ns`` (0: now) is being served; its meter must
        be finished (:meth:`RequestMeter.finish`) whatever happens. ``encoder``: the codec
        that encodes its chunks, if not the server's."""
        self.in_flight.value += 1
        return RequestMeter(self, kind, received_ns or now_ns(), encoder or self.codec)

    def answered(self, kind: str, outcome: str, received_ns: int = 0, nbytes: int = 0) -> None:
        """A request answered at once (a refusal): started and finished now."""
        meter = self.start(kind, received_ns)
        meter.written(nbytes)
        meter.finish(outcome)


class RequestMeter:
    """One request's metrics while it is served: the encoder reports each batch it encodes
    (:meth:`encoded`), the sender each write (:meth:`written`), the request handler the end
    (:meth:`finish`, once; later calls do nothing)."""

    __slots__ = (
        "_encode",
        "_last_write_ns",
        "_metrics",
        "_pending",
        "finished",
        "kind",
        "received_ns",
        "stamps",
    )

    def __init__(self, metrics: ServerMetrics, kind: str, received_ns: int, encoder: str) -> None:
        self._metrics = metrics
        self.kind = kind
        self.received_ns = received_ns
        self._encode = metrics.encode_seconds(encoder)
        self._pending = 0
        """Chunks encoded and not yet written."""
        self._last_write_ns = 0
        """When the last write that carried chunks returned (0: none yet)."""
        self.finished = False
        self.stamps: RequestStamps | None = None
        """The request's stamps, when it played a token stream: observed by the vLLM-named
        histograms when it ends ``ok``."""

    def encoded(self, chunks: int, elapsed_ns: int) -> None:
        """``chunks`` chunks were encoded in ``elapsed_ns``; the next write carries them."""
        if chunks:
            self._encode.observe(elapsed_ns * _NS / chunks, chunks)
            self._pending += chunks

    def written(self, nbytes: int) -> None:
        """``nbytes`` of the answer were handed to the socket (now), with every chunk encoded
        since the last write: the first write of chunks is the time to first token, each later
        one a gap, and the chunks after the first of one write gaps of 0."""
        metrics = self._metrics
        metrics.response_bytes.value += nbytes
        chunks = self._pending
        if not chunks:
            return
        self._pending = 0
        now = now_ns()
        if self._last_write_ns:
            metrics.inter_token_latency.observe((now - self._last_write_ns) * _NS)
        else:
            metrics.time_to_first_token.observe((now - self.received_ns) * _NS)
        if chunks > 1:
            metrics.inter_token_latency.observe(0.0, chunks - 1)
        metrics.tokens.value += chunks
        self._last_write_ns = now

    def finish(self, outcome: str) -> None:
        """The request ended with ``outcome`` (one of :data:`OUTCOMES`)."""
        if self.finished:
            return
        self.finished = True
        metrics = self._metrics
        metrics.in_flight.value -= 1
        metrics.requests[self.kind, outcome].value += 1
        if outcome == "ok":
            metrics.e2e[self.kind].observe((now_ns() - self.received_ns) * _NS)
            if self.stamps is not None and self.stamps.last_token_ns:
                metrics.observe_stamps(self.stamps, self.received_ns)

    def answered(self, status: int) -> None:
        """:meth:`finish` with the outcome of an HTTP ``status``."""
        self.finish(outcome_of_status(status))

    def failed(self, exc: BaseException) -> None:
        """:meth:`finish` with the outcome of the exception that cut the answer short."""
        self.finish(outcome_of(exc))


def outcome_of_status(status: int) -> str:
    """``ok`` below 400, ``bad_request`` for 4xx, ``error`` for 5xx."""
    if status < 400:
        return "ok"
    return "bad_request" if status < 500 else "error"


def outcome_of(exc: BaseException) -> str:
    """``cancelled`` when the peer went away (our task or call cancelled, a generator of the
    answer closed by its consumer, a reset or closed socket, a read cut short, a peer that
    stopped reading: a timeout), else ``error``."""
    if isinstance(exc, asyncio.CancelledError | GeneratorExit | OSError | EOFError):
        return "cancelled"  # OSError includes TimeoutError and ConnectionError
    return "error"


# -- exposure ----------------------------------------------------------------------------------


def exposition(metrics: ServerMetrics) -> tuple[bytes, str]:
    """What a scrape reads: the text exposition of ``metrics`` and its content type."""
    return generate_latest(metrics.registry), CONTENT_TYPE_LATEST


class MetricsServer:
    """``--metrics-port``: prometheus_client's HTTP server for ``metrics`` on ``host:port``
    (0: any free port), in a thread of its own; :meth:`stop` ends it. Its scrapes read the
    metrics from that thread: :class:`~inferwire.transports.metrics_core.MetricSet` is made
    for it (each family copied under the GIL, a histogram consistent with its count)."""

    def __init__(self, metrics: ServerMetrics, host: str, port: int) -> None:
        self._httpd, self.thread = start_http_server(port, host, registry=metrics.registry)
        bound = self._httpd.server_address
        self.address: tuple[str, int] = (str(bound[0]), int(bound[1]))

    def stop(self) -> None:
        self._httpd.shutdown()  # ends serve_forever, within its 0.5 s poll
        self._httpd.server_close()
        self.thread.join()
