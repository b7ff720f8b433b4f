"""Whole traces on a virtual clock: :func:`simulate` and seeded arrival traces.

:func:`simulate` adds each request when the clock reaches its ``arrival_s`` (requests that
arrive during an iteration join the queue at its end, their queue time counted from arrival),
steps the core, and jumps the clock to the next arrival or timeout whenever the engine is idle.
Deterministic: the same config and trace give the same result on every machine.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from inferwire.codecs import TokenChunk

from .clock import VirtualClock
from .core import EngineCore
from .errors import EngineFullError
from .model import EngineRequest, RequestRecord, StepResult
from .scheduler import EngineConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class SimResult:
    """A simulated run: the finished requests' records in finishing order, every iteration,
    and the ids refused with :class:`~inferwire.engine.EngineFullError`."""

    config: EngineConfig
    records: list[RequestRecord]
    steps: list[StepResult]
    rejected: list[str] = field(default_factory=list)
    start_s: float = 0.0
    end_s: float = 0.0

    @property
    def duration_s(self) -> float:
        """From the first arrival to the end of the last iteration."""
        return self.end_s - self.start_s

    @property
    def output_tokens(self) -> int:
        return sum(r.tokens for r in self.records)

    @property
    def throughput_tok_s(self) -> float:
        """Output tokens per second over :attr:`duration_s`."""
        return self.output_tokens / self.duration_s if self.duration_s > 0 else 0.0

    def percentiles(self, metric: str, qs: Sequence[float] = (50, 99)) -> dict[float, float]:
        """Percentiles (numpy's linear interpolation) of a record attribute such as
        ``"ttft_s"``, ``"e2e_s"`` or ``"queue_s"`` over the finished requests."""
        values = [getattr(r, metric) for r in self.records]
        if not values:
            return {q: math.nan for q in qs}
        return {q: float(np.percentile(values, q)) for q in qs}


def simulate(config: EngineConfig, trace: Sequence[EngineRequest]) -> SimResult:
    """Run ``trace`` (requests with their ``arrival_s``; ``None`` counts as 0) to the end on a
    :class:`~inferwire.engine.VirtualClock` starting at the first arrival."""
    pending = sorted(
        trace, key=lambda r: 0.0 if r.arrival_s is None else r.arrival_s
    )  # stable: ties keep trace order
    start_s = 0.0 if not pending or pending[0].arrival_s is None else pending[0].arrival_s
    clock = VirtualClock(start_s)
    core = EngineCore(config, clock)
    records: list[RequestRecord] = []
    steps: list[StepResult] = []
    rejected: list[str] = []
    i = 0
    while i < len(pending) or core.has_work():
        while i < len(pending) and (pending[i].arrival_s or 0.0) <= clock.now():
            try:
                core.add(pending[i])
            except EngineFullError:
                rejected.append(pending[i].rid)
            i += 1
        result = core.step()
        if result is not None:
            steps.append(result)
            finished = (core.pop_record(o.rid) for o in result.outputs if o.finished)
            records.extend(record for record in finished if record is not None)
            continue
        wakeups = [t for t in (core.next_wakeup_s(),) if t is not None]
        if i < len(pending):
            wakeups.append(pending[i].arrival_s or 0.0)
        if not wakeups:
            raise RuntimeError(f"the engine is stuck: {core.stats()}")  # paused forever
        clock.advance_to(min(wakeups))
    return SimResult(
        config=config,
        records=records,
        steps=steps,
        rejected=rejected,
        start_s=start_s,
        end_s=clock.now(),
    )


ChunkSource = Sequence[TokenChunk] | Callable[[int], Sequence[TokenChunk]]


def poisson_trace(
    rate_per_s: float,
    count: int,
    seed: int,
    chunks: ChunkSource,
    *,
    prompt_tokens: int | Callable[[int], int] | None = None,
    cv: float = 1.0,
    start_s: float = 0.0,
) -> list[EngineRequest]:
    """``count`` requests ``"r0"``, ``"r1"``, ... arriving at ``rate_per_s`` on average, from
    ``numpy.random.default_rng(seed)``: exponential gaps (Poisson arrivals), or with ``cv`` other
    than 1 gamma gaps of that coefficient of variation (shape ``1/cv**2``; above 1 is burstier),
    as the load generator draws them. The first request arrives after one gap.

    ``chunks``: every request's chunks, or a function of the request number that makes them
    (e.g. ``lambda i: token_stream_source("stream-256", i)``). ``prompt_tokens``: a count, a
    function of the request number, or ``None`` for the prompt size the chunks' final ``usage``
    reports (0 if none does)."""
    if not rate_per_s > 0 or not math.isfinite(rate_per_s):
        raise ValueError("rate_per_s must be a positive number")
    if count < 0:
        raise ValueError("count cannot be negative")
    if not cv > 0:
        raise ValueError("cv must be positive")
    rng = np.random.default_rng(seed)
    if cv == 1.0:
        gaps = rng.exponential(1.0 / rate_per_s, size=count)
    else:
        shape = 1.0 / cv**2
        gaps = rng.gamma(shape, 1.0 / (rate_per_s * shape), size=count)
    arrivals = start_s + np.cumsum(gaps)
    trace = []
    for i in range(count):
        request_chunks = chunks(i) if callable(chunks) else chunks
        if prompt_tokens is None:
            prompt = next((c.usage.prompt_tokens for c in reversed(request_chunks) if c.usage), 0)
        else:
            prompt = prompt_tokens(i) if callable(prompt_tokens) else prompt_tokens
        trace.append(EngineRequest(f"r{i}", request_chunks, prompt, float(arrivals[i])))
    return trace
