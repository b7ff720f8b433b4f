"""Batching policies (claims C8, C13), the per-stage split through an engine (C4, C9, C10), and
the frontend-engine hop by codec (issue 17).

On the engine's virtual clock (:func:`inferwire.engine.simulate`, deterministic, thousands of
requests in seconds):

- ``bench_c8_policies``: continuous against static batching at ``C8_RATE_RPS`` (seeded Poisson)
  with the default step model: TTFT and E2E percentiles per policy.
- ``bench_c13_batch_sizes``: the adaptive admission size B = min(Bmax, ceil(Q / (1 + L)))
  against fixed sizes (continuous batching with a fixed batch cap, static batching at fixed
  sizes), on a Poisson trace near the engine's capacity and on a bursty gamma trace at the same
  mean rate: throughput and P99.

Through the real stack (load generator -> ``inferwire serve --engine`` -> ``inferwire engine``,
each its own process, loopback), see :mod:`inferwire.bench.procs.engine_stack`:

- ``bench_c8_stack``: the C8 point again, a short window per policy, latencies from each
  request's intended send time.
- ``bench_engine_stages``: a request's time split into compute, scheduling and queueing,
  serialization and network at a moderate rate.
- ``bench_hop_sweep``: output tokens/s against offered rate per hop codec, codecs interleaved
  within each rate step, until the frontend's core saturates.

Every request's length and prompt come from a seeded draw (:func:`request_shapes`): batching
policies differ exactly where lengths differ (a static batch waits for its longest member).
Every benchmark records whether every stream arrived whole (``correct``). Under
``--benchmark-disable`` every run is cut to a fraction of a second.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Iterator, Sequence
from typing import Any, Final

import numpy as np
import pytest

import inferwire.transports as it
from inferwire import engine
from inferwire.bench.loadgen import metrics, openloop
from inferwire.bench.loadgen.arrivals import Arrival, arrival_offsets_ns
from inferwire.bench.procs import engine_stack, server_process
from inferwire.engine import steps as steps_module
from inferwire.transports import loops
from inferwire.workloads import token_stream_source

WORKLOAD: Final = "stream-256"
OUTPUT_TOKENS: Final = (16, 128)
"""Each request's output length, uniform in this range (inclusive), seeded."""
PROMPT_TOKENS: Final = (32, 512)
"""Each request's prompt length, uniform in this range (inclusive), seeded."""
DISTINCT_STREAMS: Final = 32
"""Requests reuse the chunks of this many seeds (their lengths still differ): building a
workload per request would cost more than the simulation."""
SEED: Final = 17

C8_RATE_RPS: Final = 50.0
C8_REQUESTS: Final = 4000
C8_POLICIES: Final = ("continuous", "static")

C13_REQUESTS: Final = 4000
C13_LOAD: Final = 0.9
"""The near-capacity trace's rate as a share of the engine's measured capacity."""
C13_BURSTINESS: Final = 0.25
"""The bursty trace's gamma shape (1 is Poisson; below 1, arrivals come in bursts)."""
C13_ADMIT_SIZES: Final = (1, 2, 4, 8, 16)
"""Continuous batching's fixed admission sizes (requests one prefill iteration may admit)."""
C13_STATIC_SIZES: Final = (8, 16, 32, 64)
C13_BMAX: Final = engine.EngineConfig().adaptive_bmax
C13_SLOTS: Final = engine.EngineConfig().max_batch

QUICK_REQUESTS: Final = 60


@dataclasses.dataclass(frozen=True, slots=True)
class RequestShape:
    output_tokens: int
    prompt_tokens: int
    seed: int


def request_shapes(count: int, seed: int = SEED) -> list[RequestShape]:
    """Seeded output and prompt lengths, uniform in :data:`OUTPUT_TOKENS` and
    :data:`PROMPT_TOKENS`; the chunks' seed cycles over :data:`DISTINCT_STREAMS`."""
    rng = np.random.default_rng(seed)
    outputs = rng.integers(OUTPUT_TOKENS[0], OUTPUT_TOKENS[1] + 1, size=count)
    prompts = rng.integers(PROMPT_TOKENS[0], PROMPT_TOKENS[1] + 1, size=count)
    return [
        RequestShape(int(o), int(p), i % DISTINCT_STREAMS)
        for i, (o, p) in enumerate(zip(outputs, prompts, strict=True))
    ]


def generate_request(shape: RequestShape) -> it.GenerateRequest:
    return it.GenerateRequest(
        workload=WORKLOAD,
        seed=shape.seed,
        max_tokens=shape.output_tokens,
        prompt_tokens=shape.prompt_tokens,
    )


_SERVICE: Final = it.SimulatedService(token_stream_source, cache_size=DISTINCT_STREAMS)


def trace(
    rate_rps: float,
    count: int,
    *,
    arrival: Arrival = "poisson",
    burstiness: float = 1.0,
    seed: int = SEED,
) -> list[engine.EngineRequest]:
    """A seeded trace: arrivals from the load generator's schedules, lengths from
    :func:`request_shapes`."""
    offsets_ns = arrival_offsets_ns(
        rate_rps, arrival=arrival, burstiness=burstiness, seed=seed, requests=count
    )
    shapes = request_shapes(len(offsets_ns), seed)
    return [
        engine.EngineRequest(
            rid=f"r{i}",
            chunks=_SERVICE.chunks(generate_request(shape)),
            prompt_tokens=shape.prompt_tokens,
            arrival_s=float(offset) / 1e9,
        )
        for i, (offset, shape) in enumerate(zip(offsets_ns.tolist(), shapes, strict=True))
    ]


def _tokens(request: engine.EngineRequest) -> int:
    return sum(len(chunk.token_ids) for chunk in request.chunks)


def percentiles_ms(values_s: Sequence[float]) -> dict[str, float]:
    """P50, P90 and P99 in milliseconds."""
    data = np.asarray(values_s, dtype=np.float64) * 1e3
    return {f"p{q:g}_ms": float(np.percentile(data, q)) for q in (50, 90, 99)}


def sim_figures(
    result: engine.SimResult, requests: Sequence[engine.EngineRequest]
) -> dict[str, Any]:
    """What one simulated run shows, and whether every request got exactly its tokens."""
    records = result.records
    decode_batches = [s.batch_size for s in result.steps if s.outputs]
    expected = {r.rid: _tokens(r) for r in requests}
    whole = (
        len(records) == len(requests)
        and not result.rejected
        and {r.rid: r.tokens for r in records} == expected
    )
    return {
        "requests": len(records),
        "output_tokens": int(sum(r.tokens for r in records)),
        "duration_s": float(result.duration_s),
        "throughput_tok_s": float(result.throughput_tok_s),
        "throughput_rps": len(records) / result.duration_s if result.duration_s else 0.0,
        "ttft": percentiles_ms([r.ttft_s for r in records]),
        "e2e": percentiles_ms([r.e2e_s for r in records]),
        "queue": percentiles_ms([r.queue_s for r in records]),
        "tpot": percentiles_ms(
            [(r.e2e_s - r.ttft_s) / (r.tokens - 1) for r in records if r.tokens > 1]
        ),
        "mean_batch": float(np.mean(decode_batches)) if decode_batches else 0.0,
        "steps": len(result.steps),
        "preemptions": int(sum(r.preemptions for r in records)),
        "correct": bool(whole),
    }


def step_model_info(step: engine.StepModel) -> dict[str, Any]:
    """The step model's parameters and the measurement its defaults come from (the paragraph
    of :mod:`inferwire.engine.steps` that cites it)."""
    return {
        "parameters": {f.name: getattr(step, f.name) for f in dataclasses.fields(step)},
        "source": _doc_paragraph(steps_module, mentions=("Defaults",)),
    }


def _doc_paragraph(obj: object, *, mentions: Sequence[str] = ()) -> str:
    """The first paragraph of ``obj``'s docstring that mentions every word of ``mentions``
    (the first paragraph when none is asked for), on one line."""
    doc = inspect.getdoc(obj) or ""
    paragraphs = [" ".join(p.split()) for p in doc.split("\n\n") if p.strip()]
    for paragraph in paragraphs:
        if all(word in paragraph for word in mentions):
            return paragraph
    return paragraphs[0] if paragraphs else ""


def quick(benchmark: Any) -> bool:
    """Benchmarking disabled (``--benchmark-disable``, CI): one short pass of every path."""
    return bool(benchmark.disabled)


@pytest.fixture(scope="module")
def default_step() -> engine.StepModel:
    return engine.StepModel()


def bench_c8_policies(benchmark: Any, default_step: engine.StepModel) -> None:
    """C8 on the virtual clock: the same seeded Poisson trace at 50 req/s through continuous
    and static batching, default step model and engine configuration otherwise."""
    count = QUICK_REQUESTS if quick(benchmark) else C8_REQUESTS
    requests = trace(C8_RATE_RPS, count)
    figures: dict[str, dict[str, Any]] = {}
    configs = {
        policy: engine.EngineConfig(policy=policy, step=default_step) for policy in C8_POLICIES
    }

    def run() -> None:
        for policy, config in configs.items():
            figures[policy] = sim_figures(engine.simulate(config, requests), requests)

    benchmark.pedantic(run, rounds=1, iterations=1)
    benchmark.group = "engine: C8 policies (virtual clock)"
    benchmark.extra_info.update(
        op="c8-virtual",
        clock="virtual",
        rate_rps=C8_RATE_RPS,
        arrival="poisson",
        requests=count,
        seed=SEED,
        workload=WORKLOAD,
        output_tokens=list(OUTPUT_TOKENS),
        prompt_tokens=list(PROMPT_TOKENS),
        step=step_model_info(default_step),
        config={p: _config_info(c) for p, c in configs.items()},
        policies=figures,
        correct=all(f["correct"] for f in figures.values()),
    )
    assert benchmark.extra_info["correct"], figures


def _config_info(config: engine.EngineConfig) -> dict[str, Any]:
    return {
        f.name: getattr(config, f.name)
        for f in dataclasses.fields(config)
        if isinstance(getattr(config, f.name), str | int | float | None)
    }


def capacity_rps(step: engine.StepModel, max_batch: int) -> float:
    """Requests/s the engine completes when it always runs a full batch of the trace's mean
    request (prefill, then decode steps at the mean KV size): the saturation rate the C13
    traces are set against."""
    mean_out = (OUTPUT_TOKENS[0] + OUTPUT_TOKENS[1]) / 2
    mean_prompt = (PROMPT_TOKENS[0] + PROMPT_TOKENS[1]) / 2
    kv_tokens = max_batch * (mean_prompt + mean_out / 2)
    per_request_s = (
        step.prefill_s(round(mean_prompt))
        + mean_out * step.decode_step_s(max_batch, round(kv_tokens)) / max_batch
    )
    return 1.0 / per_request_s


def c13_configs(step: engine.StepModel) -> dict[str, engine.EngineConfig]:
    """Adaptive (admitting B = min(Bmax, ceil(Q / (1 + L))) per prefill iteration), then
    continuous batching admitting at most a fixed number per prefill iteration (and uncapped),
    then static batching at fixed batch sizes; every one with the same step model, KV cache and
    ``max_batch`` slots (static: its size)."""
    configs = {
        f"adaptive Bmax={C13_BMAX}": engine.EngineConfig(
            policy="adaptive", max_batch=C13_SLOTS, adaptive_bmax=C13_BMAX, step=step
        )
    }
    for size in C13_ADMIT_SIZES:
        configs[f"continuous admit {size}"] = engine.EngineConfig(
            policy="continuous", max_batch=C13_SLOTS, admit_batch=size, step=step
        )
    configs["continuous uncapped"] = engine.EngineConfig(
        policy="continuous", max_batch=C13_SLOTS, step=step
    )
    for size in C13_STATIC_SIZES:
        configs[f"static B={size}"] = engine.EngineConfig(
            policy="static", max_batch=size, step=step
        )
    return configs


C13_TRACES: Final = ("poisson-near-capacity", "gamma-bursty")


@pytest.mark.parametrize("shape", C13_TRACES)
def bench_c13_batch_sizes(benchmark: Any, default_step: engine.StepModel, shape: str) -> None:
    """C13 on the virtual clock: every configuration of :func:`c13_configs` on one trace."""
    count = QUICK_REQUESTS if quick(benchmark) else C13_REQUESTS
    capacity = capacity_rps(default_step, C13_SLOTS)
    rate = C13_LOAD * capacity
    if shape == "gamma-bursty":
        requests = trace(rate, count, arrival="gamma", burstiness=C13_BURSTINESS)
    else:
        requests = trace(rate, count)
    configs = c13_configs(default_step)
    figures: dict[str, dict[str, Any]] = {}

    def run() -> None:
        for label, config in configs.items():
            figures[label] = {
                "policy": config.policy,
                "batch": config.max_batch,
                "admit_batch": config.admit_batch,
                **sim_figures(engine.simulate(config, requests), requests),
            }

    benchmark.pedantic(run, rounds=1, iterations=1)
    benchmark.group = "engine: C13 batch sizes (virtual clock)"
    benchmark.extra_info.update(
        op="c13-virtual",
        clock="virtual",
        trace=shape,
        arrival="gamma" if shape == "gamma-bursty" else "poisson",
        burstiness=C13_BURSTINESS if shape == "gamma-bursty" else 1.0,
        capacity_rps=capacity,
        load=C13_LOAD,
        rate_rps=rate,
        requests=count,
        seed=SEED,
        bmax=C13_BMAX,
        slots=C13_SLOTS,
        fixed_sizes=[*C13_ADMIT_SIZES, *C13_STATIC_SIZES],
        step=step_model_info(default_step),
        l_definition=" ".join(
            _doc_paragraph(engine.LoadEstimator, mentions=(word,)) for word in ("EWMA", "P99")
        ),
        configs=figures,
        correct=all(f["correct"] for f in figures.values()),
    )
    assert benchmark.extra_info["correct"], figures


def iter_rates(start: float, factor: float, stop: float) -> Iterator[float]:
    """``start``, ``start * factor``, ... up to ``stop`` (included when reached exactly)."""
    rate = start
    while rate <= stop * (1 + 1e-9):
        yield rate
        rate = math.floor(rate * factor)


# -- through the real stack ---------------------------------------------------------------------

STACK_HOP: Final = "msgspec-msgpack"
"""The hop codec of the C8 runs: vLLM's."""
C8_STACK_WINDOW_S: Final = 12.0
C8_STACK_WARMUP_S: Final = 2.0
"""Requests of the first seconds are sent but not measured: the engine starts empty."""
WARM_REQUESTS: Final = 8


def _stack_loop() -> str:
    return server_process.requested_loop()


def _point_figures(point: dict[str, Any]) -> dict[str, Any]:
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


def _drive(
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

    return loops.run(go(), _stack_loop())


@pytest.mark.parametrize("policy", C8_POLICIES)
def bench_c8_stack(benchmark: Any, policy: str) -> None:
    """C8 through the real stack: the load generator at 50 req/s (seeded Poisson) against
    ``inferwire serve --engine`` (http1, orjson), whose engine process runs ``policy`` with
    the default step model on the real clock."""
    window = 1.0 if quick(benchmark) else C8_STACK_WINDOW_S
    warmup = 0.0 if quick(benchmark) else C8_STACK_WARMUP_S
    spec = openloop.LoadSpec(duration_s=warmup + window, warmup_s=warmup, seed=SEED)
    shapes = request_shapes(int((warmup + window) * C8_RATE_RPS * 2) + 16)
    with engine_stack.EngineStack(STACK_HOP, "--policy", policy) as stack:
        point = benchmark.pedantic(
            lambda: _drive(stack.address, spec, C8_RATE_RPS, shapes, server_pid=stack.frontend_pid),
            rounds=1,
            iterations=1,
        )
    benchmark.group = "engine: C8 policies (real stack)"
    figures = _point_figures(point)
    benchmark.extra_info.update(
        op="c8-stack",
        clock="real",
        policy=policy,
        hop_codec=STACK_HOP,
        frontend_transport="http1",
        frontend_codec="orjson",
        rate_rps=C8_RATE_RPS,
        window_s=window,
        warmup_s=warmup,
        seed=SEED,
        loop=point["loop"],
        **figures,
        correct=point["requests_failed"] == 0
        and metrics.integrity_violations(point["integrity"]) == 0,
    )
    assert benchmark.extra_info["correct"], point["errors"]
