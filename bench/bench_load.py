"""The load generator's own capacity, and one small load run against a real server.

Capacity: the generator drives a null target (a "request" that yields one token at once, no
I/O), so everything measured is its own work: drawing the schedule, waking on time, starting
the request, recording its latencies. A rate is sustained when every request completes and
the P99 of the send lag (intended to actual start) stays under 1 ms; the target is 5,000
requests/s. Each rate runs ``CAPACITY_TRIALS`` trials, each from a fresh event loop, and the
figures are the median trial's (by P99 lag): a neighbour's busy spell on this shared machine
lands in one trial, and a single trial's P99 would report it as the generator's own lag. The
generator is one asyncio loop in one thread, so it uses at most one core; ``client_cpu_share``
in ``extra_info`` says how much of it. The timed value of these
benchmarks is the run's wall time, fixed by the schedule: read ``extra_info``.

Under ``--benchmark-disable`` every run is cut to a fraction of a second.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any, Final

import pytest

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire.bench.loadgen import metrics, openloop
from inferwire.bench.procs import server_process

CAPACITY_RATES: Final = (5_000.0, 10_000.0)
CAPACITY_S: Final = 1.5
CAPACITY_TRIALS: Final = 3
DISABLED_S: Final = 0.3
LAG_TARGET_MS: Final = 1.0
_TOKEN: Final = ic.TokenChunk(
    id="null",
    model="null",
    created=0,
    index=0,
    seq=0,
    token_ids=(1,),
    text="x",
    finish_reason="length",  # the end marker: the generator verifies every stream
    usage=ic.Usage(prompt_tokens=0, completion_tokens=1),
)


class NullTarget:
    """A stream of one chunk (its own end marker), produced without I/O or awaiting anything."""

    async def generate(self, request: it.GenerateRequest, /) -> AsyncIterator[ic.TokenChunk]:
        yield _TOKEN

    async def close(self) -> None:
        pass


def _run(target: openloop.Target, spec: openloop.LoadSpec, **point: Any) -> dict[str, Any]:
    with asyncio.Runner(loop_factory=openloop.event_loop_factory(precise=True)) as runner:
        return runner.run(openloop.run_point(target, spec, **point))


@pytest.mark.parametrize("concurrency", [None, 64], ids=["uncapped", "cap64"])
@pytest.mark.parametrize("rate", CAPACITY_RATES, ids=lambda r: f"{r:g}rps")
def bench_generator_capacity(benchmark: Any, rate: float, concurrency: int | None) -> None:
    spec = openloop.LoadSpec(duration_s=DISABLED_S if benchmark.disabled else CAPACITY_S, seed=1)
    trials = 1 if benchmark.disabled else CAPACITY_TRIALS
    benchmark.group = "load generator capacity"
    points: list[dict[str, Any]] = []

    def run_trials() -> None:
        for trial in range(trials):
            trial_spec = dataclasses.replace(spec, seed=spec.seed + trial)
            points.append(_run(NullTarget(), trial_spec, rate_rps=rate, concurrency=concurrency))

    benchmark.pedantic(run_trials, rounds=1, iterations=1)
    by_lag = sorted(points, key=lambda p: p["send_lag"]["p99_ms"])
    point = by_lag[len(by_lag) // 2]
    lag = point["send_lag"]
    sustained = (
        point["requests_completed"] == point["requests_scheduled"] and lag["p99_ms"] < LAG_TARGET_MS
    )
    benchmark.extra_info.update(
        target="null",
        rate_rps=rate,
        concurrency=concurrency,
        trials=trials,
        trial_s=spec.duration_s,
        trial_p99_lag_ms=[p["send_lag"]["p99_ms"] for p in points],
        requests=point["requests_scheduled"],
        achieved_rps=point["request_throughput_rps"],
        offered_rps=point["offered_rate_rps"],
        send_lag_ms={k: lag[k] for k in ("p50_ms", "p90_ms", "p99_ms", "p99_9_ms", "max_ms")},
        client_cpu_share=point["client_cpu_s"] / point["duration_s"],
        client_cpu_us_per_request=point["client_cpu_s"] / point["requests_scheduled"] * 1e6,
        sustained=sustained,
        event_loop="select",
        load_average=metrics.machine()["load_average"],  # other work on the cores skews lag
        correct=all(p["requests_failed"] == 0 for p in points),
    )
    for p in points:
        assert p["requests_failed"] == 0, p["errors"]


LOAD_RATE_RPS = 20.0
LOAD_PREFILL_MS = 20.0
LOAD_DECODE_MS = 2.0
LOAD_SLO = metrics.Slo(ttft_ms=100.0, tpot_ms=5.0)


@pytest.mark.parametrize("transport", it.TRANSPORTS)
def bench_load(benchmark: Any, transport: str) -> None:
    """An open-loop run against ``inferwire serve`` with a paced service (prefill 20 ms, 2 ms
    per token, ``stream-256``: about half a second per request) at 20 requests/s, Poisson:
    TTFT, TPOT, ITL and E2E percentiles, goodput under the SLOs, CPU per 1,000 tokens. The
    whole JSON summary of the point lands in ``extra_info``."""
    spec = openloop.LoadSpec(
        workload="stream-256",
        duration_s=0.5 if benchmark.disabled else 5.0,
        seed=1,
        slo=LOAD_SLO,
    )
    benchmark.group = "load end to end"
    options = ("--prefill-ms", str(LOAD_PREFILL_MS), "--decode-ms", str(LOAD_DECODE_MS))
    with server_process.serve(transport, "orjson", *options) as server:
        assert server.process is not None
        pid = server.process.pid

        async def go() -> dict[str, Any]:
            target = openloop.open_target(transport, server.address, "orjson")
            try:
                await openloop.warm_up(target, spec.request(), 8)
                return await openloop.run_point(
                    target, spec, rate_rps=LOAD_RATE_RPS, server_pid=pid
                )
            finally:
                await target.close()

        def run() -> dict[str, Any]:
            precise = openloop.select_is_safe(transport, [None])
            with asyncio.Runner(loop_factory=openloop.event_loop_factory(precise=precise)) as r:
                return r.run(go())

        point = benchmark.pedantic(run, rounds=1, iterations=1)
    benchmark.extra_info.update(
        transport=transport,
        codec="orjson",
        op="load",
        workload=spec.workload,
        prefill_ms=LOAD_PREFILL_MS,
        decode_ms=LOAD_DECODE_MS,
        versions=metrics.versions(),
        **point,
    )
    assert point["requests_failed"] == 0, point["errors"]
