"""Driving the real stack of the engine suite (``bench/bench_engine.py``): one open-loop point
against a frontend (:func:`drive`), the load generator's figures the report reads, and the hop
codec sweep's trial (tokens/s, and each process's CPU from psutil on its pid) with its summary
over trials."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import psutil  # type: ignore[import-untyped, unused-ignore]

from inferwire._runtime import loops
from inferwire.bench.measure.engine_runs import RequestShape, generate_request
from inferwire.bench.procs import engine_stack
from inferwire.load import metrics, openloop

WARM_REQUESTS: Final = 8


def stack_loop() -> str:
    return loops.requested_loop()


def point_figures(point: dict[str, Any]) -> dict[str, Any]:
    """The load generator's figures the report reads (latencies from the intended send time)."""
    keys = ("ttft", "e2e", "tpot", "send_lag")
    return {
        **{k: {p: point[k][p] for p in ("p50_ms", "p90_ms", "p99_ms")} for k in keys},
        **{
            k: point[k]
            for k in (
                "requests_measured",
                "requests_completed",
                "requests_failed",
                "errors",
                "output_tokens",
                "output_token_throughput_tps",
                "request_throughput_rps",
                "integrity",
            )
        },
    }


def drive(
    address: str,
    spec: openloop.LoadSpec,
    rate: float,
    shapes: Sequence[RequestShape],
    *,
    target: openloop.Target | None = None,
    server_pid: int | None = None,
    on_record: metrics.RecordSink | None = None,
) -> dict[str, Any]:
    """One open-loop point against the frontend at ``address`` (http1, orjson), request i
    shaped by ``shapes[i]``, after a few untimed requests."""
    requests = [generate_request(shape) for shape in shapes]

    async def go() -> dict[str, Any]:
        client = target or openloop.open_target("http1", address, "orjson")
        try:
            await openloop.warm_up(client, requests[0], WARM_REQUESTS)
            return await openloop.run_point(
                client,
                spec,
                rate_rps=rate,
                server_pid=server_pid,
                request_for=lambda i: requests[i % len(requests)],
                on_record=on_record,
            )
        finally:
            await client.close()

    return loops.run(go(), stack_loop())


SATURATION_GAIN: Final = 0.9
"""A point whose tokens/s is below 90% of the offered tokens/s fell short (did not keep up)."""
SATURATION_CORES: Final = 0.95


def sweep_trial(
    stack: engine_stack.EngineStack,
    rate: float,
    seed: int,
    trial_s: float,
    shapes: Sequence[RequestShape],
    encode_per_chunk_s: float,
    isolated_decode_per_chunk_s: float,
    tokens_per_request: int,
) -> dict[str, Any]:
    """One point against one stack: tokens/s (the point's), and over the whole drive (warm-up
    included, for CPU and chunks alike) the frontend's CPU, its serialization share, and the
    CPU of the engine and of this process (the load generator)."""
    spec = openloop.LoadSpec(duration_s=trial_s, seed=seed)
    meters = {
        "frontend": psutil.Process(stack.frontend_pid),
        "engine": psutil.Process(stack.engine.pid),
        "client": psutil.Process(),
    }
    before = stack.counters()["client"]
    cpu_before = {name: cpu_s(p) for name, p in meters.items()}
    started = time.perf_counter()
    point = drive(stack.address, spec, rate, shapes)
    wall_s = time.perf_counter() - started
    cpu = {name: cpu_s(p) - cpu_before[name] for name, p in meters.items()}
    after = stack.counters()["client"]
    chunks = after["chunks_decoded"] - before["chunks_decoded"]
    hop_decode_s = (after["decode_ns"] - before["decode_ns"]) / 1e9
    serialization_s = hop_decode_s + encode_per_chunk_s * chunks
    return {
        "tokens_s": point["output_token_throughput_tps"],
        "offered_tokens_s": rate * tokens_per_request,
        "frontend_cpu_cores": cpu["frontend"] / wall_s,
        "engine_cpu_cores": cpu["engine"] / wall_s,
        "client_cpu_cores": cpu["client"] / wall_s,
        "frontend_cpu_us_per_token": cpu["frontend"] / max(chunks, 1) * 1e6,
        "hop_decode_us_per_chunk": hop_decode_s / max(chunks, 1) * 1e6,
        "serialization_share": serialization_s / cpu["frontend"] if cpu["frontend"] > 0 else 0.0,
        "serialization_share_isolated": (
            (isolated_decode_per_chunk_s + encode_per_chunk_s) * chunks / cpu["frontend"]
            if cpu["frontend"] > 0
            else 0.0
        ),
        "failed": point["requests_failed"],
        "violations": metrics.integrity_violations(point["integrity"]),
    }


def cpu_s(process: Any) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def summarize(
    trials: list[dict[str, Any]], rate: float, tokens_per_request: int, shared_core: bool
) -> dict[str, Any]:
    """A codec's point at one rate: the median trial's figures, with the trials' range;
    ``fell_short`` when its tokens/s stayed under :data:`SATURATION_GAIN` of the offered,
    ``frontend_core_busy`` when the frontend used its core, ``other_core_busy`` when the
    engine and the load generator (sharing the other core when pinned) used it."""
    tokens = [t["tokens_s"] for t in trials]
    median = {
        name: float(np.median([t[name] for t in trials]))
        for name in trials[0]
        if name not in ("failed", "violations")
    }
    others = median["engine_cpu_cores"] + median["client_cpu_cores"]
    return {
        "rate_rps": rate,
        **median,
        "tokens_s_min": min(tokens),
        "tokens_s_max": max(tokens),
        "trials_tokens_s": tokens,
        "fell_short": median["tokens_s"] < SATURATION_GAIN * rate * tokens_per_request,
        "frontend_core_busy": median["frontend_cpu_cores"] >= SATURATION_CORES,
        "other_core_busy": shared_core and others >= SATURATION_CORES,
        "failed": sum(t["failed"] for t in trials),
        "violations": sum(t["violations"] for t in trials),
    }


def limited(point: dict[str, Any]) -> bool:
    """Whether a point reached a limit: short of the offered tokens, or a core busy."""
    return bool(point["fell_short"] or point["frontend_core_busy"] or point["other_core_busy"])
