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
- ``bench_engine_attribution``: ``inferwire load``'s attribution of each request's time (the
  per-request ``metrics`` object, and the point's means from ``/metrics``) against the
  frontend's ``--stamps-file``, per hop codec (issue 29).

Every request's length and prompt come from a seeded draw
(:func:`~inferwire.bench.measure.engine_runs.request_shapes`): batching policies differ exactly
where lengths differ (a static batch waits for its longest member). Every benchmark records
whether every stream arrived whole (``correct``). Under ``--benchmark-disable`` every run is
cut to a fraction of a second.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import pytest

from inferwire import engine
from inferwire.bench.measure import attribution_truth
from inferwire.bench.measure.engine_drive import (
    SATURATION_CORES,
    SATURATION_GAIN,
    drive,
    limited,
    point_figures,
    stack_loop,
    summarize,
    sweep_trial,
)
from inferwire.bench.measure.engine_runs import (
    DISTINCT_STREAMS,
    OUTPUT_TOKENS,
    PROMPT_TOKENS,
    SEED,
    SERVICE,
    WORKLOAD,
    RequestShape,
    TimedTarget,
    capacity_rps,
    encode_s_per_chunk,
    generate_request,
    hop_decode_s_per_chunk,
    request_key,
    request_shapes,
    request_split_s,
    sim_figures,
    step_model_info,
    trace,
    unique_shapes,
)
from inferwire.bench.procs import engine_stack, placement
from inferwire.load import metrics, openloop

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
C13_BMAX: Final = engine.EngineConfig().adaptive_bmax
C13_SLOTS: Final = engine.EngineConfig().max_batch
C13_STATIC_SIZES: Final = tuple(sorted({8, 16, 32, 64, C13_SLOTS}))
"""Static batching's sizes, up to the engine's slots (a batch takes whoever waits, up to it)."""

QUICK_REQUESTS: Final = 60


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
    configs[f"continuous uncapped ({C13_SLOTS} slots)"] = engine.EngineConfig(
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
        admit_sizes=list(C13_ADMIT_SIZES),
        static_sizes=list(C13_STATIC_SIZES),
        step=step_model_info(default_step),
        adaptive_target_step_ms=engine.EngineConfig().adaptive_target_step_s * 1e3,
        l_definition=" ".join((inspect.getdoc(engine.LoadEstimator) or "").split()),
        configs=figures,
        correct=all(f["correct"] for f in figures.values()),
    )
    assert benchmark.extra_info["correct"], figures


# -- through the real stack ---------------------------------------------------------------------

STACK_HOP: Final = "msgspec-msgpack"
"""The hop codec of the C8 runs: vLLM's."""
C8_STACK_WINDOW_S: Final = 12.0
C8_STACK_WARMUP_S: Final = 2.0
"""Requests of the first seconds are sent but not measured: the engine starts empty."""


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
            lambda: drive(stack.address, spec, C8_RATE_RPS, shapes, server_pid=stack.frontend_pid),
            rounds=1,
            iterations=1,
        )
    benchmark.group = "engine: C8 policies (real stack)"
    figures = point_figures(point)
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


STAGES_RATE_RPS: Final = 20.0
STAGES_WINDOW_S: Final = 10.0
STAGES_WARMUP_S: Final = 1.0
STAGES_HOPS: Final = ("msgspec-msgpack", "pickle", "orjson")


@pytest.mark.parametrize("hop", STAGES_HOPS)
def bench_engine_stages(benchmark: Any, hop: str) -> None:
    """A request's time through client -> frontend -> engine, split into compute, scheduling
    and queueing, serialization and network (see :func:`request_split_s`), at a moderate rate
    with the default step model and continuous batching."""
    window = 1.0 if quick(benchmark) else STAGES_WINDOW_S
    warmup = 0.0 if quick(benchmark) else STAGES_WARMUP_S
    spec = openloop.LoadSpec(duration_s=warmup + window, warmup_s=warmup, seed=SEED)
    shapes = unique_shapes(int((warmup + window) * STAGES_RATE_RPS * 2) + 16)
    records: list[metrics.RequestRecord] = []
    with engine_stack.EngineStack(hop, "--policy", "continuous", stage_log=True) as stack:
        target = TimedTarget(stack.address)
        before = stack.counters()["client"]

        def run() -> dict[str, Any]:
            return drive(
                stack.address,
                spec,
                STAGES_RATE_RPS,
                shapes,
                target=target,
                on_record=records.append,
            )

        point = benchmark.pedantic(run, rounds=1, iterations=1)
        after = stack.counters()["client"]
        lines = {(r["seed"], r["max_tokens"], r["prompt_tokens"]): r for r in stack.stage_lines()}
    chunks = after["chunks_decoded"] - before["chunks_decoded"]
    hop_decode_per_chunk_s = (after["decode_ns"] - before["decode_ns"]) / max(chunks, 1) / 1e9
    requests = [generate_request(shape) for shape in shapes]
    splits = []
    for record in records:
        key = request_key(requests[record.index])
        if record.measured and record.ok and key in lines and key in target.timings:
            timing = target.timings[key]
            splits.append(
                request_split_s(lines[key], timing, record.e2e_ms / 1e3, hop_decode_per_chunk_s)
            )
    measured = [r for r in records if r.measured]
    benchmark.group = "engine: per-stage split (real stack)"
    totals = {name: sum(s[name] for s in splits) for name in splits[0]} if splits else {}
    e2e_total = totals.get("e2e", 0.0) or 1.0
    benchmark.extra_info.update(
        op="engine-stages",
        hop_codec=hop,
        frontend_transport="http1",
        frontend_codec="orjson",
        policy="continuous",
        rate_rps=STAGES_RATE_RPS,
        window_s=window,
        requests=len(splits),
        step=step_model_info(engine.StepModel()),
        stages_ms={
            s: _median_ms(splits, s)
            for s in ("compute", "scheduling", "serialization", "engine_loop", "network")
        },
        shares={
            s: totals.get(s, 0.0) / e2e_total
            for s in ("compute", "scheduling", "serialization", "engine_loop", "network")
        },
        median_shares={
            s: float(np.median([x[s] / x["e2e"] for x in splits])) if splits else 0.0
            for s in ("compute", "scheduling", "serialization", "engine_loop", "network")
        },
        serialization_ms={
            s: _median_ms(splits, s)
            for s in ("engine_encode", "hop_decode", "response_encode", "client_decode")
        },
        e2e_ms=_median_ms(splits, "e2e"),
        hop_decode_us_per_chunk=hop_decode_per_chunk_s * 1e6,
        method=(
            "Sources: the engine's END_STATS per request (queue, prefill, decode, batch wait, "
            "encode), the frontend's hop decode time per chunk over the run (its engine "
            "client's counter) times the request's chunks, the frontend's response encode "
            "(the server's per-chunk stamps) and the client's decode (its read stamps); "
            "*engine loop* is the engine process's time for the request beyond its modelled "
            "steps and its encode (its Python loop: scheduling bookkeeping, receiving, "
            "sending); *network + transport* is the E2E less all of those (both event loops "
            "and the sockets)."
        ),
        correct=len(splits) == len(measured)
        and point["requests_failed"] == 0
        and metrics.integrity_violations(point["integrity"]) == 0,
    )
    assert benchmark.extra_info["correct"], (len(splits), len(measured), point["errors"])


def _median_ms(splits: Sequence[dict[str, float]], name: str) -> float:
    return float(np.median([s[name] for s in splits])) * 1e3 if splits else 0.0


SWEEP_HOPS: Final = ("msgspec-msgpack", "protobuf", "delta", "pickle", "orjson")
JSON_HOP: Final = "orjson"
SWEEP_RATES: Final = (50.0, 100.0, 200.0, 400.0, 600.0, 800.0)
SWEEP_TOKENS: Final = 64
SWEEP_PROMPT_TOKENS: Final = 128
SWEEP_TRIALS: Final = 3
SWEEP_TRIAL_S: Final = 1.5
SWEEP_STEP_SCALE: Final = 0.01
"""The engine's step times x 0.01 (a 5 ms decode step in 51 us): the engine is not what limits."""


def bench_hop_sweep(benchmark: Any) -> None:
    """Output tokens/s against offered rate per hop codec: the frontend serves http1 SSE
    (OpenAI JSON, orjson) and the engine runs continuous batching at step scale
    :data:`SWEEP_STEP_SCALE`; the frontend is pinned to one core, the engine and the load
    generator to the other. At each rate every codec runs once per trial, the order rotated
    each trial, so the machine's drift falls on all alike; the sweep stops at the first rate
    at which every codec reached a limit (fell short, or a core busy)."""
    rates = SWEEP_RATES[1:2] if quick(benchmark) else SWEEP_RATES
    trials = 1 if quick(benchmark) else SWEEP_TRIALS
    trial_s = 0.3 if quick(benchmark) else SWEEP_TRIAL_S
    shapes = [
        RequestShape(SWEEP_TOKENS, SWEEP_PROMPT_TOKENS, i % DISTINCT_STREAMS)
        for i in range(DISTINCT_STREAMS)
    ]
    chunks = SERVICE.chunks(generate_request(shapes[0]))
    cores = placement.split_cores()
    own_cores = os.sched_getaffinity(0)
    points: dict[str, dict[str, dict[str, Any]]] = {hop: {} for hop in SWEEP_HOPS}
    encode_us: list[float] = []
    decode_us: dict[str, list[float]] = {hop: [] for hop in SWEEP_HOPS}
    options = ("--policy", "continuous", "--step-scale", str(SWEEP_STEP_SCALE))
    with contextlib.ExitStack() as running:
        stacks = {
            hop: running.enter_context(engine_stack.EngineStack(hop, *options))
            for hop in SWEEP_HOPS
        }
        if cores is not None:
            for stack in stacks.values():
                placement.pin_threads(stack.frontend_pid, cores[0])
                placement.pin_threads(stack.engine.pid, cores[1])
            os.sched_setaffinity(0, {cores[1]})

        def run() -> None:
            for rate in rates:
                encode_per_chunk_s = encode_s_per_chunk("orjson", chunks)
                encode_us.append(encode_per_chunk_s * 1e6)
                isolated = {hop: hop_decode_s_per_chunk(hop, chunks) for hop in SWEEP_HOPS}
                for hop, decode_s in isolated.items():
                    decode_us[hop].append(decode_s * 1e6)
                per_trial: dict[str, list[dict[str, Any]]] = {hop: [] for hop in SWEEP_HOPS}
                for trial in range(trials):
                    shift = trial % len(SWEEP_HOPS)
                    for hop in SWEEP_HOPS[shift:] + SWEEP_HOPS[:shift]:
                        per_trial[hop].append(
                            sweep_trial(
                                stacks[hop],
                                rate,
                                SEED + trial,
                                trial_s,
                                shapes,
                                encode_per_chunk_s,
                                isolated[hop],
                                SWEEP_TOKENS,
                            )
                        )
                for hop, found in per_trial.items():
                    points[hop][f"{rate:g}"] = summarize(
                        found, rate, SWEEP_TOKENS, cores is not None
                    )
                # past this rate nothing more is learnt about the frontend
                if all(limited(points[hop][f"{rate:g}"]) for hop in SWEEP_HOPS):
                    break

        try:
            benchmark.pedantic(run, rounds=1, iterations=1)
        finally:
            os.sched_setaffinity(0, own_cores)
    benchmark.group = "engine: hop codec sweep (real stack)"
    benchmark.extra_info.update(
        op="hop-sweep",
        frontend_transport="http1",
        frontend_codec="orjson",
        policy="continuous",
        step_scale=SWEEP_STEP_SCALE,
        max_tokens=SWEEP_TOKENS,
        prompt_tokens=SWEEP_PROMPT_TOKENS,
        trials=trials,
        trial_s=trial_s,
        rates=list(rates),
        json_hop=JSON_HOP,
        saturation_gain=SATURATION_GAIN,
        saturation_cores=SATURATION_CORES,
        pinned={"frontend": cores[0], "engine_and_client": cores[1]} if cores else None,
        response_encode_us_per_chunk=float(np.median(encode_us)),
        isolated_hop_decode_us_per_chunk={
            hop: float(np.median(values)) for hop, values in decode_us.items()
        },
        serialization_method=(
            "Serialization share: the frontend's hop decode time (its engine client's counter) "
            "plus its response encode (orjson SSE, one chunk's encode measured in the "
            "benchmark's process at each rate, times the chunks served), over the frontend's "
            "CPU time, both over the same trials. The counter times each decode by the wall "
            "clock in place (cold caches between steps included, and any preemption of the "
            "frontend inside a decode); *isolated* uses instead each hop codec's decode of the "
            "same frames timed alone in CPU time (warm, a lower bound)."
        ),
        points=points,
        correct=all(
            p["failed"] == 0 and p["violations"] == 0
            for by_rate in points.values()
            for p in by_rate.values()
        ),
    )
    assert benchmark.extra_info["correct"], points


ATTRIBUTION_HOPS: Final = STAGES_HOPS
"""The stages table's hop codecs: vLLM's msgpack, the pickle it left, and JSON. The attribution
does not depend on the hop (the metrics object and the histograms are the frontend's), so three
show it holds whatever the hop costs; each stack takes 4-7 s to run once untimed."""
ATTRIBUTION_RATE_RPS: Final = STAGES_RATE_RPS
ATTRIBUTION_WINDOW_S: Final = STAGES_WINDOW_S


@pytest.mark.parametrize("hop", ATTRIBUTION_HOPS)
def bench_engine_attribution(benchmark: Any, hop: str) -> None:
    """Where a request's time goes, as ``inferwire load`` attributes it from the server's own
    reports, against the truth of the frontend's stamps: the generator drives
    ``inferwire serve --engine --enable-per-request-metrics --stamps-file`` (http1, OpenAI chat,
    orjson) at a moderate rate, continuous batching and the default step model; per request
    from each stream's ``metrics`` object, per point from the means of the frontend's
    vLLM-named histograms (see :mod:`~inferwire.bench.measure.attribution_truth`)."""
    window = 1.0 if quick(benchmark) else ATTRIBUTION_WINDOW_S
    # no warm-up window: the server's histograms count every request of the point, so the
    # truth's means are over the same requests (untimed requests warm the stack before it)
    spec = openloop.LoadSpec(duration_s=window, seed=SEED)
    shapes = request_shapes(int(window * ATTRIBUTION_RATE_RPS * 2) + 16)
    output_tokens = [shape.output_tokens for shape in shapes]
    with attribution_truth.TruthStack(hop, "--policy", "continuous") as stack:
        run = benchmark.pedantic(
            lambda: attribution_truth.run_attributed(
                stack, spec, ATTRIBUTION_RATE_RPS, output_tokens, loop=stack_loop()
            ),
            rounds=1,
            iterations=1,
        )
        wanted = attribution_truth.WARM_REQUESTS + len(run.records)
        lines = stack.stamp_lines(at_least=wanted)
    figures = attribution_truth.compare(run, lines)
    benchmark.group = "engine: attribution against the stamps (real stack)"
    benchmark.extra_info.update(
        op="engine-attribution",
        hop_codec=hop,
        frontend_transport="http1",
        frontend_codec="orjson",
        api="openai-chat",
        policy="continuous",
        rate_rps=ATTRIBUTION_RATE_RPS,
        window_s=window,
        seed=SEED,
        loop=run.point["loop"],
        output_tokens=list(OUTPUT_TOKENS),
        prompt_tokens=attribution_truth.PROMPT_TOKENS,
        step=step_model_info(engine.StepModel()),
        bound_share=attribution_truth.BOUND_SHARE,
        bound_ms=attribution_truth.BOUND_MS,
        method=(
            "Attributed: each request's queue and model time from the per-request metrics "
            "object on its stream's usage chunk, and its time outside the engine as its E2E "
            "less the generator's own lag and pool wait and the engine's queue and model time; "
            "per point, the same from the means of the frontend's vLLM histograms scraped "
            "before and after it. Truth: the frontend's stamps file (engine arrived, "
            "scheduled, last token), joined to each request by the time the frontend received "
            "it (between the client's connection in hand and the response's head, on the "
            "host's one monotonic clock) and its token count."
        ),
        **figures,
    )
    assert benchmark.extra_info["correct"], figures
