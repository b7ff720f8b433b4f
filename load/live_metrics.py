"""Live metrics of ``inferwire load`` (``--metrics-port PORT``): the client's view of the run,
served for Prometheus while it goes on, beside the servers' ``inferwire_*`` metrics.

Each metric is the client-side twin of a server metric, with the generator's own definitions
(:mod:`inferwire.load.load_command`): latencies start at each request's **intended**
send time, so a stall shows in every request that was due during it. Names as exposed (each
begins ``inferwire_load_``), types, labels, the server metric of the same meaning, and what each
measures::

    inferwire_load_ + name       type       labels   the server's twin
    requests_total               counter    outcome  inferwire_requests_total
    errors_total                 counter    kind     -
    time_to_first_token_seconds  histogram  -        inferwire_time_to_first_token_seconds
    time_to_first_output_token_seconds
                                 histogram  -        -
    inter_token_latency_seconds  histogram  -        inferwire_inter_token_latency_seconds
    inter_token_latency_per_token_seconds
                                 histogram  -        -
    e2e_request_latency_seconds  histogram  -        inferwire_e2e_request_latency_seconds
    send_lag_seconds             histogram  -        -
    requests_in_flight           gauge      -        inferwire_streams_in_flight
    output_tokens_total          counter    -        inferwire_generation_tokens_total
    token_chunks_total           counter    -        -
    reasoning_tokens_total       counter    -        -
    tool_calls_total             counter    -        -

    requests_total               requests finished, by outcome: ok, error
    errors_total                 failed requests, by the generator's error name (kind)
    time_to_first_token_seconds  intended send time -> the first token-carrying chunk
    time_to_first_output_token_seconds
                                 intended send time -> the first chunk carrying output
                                 (content or a tool call; later than TTFT when the stream
                                 reasoned first)
    inter_token_latency_seconds  each gap between two successive token-carrying chunks (ITL
                                 per chunk)
    inter_token_latency_per_token_seconds
                                 the same gaps spread over the tokens each chunk carried (a
                                 gap g before n tokens counts n times as g / n: ITL per token)
    e2e_request_latency_seconds  intended send time -> the end of the stream
    send_lag_seconds             intended send time -> the request sent (or, waiting for a
                                 slot, queued)
    requests_in_flight           requests sent and not finished
    output_tokens_total          output tokens received (of completed requests), reasoning
                                 tokens included
    token_chunks_total           their token-carrying chunks (output_tokens_total over it:
                                 the mean tokens a chunk)
    reasoning_tokens_total       of the output tokens, those spent reasoning
    tool_calls_total             tool calls assembled whole

A twin measures from the other end: the client's latencies add the network, the client's own
queueing and its parsing to the server's, and the server's ITL counts every token of a write
(0 for all but its first) where the client's counts one gap per token-carrying chunk.

What is counted is what the run's report counts, value for value, summed over its points:
``requests_total{outcome="ok"}`` is the points' ``requests_completed`` (streams that ended whole
and verified), ``outcome="error"`` their ``requests_failed``, and ``errors_total`` their
``errors`` by the same names (a transport's error class, e.g. ``ConnectError`` or
``StreamTruncatedError``; anything else by qualified name; ``Unfinished``: still running at the
drain timeout). The histograms hold the values of the report's ``ttft``, ``ttfot``,
``itl_per_chunk`` (vLLM's ITL, one value per gap), ``itl_per_token``, ``e2e`` and ``send_lag``
(their ``count`` and exact sums agree), ``reasoning_tokens_total`` and ``tool_calls_total``
its ``reasoning_tokens`` and ``tool_calls``, and ``output_tokens_total`` its
``output_tokens``: the tokens of completed requests as the report counts them (the server's
usage where an API gives it), added when each request ends. A failed request is in no latency
and adds no tokens, as in the report.

Not counted: the untimed ``--warmup`` requests before the first point, and requests intended in
a ``--warmup-s``/``--cooldown-s`` window, which the report keeps out of every statistic too.
The in-flight gauge alone counts every request of the points, in a window or not: it says how
many streams the generator holds open now, the twin of the server's streams in flight.

Cost: nothing when ``--metrics-port`` is not given (an ``is None`` test where the generator
records a request). On, per request: five additions (the counters, the gauge up and down),
two more for a stream with reasoning or tool calls; per chunk: nothing more. The latencies
are not observed one by one: the generator's own histograms already buffer every value
(:class:`~inferwire.load.metrics.Histogram`), and each time they flush, numpy counts the batch
into the live histogram too (about 10 ns a value). While a point runs its recorder is flushed
every :data:`FLUSH_EVERY_S`, so the histograms lag the counters by at most a quarter of a
second, and the end of every point flushes them, so the final values are exact. (Observing
each value as it comes, a bisection and a few additions, measured 4 to 5 times its tight-loop
cost inside a run, whose other work leaves the caches cold: 15 us a request of 256 chunks, some
5% of the generator's work.)

The buckets are the servers' (:data:`~inferwire.transports.metrics_core.LATENCY_BUCKETS_S`), so
a client and a server quantile read the same bounds; send lag has its own, from 1 us
(:data:`SEND_LAG_BUCKETS_S`). Values are kept by :mod:`inferwire.transports.metrics_core`
(lock-free, updated from the event loop's thread) and read by prometheus_client's HTTP server
in a thread of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Final, TextIO

import numpy as np
from prometheus_client import start_http_server
from prometheus_client.registry import CollectorRegistry

from inferwire._runtime import arguments, signals
from inferwire._runtime.arguments import CommandError
from inferwire.transports.metrics_core import HistogramFamily, MetricSet

DEFAULT_HOST: Final = "127.0.0.1"
SEND_LAG_BUCKETS_S: Final = (
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
"""Send lag: 1 us (a generator on time, woken by its timerfd) to 10 s (one far behind); 1 ms
(the generator's own target, ``bench_load``) and 5 ms (the P99 ``--capacity`` allows by default)
are bounds."""
PRESET_ERROR_KINDS: Final = (
    "ConnectError",
    "TransportTimeoutError",
    "ProtocolError",
    "StreamTruncatedError",
    "RemoteError",
)
OK: Final = "ok"
ERROR: Final = "error"
FLUSH_EVERY_S: Final = 0.25
"""How often, while a point runs, the latencies it has recorded are counted into the live
histograms: the most they lag the counters by."""
STOP_TIMEOUT_S: Final = 5.0


class LiveHistogram:
    """The one child of an unlabelled :class:`HistogramFamily`, fed nanoseconds in bulk: the
    bounds in integer nanoseconds (exact), the sum in seconds."""

    __slots__ = ("_bounds_ns", "_child", "_counts")

    def __init__(self, family: HistogramFamily) -> None:
        self._child = family.labels()
        self._counts = self._child.counts
        self._bounds_ns = np.array([round(bound * 1e9) for bound in family.buckets], np.int64)

    def observe_all_ns(self, values_ns: np.ndarray, counts: np.ndarray | None = None) -> None:
        """Each value once, or ``counts[i]`` times: about 10 us a call, then 10 ns a value.
        ``le`` semantics, as :meth:`metrics_core.Histogram.observe`: a value on a bound counts
        in it."""
        if not len(values_ns):
            return
        found = np.bincount(
            np.searchsorted(self._bounds_ns, values_ns, "left"),
            weights=counts,
            minlength=len(self._counts),
        )
        for index in np.flatnonzero(found).tolist():
            self._counts[index] += int(found[index])
        total_ns = values_ns.sum() if counts is None else np.dot(values_ns, counts)
        self._child.sum += int(total_ns) / 1e9


class LiveMetrics:
    """The ``inferwire_load_*`` metrics of one process (see the module docstring), on
    ``metric_set`` (a new one by default). The generator's
    :class:`~inferwire.load.metrics.Recorder` feeds it: the counters and the gauge
    as each request starts and ends, the histograms (:attr:`ttft`, :attr:`ttfot`, :attr:`itl`,
    :attr:`itl_per_token`, :attr:`e2e`, :attr:`send_lag`) with the values its own histograms
    buffer, in bulk, each time they are flushed (:func:`kept_flushed`)."""

    def __init__(self, metric_set: MetricSet | None = None) -> None:
        metrics = self.metric_set = metric_set if metric_set is not None else MetricSet()
        requests = metrics.counter(
            "inferwire_load_requests", "Requests finished, by outcome (ok, error)", ["outcome"]
        )
        self._ok = requests.labels(OK)
        self._error = requests.labels(ERROR)  # both exposed from the start, at 0
        self._errors = metrics.counter(
            "inferwire_load_errors",
            "Failed requests by the load generator's error name (a transport error's class)",
            ["kind"],
        )
        # The kinds a run most often meets are exposed from the start, at 0, as Prometheus'
        # instrumentation guide advises, so that rate() over them is 0 rather than no data
        # before the first failure (a dashboard's error panel, an alert on the error rate)
        for kind in PRESET_ERROR_KINDS:
            self._errors.labels(kind)
        self.ttft = LiveHistogram(
            metrics.histogram(
                "inferwire_load_time_to_first_token_seconds",
                "Time to the first token-carrying chunk, from the intended send time",
                [],
            )
        )
        self.ttfot = LiveHistogram(
            metrics.histogram(
                "inferwire_load_time_to_first_output_token_seconds",
                "Time to the first chunk carrying output (content or a tool call), from the"
                " intended send time",
                [],
            )
        )
        self.itl = LiveHistogram(
            metrics.histogram(
                "inferwire_load_inter_token_latency_seconds",
                "Gaps between successive token-carrying chunks (one value per gap: ITL per chunk)",
                [],
            )
        )
        self.itl_per_token = LiveHistogram(
            metrics.histogram(
                "inferwire_load_inter_token_latency_per_token_seconds",
                "The same gaps spread over the tokens each chunk carried (ITL per token)",
                [],
            )
        )
        self.e2e = LiveHistogram(
            metrics.histogram(
                "inferwire_load_e2e_request_latency_seconds",
                "Time to the end of the stream, from the intended send time",
                [],
            )
        )
        self.send_lag = LiveHistogram(
            metrics.histogram(
                "inferwire_load_send_lag_seconds",
                "Actual send (or queueing for a slot) minus the intended send time",
                [],
                SEND_LAG_BUCKETS_S,
            )
        )
        self._in_flight = metrics.gauge(
            "inferwire_load_requests_in_flight", "Requests sent and not finished", []
        ).labels()
        self._tokens = metrics.counter(
            "inferwire_load_output_tokens", "Output tokens of the completed requests", []
        ).labels()
        self._chunks = metrics.counter(
            "inferwire_load_token_chunks",
            "Token-carrying chunks of the completed requests",
            [],
        ).labels()
        self._reasoning = metrics.counter(
            "inferwire_load_reasoning_tokens",
            "Of the output tokens of the completed requests, those spent reasoning",
            [],
        ).labels()
        self._tool_calls = metrics.counter(
            "inferwire_load_tool_calls", "Tool calls of the completed requests", []
        ).labels()

    @property
    def registry(self) -> CollectorRegistry:
        return self.metric_set.registry

    @property
    def in_flight(self) -> int:
        return int(self._in_flight.value)

    def started(self) -> None:
        """A request was sent."""
        self._in_flight.value += 1

    def ended(self) -> None:
        """A request that :meth:`started` is over, however it ended."""
        self._in_flight.value -= 1

    def completed(self, output_tokens: int, chunks: int = 0) -> None:
        """A stream that ended whole, with its output tokens and token-carrying chunks."""
        self._ok.value += 1
        self._tokens.value += output_tokens
        self._chunks.value += chunks

    def carried(self, reasoning_tokens: int, tool_calls: int) -> None:
        """What a completed stream with reasoning or tool calls carried."""
        self._reasoning.value += reasoning_tokens
        self._tool_calls.value += tool_calls

    def failed(self, kind: str) -> None:
        self._error.value += 1
        self._errors.labels(kind).value += 1


@contextlib.asynccontextmanager
async def kept_flushed(
    flush: Callable[[], object] | None, every_s: float = FLUSH_EVERY_S
) -> AsyncIterator[None]:
    """While the block runs, call ``flush`` every ``every_s`` from a task of the running loop
    (``None``: nothing to flush, no task)."""
    if flush is None:
        yield
        return
    task = asyncio.get_running_loop().create_task(_every(flush, every_s))
    try:
        yield
    finally:
        task.cancel()  # not awaited: a cancellation of the block itself must go on


async def _every(flush: Callable[[], object], every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        flush()


# -- the command's side server -----------------------------------------------------------------


def check_metrics_arguments(args: argparse.Namespace) -> None:
    if args.metrics_port is None:
        for option, value in (
            ("--metrics-host", args.metrics_host),
            ("--metrics-hold", args.metrics_hold),
        ):
            if value is not None:
                raise CommandError(f"{option} goes with --metrics-port")
        return
    host = DEFAULT_HOST if args.metrics_host is None else args.metrics_host
    arguments.check_can_listen(host, args.metrics_port)


@contextlib.contextmanager
def serving(
    args: argparse.Namespace,
    announce: TextIO | None = None,
    stop: signals.StopSignal | None = None,
) -> Iterator[LiveMetrics | None]:
    """With ``--metrics-port``: a :class:`LiveMetrics` served over HTTP from now on (the line
    ``metrics=HOST:PORT`` on ``announce`` once it listens) until the block ends, ``--metrics-hold``
    seconds later when it ends without an exception, unless SIGINT or SIGTERM ends the wait
    (``stop``: the caller's handler of them, else one of the wait's own). Without: ``None``."""
    if args.metrics_port is None:
        yield None
        return
    host = DEFAULT_HOST if args.metrics_host is None else args.metrics_host
    live = LiveMetrics()
    try:
        server, thread = start_http_server(args.metrics_port, host, registry=live.registry)
    except OSError as exc:  # taken since it was checked
        raise CommandError(arguments.listen_failure(host, args.metrics_port, exc)) from exc
    try:
        bound_host, bound_port = server.server_address[:2]
        print(
            f"metrics={arguments.authority(str(bound_host), int(bound_port))}",
            file=sys.stderr if announce is None else announce,
            flush=True,
        )
        yield live
        sys.stdout.flush()  # the run's lines before the wait, even into a pipe
        hold(args.metrics_hold or 0.0, stop)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(STOP_TIMEOUT_S)


def hold(seconds: float, stop: signals.StopSignal | None = None) -> None:
    """Wait ``seconds`` (the metrics still served), or until SIGINT or SIGTERM: ``stop``, a
    handler already installed, or one installed for the wait. The signal ends the wait, not
    the command."""
    if seconds <= 0:
        return
    if stop is not None:
        stop.wait(seconds)
        return
    stop = signals.StopSignal()
    with signals.handled(stop):
        stop.wait(seconds)
