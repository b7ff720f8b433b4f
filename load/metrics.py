"""What the load generator records: HDR histograms of latencies, counts of requests, tokens and
errors, and CPU time. The definitions of the metrics are in
:mod:`inferwire.load.load_command`.

Latencies are fed in nanoseconds of ``time.monotonic_ns()`` and kept in HDR histograms in
microseconds with 3 significant digits (every reported value is within 0.1% of the recorded
one). Values are appended to a buffer, added to counts per HDR bucket with numpy every 4,096
values (a fraction of a millisecond, so a flush never holds up a send), and recorded into the
HDR histogram, one ``record_value`` per bucket touched, only when it is read: the library
records in pure Python, about 1.5 us a call, and a flush of 65,536 spread-out values that way
held the event loop for 31 ms.
"""

from __future__ import annotations

import platform
import sys
import time
from array import array
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

import numpy as np
import psutil  # type: ignore[import-untyped, unused-ignore]
from hdrh.histogram import HdrHistogram  # type: ignore[import-untyped, unused-ignore]

import inferwire.codecs as ic
from inferwire._runtime.versions import CORE_LIBRARIES, library_versions
from inferwire.codecs.errors import DuplicateFrameError, ReorderedFrameError, SequenceGapError
from inferwire.codecs.integrity import AlteredStreamError
from inferwire.transports import StreamTruncatedError, TransportError

from .stream_content import CHUNK_TOKENS_TOP, EventOrderError, StreamContent, tokens_per_chunk
from .timeline import Timeline

if TYPE_CHECKING:
    from .live_metrics import LiveMetrics

HIGHEST_US: Final = 3_600_000_000
"""One hour: anything slower is clamped to it (and still counted)."""
SIGNIFICANT_DIGITS: Final = 3
PERCENTILES: Final = ((50.0, "p50"), (90.0, "p90"), (99.0, "p99"), (99.9, "p99_9"))
_FLUSH_AT: Final = 1 << 12
CDF_PERCENTILES: Final = tuple(
    sorted(
        {*np.linspace(0.0, 99.0, 100).round(6).tolist(), 100.0}
        | set((100 * (1 - np.logspace(-2, -5, 61))).round(6).tolist())
    )
)
"""Where a histogram's CDF is read: every percent, then 61 points of the tail, log-spaced from
P99 to P99.999 (a latency CDF is read on a log scale near 1)."""
UNFINISHED: Final = "Unfinished"
"""The error name of a request still running when the run's drain timeout ran out."""
INTEGRITY_KINDS: Final[tuple[tuple[str, tuple[type[BaseException], ...]], ...]] = (
    ("lost", (SequenceGapError,)),
    ("duplicated", (DuplicateFrameError,)),
    ("reordered", (ReorderedFrameError, EventOrderError)),
    ("truncated", (StreamTruncatedError, ic.IncompleteStreamError)),
    ("altered", (AlteredStreamError,)),
)
"""What each integrity count of a point counts: the failures of these classes (a stream that
failed verification, or that its transport found cut short before its end marker)."""

LIBRARIES: Final = (*CORE_LIBRARIES, "h2", "httptools", "hdrhistogram", "tqdm", "psutil")


class Twin(Protocol):
    """What a histogram's flushed values are counted into too (a live histogram)."""

    def observe_all_ns(self, values_ns: np.ndarray, counts: np.ndarray | None = None) -> None: ...


class _Twins:
    """Two twins fed the same values: TTFT's live histogram and TTFOT's, while every TTFOT
    is its TTFT (:meth:`Recorder.completed_stream`)."""

    __slots__ = ("_both",)

    def __init__(self, first: Twin, second: Twin) -> None:
        self._both = (first, second)

    def observe_all_ns(self, values_ns: np.ndarray, counts: np.ndarray | None = None) -> None:
        for twin in self._both:
            twin.observe_all_ns(values_ns, counts)


class Histogram:
    """An HDR histogram of durations in microseconds, fed nanoseconds (with a count each).

    ``spread``: each value is a gap shared by ``count`` tokens, recorded as ``count`` values of
    ``value / count``. Mean and max are kept exactly, beside the histogram."""

    __slots__ = (
        "_bucket_bits",
        "_buckets",
        "_counted_ns",
        "_counts",
        "_half",
        "_hdr",
        "_max_ns",
        "_spread",
        "_sum_ns",
        "_values_ns",
        "twin",
    )

    def __init__(self, *, spread: bool = False) -> None:
        self._spread = spread
        self._hdr = HdrHistogram(1, HIGHEST_US, SIGNIFICANT_DIGITS)
        self._bucket_bits = int(self._hdr.sub_bucket_count).bit_length() - 1
        self._half = int(self._hdr.sub_bucket_count) // 2
        # counts by HDR bucket, numpy-added at each flush (a flush must not stall the loop:
        # one hdrh call per distinct bucket took 31 ms for 65,536 spread-out values)
        highest_shift = max(int(HIGHEST_US).bit_length() - self._bucket_bits, 0)
        self._buckets = np.zeros((highest_shift + 2) * self._half, np.int64)
        # values of a count of 1 (nearly all: one append each), and values with their counts
        self._values_ns = array("q")
        self._counted_ns = array("q")
        self._counts = array("q")
        self._sum_ns = 0
        self._max_ns = 0
        self.twin: Twin | None = None
        """A live histogram that counts each flushed batch too (``--metrics-port``)."""

    def record_ns(self, value_ns: int) -> None:
        values_ns = self._values_ns
        values_ns.append(value_ns)
        if len(values_ns) >= _FLUSH_AT:
            self.flush()

    def record_all_ns(self, values_ns: list[int]) -> None:
        """Each value once."""
        self._values_ns.fromlist(values_ns)  # fromlist: half the cost of extend
        if len(self._values_ns) >= _FLUSH_AT:
            self.flush()

    def record_many_ns(self, values_ns: Sequence[int], counts: Sequence[int]) -> None:
        self._counted_ns.extend(values_ns)
        self._counts.extend(counts)
        if len(self._counted_ns) >= _FLUSH_AT:
            self.flush()

    def flush(self) -> None:
        if not self._values_ns and not self._counted_ns:
            return
        counts = np.concatenate(
            [np.ones(len(self._values_ns), np.int64), np.frombuffer(self._counts, np.int64)]
        )
        values_ns = np.concatenate(
            [np.frombuffer(self._values_ns, np.int64), np.frombuffer(self._counted_ns, np.int64)]
        ).clip(0, None)  # none expected < 0
        if self._spread:
            values_ns = values_ns // counts
        if self.twin is not None:  # each value once (all but record_many_ns'): the cheaper pass
            self.twin.observe_all_ns(values_ns, counts if self._counts else None)
        self._sum_ns += int(np.dot(values_ns, counts))
        self._max_ns = max(self._max_ns, int(values_ns.max()))
        values_us = ((values_ns + 500) // 1000).clip(None, HIGHEST_US)  # nearest microsecond
        # HDR's layout: values below 2 x half are their own bucket; above, a value keeps its
        # top bits (shifted right by ``shift``) and ``shift`` numbers the half-bucket it is in
        shift = (np.frexp(values_us)[1] - self._bucket_bits).clip(0, None)
        index = (values_us >> shift) + shift * self._half
        self._buckets += np.bincount(index, weights=counts, minlength=len(self._buckets)).astype(
            np.int64
        )
        self._values_ns = array("q")
        self._counted_ns = array("q")
        self._counts = array("q")

    def _histogram(self) -> HdrHistogram:
        """The HDR histogram, with every value recorded so far: each bucket's count is recorded
        at the bucket's lowest value (the same bucket), once per bucket, here rather than at
        each flush (hdrh records in pure Python, about 1.5 us a call)."""
        self.flush()
        (nonzero,) = np.nonzero(self._buckets)
        if len(nonzero):
            shift = np.maximum(nonzero // self._half - 1, 0)
            lowest = (nonzero - shift * self._half) << shift
            for value, count in zip(lowest.tolist(), self._buckets[nonzero].tolist(), strict=True):
                self._hdr.record_value(value, count)
            self._buckets[:] = 0
        return self._hdr

    @property
    def count(self) -> int:
        return int(self._histogram().get_total_count())

    def encode(self) -> dict[str, Any]:
        """The histogram as JSON values: HdrHistogram's own encoding (compressed, base64; any
        HdrHistogram library reads it) and the exact sum and max kept beside it."""
        return {
            "hdr": self._histogram().encode().decode("ascii"),
            "sum_ns": self._sum_ns,
            "max_ns": self._max_ns,
            "spread": self._spread,
        }

    @classmethod
    def decode(cls, encoded: Mapping[str, Any]) -> Histogram:
        """The histogram :meth:`encode` gave; raises ``ValueError`` for anything else."""
        try:
            hdr = HdrHistogram.decode(str(encoded["hdr"]).encode("ascii"))
            sum_ns, max_ns = int(encoded["sum_ns"]), int(encoded["max_ns"])
            spread = bool(encoded["spread"])
        except Exception as exc:  # hdrh raises anything from zlib.error to struct.error
            raise ValueError(f"not an encoded histogram: {exc}") from exc
        if (hdr.lowest_trackable_value, hdr.highest_trackable_value) != (1, HIGHEST_US) or (
            hdr.significant_figures != SIGNIFICANT_DIGITS
        ):
            raise ValueError("an encoded histogram of another range or precision")
        histogram = cls(spread=spread)
        histogram._hdr = hdr
        histogram._sum_ns, histogram._max_ns = sum_ns, max_ns
        return histogram

    def add(self, other: Histogram) -> None:
        """Count ``other``'s values here too (merging the histograms of several processes)."""
        self._histogram().add(other._histogram())
        self._sum_ns += other._sum_ns
        self._max_ns = max(self._max_ns, other._max_ns)

    def summary_ms(self) -> dict[str, Any]:
        """``count``, then P50/P90/P99/P99.9, mean and max in milliseconds (None when empty),
        and the ``cdf`` (:meth:`cdf_ms`)."""
        count = self.count
        out: dict[str, Any] = {"count": count}
        found = self._histogram().get_percentile_to_value_dict([p for p, _ in PERCENTILES])
        for percentile, name in PERCENTILES:
            out[f"{name}_ms"] = found[percentile] / 1000 if count else None
        out["mean_ms"] = self._sum_ns / count / 1e6 if count else None
        out["max_ms"] = self._max_ns / 1e6 if count else None
        out["cdf"] = self.cdf_ms()
        return out

    def cdf_ms(self) -> list[list[float]]:
        """The distribution as ``[value_ms, cumulative_fraction]`` points (at most one per
        :data:`CDF_PERCENTILES`, each value once with its highest fraction); empty when empty."""
        if not self.count:
            return []
        found = self._histogram().get_percentile_to_value_dict(list(CDF_PERCENTILES))
        fraction_at: dict[float, float] = {}
        for percentile, value_us in sorted(found.items()):
            fraction_at[value_us / 1000] = percentile / 100
        return [[value_ms, round(f, 8)] for value_ms, f in sorted(fraction_at.items())]


@dataclass(frozen=True, slots=True, kw_only=True)
class Slo:
    """Service-level objectives for goodput; ``None`` leaves a metric unconstrained."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.ttft_ms, self.tpot_ms, self.e2e_ms))

    def met(self, *, ttft_ns: int, tpot_ns: float | None, e2e_ns: int) -> bool:
        return (
            (self.ttft_ms is None or ttft_ns <= self.ttft_ms * 1e6)
            and (self.tpot_ms is None or tpot_ns is None or tpot_ns <= self.tpot_ms * 1e6)
            and (self.e2e_ms is None or e2e_ns <= self.e2e_ms * 1e6)
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestRecord:
    """One request of a point, as the per-request records (CSV, JSONL) and the timeline give it.
    Times are from the request's intended send time, as every latency of the generator."""

    index: int
    """Its place in the point's schedule, from 0."""
    intended_s: float
    """Its intended send time, seconds after the point's first."""
    queue_wait_ms: float
    """Intended send time to the moment it was sent (the generator's lag, or a wait for a
    connection or a slot)."""
    ok: bool
    error: str | None
    """The failure's name (:func:`error_name`), ``None`` when ``ok``."""
    ttft_ms: float | None
    e2e_ms: float
    """To the end of the stream, or to the failure."""
    output_tokens: int
    chunks: int
    """Chunks that carried a token."""
    tpot_ms: float | None
    itl_max_ms: float | None
    """The longest gap between two token-carrying chunks."""
    input_tokens: int | None
    """The prompt's tokens, as the server's usage gives them (else as known, else None)."""
    measured: bool = True
    """False for a request in a warm-up or cool-down window: kept out of the statistics."""
    # the client's own stages (inferwire.load.attribution.split), None where not stamped
    pool_wait_ms: float | None = None
    connect_ms: float | None = None
    """Opening the connection it took (TCP, TLS); 0 when it reused one."""
    write_ms: float | None = None
    wait_head_ms: float | None = None
    first_event_ms: float | None = None
    client_parse_ms: float | None = None
    """The client's parse time over all the stream's events."""
    trace_id: str | None = None
    """The W3C trace id it carried (its ``traceparent``), to find the server's spans."""
    # what the server reported, and the split (None where no source reported the request)
    server_source: str | None = None
    server_queue_ms: float | None = None
    server_prefill_ms: float | None = None
    server_decode_ms: float | None = None
    server_model_ms: float | None = None
    """Prefill and decode, or the inference time the server reported."""
    outside_engine_ms: float | None = None
    """E2E less the generator's lag and pool wait, less the server's queue and model time."""
    # what the stream carried (inferwire.load.stream_content), None where unknown or failed
    ttfot_ms: float | None = None
    """Time to the first output token (content or a tool call): TTFT unless reasoning came
    first; None without output."""
    reasoning_tokens: int | None = None
    """Of ``output_tokens``, those spent reasoning."""
    tool_calls: int | None = None
    """Tool calls assembled, each with whole JSON arguments."""
    max_tokens_per_chunk: int | None = None
    """The most tokens one chunk carried."""
    # a conversation's turn (--turns, --conversations; inferwire.load.conversations)
    conversation: int | None = None
    """The conversation it belongs to, by its place in the point's schedule; None outside one."""
    turn: int | None = None
    """Its turn in the conversation, from 0; None outside a conversation."""


RecordSink = Callable[[RequestRecord], object]
_NO_END_NS: Final = 1 << 62


@dataclass(frozen=True, slots=True, kw_only=True)
class Window:
    """The intended send times whose requests count, in nanoseconds after the schedule's first:
    from ``from_ns`` to ``until_ns``, both included. The requests before (warm-up) and after
    (cool-down) are sent as usual and kept out of every statistic."""

    from_ns: int = 0
    until_ns: int = _NO_END_NS

    def __post_init__(self) -> None:
        if not 0 <= self.from_ns <= self.until_ns:
            raise ValueError("the measured window must start at or after 0 and end after it")

    def seconds(self) -> list[float]:
        return [self.from_ns / 1e9, self.until_ns / 1e9]


class Recorder:
    """Everything one load point measures: the generator calls :meth:`completed_stream` or
    :meth:`failed` once per request, and :meth:`lagged` and :meth:`sent` for its lateness.

    With a ``window``, the requests whose intended send time lies outside it are in none of
    the counts, histograms or rates (each of these methods is given the intended time); call
    :meth:`begin` with the schedule's start before the first."""

    def __init__(
        self,
        slo: Slo = Slo(),
        *,
        on_record: RecordSink | None = None,
        window: Window | None = None,
        live: LiveMetrics | None = None,
    ) -> None:
        self.slo = slo
        self.on_record = on_record
        """Called with each request's :class:`RequestRecord` as it ends."""
        self.live = live
        """The metrics served while the run goes (``--metrics-port``), fed the same values as
        the histograms and counts here, for the same requests; ``None``: none. Its histograms
        count what these buffer when they flush (:meth:`flush_live`), so that recording a
        request costs nothing more."""
        self.window = window
        """The requests that count; ``None``: all of them."""
        self._window_ns = (-_NO_END_NS, _NO_END_NS)
        self.start_ns = 0
        self.recorded: set[int] = set()
        """The indices of the requests that have their record (every request, by the end). The
        records themselves go to ``on_record`` and are not kept: a run of millions of requests
        would hold them all, and every full pass of the garbage collector would walk them."""
        self.ttft = Histogram()
        self._ttfot = Histogram()
        self._ttfot_apart = False
        """Whether a stream's TTFOT differed from its TTFT yet: until one does, TTFOT is the
        TTFT histogram itself (a plain stream records nothing more), then :attr:`ttfot` takes
        the TTFTs so far and every stream's own from then on."""
        self.tpot = Histogram()
        self.itl_per_token = Histogram(spread=True)
        self.itl_per_chunk = Histogram()
        self.e2e = Histogram()
        self.send_lag = Histogram()
        self.queue_wait = Histogram()
        self.client_parse = Histogram()
        """The client's time to parse each event of a stream of another API (not timed for
        inferwire's own transports, whose decode the codec benchmarks measure)."""
        self.token_sources: Counter[str] = Counter()
        """How the completed streams' output tokens were counted: token_ids, usage,
        tokenizer, chunks."""
        self.chunk_sources: Counter[str] = Counter()
        """How each chunk's tokens were counted, by stream (``CHUNK_SOURCES``)."""
        self.reasoning_tokens = 0
        self.reasoning_sources: Counter[str] = Counter()
        """How the streams that reasoned had their reasoning tokens counted."""
        self.tool_calls = 0
        self.input_tokens = 0
        self.input_tokens_known = 0
        """Completed requests whose input tokens are known (the server's usage)."""
        self.inputs_completed = 0
        """Inputs of the completed requests: one a generation, a batch's for embeddings."""
        self.completed = 0
        self.good = 0
        self.output_tokens = 0
        self.errors: Counter[str] = Counter()
        self.error_examples: dict[str, str] = {}
        self.integrity: Counter[str] = Counter()
        self.max_in_flight = 0
        self.last_done_ns = 0
        self.timeline = Timeline()
        """Every request, in the windows or not: the run over time."""
        self.waited_for_bound = 0
        """Requests that found the bound on requests in flight reached, and waited (all)."""
        if live is not None:
            self.ttft.twin = _Twins(live.ttft, live.ttfot)
            self.itl_per_chunk.twin = live.itl
            self.itl_per_token.twin = live.itl_per_token
            self.e2e.twin = live.e2e
            self.send_lag.twin = live.send_lag

    def begin(self, start_ns: int) -> None:
        """The schedule starts at ``start_ns`` (its first intended send time): the window,
        given in offsets from the start, is placed on the clock."""
        self.start_ns = start_ns
        if self.window is not None:
            self._window_ns = (start_ns + self.window.from_ns, start_ns + self.window.until_ns)

    def measures(self, intended_ns: int) -> bool:
        """Whether a request intended for ``intended_ns`` counts (is in the window)."""
        return self._window_ns[0] <= intended_ns <= self._window_ns[1]

    def sent(self, intended_ns: int, sent_ns: int) -> None:
        """A request left: its queue wait."""
        if self.measures(intended_ns):
            self.queue_wait.record_ns(sent_ns - intended_ns)

    def lagged(self, intended_ns: int, acted_ns: int) -> None:
        """The generator started (or queued) a request at ``acted_ns``: its send lag."""
        if self.measures(intended_ns):
            self.send_lag.record_ns(acted_ns - intended_ns)

    def completed_stream(
        self,
        *,
        intended_ns: int,
        first_token_ns: int,
        done_ns: int,
        output_tokens: int,
        gaps_ns: Sequence[int] = (),
        chunk_tokens: Sequence[int] = (),
        first_chunk_tokens: int = 1,
        chunk_source: str | None = None,
        content: StreamContent | None = None,
        input_tokens: int | None = None,
        inputs: int = 1,
    ) -> None:
        """A stream that ended with its end marker and passed verification. ``first_token_ns``
        is 0 if it had none; ``gaps_ns`` are the gaps before each token-carrying chunk after
        the first, and ``chunk_tokens`` the number of tokens in each of those chunks
        (``first_chunk_tokens``: in the first), counted as ``chunk_source`` says.
        ``content``: its reasoning and tool calls (``None``: neither, and its first token was
        output). ``input_tokens``: its prompt's, when known; ``inputs``: the inputs it
        carried (1, or an embeddings batch's)."""
        measured = self.measures(intended_ns)
        self.timeline.completed(
            intended_ns=intended_ns,
            first_token_ns=first_token_ns,
            done_ns=done_ns,
            output_tokens=output_tokens,
            gaps_ns=gaps_ns,
            chunk_tokens=chunk_tokens,
            first_chunk_tokens=first_chunk_tokens if first_token_ns else 0,
            measured=measured,
        )
        if not measured:
            return
        if self.live is not None:
            self.live.completed(output_tokens, len(gaps_ns) + 1 if first_token_ns else 0)
        if gaps_ns:
            self.itl_per_chunk.record_all_ns(list(gaps_ns))
            self.itl_per_token.record_many_ns(gaps_ns, chunk_tokens)
        self.last_done_ns = max(self.last_done_ns, done_ns)
        self.completed += 1
        self.output_tokens += output_tokens
        self.inputs_completed += inputs
        if input_tokens is not None:
            self.input_tokens += input_tokens
            self.input_tokens_known += 1
        e2e_ns = done_ns - intended_ns
        self.e2e.record_ns(e2e_ns)
        if content is not None:
            self._content(content)
        if not output_tokens:
            self.good += self.slo.met(ttft_ns=e2e_ns, tpot_ns=None, e2e_ns=e2e_ns)
            return
        if chunk_source is not None:
            self.chunk_sources[chunk_source] += 1
        ttft_ns = first_token_ns - intended_ns
        if content is not None and content.first_output_ns is not None:
            if not self._ttfot_apart:  # before this stream's TTFT is in TTFT's histogram
                self._part_ttfot()
            if content.first_output_ns:  # else: no output at all, no TTFOT
                self._ttfot.record_ns(content.first_output_ns - intended_ns)
        elif self._ttfot_apart:
            self._ttfot.record_ns(ttft_ns)
        self.ttft.record_ns(ttft_ns)
        tpot_ns = None
        if output_tokens > 1:
            tpot_ns = (done_ns - first_token_ns) / (output_tokens - 1)
            self.tpot.record_ns(round(tpot_ns))
        self.good += self.slo.met(ttft_ns=ttft_ns, tpot_ns=tpot_ns, e2e_ns=e2e_ns)

    @property
    def ttfot(self) -> Histogram:
        """Time to the first output token: TTFT, or later when the stream reasoned first."""
        return self._ttfot if self._ttfot_apart else self.ttft

    def _part_ttfot(self) -> None:
        """The first stream whose TTFOT is not its TTFT: TTFOT's histogram starts as a copy
        of TTFT's (the values so far are the same), and is its live twin's source from now."""
        self._ttfot_apart = True
        self._ttfot.add(self.ttft)  # flushes TTFT's buffer first, into both live twins
        if self.live is not None:
            self.ttft.twin = self.live.ttft
            self._ttfot.twin = self.live.ttfot

    def _content(self, content: StreamContent) -> None:
        """A measured stream's reasoning and tool calls."""
        if content.reasoning_tokens:
            self.reasoning_tokens += content.reasoning_tokens
            self.reasoning_sources[content.reasoning_source] += 1
        self.tool_calls += content.tool_calls
        if self.live is not None:
            self.live.carried(content.reasoning_tokens, content.tool_calls)

    def failed(
        self, exc: BaseException | None, done_ns: int, *, intended_ns: int | None = None
    ) -> None:
        """A request that raised ``exc`` (``None``: it never finished); one whose intended
        send time is not given is counted."""
        self.timeline.failed(done_ns)
        if intended_ns is not None and not self.measures(intended_ns):
            return
        self.last_done_ns = max(self.last_done_ns, done_ns)
        name = UNFINISHED if exc is None else error_name(exc)
        self.errors[name] += 1
        if self.live is not None:
            self.live.failed(name)
        self.error_examples.setdefault(name, "" if exc is None else str(exc)[:200])
        if exc is not None:
            kind = integrity_kind(exc)
            if kind is not None:
                self.integrity[kind] += 1

    def add_record(self, record: RequestRecord) -> None:
        self.recorded.add(record.index)
        if self.on_record is not None:
            self.on_record(record)

    def histograms(self) -> dict[str, Histogram]:
        return {
            "ttft": self.ttft,
            "ttfot": self.ttfot,
            "tpot": self.tpot,
            "itl_per_token": self.itl_per_token,
            "itl_per_chunk": self.itl_per_chunk,
            "e2e": self.e2e,
            "send_lag": self.send_lag,
            "queue_wait": self.queue_wait,
            "client_parse": self.client_parse,
        }

    def flush(self) -> None:
        for histogram in self.histograms().values():
            histogram.flush()

    def flush_live(self) -> None:
        """Count what the histograms with a live twin buffer (a cheap numpy pass each)."""
        for histogram in (
            self.ttft,
            self._ttfot,
            self.itl_per_chunk,
            self.itl_per_token,
            self.e2e,
            self.send_lag,
        ):
            histogram.flush()

    def summary(self, *, start_ns: int, scheduled: int, excluded: int = 0) -> dict[str, Any]:
        """The point's metrics; ``start_ns`` is the first request's intended send time,
        ``scheduled`` counts every request of the schedule and ``excluded`` those outside the
        window. Rates are over the window: from its start to the last measured request's end."""
        window = self.window or Window()
        duration_s = max(self.last_done_ns - start_ns - window.from_ns, 1) / 1e9
        failed = sum(self.errors.values())
        input_tokens = self.input_tokens if self.input_tokens_known else None
        return {
            "requests_scheduled": scheduled,
            "requests_excluded": excluded,
            "requests_measured": scheduled - excluded,
            "measured_window_s": None if self.window is None else self.window.seconds(),
            "requests_completed": self.completed,
            "requests_failed": failed,
            "requests_good": self.good if self.slo.any else None,
            "errors": dict(self.errors),
            "error_examples": self.error_examples,
            "duration_s": duration_s,
            "request_throughput_rps": self.completed / duration_s,
            "output_tokens": self.output_tokens,
            "output_token_throughput_tps": self.output_tokens / duration_s,
            "input_tokens": input_tokens,
            "input_token_throughput_tps": (
                None if input_tokens is None else input_tokens / duration_s
            ),
            "inputs_completed": self.inputs_completed,
            "input_throughput_ips": self.inputs_completed / duration_s,
            "reasoning_tokens": self.reasoning_tokens,
            "reasoning_token_count": dict(self.reasoning_sources),
            "tool_calls": self.tool_calls,
            "goodput_rps": self.good / duration_s if self.slo.any else None,
            "slo": asdict(self.slo),
            "max_in_flight": self.max_in_flight,
            "requests_waited_for_bound": self.waited_for_bound,
            "token_count": dict(self.token_sources),
            "chunk_token_count": dict(self.chunk_sources),
            "tokens_per_chunk": tokens_per_chunk(
                self.timeline.chunk_token_counts(CHUNK_TOKENS_TOP)
            ),
            "integrity": {
                "verified": self.completed,
                **{kind: self.integrity[kind] for kind, _ in INTEGRITY_KINDS},
            },
            **{name: h.summary_ms() for name, h in self.histograms().items()},
            "timeline": self.timeline.summary(start_ns),
        }


def integrity_kind(exc: BaseException) -> str | None:
    """Which integrity count a failure adds to (see :data:`INTEGRITY_KINDS`), if any."""
    for kind, classes in INTEGRITY_KINDS:
        if isinstance(exc, classes):
            return kind
    return None


def integrity_violations(integrity: dict[str, int]) -> int:
    """The streams of a point's ``integrity`` found lost, duplicated, reordered, truncated or
    altered: zero in a healthy run."""
    return sum(integrity.get(kind, 0) for kind, _ in INTEGRITY_KINDS)


def error_name(exc: BaseException) -> str:
    """The class name, qualified when it is not one of the transports' own errors."""
    cls = type(exc)
    if isinstance(exc, TransportError):
        return cls.__name__
    return f"{cls.__module__}.{cls.__qualname__}"


class CpuMeter:
    """CPU seconds (user + system) of this process and, if its pid is known, the server's."""

    def __init__(self, server_pid: int | None = None) -> None:
        self._server = psutil.Process(server_pid) if server_pid is not None else None
        self._client_start = 0.0
        self._server_start = 0.0

    def _server_s(self) -> float:
        if self._server is None:
            return 0.0
        try:
            times = self._server.cpu_times()
        except psutil.Error:  # it exited: its time is lost, say so with None below
            return float("nan")
        return float(times.user + times.system)

    def start(self) -> None:
        self._client_start = time.process_time()
        self._server_start = self._server_s()

    def stop(self, output_tokens: int) -> dict[str, float | None]:
        client_s = time.process_time() - self._client_start
        server_s: float | None = self._server_s() - self._server_start
        if self._server is None or server_s != server_s:  # no pid, or NaN: not measured
            server_s = None
        per_1k = 1000 / output_tokens if output_tokens else None
        return {
            "client_cpu_s": client_s,
            "server_cpu_s": server_s,
            "client_cpu_s_per_1k_tokens": client_s * per_1k if per_1k else None,
            "server_cpu_s_per_1k_tokens": (
                server_s * per_1k if per_1k and server_s is not None else None
            ),
        }


def versions() -> dict[str, str]:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        **library_versions(LIBRARIES),
    }


def machine() -> dict[str, Any]:
    return {
        "cpus": psutil.cpu_count(logical=True),
        "cpus_usable": len(psutil.Process().cpu_affinity() or ()),
        "processor": platform.processor() or platform.machine(),
        "load_average": list(psutil.getloadavg()),
    }
