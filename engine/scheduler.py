"""Batching policies: what an iteration admits (see :mod:`inferwire.engine.core` for how an
iteration runs).

The engine schedules at the iteration level, as Orca introduced and vLLM V0 does without chunked
prefill: each :meth:`~inferwire.engine.EngineCore.step` is *either* a prefill iteration of the
requests admitted now *or* one decode step of every running, unpaused request; prefill goes
first whenever the policy admits someone. A policy only says how many waiting requests an
iteration may admit (and, for ``static``, which); the core takes them first come, first served,
up to the free slots (``max_batch``), the KV blocks free and (except ``static``) the prefill
token budget ``max_prefill_tokens``, and stops at the first request that does not fit
(head-of-line, as vLLM's FCFS queue).

- ``static``: request-level batching. With no batch running it waits until ``max_batch``
  requests wait or the oldest has waited ``static_timeout_s``, then admits up to ``max_batch``
  in one prefill; that batch decodes until *every* member has finished, and nothing else is
  admitted meanwhile (a finished member's slot stays idle). A member preempted for KV space is
  readmitted before the batch goes on.
- ``continuous``: every iteration admits whatever fits (vLLM, TensorRT-LLM in-flight batching);
  finished requests leave at once. ``admit_batch`` caps how many one prefill iteration admits
  (``None``: no cap): a fixed admission batch size, the baseline C13 compares against.
- ``adaptive``: continuous, admitting ``B = min(Bmax, ceil(Q / (1 + L)))`` per prefill
  iteration (:func:`adaptive_batch`), with ``Q`` the number of requests waiting and ``L`` the
  predicted load (:class:`LoadEstimator`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Final, Literal

from .steps import StepModel

PolicyName = Literal["static", "continuous", "adaptive"]
POLICIES: Final[tuple[PolicyName, ...]] = ("static", "continuous", "adaptive")


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """The engine's configuration; every field is checked when it is made.

    Defaults are a single-GPU 7B deployment as vLLM configures one: ``max_batch`` is vLLM's
    default ``max_num_seqs`` (256; at 64 the default step model cannot keep up with 50 req/s
    of 256-token streams), 16-token blocks (vLLM's default block size) and
    ``kv_blocks`` derived for the default step model's GPU: an H100 80GB at vLLM's
    ``gpu_memory_utilization`` 0.9 leaves 72 GB, less 6.7 GB of FP8 weights and about 2 GB of
    activations, for FP8 KV tokens of 256 KiB: about 240,000 tokens, 15,000 blocks (derived, not
    measured). ``static_timeout_s`` and the adaptive targets are choices, not measurements.
    """

    policy: PolicyName = "continuous"
    max_batch: int = 256
    """Requests holding a slot at once (running or paused): vLLM's ``max_num_seqs``."""
    kv_blocks: int = 15_000
    block_tokens: int = 16
    max_waiting: int = 4096
    """Requests that may wait; one more raises :class:`~inferwire.engine.EngineFullError`."""
    static_timeout_s: float = 0.05
    """``static``: the longest the oldest waiting request waits for a batch to fill."""
    admit_batch: int | None = None
    """``continuous``: most requests one prefill iteration admits (``None``: no cap)."""
    max_prefill_tokens: int | None = None
    """``continuous``, ``adaptive``: most tokens one prefill iteration computes, as vLLM's
    ``max_num_batched_tokens`` (``None``: no cap; a longer request is prefilled alone).
    ``static`` prefills its whole batch at once."""
    adaptive_bmax: int = 32
    """``adaptive``: ``Bmax``, the most requests one prefill iteration admits."""
    adaptive_target_step_s: float = 0.025
    """``adaptive``: the decode step time that counts as load 1 (25 ms, 40 tokens/s a stream)."""
    adaptive_ewma_alpha: float = 0.2
    """``adaptive``: weight of the newest measured/predicted step-time ratio in its EWMA."""
    keep_records: int = 100_000
    """Finished or aborted requests whose times :meth:`EngineCore.request_times` still has."""
    step: StepModel = field(default_factory=StepModel)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, not {self.policy!r}")
        for name in ("max_batch", "kv_blocks", "block_tokens", "max_waiting", "adaptive_bmax"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be an integer of at least 1")
        if type(self.keep_records) is not int or self.keep_records < 0:
            raise ValueError("keep_records must be a non-negative integer")
        for name in ("admit_batch", "max_prefill_tokens"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 1):
                raise ValueError(f"{name} must be None or an integer of at least 1")
        if not math.isfinite(self.static_timeout_s) or self.static_timeout_s < 0:
            raise ValueError("static_timeout_s must be a finite, non-negative number")
        if not math.isfinite(self.adaptive_target_step_s) or self.adaptive_target_step_s <= 0:
            raise ValueError("adaptive_target_step_s must be a positive number")
        if not 0 < self.adaptive_ewma_alpha <= 1:
            raise ValueError("adaptive_ewma_alpha must be in (0, 1]")
        if not isinstance(self.step, StepModel):
            raise ValueError("step must be a StepModel")


def adaptive_batch(queue_len: int, load: float, bmax: int) -> int:
    """C13's admission size ``min(Bmax, ceil(Q / (1 + L)))``: 0 when nothing waits, ``min(Bmax,
    Q)`` at no load, 1 (while anything waits) as the load grows without bound. The caller still
    caps it by the free slots and KV blocks."""
    if queue_len < 0 or bmax < 1:
        raise ValueError("queue_len must be >= 0 and bmax >= 1")
    if not load >= 0:  # also refuses NaN
        raise ValueError(f"load must be a non-negative number, not {load!r}")
    if queue_len == 0:
        return 0
    return max(1, min(bmax, math.ceil(queue_len / (1 + load))))


class LoadEstimator:
    """``L``, the predicted load of the model, for the ``adaptive`` policy:

    ``L = r * decode_step_s(n, kv) / target_step_s``

    where ``n`` and ``kv`` are the running, unpaused requests and the KV tokens they hold (the
    next decode iteration, predicted by the step model), ``target_step_s`` is
    ``EngineConfig.adaptive_target_step_s``, and ``r`` corrects the model with what was
    measured: an EWMA (weight ``adaptive_ewma_alpha``) of measured/predicted step time, where
    the measured time of a step is the time from its start to the next step's start while work
    remained (so a frontend that is slow to send the outputs raises the load). On the virtual
    clock the measurement equals the prediction and ``r`` stays 1. ``L`` is 0 when nothing
    runs. Samples are clamped to [0.25, 4] so one stall cannot dominate.

    The source of C13 also watches the historical P99; that term is left out here: ``L`` is
    the model's own step-time pressure only.
    """

    __slots__ = ("_alpha", "_step", "_target_s", "ratio")

    def __init__(self, step: StepModel, target_step_s: float, alpha: float) -> None:
        self._step = step
        self._target_s = target_step_s
        self._alpha = alpha
        self.ratio = 1.0

    def observe(self, predicted_s: float, measured_s: float) -> None:
        if predicted_s <= 0:
            return
        sample = min(4.0, max(0.25, measured_s / predicted_s))
        self.ratio += self._alpha * (sample - self.ratio)

    def load(self, running: int, kv_tokens: int) -> float:
        if running == 0:
            return 0.0
        return self.ratio * self._step.decode_step_s(running, kv_tokens) / self._target_s


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueView:
    """What a policy sees of the engine when it plans an iteration."""

    now_s: float
    waiting: int
    """Requests waiting that could be admitted (not paused)."""
    oldest_arrival_s: float | None
    """Arrival of the first of them (the head of the queue)."""
    running: int
    """Requests holding a slot (running or paused)."""
    decodable: int
    """Running requests that are not paused."""
    decodable_kv_tokens: int


@dataclass(frozen=True, slots=True)
class Admission:
    """At most ``limit`` waiting requests may be admitted now, only those in ``only`` if set,
    with at most ``max_tokens`` tokens to prefill among them (beyond the first) if set."""

    limit: int
    only: frozenset[str] | None = None
    max_tokens: int | None = None


class Policy:
    """One batching policy's state; the core calls these hooks, in this order, every step."""

    name: ClassVar[PolicyName]

    def __init__(self, config: EngineConfig) -> None:
        self.config = config

    def admission(self, view: QueueView) -> Admission:
        """How many waiting requests this iteration may admit."""
        raise NotImplementedError

    def admitted(self, rids: Sequence[str]) -> None:
        """The requests a prefill iteration took (after :meth:`admission`)."""

    def retired(self, rid: str) -> None:
        """``rid`` finished or was aborted."""

    def observe(self, predicted_s: float, measured_s: float) -> None:
        """A step predicted to take ``predicted_s`` took ``measured_s`` until the next began."""

    def next_wakeup_s(self, view: QueueView) -> float | None:
        """When this policy may admit without anything new happening (a timeout), if ever."""
        return None

    def load(self, view: QueueView) -> float | None:
        """The load ``L`` this policy sees now (adaptive only), for stats."""
        return None


class StaticPolicy(Policy):
    name = "static"

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.batch: set[str] = set()

    def _due_s(self, view: QueueView) -> float | None:
        if view.oldest_arrival_s is None:
            return None
        return view.oldest_arrival_s + self.config.static_timeout_s

    def admission(self, view: QueueView) -> Admission:
        if self.batch:  # a batch runs: only its own preempted members come back
            return Admission(self.config.max_batch, frozenset(self.batch))
        due_s = self._due_s(view)
        if view.waiting >= self.config.max_batch or (due_s is not None and view.now_s >= due_s):
            return Admission(self.config.max_batch)
        return Admission(0)

    def admitted(self, rids: Sequence[str]) -> None:
        if not self.batch:
            self.batch = set(rids)

    def retired(self, rid: str) -> None:
        self.batch.discard(rid)

    def next_wakeup_s(self, view: QueueView) -> float | None:
        return None if self.batch else self._due_s(view)


class ContinuousPolicy(Policy):
    name = "continuous"

    def admission(self, view: QueueView) -> Admission:
        cap = self.config.admit_batch
        return Admission(
            self.config.max_batch if cap is None else cap,
            max_tokens=self.config.max_prefill_tokens,
        )


class AdaptivePolicy(Policy):
    name = "adaptive"

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.estimator = LoadEstimator(
            config.step, config.adaptive_target_step_s, config.adaptive_ewma_alpha
        )

    def admission(self, view: QueueView) -> Admission:
        load = self.estimator.load(view.decodable, view.decodable_kv_tokens)
        return Admission(
            adaptive_batch(view.waiting, load, self.config.adaptive_bmax),
            max_tokens=self.config.max_prefill_tokens,
        )

    def observe(self, predicted_s: float, measured_s: float) -> None:
        self.estimator.observe(predicted_s, measured_s)

    def load(self, view: QueueView) -> float | None:
        return self.estimator.load(view.decodable, view.decodable_kv_tokens)


_POLICY_CLASSES: Final[dict[str, type[Policy]]] = {
    cls.name: cls for cls in (StaticPolicy, ContinuousPolicy, AdaptivePolicy)
}


def make_policy(config: EngineConfig) -> Policy:
    """The policy ``config.policy`` names, with fresh state."""
    return _POLICY_CLASSES[config.policy](config)
