"""The open-loop engine behind ``inferwire load`` (see
:mod:`inferwire.bench.loadgen.load_command` for what it measures and how each metric is
defined): the seeded arrival schedule, the clients it sends to, and the scheduler that starts
each request at its intended time.

Every stream is checked as it arrives (:class:`~inferwire.codecs.integrity.StreamVerifier`):
in order, none lost or repeated, up to an end marker whose token count matches, and, when the
expected chunks are given, the very chunks sent. A stream that fails is an error, never a
success.

Without a cap, each request is a task started at its time. With ``concurrency`` N, N workers
take the due requests in order of their intended time, so a backlog costs memory for a
number, not for a task, and the cap holds exactly.
"""

from __future__ import annotations

import asyncio
import math
import selectors
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol

import numpy as np
from tqdm import tqdm  # type: ignore[import-untyped, unused-ignore]

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire.codecs.integrity import StreamVerifier
from inferwire.transports.common import DEFAULT_LIMITS, aiter_close
from inferwire.workloads import token_stream_source

from . import metrics
from .metrics import Histogram, Recorder, Slo

Arrival = Literal["poisson", "gamma"]
now_ns: Final = time.monotonic_ns  # the clock of loop.time() and of the transports' stamps
DEFAULT_DURATION_S: Final = 10.0
DEFAULT_DRAIN_TIMEOUT_S: Final = 60.0
SELECT_MAX_SOCKETS: Final = 512
"""Below select()'s FD_SETSIZE of 1,024 with room for everything else the process has open."""


def arrival_offsets_ns(
    rate_rps: float,
    *,
    arrival: Arrival = "poisson",
    burstiness: float = 1.0,
    seed: int = 0,
    requests: int | None = None,
    duration_s: float | None = None,
) -> np.ndarray:
    """Intended send times in nanoseconds after the start, the first at 0: gaps drawn from a
    gamma distribution of mean ``1 / rate_rps`` and shape ``burstiness`` (Poisson: shape 1).
    The schedule ends after ``requests`` requests or before ``duration_s``, whichever is first;
    an infinite rate sends every request at once. Same arguments, same schedule."""
    if requests is None and duration_s is None:
        raise ValueError("give a number of requests or a duration")
    if not rate_rps > 0:
        raise ValueError("the rate must be positive")
    if (requests is not None and requests < 1) or (duration_s is not None and not duration_s > 0):
        raise ValueError("the number of requests and the duration must be positive")
    if arrival == "poisson" and burstiness != 1.0:
        raise ValueError("burstiness is the gamma shape: it needs the gamma arrival process")
    if not burstiness > 0:
        raise ValueError("burstiness must be positive")
    if math.isinf(rate_rps):
        if requests is None:
            raise ValueError("an infinite rate needs a number of requests")
        return np.zeros(requests, dtype=np.int64)
    rng = np.random.default_rng(seed)
    scale_s = 1.0 / (rate_rps * burstiness)
    limit = requests if requests is not None else math.inf
    horizon_s = duration_s if duration_s is not None else math.inf
    block = int(min(limit, rate_rps * min(horizon_s, 3600.0) * 1.1 + 64))
    gaps: list[np.ndarray] = []
    drawn = 0
    total_s = 0.0
    while drawn < limit and total_s < horizon_s:  # one block suffices but for bad luck
        more = rng.gamma(burstiness, scale_s, size=block)
        gaps.append(more)
        drawn += block
        total_s += float(more.sum())
    offsets_s = np.concatenate([[0.0], np.cumsum(np.concatenate(gaps))])
    offsets_s = offsets_s[: int(min(limit, len(offsets_s)))]
    offsets_s = offsets_s[offsets_s < horizon_s]
    return np.round(offsets_s * 1e9).astype(np.int64)


class Target(Protocol):
    """What the generator sends to: an :class:`~inferwire.transports.Client`, a pool of them,
    or anything else with the same ``generate``."""

    def generate(self, request: Any, /) -> AsyncIterator[Any]: ...

    async def close(self) -> None: ...


class StreamCheck(Protocol):
    """Checks one stream as it arrives: :meth:`check` takes each item and returns the tokens
    it carries; :meth:`finish`, after the last, raises if the stream is not whole and sets
    ``output_tokens`` (which may differ from the sum of the counts: a server's usage) and
    ``input_tokens``, and ``source`` says how the tokens were counted."""

    output_tokens: int
    input_tokens: int | None
    source: str

    def check(self, item: Any, /) -> int: ...

    def finish(self, counted: int) -> None: ...


class VerifiedStream:
    """:class:`StreamCheck` for inferwire's own servers: the stream verifier's sequence, end
    marker and, with ``expected``, content checks."""

    __slots__ = ("check", "input_tokens", "output_tokens", "source", "verifier")

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

    async def generate(self, request: it.GenerateRequest, /) -> AsyncIterator[ic.TokenChunk]:
        if self._idle:
            client = self._idle.pop()
        else:
            client = self._make()
            self._clients.append(client)
        try:
            async for chunk in client.generate(request):
                yield chunk
        finally:
            self._idle.append(client)

    async def close(self) -> None:
        for client in self._clients:
            await client.close()


def open_target(
    transport: str, address: str, codec: str, *, limits: it.Limits = DEFAULT_LIMITS
) -> Target:
    """A client for ``transport``: http1 pools connections itself, http2 and grpc multiplex
    one connection, and tcp gets a :class:`ClientPool`. ``limits.timeout_s`` bounds each
    connect and each wait for the server."""
    if transport == "tcp":
        return ClientPool(lambda: it.connect(transport, address, codec=codec, limits=limits))
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
        )

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
    taking due requests in order (capped)."""

    def __init__(
        self,
        target: Target,
        request_for: Callable[[int], Any],
        recorder: Recorder,
        on_done: Callable[[], object] | None,
        new_check: Callable[[], StreamCheck],
    ) -> None:
        self.target = target
        self.request_for = request_for
        self.recorder = recorder
        self.on_done = on_done
        self.new_check = new_check
        self.in_flight = 0
        self.start_ns = 0

    async def send(self, index: int, intended_ns: int) -> None:
        """One request, start to end; never raises but for cancellation."""
        recorder = self.recorder
        sent_ns = now_ns()
        recorder.queue_wait.record_ns(sent_ns - intended_ns)
        self.in_flight += 1
        recorder.max_in_flight = max(recorder.max_in_flight, self.in_flight)
        stream: AsyncIterator[ic.TokenChunk] | None = None
        first_ns = previous_ns = 0
        tokens = 0
        gaps_ns: list[int] = []  # recorded once the stream is whole: a failure has no ITL
        chunk_tokens: list[int] = []
        error: str | None = None
        checker: StreamCheck | None = None
        try:
            stream = self.target.generate(self.request_for(index))
            checker = self.new_check()
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
                previous_ns = arrived_ns
                tokens += count
            checker.finish(tokens)
            done_ns = now_ns()
            recorder.token_sources[checker.source] += 1
            recorder.completed_stream(
                intended_ns=intended_ns,
                first_token_ns=first_ns,
                done_ns=done_ns,
                output_tokens=checker.output_tokens if tokens else 0,
                gaps_ns=gaps_ns,
                chunk_tokens=chunk_tokens,
            )
        except Exception as exc:
            done_ns = now_ns()
            if stream is not None:  # one left mid-way is cancelled, not left to the GC
                await aiter_close(stream)
            recorder.failed(exc, done_ns)
            error = metrics.error_name(exc)
        finally:
            self.in_flight -= 1
            if self.on_done is not None:
                self.on_done()
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
            )
        )

    async def uncapped(self, index: int, intended_ns: int) -> None:
        self.recorder.send_lag.record_ns(now_ns() - intended_ns)
        await self.send(index, intended_ns)

    async def worker(self, due: asyncio.Queue[tuple[int, int] | None]) -> None:
        while (item := await due.get()) is not None:
            await self.send(*item)

    async def schedule(
        self, start_ns: int, offsets_ns: np.ndarray, concurrency: int | None
    ) -> list[asyncio.Task[None]]:
        """Start each request at its time; returns the tasks that are still to finish."""
        loop = asyncio.get_running_loop()
        tasks: set[asyncio.Task[None]] = set()
        self.start_ns = start_ns
        due: asyncio.Queue[tuple[int, int] | None] = asyncio.Queue()
        if concurrency is not None:
            workers = [loop.create_task(self.worker(due)) for _ in range(concurrency)]
        lag = self.recorder.send_lag
        for index, offset_ns in enumerate(offsets_ns.tolist()):
            intended_ns = start_ns + offset_ns
            delay_ns = intended_ns - now_ns()
            if delay_ns > 0:
                await asyncio.sleep(delay_ns / 1e9)
            if concurrency is None:
                task = loop.create_task(self.uncapped(index, intended_ns))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            else:
                lag.record_ns(now_ns() - intended_ns)
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
) -> dict[str, Any]:
    """Drive ``target`` at one rate (and cap) and return the point's metrics.

    Every stream is verified (see the module docstring); ``expected``: the chunks each should
    carry (e.g. :meth:`LoadSpec.expected_chunks`), to catch altered content too. For a target
    of another API (:mod:`.endpoints`): ``request_for`` gives the request of each index of
    the schedule (default: ``spec.request()`` for all), ``checks`` the checks of its streams
    (default: :class:`VerifiedStream`)."""
    if concurrency is not None and concurrency < 1:
        raise ValueError("the concurrency cap must be at least 1")
    offsets_ns = spec.offsets_ns(rate_rps)
    recorder = Recorder(spec.slo, on_record=on_record)
    cpu = metrics.CpuMeter(server_pid)
    label = f"rate {rate_rps:g}/s" + (f" cap {concurrency}" if concurrency else "")
    with tqdm(
        total=len(offsets_ns),
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
        run = _Run(target, request_for, recorder, bar.update if progress else None, new_check)
        cpu.start()
        start_ns = now_ns() + 1_000_000  # a millisecond to get the scheduler going
        pending = await run.schedule(start_ns, offsets_ns, concurrency)
        if pending:
            _, late = await asyncio.wait(pending, timeout=spec.drain_timeout_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        unaccounted = len(offsets_ns) - recorder.completed - sum(recorder.errors.values())
        for _ in range(unaccounted):
            recorder.failed(None, now_ns())
        recorder.flush()  # the recording's last step, billed to the client like the rest
        usage = cpu.stop(recorder.output_tokens)
    schedule_s = float(offsets_ns[-1]) / 1e9 if len(offsets_ns) > 1 else 0.0
    summary = recorder.summary(start_ns=start_ns, scheduled=len(offsets_ns))
    summary["integrity"]["content_checked"] = expected is not None
    return {
        "rate_rps": finite_or_text(rate_rps),
        "concurrency": concurrency,
        "offered_rate_rps": (len(offsets_ns) - 1) / schedule_s if schedule_s else None,
        **summary,
        **usage,
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


def event_loop_factory(precise: bool) -> Callable[[], asyncio.AbstractEventLoop]:
    """``precise``: wait on select() (microsecond timeouts); else the default (epoll)."""
    selector = selectors.SelectSelector if precise else selectors.DefaultSelector
    return lambda: asyncio.SelectorEventLoop(selector())


def select_is_safe(transport: str, concurrencies: list[int | None]) -> bool:
    """Whether the generator's sockets stay well under select()'s limit: one connection for
    http2 and grpc, one per request in flight (at most the cap) for tcp and http1."""
    if transport in ("http2", "grpc"):
        return True
    return all(c is not None and c <= SELECT_MAX_SOCKETS for c in concurrencies)
