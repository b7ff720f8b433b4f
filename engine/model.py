"""The engine's values: a request going in, the outputs and iterations coming out, and a
finished request's record. Frozen and slotted, as the codecs' model objects."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from inferwire.codecs import TokenChunk

from .errors import InvalidRequestError

StepKind = Literal["prefill", "decode"]


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """A request to play ``chunks`` (one per iteration) after prefilling ``prompt_tokens``.

    ``arrival_s`` is on the engine's clock; ``None`` stamps it when :meth:`EngineCore.add`
    takes the request. Each chunk's token count grows the request's KV cache."""

    rid: str
    chunks: Sequence[TokenChunk]
    prompt_tokens: int
    arrival_s: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.rid, str) or not self.rid:
            raise InvalidRequestError("rid must be a non-empty string")
        if isinstance(self.chunks, str | bytes) or not len(self.chunks):
            raise InvalidRequestError(f"request {self.rid!r} has no chunks")
        if type(self.prompt_tokens) is not int or self.prompt_tokens < 0:
            raise InvalidRequestError(f"request {self.rid!r}: prompt_tokens must be >= 0")
        if self.arrival_s is not None and not 0 <= self.arrival_s < math.inf:
            raise InvalidRequestError(f"request {self.rid!r}: arrival_s must be finite, >= 0")

    @property
    def output_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.chunks)


@dataclass(frozen=True, slots=True)
class Output:
    """Chunk number ``index`` of request ``rid``; ``finished`` on its last."""

    rid: str
    chunk: TokenChunk
    index: int
    finished: bool


@dataclass(frozen=True, slots=True)
class StepResult:
    """One iteration: it started at ``start_s`` and takes ``duration_s``; its outputs are due at
    its end. ``prefilled``: requests prefilled in it; ``preempted``: requests evicted to make
    room; ``batch_size``: requests computed; ``queue_len``: requests waiting after it.
    Additions: ``kind`` and ``rids`` (the requests computed, in order); ``kv_blocks_used`` after
    it."""

    start_s: float
    duration_s: float
    outputs: list[Output]
    prefilled: list[str]
    preempted: list[str]
    batch_size: int
    queue_len: int
    kind: StepKind = "decode"
    rids: tuple[str, ...] = ()
    kv_blocks_used: int = 0

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestRecord:
    """A finished request's times (engine clock, seconds) and counts: ``tokens`` and
    ``output_chunks`` emitted, ``preemptions`` suffered.

    ``queue_s``: time spent waiting (from arrival, and again after each preemption);
    ``prefill_s``: time in prefill iterations it was part of (its first and any recompute);
    ``decode_s``: time in decode iterations it was part of; ``stall_s``: time it held a slot
    while other requests' prefill ran or while paused. They add up:
    ``e2e_s = queue_s + prefill_s + decode_s + stall_s``."""

    rid: str
    arrival_s: float
    first_scheduled_s: float
    first_token_s: float
    finished_s: float
    tokens: int
    output_chunks: int
    prompt_tokens: int
    preemptions: int
    queue_s: float
    prefill_s: float
    decode_s: float
    stall_s: float

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float:
        return self.finished_s - self.arrival_s
