"""The open-loop engine behind ``inferwire load`` (see
:mod:`inferwire.load.load_command` for what it measures and how each metric is
defined): the seeded arrival schedule, the clients it sends to, and the scheduler that starts
each request at its intended time.

Every stream is checked as it arrives (:class:`~inferwire.codecs.integrity.StreamVerifier`):
in order, none lost or repeated, up to an end marker whose token count matches, and, when the
expected chunks are given, the very chunks sent. A stream that fails is an error, never a
success.

Without a cap, each request is a task started at its time, up to a bound on requests in
flight (``LoadSpec.max_in_flight``): past it, a due request waits for the first task to finish,
which takes it, so a generator (or server) that falls behind holds at most that many
connections and reports how many requests waited, instead of collapsing under one connection
per late request. With ``concurrency`` N, N workers take the due requests in order of their
intended time, so a backlog costs memory for a number, not for a task, and the cap holds
exactly. Requests intended in a warm-up or cool-down window are sent, and kept out of every
statistic (:class:`~inferwire.load.metrics.Window`).
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import numpy as np
from tqdm import tqdm  # type: ignore[import-untyped, unused-ignore]

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire._runtime import loops
from inferwire.codecs.integrity import StreamVerifier
from inferwire.transports.common import DEFAULT_LIMITS, aiter_close
from inferwire.workloads import token_stream_source

from . import live_metrics, metrics
from .alarm import Alarm
from .arrivals import ARRIVALS as ARRIVALS  # the schedules moved there; re-exported
from .arrivals import Arrival as Arrival
from .arrivals import arrival_offsets_ns as arrival_offsets_ns
from .attribution.session import PointAttribution
from .attribution.split import PointSplit
from .conversations import ConversationPoint, TurnEnded
from .metrics import Histogram, Recorder, Slo, Window
from .stream_check import StreamCheck as StreamCheck  # defined apart: conversations use it too

now_ns: Final = time.monotonic_ns  # the clock of loop.time() and of the transports' stamps
DEFAULT_DURATION_S: Final = 10.0
DEFAULT_DRAIN_TIMEOUT_S: Final = 60.0
DEFAULT_MAX_IN_FLIGHT: Final = 512
"""The bound on requests in flight of an uncapped run. A generator that falls behind would
otherwise open a connection per late request (http1, tcp) until it collapses; 512 keeps every
transport's sockets under the common soft descriptor limit of 1,024, and still carries 5,000
req/s of 100 ms streams (Little's law). A run that reaches it says so; a higher bound is a flag
away."""


class Target(Protocol):
    """What the generator sends to: an :class:`~inferwire.transports.Client`, a pool of them,
    or anything else with the same ``generate``."""

    def generate(self, request: Any, /) -> AsyncIterator[Any]: ...

    async def close(self) -> None: ...


class VerifiedStream:
    """:class:`StreamCheck` for inferwire's own servers: the stream verifier's sequence, end
    marker and, with ``expected``, content checks."""

    __slots__ = ("check", "input_tokens", "output_tokens", "source", "verifier")
    # what send() asks of every check, here without a failed lookup each request
    chunk_source: Final = "token_ids"
    content: Final = None
    inputs: Final = 1

    def __init__(self, expected: Sequence[ic.TokenChunk] | None = None) -> None:
        self.verifier = StreamVerifier(expected)
        self.check = self.verifier.check
        self.output_tokens = 0
        self.input_tokens: int | None = None
        self.source = "token_ids"

    def finish(self, counted: int) -> None:
        self.verifier.finish()
        self.output_tokens = counted


CheckFactory = Callable[[Histogram], Callable[[], StreamCheck]]
"""Given a point's histogram of client parse times, makes each request's check."""


class ClientPool:
    """One client per request in flight, for a transport whose client runs its requests in
    turn on one connection (tcp): without it, the generator would queue requests itself."""

    def __init__(self, make: Callable[[], it.Client]) -> None:
        self._make = make
        self._idle: list[it.Client] = []
        self._clients: list[it.Client] = []

    async def generate(
        self, request: it.GenerateRequest, /, *, timing: it.StreamTiming | None = None
    ) -> AsyncIterator[ic.TokenChunk]:
        if self._idle:
            client = self._idle.pop()
        else:
            client = self._make()
            self._clients.append(client)
        try:
            async for chunk in client.generate(request, timing=timing):
                yield chunk
        finally:
            self._idle.append(client)

    async def close(self) -> None:
        for client in self._clients:
            await client.close()


def open_target(
    transport: str,
    address: str,
    codec: str,
    *,
    limits: it.Limits = DEFAULT_LIMITS,
    accept_encoding: str | None = None,
) -> it.Client | ClientPool:
    """A client for ``transport``: http1 pools connections itself, http2 and grpc multiplex
    one connection, and tcp gets a :class:`ClientPool`. ``limits.timeout_s`` bounds each
    connect and each wait for the server. ``accept_encoding`` (http1 and http2 only): the
    ``Accept-Encoding`` every request sends (``--accept-encoding``)."""
    if transport == "tcp":
        return ClientPool(lambda: it.connect(transport, address, codec=codec, limits=limits))
    if accept_encoding is not None:
        if transport not in ("http1", "http2"):
            raise ValueError(f"accept-encoding is for http1 and http2, not {transport}")
        return it.connect(
            transport, address, codec=codec, limits=limits, accept_encoding=accept_encoding
        )
    return it.connect(transport, address, codec=codec, limits=limits)


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadSpec:
    """What every point of a sweep shares."""

    workload: str = "stream-256"
    max_tokens: int | None = None
    arrival: Arrival = "poisson"
    burstiness: float = 1.0
    duration_s: float | None = None
    requests: int | None = None
    seed: int = 0
    slo: Slo = field(default_factory=Slo)
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    ramp_from_rps: float | None = None
    """With ``ramp_s``: the rate rises linearly from this to each point's rate, then holds."""
    ramp_s: float = 0.0
    warmup_s: float = 0.0
    """Requests intended in the schedule's first seconds are sent but not measured."""
    cooldown_s: float = 0.0
    """Requests intended in the schedule's last seconds are sent but not measured."""
    max_in_flight: int | None = DEFAULT_MAX_IN_FLIGHT
    """Uncapped runs: a request due while this many are in flight waits (``None``: no bound).
    A concurrency cap is its own bound."""
    part: tuple[int, int] | None = None
    """``(i, n)``: run only requests i, i + n, i + 2n, ... of the schedule, which is drawn whole
    from the seed, so n parts in n processes together send exactly the one schedule."""
    start_at_unix_s: float | None = None
    """The schedule's start as a UNIX time (one point only), shared by the parts of a
    split run so that they interleave as the one schedule would; ``None``: start now."""

    def __post_init__(self) -> None:
        if self.part is not None:
            index, parts = self.part
            if not 0 <= index < parts:
                raise ValueError(f"part {index}/{parts}: needs 0 <= I < N")

    def part_of(self, offsets_ns: np.ndarray) -> tuple[np.ndarray, int, int]:
        """This part's offsets of a whole schedule, with the schedule index of its first
        request and the step between its indices."""
        if self.part is None:
            return offsets_ns, 0, 1
        index, parts = self.part
        return offsets_ns[index::parts], index, parts

    def offsets_ns(self, rate_rps: float) -> np.ndarray:
        duration_s = self.duration_s
        if duration_s is None and self.requests is None:
            duration_s = DEFAULT_DURATION_S
        return arrival_offsets_ns(
            rate_rps,
            arrival=self.arrival,
            burstiness=self.burstiness,
            seed=self.seed,
            requests=self.requests,
            duration_s=duration_s,
            ramp_from_rps=self.ramp_from_rps,
            ramp_s=self.ramp_s,
        )

    def window(self, offsets_ns: np.ndarray) -> Window | None:
        """The measured part of a schedule: all but its first ``warmup_s`` and its last
        ``cooldown_s``. Its end is the duration's, or the last request's time when the number
        of requests ended it first. Raises ``ValueError`` if no request is left to measure."""
        if self.warmup_s < 0 or self.cooldown_s < 0:
            raise ValueError("the warm-up and cool-down windows cannot be negative")
        if not (self.warmup_s or self.cooldown_s):
            return None
        end_ns = int(offsets_ns[-1])
        duration_s = self.duration_s
        if duration_s is None and self.requests is None:
            duration_s = DEFAULT_DURATION_S
        if duration_s is not None and (self.requests is None or len(offsets_ns) < self.requests):
            end_ns = round(duration_s * 1e9)
        from_ns = round(self.warmup_s * 1e9)
        until_ns = end_ns - round(self.cooldown_s * 1e9)
        if until_ns < from_ns or not np.any((offsets_ns >= from_ns) & (offsets_ns <= until_ns)):
            raise ValueError(
                f"--warmup-s {self.warmup_s:g} and --cooldown-s {self.cooldown_s:g} leave no"
                f" request of the {end_ns / 1e9:g} s schedule to measure"
            )
        return Window(from_ns=from_ns, until_ns=until_ns)

    def request(self) -> it.GenerateRequest:
        return it.GenerateRequest(workload=self.workload, max_tokens=self.max_tokens)

    def expected_chunks(self) -> list[ic.TokenChunk] | None:
        """The chunks every request of the run should receive, as the simulated service makes
        them (``None``: a workload this package does not know, served by someone else)."""
        try:
            return list(it.SimulatedService(token_stream_source).chunks(self.request()))
        except it.BadRequestError:
            return None


class _Run:
    """One point: the scheduler, and either a task per request (uncapped) or a worker per slot
    taking due requests in order (capped).

    Uncapped with a ``bound``: a request due while ``bound`` tasks run waits in a queue, and
    the first task to finish takes it (in order of intended time): no more tasks, connections
    or sockets than the bound, whatever the backlog."""

    def __init__(
        self,
        target: Target,
        request_for: Callable[[int], Any],
        recorder: Recorder,
        on_done: Callable[[], object] | None,
        new_check: Callable[[], StreamCheck],
        bound: int | None = None,
        unmeasured_check: Callable[[], StreamCheck] | None = None,
    ) -> None:
        self.target = target
        self.request_for = request_for
        self.recorder = recorder
        self.on_done = on_done
        self.new_check = new_check
        self.unmeasured_check = unmeasured_check or new_check
        """For requests in a warm-up or cool-down window: its parse times go nowhere."""
        self.in_flight = 0
        self.start_ns = 0
        self.bound = bound
        self.tasks_running = 0
        self.waiting: deque[tuple[int, int]] = deque()
        self.index_first = 0
        self.index_step = 1
        self.alarm: Alarm
        self.split: PointSplit | None = None
        """The point's split: each request is stamped (its client stages) and its server's
        report read; None: no stamps taken (attribution off)."""
        self.new_traceparent: Callable[[], str] | None = None
        self.spans_expected = False
        """The server's spans may give a request's report after the point (OTLP)."""
        self.conversations: ConversationPoint | None = None
        """The point's conversations (``--turns``): the schedule's entries are their starts."""
        self.ended: TurnEnded | None = None
        """Called as each request ends (a conversation's turn), with its check."""

    async def send(self, index: int, intended_ns: int) -> None:
        """One request, start to end; never raises but for cancellation."""
        recorder = self.recorder
        sent_ns = now_ns()
        recorder.sent(intended_ns, sent_ns)
        self.in_flight += 1
        live = recorder.live
        if live is not None:
            live.started()
        recorder.max_in_flight = max(recorder.max_in_flight, self.in_flight)
        stream: AsyncIterator[ic.TokenChunk] | None = None
        first_ns = previous_ns = 0
        tokens = first_count = 0
        gaps_ns: list[int] = []  # recorded once the stream is whole: a failure has no ITL
        chunk_tokens: list[int] = []
        error: str | None = None
        checker: StreamCheck | None = None
        timing: it.StreamTiming | None = None
        fields: dict[str, Any] | None = None
        waits_for_spans = False
        try:
            if self.split is None:
                stream = self.target.generate(self.request_for(index))
            else:
                timing = it.StreamTiming(server_stamps=False)
                if self.new_traceparent is not None:
                    timing.traceparent = self.new_traceparent()
                # every target here takes a timing: the transports' clients, the API targets
                target: Any = self.target
                stream = target.generate(self.request_for(index), timing=timing)
            measured = recorder.measures(intended_ns)
            checker = self.new_check() if measured else self.unmeasured_check()
            check = checker.check
            async for chunk in stream:
                count = check(chunk)
                if not count:
                    continue
                arrived_ns = now_ns()
                if tokens:
                    gaps_ns.append(arrived_ns - previous_ns)
                    chunk_tokens.append(count)
                else:
                    first_ns = arrived_ns
                    first_count = count
                previous_ns = arrived_ns
                tokens += count
            checker.finish(tokens)
            done_ns = now_ns()
            if measured:
                recorder.token_sources[checker.source] += 1
                if timing is not None and self.split is not None:
                    fields = self.split.request(
                        timing,
                        intended_ns=intended_ns,
                        sent_ns=sent_ns,
                        first_ns=first_ns,
                        done_ns=done_ns,
                        parse_ns=getattr(checker, "parse_total_ns", 0),
                        metrics_object=getattr(checker, "server_metrics", None),
                        deferred=self._deferred(
                            index,
                            intended_ns,
                            sent_ns,
                            done_ns,
                            tokens,
                            first_ns,
                            gaps_ns,
                            checker,
                            chunk_tokens,
                            first_count,
                        )
                        if self.spans_expected
                        else None,
                        fields=recorder.on_record is not None,
                    )
                    waits_for_spans = fields is None
            recorder.completed_stream(
                intended_ns=intended_ns,
                first_token_ns=first_ns,
                done_ns=done_ns,
                output_tokens=checker.output_tokens if tokens else 0,
                gaps_ns=gaps_ns,
                chunk_tokens=chunk_tokens,
                first_chunk_tokens=first_count,
                # what another API's stream carried (reasoning, tool calls), how it was counted
                chunk_source=getattr(checker, "chunk_source", checker.source),
                content=getattr(checker, "content", None),
                input_tokens=checker.input_tokens,
                inputs=getattr(checker, "inputs", 1),
            )
        except Exception as exc:
            done_ns = now_ns()
            if stream is not None:  # one left mid-way is cancelled, not left to the GC
                await aiter_close(stream)
            recorder.failed(exc, done_ns, intended_ns=intended_ns)
            error = metrics.error_name(exc)
        except asyncio.CancelledError:  # the drain timeout: counted as unfinished by the run
            self._record(
                index, intended_ns, sent_ns, now_ns(), metrics.UNFINISHED, 0, 0, [], checker
            )
            raise
        finally:
            self.in_flight -= 1
            if live is not None:
                live.ended()
            if self.on_done is not None:
                self.on_done()
        if self.ended is not None:  # a conversation's turn: its reply and end, for the next
            self.ended(index, intended_ns, done_ns, error, checker)
        if recorder.on_record is None or waits_for_spans:  # made later, or read by nobody
            recorder.recorded.add(index)
        else:
            self._record(
                index,
                intended_ns,
                sent_ns,
                done_ns,
                error,
                tokens,
                first_ns,
                gaps_ns,
                checker,
                fields,
                chunk_tokens,
                first_count,
            )

    def _deferred(
        self,
        index: int,
        intended_ns: int,
        sent_ns: int,
        done_ns: int,
        tokens: int,
        first_ns: int,
        gaps_ns: list[int],
        checker: StreamCheck,
        chunk_tokens: list[int],
        first_count: int,
    ) -> Callable[[dict[str, Any]], None]:
        """What makes the request's record once its spans are joined."""

        def record(fields: dict[str, Any]) -> None:
            self._record(
                index,
                intended_ns,
                sent_ns,
                done_ns,
                None,
                tokens,
                first_ns,
                gaps_ns,
                checker,
                fields,
                chunk_tokens,
                first_count,
            )

        return record

    def _record(
        self,
        index: int,
        intended_ns: int,
        sent_ns: int,
        done_ns: int,
        error: str | None,
        tokens: int,
        first_ns: int,
        gaps_ns: list[int],
        checker: StreamCheck | None,
        fields: dict[str, Any] | None = None,
        chunk_tokens: list[int] | None = None,
        first_count: int = 0,
    ) -> None:
        recorder = self.recorder
        if recorder.on_record is None:  # nobody reads it: building it would be the cost
            recorder.recorded.add(index)
            return
        counted = tokens
        if error is None and checker is not None and tokens:
            tokens = checker.output_tokens
        recorder.add_record(
            metrics.RequestRecord(
                index=index,
                intended_s=(intended_ns - self.start_ns) / 1e9,
                queue_wait_ms=(sent_ns - intended_ns) / 1e6,
                ok=error is None,
                error=error,
                ttft_ms=(first_ns - intended_ns) / 1e6 if tokens else None,
                e2e_ms=(done_ns - intended_ns) / 1e6,
                output_tokens=tokens,
                chunks=len(gaps_ns) + (1 if tokens else 0),
                tpot_ms=(done_ns - first_ns) / (tokens - 1) / 1e6 if tokens > 1 else None,
                itl_max_ms=max(gaps_ns) / 1e6 if gaps_ns else None,
                input_tokens=checker.input_tokens if checker is not None else None,
                measured=self.recorder.measures(intended_ns),
                **(fields or {}),
                **_carried(
                    error, counted, first_ns, intended_ns, chunk_tokens, first_count, checker
                ),
            )
        )

    async def uncapped(self, index: int, intended_ns: int) -> None:
        self.recorder.lagged(intended_ns, now_ns())
        try:
            await self.send(index, intended_ns)
            while self.waiting:  # keep the slot for the request that has waited longest
                await self.send(*self.waiting.popleft())
        finally:
            self.tasks_running -= 1

    async def worker(self, due: asyncio.Queue[tuple[int, int] | None]) -> None:
        while (item := await due.get()) is not None:
            await self.send(*item)

    async def converse(self, index: int, intended_ns: int) -> None:
        """One conversation: its first turn at its time, then each next one once the turn
        before has ended and its think time has passed (:mod:`.conversations`)."""
        conversations = self.conversations
        assert conversations is not None
        assert conversations.clock is not None
        while True:
            await self.send(index, intended_ns)
            following = conversations.next_turn(index)
            if following is None:
                return
            index, intended_ns = following
            await conversations.clock.sleep_until(intended_ns)
            self.recorder.lagged(intended_ns, now_ns())

    async def conversing(self, index: int, intended_ns: int) -> None:
        """:meth:`uncapped` for conversations: the slot is held from a conversation's start to
        its last turn's end, then taken by the one that has waited longest."""
        self.recorder.lagged(intended_ns, now_ns())
        try:
            await self.converse(index, intended_ns)
            while self.waiting:
                await self.converse(*self.waiting.popleft())
        finally:
            self.tasks_running -= 1

    async def schedule_conversations(
        self, start_ns: int, offsets_ns: np.ndarray, concurrency: int | None
    ) -> list[asyncio.Task[None]]:
        """Start each conversation at its time; the cap (or the bound) counts conversations
        under way. Returns the tasks that are still to finish."""
        assert self.conversations is not None
        loop = asyncio.get_running_loop()
        tasks: set[asyncio.Task[None]] = set()
        self.start_ns = start_ns
        recorder = self.recorder
        slots = concurrency if concurrency is not None else self.bound or math.inf
        for position, offset_ns in enumerate(offsets_ns.tolist()):
            index = self.conversations.first_index(position)
            intended_ns = start_ns + offset_ns
            if intended_ns > now_ns():
                await self.alarm.sleep_until(intended_ns)
            if self.tasks_running < slots:
                self.tasks_running += 1
                task = loop.create_task(self.conversing(index, intended_ns))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            else:  # every slot is under way: the next conversation to end takes it
                recorder.lagged(intended_ns, now_ns())
                recorder.waited_for_bound += concurrency is None
                self.waiting.append((index, intended_ns))
        return list(tasks)

    async def schedule(
        self, start_ns: int, offsets_ns: np.ndarray, concurrency: int | None
    ) -> list[asyncio.Task[None]]:
        """Start each request at its time; returns the tasks that are still to finish."""
        if self.conversations is not None:
            return await self.schedule_conversations(start_ns, offsets_ns, concurrency)
        loop = asyncio.get_running_loop()
        tasks: set[asyncio.Task[None]] = set()
        self.start_ns = start_ns
        due: asyncio.Queue[tuple[int, int] | None] = asyncio.Queue()
        if concurrency is not None:
            workers = [loop.create_task(self.worker(due)) for _ in range(concurrency)]
        recorder = self.recorder
        bound = self.bound if self.bound is not None else math.inf
        alarm = self.alarm
        for position, offset_ns in enumerate(offsets_ns.tolist()):
            index = self.index_first + position * self.index_step  # in the whole schedule
            intended_ns = start_ns + offset_ns
            if intended_ns > now_ns():
                await alarm.sleep_until(intended_ns)
            if concurrency is None and self.tasks_running < bound:
                self.tasks_running += 1
                task = loop.create_task(self.uncapped(index, intended_ns))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            elif concurrency is None:  # the bound is reached: the next task to finish takes it
                recorder.lagged(intended_ns, now_ns())
                recorder.waited_for_bound += 1
                self.waiting.append((index, intended_ns))
            else:
                recorder.lagged(intended_ns, now_ns())
                due.put_nowait((index, intended_ns))
        if concurrency is None:
            return list(tasks)
        for _ in workers:
            due.put_nowait(None)
        return workers


async def run_point(
    target: Target,
    spec: LoadSpec,
    *,
    rate_rps: float,
    concurrency: int | None = None,
    server_pid: int | None = None,
    progress: bool = False,
    expected: Sequence[ic.TokenChunk] | None = None,
    request_for: Callable[[int], Any] | None = None,
    checks: CheckFactory | None = None,
    on_record: metrics.RecordSink | None = None,  # each request's record, as it ends
    live: live_metrics.LiveMetrics | None = None,
    attribution: PointAttribution | None = None,
    schedule_ns: np.ndarray | None = None,
    conversations: ConversationPoint | None = None,
) -> dict[str, Any]:
    """Drive ``target`` at one rate (and cap) and return the point's metrics.

    Every stream is verified (see the module docstring); ``expected``: the chunks each should
    carry (e.g. :meth:`LoadSpec.expected_chunks`), to catch altered content too. For a target
    of another API (:mod:`.endpoints`): ``request_for`` gives the request of each index of
    the schedule (default: ``spec.request()`` for all), ``checks`` the checks of its streams
    (default: :class:`VerifiedStream`). ``live``: the metrics served while it runs, fed what
    the point records (:mod:`.live_metrics`). ``attribution``: stamp each request and read
    its server's reports (:mod:`.attribution`), in the point's ``attribution``.
    ``schedule_ns``: the intended send times (a trace's, :mod:`.traces`) instead of the ones
    ``spec`` draws at ``rate_rps``. ``conversations``: the schedule's entries are conversations'
    starts, each later turn sent after the one before (:mod:`.conversations`), in the point's
    ``conversations``."""
    if concurrency is not None and concurrency < 1:
        raise ValueError("the concurrency cap must be at least 1")
    if spec.max_in_flight is not None and spec.max_in_flight < 1:
        raise ValueError("the bound on requests in flight must be at least 1")
    whole = spec.offsets_ns(rate_rps) if schedule_ns is None else schedule_ns
    window = spec.window(whole)  # the windows are the whole schedule's, a part's too
    offsets_ns, index_first, index_step = spec.part_of(whole)
    measured = len(offsets_ns)
    if window is not None:
        measured = int(
            np.count_nonzero((offsets_ns >= window.from_ns) & (offsets_ns <= window.until_ns))
        )
    bound = spec.max_in_flight if concurrency is None else None
    recorder = Recorder(spec.slo, on_record=on_record, window=window, live=live)
    cpu = metrics.CpuMeter(server_pid)
    label = f"rate {rate_rps:g}/s" + (f" cap {concurrency}" if concurrency else "")
    with tqdm(
        total=len(offsets_ns) if conversations is None else conversations.planned,
        desc=label,
        unit="req",
        file=sys.stderr,
        disable=not progress,
        leave=False,
    ) as bar:
        if request_for is None:
            same = spec.request()
            request_for = lambda _: same  # noqa: E731
        new_check = (
            (lambda: VerifiedStream(expected)) if checks is None else checks(recorder.client_parse)
        )
        unmeasured = new_check if checks is None else checks(metrics.Histogram())
        if conversations is not None:  # each turn's reply goes into the next turn's history
            new_check, unmeasured = conversations.wrap(new_check), conversations.wrap(unmeasured)
        run = _Run(
            target,
            request_for,
            recorder,
            bar.update if progress else None,
            new_check,
            bound,
            unmeasured,
        )
        run.index_first, run.index_step = index_first, index_step
        if conversations is not None:
            conversations.bind(recorder)
            run.conversations, run.ended = conversations, conversations.ended
        run.alarm = alarm = Alarm()
        if attribution is not None:
            run.split = attribution.split
            run.new_traceparent = attribution.new_traceparent
            run.spans_expected = attribution.spans_expected
            await attribution.start()
        cpu.start()
        start_ns = now_ns() + 1_000_000  # a millisecond to get the scheduler going
        if spec.start_at_unix_s is not None:
            start_ns = start_instant_ns(spec.start_at_unix_s)
        recorder.begin(start_ns)
        # the live histograms count what the point recorded, every quarter second
        async with live_metrics.kept_flushed(None if live is None else recorder.flush_live):
            try:
                try:
                    pending = await run.schedule(start_ns, offsets_ns, concurrency)
                finally:
                    alarm.close()
                if pending:
                    _, late = await asyncio.wait(pending, timeout=spec.drain_timeout_s)
                    for task in late:
                        task.cancel()
                    await asyncio.gather(*late, return_exceptions=True)
            finally:
                if conversations is not None:
                    conversations.close()
        if attribution is not None:  # the last scrape, the spans still in flight, joined
            await attribution.finish()
        scheduled = len(offsets_ns)
        if conversations is not None:  # the later turns sent are requests of the point too
            scheduled += len(conversations.later_intended_ns)
            measured += conversations.later_measured()
        unaccounted = measured - recorder.completed - sum(recorder.errors.values())
        for _ in range(unaccounted):
            recorder.failed(None, now_ns())
        if conversations is None:
            _record_unfinished(recorder, start_ns, offsets_ns, index_first, index_step)
        else:
            conversations.record_unstarted(recorder, start_ns, offsets_ns)
        recorder.flush()  # the recording's last step, billed to the client like the rest
        usage = cpu.stop(recorder.output_tokens)
    schedule_s = float(offsets_ns[-1] - offsets_ns[0]) / 1e9 if len(offsets_ns) > 1 else 0.0
    summary = recorder.summary(
        start_ns=start_ns, scheduled=scheduled, excluded=scheduled - measured
    )
    summary["integrity"]["content_checked"] = expected is not None
    if attribution is not None:
        summary["attribution"] = attribution.summary(summary)
    point: dict[str, Any] = {
        "rate_rps": finite_or_text(rate_rps),
        "concurrency": concurrency,
        "loop": loops.running(),
        "timer": alarm.kind,
        "offered_rate_rps": (len(offsets_ns) - 1) / schedule_s if schedule_s else None,
        "in_flight_bound": bound,
        **summary,
        **usage,
        # the histograms themselves, so that points of several processes can be merged
        "hdr": {name: h.encode() for name, h in recorder.histograms().items()},
    }
    if conversations is not None:
        point["conversations"] = conversations.summary()
    if spec.part is not None:  # the span of its offsets gives the whole schedule's offered rate
        point["part"] = {
            "index": index_first,
            "parts": index_step,
            "first_offset_s": float(offsets_ns[0]) / 1e9 if len(offsets_ns) else None,
            "last_offset_s": float(offsets_ns[-1]) / 1e9 if len(offsets_ns) else None,
        }
    return point


def start_instant_ns(start_at_unix_s: float) -> int:
    """The :data:`now_ns` instant of a UNIX time: the wall clock read beside the monotonic one
    (across hosts, as good as their clocks' synchronisation)."""
    return now_ns() + round((start_at_unix_s - time.time()) * 1e9)


def _record_unfinished(
    recorder: Recorder, start_ns: int, offsets_ns: np.ndarray, first: int, step: int
) -> None:
    """A record for each request that has none: cancelled at the drain timeout, or never
    sent (still queued for a slot), so the records count every scheduled request."""
    recorded = recorder.recorded
    if len(recorded) == len(offsets_ns):
        return
    done_ns = now_ns()
    for position, offset_ns in enumerate(offsets_ns.tolist()):
        index = first + position * step
        if index in recorded:
            continue
        intended_ns = start_ns + offset_ns
        recorder.add_record(
            metrics.RequestRecord(
                index=index,
                intended_s=offset_ns / 1e9,
                queue_wait_ms=(done_ns - intended_ns) / 1e6,
                ok=False,
                error=metrics.UNFINISHED,
                ttft_ms=None,
                e2e_ms=(done_ns - intended_ns) / 1e6,
                output_tokens=0,
                chunks=0,
                tpot_ms=None,
                itl_max_ms=None,
                input_tokens=None,
                measured=recorder.measures(intended_ns),
            )
        )


def _carried(
    error: str | None,
    counted: int,
    first_ns: int,
    intended_ns: int,
    chunk_tokens: list[int] | None,
    first_count: int,
    checker: StreamCheck | None,
) -> dict[str, Any]:
    """A record's figures of what its stream carried (:mod:`.stream_content`): the most tokens
    a chunk carried, so far for a failure; TTFOT, reasoning tokens and tool calls of a
    completed stream."""
    most = max(first_count, max(chunk_tokens or (0,))) if counted else None
    if error is not None or checker is None:
        return {"max_tokens_per_chunk": most}
    content = getattr(checker, "content", None)
    if content is None:  # nothing but output: its first token was the first output
        return {
            "max_tokens_per_chunk": most,
            "ttfot_ms": (first_ns - intended_ns) / 1e6 if counted else None,
            "reasoning_tokens": 0,
            "tool_calls": 0,
        }
    first_output_ns = first_ns if content.first_output_ns is None else content.first_output_ns
    return {
        "max_tokens_per_chunk": most,
        "ttfot_ms": (first_output_ns - intended_ns) / 1e6 if counted and first_output_ns else None,
        "reasoning_tokens": content.reasoning_tokens,
        "tool_calls": content.tool_calls,
    }


def finite_or_text(value: float) -> float | str:
    """JSON has no infinity: an infinite rate is written ``"inf"``."""
    return value if math.isfinite(value) else str(value)


async def warm_up(target: Target, request: Any, requests: int) -> None:
    """Open connections and fill the server's caches before anything is timed; raises the
    first failure."""
    outcomes = await asyncio.gather(
        *(_drain(target.generate(request)) for _ in range(requests)), return_exceptions=True
    )
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome


async def _drain(chunks: AsyncIterator[Any]) -> None:
    async for _ in chunks:
        pass
