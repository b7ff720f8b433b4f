"""The engine core: requests in, one iteration at a time out. Pure Python, no I/O.

:meth:`EngineCore.step` plans and "runs" one iteration (see :mod:`inferwire.engine.scheduler`
for the policies): a **prefill** iteration of the requests the policy admits now, each of which
emits its next chunk at the iteration's end (its first, or after a preemption the one it had
reached), or else a **decode** iteration in which every running, unpaused request emits one
chunk. Its time comes from the :class:`~inferwire.engine.StepModel`: prefill of the admitted
requests' tokens, or a decode step of the batch and the KV tokens it holds. On a
:class:`~inferwire.engine.VirtualClock` the step advances the clock by that time; on the real
clock the caller waits it out.

KV cache (:class:`~inferwire.engine.kvcache.KVCache`): admission takes the blocks of the
tokens to prefill plus the chunk it emits; before a decode iteration each request, in
admission order, reserves room for its next chunk. When no block is free the most recently
admitted running request is **preempted** (vLLM's default, recompute): its blocks are freed
and it goes to the front of the waiting queue (several in one step keep their admission
order); readmitted, it prefills its prompt and every token it has emitted, then emits the chunk
it had reached, so no output is emitted twice. If the request that needs room is itself the
most recently admitted, it is the one preempted.

A paused request (:meth:`EngineCore.pause`, frontend backpressure) keeps its slot and blocks
but is skipped by decode iterations (and, if it waits, by admission) until resumed; holding
blocks, it can be the one preempted.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

from .clock import Clock, VirtualClock
from .errors import (
    DuplicateRequestError,
    EngineFullError,
    InvalidRequestError,
    RequestTooLargeError,
)
from .kvcache import KVCache
from .model import EngineRequest, Output, RequestRecord, StepResult
from .scheduler import Admission, EngineConfig, QueueView, make_policy

__all__ = ["EngineCore", "EngineRequest", "Output", "RequestRecord", "StepResult"]


@dataclass(slots=True, eq=False)
class _Live:
    """A request's mutable state inside the core."""

    request: EngineRequest
    rid: str
    arrival_s: float
    waiting_since_s: float
    next_index: int = 0
    emitted_tokens: int = 0
    paused: bool = False
    state: str = "waiting"
    preemptions: int = 0
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None
    queue_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    stall_s: float = 0.0

    def next_tokens(self) -> int:
        return len(self.request.chunks[self.next_index].token_ids)

    def times(self) -> dict[str, Any]:
        return {
            "rid": self.rid,
            "state": self.state,
            "paused": self.paused,
            "arrival_s": self.arrival_s,
            "first_scheduled_s": self.first_scheduled_s,
            "first_token_s": self.first_token_s,
            "finished_s": self.finished_s,
            "queue_s": self.queue_s,
            "prefill_s": self.prefill_s,
            "decode_s": self.decode_s,
            "stall_s": self.stall_s,
            "preemptions": self.preemptions,
            "tokens": self.emitted_tokens,
            "output_chunks": self.next_index,
            "prompt_tokens": self.request.prompt_tokens,
        }

    def record(self) -> RequestRecord:
        assert self.first_scheduled_s is not None
        assert self.first_token_s is not None
        assert self.finished_s is not None
        return RequestRecord(
            rid=self.rid,
            arrival_s=self.arrival_s,
            first_scheduled_s=self.first_scheduled_s,
            first_token_s=self.first_token_s,
            finished_s=self.finished_s,
            tokens=self.emitted_tokens,
            output_chunks=self.next_index,
            prompt_tokens=self.request.prompt_tokens,
            preemptions=self.preemptions,
            queue_s=self.queue_s,
            prefill_s=self.prefill_s,
            decode_s=self.decode_s,
            stall_s=self.stall_s,
        )


class EngineCore:
    """The engine's scheduler and KV cache on a clock; see the module docstring."""

    def __init__(self, config: EngineConfig | None = None, clock: Clock | None = None) -> None:
        self.config = config if config is not None else EngineConfig()
        self.clock: Clock = clock if clock is not None else VirtualClock()
        self.kv = KVCache(self.config.kv_blocks, self.config.block_tokens)
        self.policy = make_policy(self.config)
        self._waiting: deque[_Live] = deque()
        self._running: list[_Live] = []  # admission order
        self._live: dict[str, _Live] = {}
        self._done: OrderedDict[str, _Live] = OrderedDict()
        self._last_busy_step: tuple[float, float] | None = None  # (start, duration)
        self._counts = {
            "steps": 0,
            "prefill_steps": 0,
            "decode_steps": 0,
            "preemptions": 0,
            "finished": 0,
            "aborted": 0,
            "rejected": 0,
            "output_tokens": 0,
        }
        self._busy_s = 0.0

    # requests in and out

    def add(self, request: EngineRequest) -> None:
        """Queue ``request``. Raises :class:`EngineFullError` when ``max_waiting`` requests
        wait, :class:`RequestTooLargeError` when it could never fit in the KV cache,
        :class:`DuplicateRequestError` when its id is in use."""
        if not isinstance(request, EngineRequest):
            raise InvalidRequestError("add takes an EngineRequest")
        if request.rid in self._live:
            raise DuplicateRequestError(f"request {request.rid!r} is already in the engine")
        needed = self.kv.blocks_for(request.prompt_tokens + request.output_tokens)
        if needed > self.kv.total_blocks:
            self._counts["rejected"] += 1
            raise RequestTooLargeError(request.rid, needed, self.kv.total_blocks)
        if len(self._waiting) >= self.config.max_waiting:
            self._counts["rejected"] += 1
            raise EngineFullError(len(self._waiting), self.config.max_waiting)
        arrival_s = self.clock.now() if request.arrival_s is None else request.arrival_s
        live = _Live(
            request=request, rid=request.rid, arrival_s=arrival_s, waiting_since_s=arrival_s
        )
        self._done.pop(request.rid, None)
        self._live[request.rid] = live
        self._waiting.append(live)

    def abort(self, rid: str) -> None:
        """Remove ``rid`` wherever it is and free its KV blocks; an unknown id is a no-op."""
        live = self._live.pop(rid, None)
        if live is None:
            return
        if live.state == "waiting":
            self._waiting.remove(live)
        else:
            self._running.remove(live)
            self.kv.free(rid)
        live.state = "aborted"
        self._counts["aborted"] += 1
        self.policy.retired(rid)
        self._retain(live)

    def pause(self, rid: str) -> None:
        """Skip ``rid`` in decode iterations (it keeps its slot and blocks) until resumed; an
        unknown id is a no-op."""
        if (live := self._live.get(rid)) is not None:
            live.paused = True

    def resume(self, rid: str) -> None:
        if (live := self._live.get(rid)) is not None:
            live.paused = False

    def has_work(self) -> bool:
        """Anything waiting or running (paused included)."""
        return bool(self._live)

    def next_wakeup_s(self) -> float | None:
        """When :meth:`step` may have work although it returned ``None`` and nothing new arrives
        (the ``static`` policy's fill timeout), on the engine's clock; ``None``: not before
        something arrives, resumes or is aborted."""
        return self.policy.next_wakeup_s(self._view(self.clock.now()))

    # one iteration

    def step(self) -> StepResult | None:
        """Plan and run one iteration; ``None`` when there is nothing to compute now."""
        now_s = self.clock.now()
        if self._last_busy_step is not None:
            start_s, duration_s = self._last_busy_step
            self.policy.observe(duration_s, now_s - start_s)
            self._last_busy_step = None
        view = self._view(now_s)
        admitted = self._admit(self.policy.admission(view)) if view.waiting else []
        if admitted:
            result = self._prefill(now_s, admitted)
        elif view.decodable:
            result = self._decode(now_s)
        else:
            return None
        self._counts["steps"] += 1
        self._counts[f"{result.kind}_steps"] += 1
        self._busy_s += result.duration_s
        if isinstance(self.clock, VirtualClock):
            self.clock.advance(result.duration_s)
        if result.duration_s > 0 and any(not r.paused for r in self._running):
            self._last_busy_step = (result.start_s, result.duration_s)
        return result

    def _view(self, now_s: float) -> QueueView:
        admissible = [r for r in self._waiting if not r.paused]
        decodable = [r for r in self._running if not r.paused]
        return QueueView(
            now_s=now_s,
            waiting=len(admissible),
            oldest_arrival_s=admissible[0].arrival_s if admissible else None,
            running=len(self._running),
            decodable=len(decodable),
            decodable_kv_tokens=sum(self.kv.tokens(r.rid) for r in decodable),
        )

    def _admit(self, admission: Admission) -> list[_Live]:
        limit = min(admission.limit, self.config.max_batch - len(self._running))
        admitted: list[_Live] = []
        prefill_tokens = 0
        for live in self._waiting:
            if len(admitted) >= limit:
                break
            if live.paused or (admission.only is not None and live.rid not in admission.only):
                continue
            tokens = live.request.prompt_tokens + live.emitted_tokens
            if (
                admission.max_tokens is not None
                and admitted
                and prefill_tokens + tokens > admission.max_tokens
            ):
                break
            if not self.kv.can_allocate(tokens + live.next_tokens()):
                break  # first come, first served: nobody overtakes the head of the queue
            self.kv.allocate(live.rid, tokens + live.next_tokens())
            prefill_tokens += tokens
            admitted.append(live)
        for live in admitted:
            if self._waiting[0] is live:  # the usual case: the head of the queue, in order
                self._waiting.popleft()
            else:
                self._waiting.remove(live)
            self._running.append(live)
            live.state = "running"
        return admitted

    def _prefill(self, now_s: float, admitted: list[_Live]) -> StepResult:
        duration_s = self.config.step.prefill_batch_s(
            live.request.prompt_tokens + live.emitted_tokens for live in admitted
        )
        end_s = now_s + duration_s
        prefilling = {id(live) for live in admitted}
        for live in self._running:
            if id(live) not in prefilling:
                live.stall_s += duration_s
        rids = tuple(live.rid for live in admitted)
        self.policy.admitted(rids)  # before any of them can retire in _emit
        outputs = []
        for live in admitted:
            live.queue_s += now_s - live.waiting_since_s
            live.prefill_s += duration_s
            if live.first_scheduled_s is None:
                live.first_scheduled_s = now_s
            if live.first_token_s is None:
                live.first_token_s = end_s
            outputs.append(self._emit(live, end_s))
        return StepResult(
            start_s=now_s,
            duration_s=duration_s,
            outputs=outputs,
            prefilled=list(rids),
            preempted=[],
            batch_size=len(admitted),
            queue_len=len(self._waiting),
            kind="prefill",
            rids=rids,
            kv_blocks_used=self.kv.used_blocks,
        )

    def _decode(self, now_s: float) -> StepResult:
        batch: list[_Live] = []
        preempted: list[str] = []
        kv_tokens = 0
        for live in list(self._running):
            if live.paused or live.state != "running":
                continue
            need = live.next_tokens()
            held = self.kv.tokens(live.rid)
            while not self.kv.try_grow(live.rid, need):
                victim = self._running[-1]
                self._preempt(victim, now_s)
                preempted.append(victim.rid)
                if victim is live:
                    break
            else:
                kv_tokens += held
                batch.append(live)
        duration_s = self.config.step.decode_step_s(len(batch), kv_tokens) if batch else 0.0
        end_s = now_s + duration_s
        for live in self._running:
            if live.paused:
                live.stall_s += duration_s
        outputs = []
        for live in batch:
            live.decode_s += duration_s
            outputs.append(self._emit(live, end_s))
        return StepResult(
            start_s=now_s,
            duration_s=duration_s,
            outputs=outputs,
            prefilled=[],
            preempted=preempted,
            batch_size=len(batch),
            queue_len=len(self._waiting),
            kind="decode",
            rids=tuple(live.rid for live in batch),
            kv_blocks_used=self.kv.used_blocks,
        )

    def _emit(self, live: _Live, end_s: float) -> Output:
        """The request's next chunk; it retires if that was its last. Its KV cache already
        holds the chunk's tokens (reserved at admission or before the decode step)."""
        index = live.next_index
        chunk = live.request.chunks[index]
        live.next_index += 1
        live.emitted_tokens += len(chunk.token_ids)
        self._counts["output_tokens"] += len(chunk.token_ids)
        finished = live.next_index == len(live.request.chunks)
        if finished:
            live.finished_s = end_s
            live.state = "finished"
            self._running.remove(live)
            self.kv.free(live.rid)
            del self._live[live.rid]
            self._counts["finished"] += 1
            self.policy.retired(live.rid)
            self._retain(live)
        return Output(live.rid, chunk, index, finished)

    def _preempt(self, live: _Live, now_s: float) -> None:
        self._running.remove(live)
        self.kv.free(live.rid)
        self._waiting.appendleft(live)
        live.state = "waiting"
        live.waiting_since_s = now_s
        live.preemptions += 1
        self._counts["preemptions"] += 1

    def _retain(self, live: _Live) -> None:
        self._done[live.rid] = live
        while len(self._done) > self.config.keep_records:
            self._done.popitem(last=False)

    # what the engine knows

    def request_times(self, rid: str) -> dict[str, Any]:
        """``rid``'s ``state`` ("waiting", "running", "finished" or "aborted"), whether it is
        ``paused``, and its times so far (engine clock, seconds; ``None`` where not reached):
        ``arrival_s``, ``first_scheduled_s``, ``first_token_s``, ``finished_s``, and the split
        of :class:`RequestRecord` (``queue_s``, ``prefill_s``, ``decode_s``, ``stall_s``),
        ``preemptions``, ``tokens``, ``output_chunks``. Finished and aborted requests are kept (the
        last ``keep_records``) until :meth:`pop_record`. Unknown id: ``KeyError``."""
        live = self._live.get(rid) or self._done.get(rid)
        if live is None:
            raise KeyError(rid)
        return live.times()

    def pop_record(self, rid: str) -> RequestRecord | None:
        """The record of finished request ``rid``, forgotten from now on (``None`` if it is not
        a retained finished request)."""
        live = self._done.get(rid)
        if live is None or live.state != "finished":
            return None
        del self._done[rid]
        return live.record()

    def stats(self) -> dict[str, Any]:
        """Counts and gauges: ``running``, ``waiting``, ``paused``, ``kv_blocks_used``,
        ``kv_blocks_total``, ``steps`` (and ``prefill_steps``, ``decode_steps``),
        ``preemptions``, ``finished``, ``aborted``, ``rejected``, ``output_tokens``,
        ``busy_s`` (modelled compute time), ``load`` (adaptive's ``L`` now, else ``None``)."""
        return {
            "policy": self.config.policy,
            "running": len(self._running),
            "waiting": len(self._waiting),
            "paused": sum(1 for r in self._live.values() if r.paused),
            "kv_blocks_used": self.kv.used_blocks,
            "kv_blocks_total": self.kv.total_blocks,
            **self._counts,
            "busy_s": self._busy_s,
            "load": self.policy.load(self._view(self.clock.now())),
        }
