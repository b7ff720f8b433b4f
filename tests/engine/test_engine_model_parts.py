"""The engine model's parts: the step model's formulas and defaults, C13's formula at its
edges, the KV cache's arithmetic, the typed errors, seeded traces, and a property over random
traces (every request gets exactly its chunks, in order, under every policy)."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inferwire.codecs import TokenChunk
from inferwire.engine import (
    POLICIES,
    DuplicateRequestError,
    EngineConfig,
    EngineCore,
    EngineError,
    EngineFullError,
    EngineRequest,
    InvalidRequestError,
    KVCache,
    RequestTooLargeError,
    StepModel,
    adaptive_batch,
    poisson_trace,
    simulate,
)
from inferwire.workloads import token_stream_source


def chunks(rid: str, count: int, tokens: int = 1) -> list[TokenChunk]:
    return [
        TokenChunk(
            id=rid,
            model="m",
            created=0,
            index=0,
            seq=i,
            token_ids=tuple(range(tokens)),
            text=str(i),
        )
        for i in range(count)
    ]


# the step model


def test_step_model_formulas() -> None:
    model = StepModel(
        prefill_fixed_s=1.0,
        prefill_per_token_s=0.5,
        decode_base_s=2.0,
        decode_per_seq_s=0.25,
        decode_per_kv_token_s=0.125,
    )
    assert model.prefill_s(0) == 1.0
    assert model.prefill_s(4) == 3.0
    assert model.prefill_batch_s([4, 2]) == 4.0  # one pass: the fixed cost once
    assert model.decode_step_s(1, 0) == 2.25
    assert model.decode_step_s(4, 8) == 2.0 + 1.0 + 1.0
    half = model.scaled(0.5)
    assert half.prefill_s(4) == 1.5
    assert half.decode_step_s(4, 8) == 2.0
    assert model.scaled(0).decode_step_s(4, 8) == 0.0


def test_step_model_defaults_reproduce_the_cited_figures() -> None:
    model = StepModel()
    # TensorRT-LLM, LLaMA 7B, H100 FP8, batch 1: first token 7 ms at 128 tokens, 36 at 2048
    assert model.prefill_s(128) == pytest.approx(0.007, abs=1e-4)
    assert model.prefill_s(2048) == pytest.approx(0.036, abs=1e-4)
    # static batches of batch x input x output: published output tokens/s, and the tolerance
    for batch, tokens_in, tokens_out, published, rel in [
        (768, 128, 128, 19_694, 0.01),
        (112, 128, 2048, 6_818, 0.01),
        (80, 2048, 128, 2_244, 0.07),
        (48, 2048, 2048, 2_740, 0.01),
    ]:
        steps = sum(
            model.decode_step_s(batch, batch * (tokens_in + j)) for j in range(1, tokens_out)
        )
        total_s = model.prefill_s(batch * tokens_in) + steps
        assert batch * tokens_out / total_s == pytest.approx(published, rel=rel)


@pytest.mark.parametrize(
    "kwargs",
    [{"decode_base_s": -1.0}, {"prefill_per_token_s": math.nan}, {"decode_per_seq_s": math.inf}],
)
def test_step_model_refuses_bad_parameters(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="non-negative"):
        StepModel(**kwargs)


def test_step_model_refuses_bad_arguments() -> None:
    model = StepModel()
    with pytest.raises(ValueError, match="negative"):
        model.prefill_s(-1)
    with pytest.raises(ValueError, match="at least one"):
        model.decode_step_s(0, 0)
    with pytest.raises(ValueError, match="negative"):
        model.decode_step_s(1, -1)
    with pytest.raises(ValueError, match="factor"):
        model.scaled(-1)


# C13: B = min(Bmax, ceil(Q / (1 + L)))


@pytest.mark.parametrize(
    ("queue", "load", "bmax", "admitted"),
    [
        (0, 0.0, 8, 0),  # Q = 0: nothing to admit
        (0, 100.0, 8, 0),
        (5, 0.0, 8, 5),  # L = 0: min(Bmax, Q)
        (20, 0.0, 8, 8),  # Bmax caps
        (5, 1.0, 8, 3),  # ceil(5 / 2)
        (6, 2.0, 8, 2),  # ceil(6 / 3)
        (7, 2.5, 8, 2),  # ceil(2)
        (1, 1e9, 8, 1),  # huge L: one while anything waits
        (1000, 1e12, 8, 1),
        (10, 0.5, 1, 1),
    ],
)
def test_adaptive_batch_formula(queue: int, load: float, bmax: int, admitted: int) -> None:
    assert adaptive_batch(queue, load, bmax) == admitted


@pytest.mark.parametrize(
    ("queue", "load", "bmax"), [(-1, 0.0, 1), (1, -0.5, 1), (1, math.nan, 1), (1, 0.0, 0)]
)
def test_adaptive_batch_refuses_bad_input(queue: int, load: float, bmax: int) -> None:
    with pytest.raises(ValueError, match="must be"):
        adaptive_batch(queue, load, bmax)


# the KV cache


def test_kv_cache_blocks() -> None:
    kv = KVCache(total_blocks=4, block_tokens=16)
    assert [kv.blocks_for(n) for n in (0, 1, 16, 17, 32, 33)] == [0, 1, 1, 2, 2, 3]
    kv.allocate("a", 17)
    assert (kv.blocks("a"), kv.used_blocks, kv.free_blocks) == (2, 2, 2)
    assert kv.blocks_to_grow("a", 15) == 0
    kv.grow("a", 15)
    assert kv.blocks("a") == 2
    assert kv.blocks_to_grow("a", 1) == 1
    kv.grow("a", 1)
    assert (kv.tokens("a"), kv.blocks("a")) == (33, 3)
    assert not kv.can_allocate(17)
    assert kv.can_allocate(16)
    with pytest.raises(ValueError, match="free"):
        kv.allocate("b", 17)
    with pytest.raises(ValueError, match="already"):
        kv.allocate("a", 1)
    assert kv.free("a") == 3
    assert kv.free("a") == 0
    assert kv.used_blocks == 0


# errors and validation


def test_errors_share_a_root() -> None:
    for cls in (EngineFullError, InvalidRequestError, RequestTooLargeError, DuplicateRequestError):
        assert issubclass(cls, EngineError)
    assert issubclass(InvalidRequestError, ValueError)


def test_engine_full() -> None:
    core = EngineCore(EngineConfig(policy="static", max_batch=8, max_waiting=2))
    core.add(EngineRequest("a", chunks("a", 1), 0, 0.0))
    core.add(EngineRequest("b", chunks("b", 1), 0, 0.0))
    with pytest.raises(EngineFullError) as caught:
        core.add(EngineRequest("c", chunks("c", 1), 0, 0.0))
    assert (caught.value.waiting, caught.value.max_waiting) == (2, 2)
    assert core.stats()["rejected"] == 1


def test_simulate_counts_rejections() -> None:
    trace = [EngineRequest(f"r{i}", chunks(f"r{i}", 1), 0, 0.0) for i in range(4)]
    result = simulate(EngineConfig(policy="static", max_batch=8, max_waiting=2), trace)
    assert result.rejected == ["r2", "r3"]
    assert sorted(r.rid for r in result.records) == ["r0", "r1"]


def test_request_too_large_for_the_cache() -> None:
    core = EngineCore(EngineConfig(kv_blocks=2, block_tokens=4))
    core.add(EngineRequest("fits", chunks("fits", 4), 4, 0.0))  # 8 tokens: 2 blocks
    with pytest.raises(RequestTooLargeError) as caught:
        core.add(EngineRequest("big", chunks("big", 1), 8, 0.0))  # 9 tokens: 3 blocks
    assert (caught.value.blocks_needed, caught.value.kv_blocks) == (3, 2)


def test_duplicate_request_id() -> None:
    core = EngineCore()
    core.add(EngineRequest("a", chunks("a", 1), 0, 0.0))
    with pytest.raises(DuplicateRequestError):
        core.add(EngineRequest("a", chunks("a", 1), 0, 0.0))
    core.step()  # "a" finishes: its id may come again
    core.add(EngineRequest("a", chunks("a", 1), 0))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("", chunks("a", 1), 0, 0.0), "rid"),
        (("a", [], 0, 0.0), "no chunks"),
        (("a", chunks("a", 1), -1, 0.0), "prompt_tokens"),
        (("a", chunks("a", 1), 1.5, 0.0), "prompt_tokens"),
        (("a", chunks("a", 1), 0, -1.0), "arrival_s"),
        (("a", chunks("a", 1), 0, math.nan), "arrival_s"),
    ],
)
def test_bad_requests(args: tuple[object, ...], message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        EngineRequest(*args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"policy": "fifo"},
        {"max_batch": 0},
        {"kv_blocks": 0},
        {"block_tokens": 0},
        {"max_waiting": 0},
        {"max_batch": 2.0},
        {"admit_batch": 0},
        {"max_prefill_tokens": 0},
        {"adaptive_bmax": 0},
        {"static_timeout_s": -1.0},
        {"adaptive_target_step_s": 0.0},
        {"adaptive_ewma_alpha": 0.0},
        {"keep_records": -1},
        {"step": None},
    ],
)
def test_bad_configs(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=r"must|policy"):
        EngineConfig(**kwargs)  # type: ignore[arg-type]


# traces


def test_poisson_trace_is_seeded() -> None:
    stream = chunks("s", 3)
    first = poisson_trace(50.0, 200, 7, stream, prompt_tokens=128)
    again = poisson_trace(50.0, 200, 7, stream, prompt_tokens=128)
    other = poisson_trace(50.0, 200, 8, stream, prompt_tokens=128)
    assert [r.arrival_s for r in first] == [r.arrival_s for r in again]
    assert [r.arrival_s for r in first] != [r.arrival_s for r in other]
    assert [r.rid for r in first[:3]] == ["r0", "r1", "r2"]
    arrivals = [r.arrival_s or 0.0 for r in first]
    assert arrivals == sorted(arrivals)
    assert 200 / arrivals[-1] == pytest.approx(50.0, rel=0.2)
    assert {r.prompt_tokens for r in first} == {128}


def test_poisson_trace_from_workloads() -> None:
    trace = poisson_trace(10.0, 3, 0, lambda i: token_stream_source("stream-16", i))
    assert [len(r.chunks) for r in trace] == [16, 16, 16]
    usage = trace[1].chunks[-1].usage
    assert usage is not None
    assert trace[1].prompt_tokens == usage.prompt_tokens  # from the stream's own usage
    sized = poisson_trace(10.0, 3, 0, chunks("s", 1), prompt_tokens=lambda i: 10 * i)
    assert [r.prompt_tokens for r in sized] == [0, 10, 20]


def test_gamma_trace_is_burstier() -> None:
    def cv_of(trace: list[EngineRequest]) -> float:
        arrivals = [0.0] + [r.arrival_s or 0.0 for r in trace]
        gaps = [b - a for a, b in itertools.pairwise(arrivals)]
        mean = sum(gaps) / len(gaps)
        return math.sqrt(sum((g - mean) ** 2 for g in gaps) / len(gaps)) / mean

    stream = chunks("s", 1)
    assert cv_of(poisson_trace(100.0, 4000, 1, stream, cv=3.0)) > 2.0
    assert cv_of(poisson_trace(100.0, 4000, 1, stream)) == pytest.approx(1.0, abs=0.1)
    with pytest.raises(ValueError, match="rate_per_s"):
        poisson_trace(0.0, 1, 1, stream)


# a property over random traces


@st.composite
def traces(draw: st.DrawFn) -> list[EngineRequest]:
    count = draw(st.integers(1, 12))
    trace = []
    for i in range(count):
        rid = f"r{i}"
        trace.append(
            EngineRequest(
                rid,
                chunks(rid, draw(st.integers(1, 8)), draw(st.integers(1, 3))),
                draw(st.integers(0, 12)),
                draw(st.floats(0.0, 0.05)),
            )
        )
    return trace


@given(
    trace=traces(),
    policy=st.sampled_from(POLICIES),
    max_batch=st.integers(1, 6),
    kv_blocks=st.integers(10, 24),
    block_tokens=st.sampled_from([1, 2, 4]),
    admit_batch=st.one_of(st.none(), st.integers(1, 3)),
    max_prefill_tokens=st.one_of(st.none(), st.integers(1, 30)),
)
def test_every_request_gets_its_chunks_once_in_order(
    trace: list[EngineRequest],
    policy: str,
    max_batch: int,
    kv_blocks: int,
    block_tokens: int,
    admit_batch: int | None,
    max_prefill_tokens: int | None,
) -> None:
    config = EngineConfig(
        policy=policy,  # type: ignore[arg-type]
        max_batch=max_batch,
        kv_blocks=kv_blocks,
        block_tokens=block_tokens,
        admit_batch=admit_batch,
        max_prefill_tokens=max_prefill_tokens,
        adaptive_bmax=2,
        static_timeout_s=0.01,
    )
    fits = [
        r for r in trace if -(-(r.prompt_tokens + r.output_tokens) // block_tokens) <= kv_blocks
    ]
    result = simulate(config, fits)
    seen: dict[str, list[tuple[int, TokenChunk]]] = {r.rid: [] for r in fits}
    for step in result.steps:
        assert step.batch_size <= max_batch
        assert step.kv_blocks_used <= kv_blocks
        if step.kind == "decode":
            assert not step.prefilled
        for out in step.outputs:
            seen[out.rid].append((out.index, out.chunk))
    for req in fits:
        assert seen[req.rid] == list(enumerate(req.chunks))
    assert sorted(r.rid for r in result.records) == sorted(r.rid for r in fits)
    for record in result.records:
        assert record.arrival_s <= record.first_scheduled_s < record.first_token_s
        assert record.first_token_s <= record.finished_s
        parts = record.queue_s + record.prefill_s + record.decode_s + record.stall_s
        assert parts == pytest.approx(record.e2e_s)


# a property over random interleavings of add, step, pause, resume and abort (the engine
# process's calls on the real clock)

Op = tuple[str, int]


@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["add", "step", "pause", "resume", "abort"]), st.integers(0, 7)),
        max_size=60,
    ),
    policy=st.sampled_from(POLICIES),
    kv_blocks=st.integers(8, 20),
)
def test_random_operations_keep_the_invariants(ops: list[Op], policy: str, kv_blocks: int) -> None:
    config = EngineConfig(
        policy=policy,  # type: ignore[arg-type]
        max_batch=3,
        kv_blocks=kv_blocks,
        block_tokens=2,
        static_timeout_s=0.0,
        adaptive_bmax=2,
    )
    core = EngineCore(config)
    requests = {
        f"r{i}": EngineRequest(f"r{i}", chunks(f"r{i}", 1 + i % 4), i % 5) for i in range(8)
    }
    added: set[str] = set()
    aborted: set[str] = set()
    seen: dict[str, list[int]] = {rid: [] for rid in requests}

    def step() -> None:
        result = core.step()
        if result is None:
            return
        for out in result.outputs:
            assert out.rid not in aborted
            seen[out.rid].append(out.index)
        states = {rid: core.request_times(rid)["state"] for rid in added}
        holding = [rid for rid, state in states.items() if state == "running"]
        assert len(holding) <= config.max_batch
        assert core.kv.used_blocks == sum(core.kv.blocks(rid) for rid in holding)
        assert core.kv.used_blocks <= kv_blocks

    for op, n in ops:
        rid = f"r{n}"
        if op == "add" and rid not in added:
            core.add(requests[rid])
            added.add(rid)
        elif op == "step":
            step()
        elif op == "pause":
            core.pause(rid)
        elif op == "resume":
            core.resume(rid)
        elif op == "abort":
            if rid in added and core.request_times(rid)["state"] != "finished":
                aborted.add(rid)
            core.abort(rid)
    for rid in added:
        core.resume(rid)
    for _ in range(200):
        if not core.has_work():
            break
        step()
    assert not core.has_work()
    assert core.kv.used_blocks == 0
    for rid in added:
        indices = seen[rid]
        assert indices == list(range(len(indices)))  # in order, none twice
        if rid not in aborted:
            assert len(indices) == len(requests[rid].chunks)
