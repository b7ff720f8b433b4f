"""The API-server <-> engine-core hop as vLLM V1 builds it, model-free (issue 33): what it costs a
frontend to receive and decode one engine step's outputs, by batch size, codec and transport.

An engine process (:mod:`inferwire.engine.vllm_hop`) sends runs of prebuilt steps over ZeroMQ
PUSH/PULL (``ipc://`` and ``tcp://127.0.0.1``); this process is the frontend: it receives
(``copy=False``), decodes and checks every step, and reads its CPU clocks. Per (transport, case)
one benchmark; in it, every batch size of :data:`BATCHES` (the case's :data:`CASE_BATCHES`)
and every codec, the codecs' order rotated each round, :data:`ROUNDS` rounds. Cases:
``tokens`` (one new token per request), ``logprobs`` (plus a 128k-float float32 logprobs
tensor per request), ``embedding`` (plus a 4,096-float pooled embedding per request); codecs
``msgspec-oob`` (vLLM's), ``msgspec-inband``, ``pickle5-oob``, ``pickle-inband``, and for
``tokens`` inferwire's own hop codecs as they are (``hop:msgspec-msgpack``, ``hop:protobuf``,
``hop:delta``, ``hop:orjson``).

Per cell: the frontend's CPU per step (its process clock over the run, every thread: ZeroMQ's
I/O thread reads the socket; the checks left out), its thread's receive + decode CPU per step
(median of the steps), tokens per second per frontend core (B tokens a step / the CPU per
step), the engine's encode CPU per step, the bytes per step (all frames), whether every step
arrived whole, in order and with the values sent (``correct``, asserted). Each figure is the
median of its rounds, with their range. The frontend is pinned to one core and the engine to
the other when there are two. Under ``--benchmark-disable`` one round of batch sizes 1 and 8
and three steps a cell checks every path in a few seconds.

``logprobs`` stops at B = 256: a step of 1,024 requests' vocabularies is 512 MiB, with two steps
in flight on each side more memory than a shared machine should be asked for.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterator
from typing import Any, Final

import pytest

from inferwire import engine
from inferwire.bench.procs import placement
from inferwire.engine import vllm_hop
from inferwire.engine.vllm_hop.codecs import ZERO_COPY_THRESHOLD
from inferwire.engine.vllm_hop.frontend import RunResult, engine_pid
from inferwire.engine.vllm_hop.steps import step_tensor_bytes, tensor_width

BATCHES: Final = (1, 8, 64, 256, 1024)
CASE_BATCHES: Final = {
    vllm_hop.TOKENS: BATCHES,
    vllm_hop.LOGPROBS: (1, 8, 64, 256),
    vllm_hop.EMBEDDING: BATCHES,
}
QUICK_BATCHES: Final = (1, 8)
ROUNDS: Final = 3
STEP_BUDGET_BYTES: Final = 64 * 1024 * 1024
"""A cell sends at most about this many tensor bytes (its steps x the step's bytes)..."""
STEP_BUDGET_TOKENS: Final = 20_000
"""... and at most this many tokens..."""
MIN_STEPS: Final = 3
MAX_STEPS: Final = 200
"""... in at least 3 and at most 200 steps (the first step of a run pays for cold buffers: the
CPU per step is over all of them, as a frontend's steps come)."""
QUICK_STEPS: Final = 3
SEED: Final = 33
CONTEXT_TOKENS: Final = 1024
"""Each request's KV tokens in the step model's decode step (the saturation finding's step
period): a 1k-token context."""


def quick(benchmark: Any) -> bool:
    return bool(benchmark.disabled)


def steps_for(case: str, batch: int) -> int:
    """Steps of one cell: within :data:`STEP_BUDGET_BYTES` and :data:`STEP_BUDGET_TOKENS`."""
    by_bytes = STEP_BUDGET_BYTES // max(step_tensor_bytes(case, batch), 1)
    return max(MIN_STEPS, min(MAX_STEPS, by_bytes, STEP_BUDGET_TOKENS // batch))


def codecs_for(case: str) -> tuple[str, ...]:
    if case == vllm_hop.TOKENS:
        hop_codecs = tuple(vllm_hop.TOKEN_HOP_PREFIX + c for c in vllm_hop.TOKEN_HOP_CODECS)
        return (*vllm_hop.CODECS, *hop_codecs)
    return vllm_hop.CODECS


@pytest.fixture(scope="module", params=vllm_hop.TRANSPORTS)
def frontend(request: pytest.FixtureRequest) -> Iterator[vllm_hop.Frontend]:
    """One engine process per transport (pickle allowed: both ends are this benchmark's)."""
    with vllm_hop.Frontend(request.param, allow_pickle=True) as running:
        yield running


def _pin(frontend: vllm_hop.Frontend) -> tuple[int, int] | None:
    """The frontend (every thread of this process, ZeroMQ's included) to one core, the engine
    to the other."""
    cores = placement.split_cores()
    if cores is not None:
        placement.pin_threads(os.getpid(), cores[0])
        placement.pin_threads(engine_pid(frontend), cores[1])
    return cores


def _unpin(own: set[int]) -> None:
    import psutil  # type: ignore[import-untyped, unused-ignore]

    for thread in psutil.Process(os.getpid()).threads():
        os.sched_setaffinity(thread.id, own)


def _cell(runs: list[RunResult]) -> dict[str, Any]:
    """One (batch, codec)'s figures: the median of its rounds, with their range."""
    batch = runs[0].batch
    per_round = [
        {
            "frontend_us": run.frontend_ns_per_step / 1e3,
            "frontend_thread_us": statistics.median(run.decode_thread_ns) / 1e3,
            "check_us": statistics.median(run.check_ns) / 1e3,
            "engine_encode_us": statistics.median(run.engine.encode_ns) / 1e3,
            "engine_build_us": statistics.median(run.engine.build_ns) / 1e3,
            "engine_send_us": statistics.median(run.engine.send_ns) / 1e3,
            "engine_process_us": run.engine.process_ns / run.steps / 1e3,
            "bytes": statistics.median(run.bytes),
        }
        for run in runs
        if run.engine is not None
    ]
    cell: dict[str, Any] = {"batch": batch, "steps": runs[0].steps, "rounds": len(runs)}
    for name in per_round[0] if per_round else ():
        values = [r[name] for r in per_round]
        cell[name] = statistics.median(values)
        cell[f"{name}_min"] = min(values)
        cell[f"{name}_max"] = max(values)
    frontend_s = cell.get("frontend_us", 0.0) / 1e6
    cell["tokens_per_s_per_core"] = batch / frontend_s if frontend_s else 0.0
    cell["correct"] = len(per_round) == len(runs) and all(run.correct for run in runs)
    cell["problems"] = [p for run in runs for p in run.problems][:5]
    return cell


@pytest.mark.parametrize("case", vllm_hop.CASES)
def bench_vllm_hop(benchmark: Any, frontend: vllm_hop.Frontend, case: str) -> None:
    """Every batch size x codec of ``case`` over the frontend's transport, interleaved."""
    batches = QUICK_BATCHES if quick(benchmark) else CASE_BATCHES[case]
    rounds = 1 if quick(benchmark) else ROUNDS
    codecs = codecs_for(case)
    runs: dict[tuple[int, str], list[RunResult]] = {}
    own = os.sched_getaffinity(0)
    cores = _pin(frontend)

    def run() -> None:
        for round_index in range(rounds):
            shift = round_index % len(codecs)
            for batch in batches:
                steps = QUICK_STEPS if quick(benchmark) else steps_for(case, batch)
                for codec in codecs[shift:] + codecs[:shift]:
                    result = frontend.run(codec, case, batch=batch, steps=steps, seed=SEED)
                    runs.setdefault((batch, codec), []).append(result)

    try:
        benchmark.pedantic(run, rounds=1, iterations=1)
    finally:
        if cores is not None:
            _unpin(own)
    cells: dict[str, dict[str, Any]] = {}
    for (batch, codec), found in sorted(runs.items()):
        cells.setdefault(codec, {})[str(batch)] = _cell(found)
    step = engine.StepModel()
    benchmark.group = "engine: the vLLM-shaped hop"
    benchmark.extra_info.update(
        op="vllm-hop",
        transport=frontend.transport,
        case=case,
        tensor_floats=tensor_width(case),
        batches=list(batches),
        codecs=list(codecs),
        rounds=rounds,
        seed=SEED,
        pinned={"frontend": cores[0], "engine": cores[1]} if cores else None,
        zero_copy_threshold=ZERO_COPY_THRESHOLD,
        context_tokens=CONTEXT_TOKENS,
        step_period_ms={str(b): step.decode_step_s(b, b * CONTEXT_TOKENS) * 1e3 for b in batches},
        method=(
            "Frontend CPU per step: the frontend process's CPU clock over a run of N steps "
            "(every thread, ZeroMQ's I/O thread included), less its checks, / N; thread: the "
            "median step's receive + decode on the frontend's thread clock. Engine encode: "
            "the median step's codec encode on the engine thread's clock (building the "
            "step's structs and sending them are recorded apart). Bytes: all frames of a "
            "step. Each cell the median of its rounds (range in *_min/*_max)."
        ),
        cells=cells,
        correct=all(c["correct"] for by_batch in cells.values() for c in by_batch.values()),
    )
    assert benchmark.extra_info["correct"], {
        codec: {b: c["problems"] for b, c in by_batch.items() if not c["correct"]}
        for codec, by_batch in cells.items()
    }
