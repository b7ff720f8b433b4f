"""The engine model on the virtual clock: batch composition step by step for each policy, the
KV cache at capacity (waiting, preemption, resumption), pause/resume/abort and the per-request
times. Every trace here is small and fixed; every time is exact arithmetic on the step model."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from inferwire.codecs import TokenChunk
from inferwire.engine import (
    EngineConfig,
    EngineCore,
    EngineRequest,
    StepModel,
    StepResult,
    VirtualClock,
    simulate,
)

# 10 ms a prefill iteration (+1 ms a prompt token where a test gives prompts), 1 ms a decode step
STEP = StepModel(
    prefill_fixed_s=0.010,
    prefill_per_token_s=0.0,
    decode_base_s=0.001,
    decode_per_seq_s=0.0,
    decode_per_kv_token_s=0.0,
)


def chunks(rid: str, count: int, tokens: int = 1) -> list[TokenChunk]:
    return [
        TokenChunk(
            id=rid,
            model="m",
            created=0,
            index=0,
            seq=i,
            token_ids=tuple(range(tokens)),
            text=f"{rid}.{i}",
            finish_reason="stop" if i == count - 1 else None,
        )
        for i in range(count)
    ]


def request(rid: str, count: int, *, at: float = 0.0, prompt: int = 0) -> EngineRequest:
    return EngineRequest(rid, chunks(rid, count), prompt, at)


def composition(steps: Sequence[StepResult]) -> list[tuple[str, tuple[str, ...], float]]:
    return [(s.kind, s.rids, round(s.start_s, 9)) for s in steps]


def config(**kwargs: object) -> EngineConfig:
    kwargs.setdefault("step", STEP)
    return EngineConfig(**kwargs)  # type: ignore[arg-type]


def check_outputs(steps: Sequence[StepResult], trace: Sequence[EngineRequest]) -> None:
    """Every request's outputs are exactly its chunks, in order, each once; ``finished`` on the
    last only."""
    seen: dict[str, list[tuple[int, TokenChunk, bool]]] = {r.rid: [] for r in trace}
    for step in steps:
        for out in step.outputs:
            seen[out.rid].append((out.index, out.chunk, out.finished))
    for req in trace:
        got = seen[req.rid]
        assert [i for i, _, _ in got] == list(range(len(req.chunks)))
        assert [c for _, c, _ in got] == list(req.chunks)
        assert [f for _, _, f in got] == [False] * (len(req.chunks) - 1) + [True]


# the fixed trace: A (3 chunks) and B (2) and C (2) arrive at 0 for two slots
TRACE = [request("A", 3), request("B", 2), request("C", 2)]


def test_continuous_admits_mid_batch_and_retires_at_once() -> None:
    result = simulate(config(policy="continuous", max_batch=2), TRACE)
    assert composition(result.steps) == [
        ("prefill", ("A", "B"), 0.0),
        ("decode", ("A", "B"), 0.010),  # B finishes: its slot frees at once
        ("prefill", ("C",), 0.011),  # C joins while A still runs
        ("decode", ("A", "C"), 0.021),  # both finish
    ]
    assert result.end_s == pytest.approx(0.022)
    check_outputs(result.steps, TRACE)
    times = {r.rid: r for r in result.records}
    assert times["C"].first_scheduled_s == pytest.approx(0.011)
    assert times["C"].ttft_s == pytest.approx(0.021)
    assert times["A"].stall_s == pytest.approx(0.010)  # held its slot through C's prefill


def test_static_runs_a_batch_to_its_end_before_admitting() -> None:
    result = simulate(config(policy="static", max_batch=2, static_timeout_s=0.005), TRACE)
    assert composition(result.steps) == [
        ("prefill", ("A", "B"), 0.0),  # full at once
        ("decode", ("A", "B"), 0.010),
        ("decode", ("A",), 0.011),  # B's slot stays idle; C waits for the whole batch
        ("prefill", ("C",), 0.012),  # C alone has waited past the timeout
        ("decode", ("C",), 0.022),
    ]
    check_outputs(result.steps, TRACE)


def test_static_waits_to_fill() -> None:
    trace = [request("A", 1), request("B", 1, at=0.002), request("C", 1, at=0.003)]
    result = simulate(config(policy="static", max_batch=2, static_timeout_s=0.005), trace)
    assert composition(result.steps) == [
        ("prefill", ("A", "B"), 0.002),  # B fills the batch before A's timeout
        ("prefill", ("C",), 0.012),  # alone: waits until 0.003 + 5 ms, after the batch
    ]


def test_static_times_out() -> None:
    core = EngineCore(config(policy="static", max_batch=4, static_timeout_s=0.005), VirtualClock())
    core.add(request("A", 1))
    assert core.step() is None  # not full, not yet due
    assert core.has_work()
    assert core.next_wakeup_s() == pytest.approx(0.005)
    result = simulate(core.config, [request("A", 1)])
    assert composition(result.steps) == [("prefill", ("A",), 0.005)]
    assert result.records[0].queue_s == pytest.approx(0.005)


def test_continuous_admission_cap() -> None:
    trace = [request(f"r{i}", 2) for i in range(5)]
    result = simulate(config(policy="continuous", admit_batch=2), trace)
    assert composition(result.steps) == [
        ("prefill", ("r0", "r1"), 0.0),
        ("prefill", ("r2", "r3"), 0.010),
        ("prefill", ("r4",), 0.020),
        ("decode", ("r0", "r1", "r2", "r3", "r4"), 0.030),
    ]


def test_prefill_token_budget() -> None:
    trace = [request(f"r{i}", 2, prompt=p) for i, p in enumerate((300, 300, 500, 2000, 10))]
    result = simulate(config(policy="continuous", max_prefill_tokens=1000), trace)
    assert [s.rids for s in result.steps[:4]] == [
        ("r0", "r1"),  # 600 tokens; r2's 500 more would pass 1000
        ("r2",),
        ("r3",),  # over the budget alone: prefilled alone
        ("r4",),
    ]


def test_adaptive_admits_by_queue_and_load() -> None:
    # load L = decode_step_s / target = 1 ms / 1 ms = 1 whenever anything runs
    trace = [request(f"r{i}", 2) for i in range(5)]
    cfg = config(policy="adaptive", adaptive_bmax=2, adaptive_target_step_s=0.001)
    result = simulate(cfg, trace)
    assert composition(result.steps) == [
        ("prefill", ("r0", "r1"), 0.0),  # L=0: min(Bmax, Q) = min(2, 5)
        ("prefill", ("r2", "r3"), 0.010),  # L=1: ceil(3 / 2) = 2
        ("prefill", ("r4",), 0.020),  # L=1: ceil(1 / 2) = 1
        ("decode", ("r0", "r1", "r2", "r3", "r4"), 0.030),
    ]


def test_adaptive_is_capped_by_free_slots() -> None:
    trace = [request(f"r{i}", 2) for i in range(5)]
    cfg = config(policy="adaptive", adaptive_bmax=8, max_batch=3, adaptive_target_step_s=1.0)
    result = simulate(cfg, trace)
    assert composition(result.steps)[:2] == [
        ("prefill", ("r0", "r1", "r2"), 0.0),  # B = min(8, 5) = 5, three slots
        ("decode", ("r0", "r1", "r2"), 0.010),
    ]


def test_adaptive_load_follows_measured_step_times() -> None:
    cfg = config(policy="adaptive", adaptive_target_step_s=0.001, adaptive_ewma_alpha=0.5)
    clock = VirtualClock()
    core = EngineCore(cfg, clock)
    for i in range(3):
        core.add(request(f"r{i}", 5))
    core.step()  # prefill
    core.step()  # a decode step of 1 ms (the prefill's 10 ms took 10 ms: ratio stays 1)
    assert core.stats()["load"] == pytest.approx(1.0)
    clock.advance(0.003)  # the frontend took 3 ms more to send the outputs
    core.step()  # measured 4 ms for 1 ms predicted: ratio 1 + 0.5 * (4 - 1)
    assert core.stats()["load"] == pytest.approx(2.5)
    clock.advance(0.100)  # one stall counts as 4x at most: ratio 2.5 + 0.5 * (4 - 2.5)
    core.step()
    assert core.stats()["load"] == pytest.approx(3.25)


def test_kv_capacity_preempts_and_resumes_without_duplicates() -> None:
    # 3 blocks of 4 tokens; prompts of 3 tokens, one token a chunk
    step = StepModel(
        prefill_fixed_s=0.010,
        prefill_per_token_s=0.001,
        decode_base_s=0.001,
        decode_per_seq_s=0.0,
        decode_per_kv_token_s=0.0,
    )
    trace = [request("A", 6, prompt=3), request("B", 2, prompt=3)]
    cfg = EngineConfig(policy="continuous", kv_blocks=3, block_tokens=4, step=step)
    result = simulate(cfg, trace)
    assert composition(result.steps) == [
        ("prefill", ("A", "B"), 0.0),  # 6 prompt tokens: 16 ms; a block each
        ("decode", ("A",), 0.016),  # A takes the last block; B needs one: B is preempted
        ("decode", ("A",), 0.017),  # B waits: it needs 2 blocks again, 1 is free
        ("decode", ("A",), 0.018),
        ("decode", ("A",), 0.019),
        ("decode", ("A",), 0.020),  # A's last chunk, in its third block
        ("prefill", ("B",), 0.021),  # B recomputes prompt + its 1 token: 14 ms
    ]
    assert [s.preempted for s in result.steps][1] == ["B"]
    assert result.steps[-1].duration_s == pytest.approx(0.014)
    check_outputs(result.steps, trace)
    records = {r.rid: r for r in result.records}
    assert (records["A"].preemptions, records["B"].preemptions) == (0, 1)
    assert records["B"].first_token_s == pytest.approx(0.016)  # its first, not its recompute
    assert records["B"].queue_s == pytest.approx(0.021 - 0.016)
    assert records["B"].prefill_s == pytest.approx(0.016 + 0.014)
    assert max(s.kv_blocks_used for s in result.steps) <= 3


def test_preemption_takes_the_most_recently_admitted() -> None:
    # 4 blocks of 2 tokens; prompt 1, one token a chunk, 4 chunks each (5 tokens: 3 blocks)
    trace = [request(r, 4, prompt=1) for r in ("A", "B", "C")]
    cfg = config(policy="continuous", kv_blocks=4, block_tokens=2)
    result = simulate(cfg, trace)
    assert [(s.kind, s.rids, s.preempted) for s in result.steps] == [
        ("prefill", ("A", "B", "C"), []),
        ("decode", ("A", "B"), ["C"]),  # B needs a block: C, admitted last, goes
        ("decode", ("A", "B"), []),  # C waits for 2 blocks
        ("decode", ("A",), ["B"]),  # A needs a block: B is now the last admitted
        ("prefill", ("B",), []),  # B first: it went back to the front of the queue
        ("prefill", ("C",), []),
        ("decode", ("C",), []),
        ("decode", ("C",), []),
    ]
    check_outputs(result.steps, trace)


def test_a_request_that_needs_room_last_preempts_itself() -> None:
    trace = [request("A", 3, prompt=1), request("B", 3, prompt=1)]
    cfg = config(policy="continuous", kv_blocks=3, block_tokens=2)
    result = simulate(cfg, trace)
    # A grows into the free block; B, admitted last, finds none and is the one evicted
    assert (result.steps[1].rids, result.steps[1].preempted) == (("A",), ["B"])
    check_outputs(result.steps, trace)


def test_waits_at_capacity_until_blocks_free() -> None:
    trace = [request("A", 2, prompt=7), request("B", 1, prompt=7)]
    cfg = config(policy="continuous", kv_blocks=3, block_tokens=4)
    result = simulate(cfg, trace)
    assert composition(result.steps) == [
        ("prefill", ("A",), 0.0),  # 8 tokens, 2 blocks; B needs 2, waits though a slot is free
        ("decode", ("A",), 0.010),  # A's 9th token takes the third block; A finishes
        ("prefill", ("B",), 0.011),
    ]
    assert [s.kv_blocks_used for s in result.steps] == [2, 0, 0]


def test_pause_resume_abort() -> None:
    clock = VirtualClock()
    core = EngineCore(config(policy="continuous"), clock)
    for rid in ("A", "B", "C"):
        core.add(request(rid, 4, prompt=16))
    assert core.step() is not None  # prefill of all three
    used = core.stats()["kv_blocks_used"]
    core.pause("A")
    step = core.step()
    assert step is not None
    assert step.rids == ("B", "C")
    assert core.stats()["paused"] == 1
    assert core.stats()["kv_blocks_used"] == used  # A keeps its blocks
    core.resume("A")
    step = core.step()
    assert step is not None
    assert step.rids == ("A", "B", "C")
    core.abort("B")
    core.abort("nobody")  # unknown: no-op
    assert core.stats()["kv_blocks_used"] < used
    assert core.request_times("B")["state"] == "aborted"
    step = core.step()
    assert step is not None
    assert step.rids == ("A", "C")
    assert [o.index for o in step.outputs] == [2, 3]  # A was paused one step
    core.pause("A")
    core.pause("C")
    assert core.step() is None  # everything paused: nothing to compute
    assert core.has_work()
    core.abort("A")
    core.abort("C")
    assert not core.has_work()
    assert core.stats()["kv_blocks_used"] == 0


def test_abort_a_waiting_request() -> None:
    core = EngineCore(config(policy="static", max_batch=4, static_timeout_s=1.0))
    core.add(request("A", 2))
    core.abort("A")
    assert not core.has_work()
    assert core.step() is None
    assert core.next_wakeup_s() is None


def test_a_paused_waiting_request_is_passed_over() -> None:
    core = EngineCore(config(policy="continuous"))
    core.add(request("A", 2))
    core.add(request("B", 2))
    core.pause("A")
    step = core.step()
    assert step is not None
    assert step.rids == ("B",)
    core.resume("A")
    step = core.step()
    assert step is not None
    assert (step.kind, step.rids) == ("prefill", ("A",))


def test_request_times_split() -> None:
    trace = [request("A", 3, prompt=5), request("B", 2, at=0.004)]
    result = simulate(config(policy="continuous"), trace)
    for record in result.records:
        parts = record.queue_s + record.prefill_s + record.decode_s + record.stall_s
        assert parts == pytest.approx(record.e2e_s)
    b = next(r for r in result.records if r.rid == "B")
    assert b.arrival_s == pytest.approx(0.004)
    assert b.first_scheduled_s == pytest.approx(0.010)  # after A's prefill
    assert b.queue_s == pytest.approx(0.006)
    assert b.tokens == 2
    assert b.output_chunks == 2


def test_request_times_while_running_and_after() -> None:
    core = EngineCore(config(policy="continuous"), VirtualClock(5.0))
    core.add(EngineRequest("A", chunks("A", 2), 0))  # arrival stamped from the clock
    times = core.request_times("A")
    assert times["arrival_s"] == 5.0
    assert times["first_token_s"] is None
    assert times["state"] == "waiting"
    while core.has_work():
        core.step()
    times = core.request_times("A")
    assert times["state"] == "finished"
    assert times["finished_s"] == pytest.approx(5.011)
    record = core.pop_record("A")
    assert record is not None
    assert record.e2e_s == pytest.approx(0.011)
    assert core.pop_record("A") is None
    with pytest.raises(KeyError):
        core.request_times("A")


def test_real_clock_is_not_advanced() -> None:
    class Fixed:
        def now(self) -> float:
            return 100.0

    core = EngineCore(config(policy="continuous"), Fixed())
    core.add(request("A", 2, at=100.0))
    step = core.step()
    assert step is not None
    assert step.start_s == 100.0
    assert step.duration_s == pytest.approx(0.010)
    assert core.clock.now() == 100.0  # the caller waits duration_s, not the core


def test_stats_count_steps() -> None:
    core = EngineCore(config(policy="continuous"))
    core.add(request("A", 3))
    while core.has_work():
        core.step()
    stats = core.stats()
    assert (stats["steps"], stats["prefill_steps"], stats["decode_steps"]) == (3, 1, 2)
    assert stats["finished"] == 1
    assert stats["output_tokens"] == 3
    assert stats["busy_s"] == pytest.approx(0.012)
