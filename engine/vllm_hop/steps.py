"""The engine steps the hop benchmark sends, and the checks the frontend makes of each: model-free
but exact, so that every step received is known to be the step sent, whole and in order.

A step of batch ``B`` carries one output per request ``req-0`` .. ``req-{B-1}``, each one new
token (a decode step: :func:`token_of`), and by case:

- ``tokens``: nothing more;
- ``logprobs``: the whole vocabulary's logprobs for the token, ``[1, VOCAB]`` float32
  (:data:`VOCAB` = 128k, a Llama 3 sized vocabulary);
- ``embedding``: a pooled embedding, ``[EMBEDDING_DIM]`` float32.

Tensors are built once per (case, B) (:class:`StepSource`), in two sets used in turn: a set's
buffers may still be in ZeroMQ's hands (sent without a copy) while the next step is made, so
the engine waits for a set's previous send to finish before it writes the set again
(``track=True``, as vLLM keeps a step's buffers until ZeroMQ is done with them). Each tensor's
values follow :func:`tensor_value`, and its first and last elements are overwritten per step
with the step's and the request's index: the frontend checks those and two inner values
(:func:`check_step`), so a stale, reordered or cross-wired tensor is caught, at a cost of a
few reads per request.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from .messages import (
    Array,
    EngineCoreOutput,
    EngineCoreOutputs,
    FinishReason,
    LogprobsTensors,
)

TOKENS: Final = "tokens"
LOGPROBS: Final = "logprobs"
EMBEDDING: Final = "embedding"
CASES: Final = (TOKENS, LOGPROBS, EMBEDDING)
VOCAB: Final = 128 * 1024
EMBEDDING_DIM: Final = 4096
TOKEN_SPACE: Final = 128_000
"""Token ids are drawn below this (a vocabulary's ordinary ids)."""
CACHED_TOKENS: Final = 16
"""Each request's first output says ``num_cached_tokens`` = 16 x (its index mod 32)."""
SETS: Final = 2


def rid(index: int) -> str:
    return f"req-{index}"


def token_of(seed: int, step: int, index: int) -> int:
    """The token request ``index`` gets in ``step`` (a fixed scramble: neighbours differ)."""
    return ((seed * 1_000_003 + step * 7919 + index) * 2_654_435_761) % TOKEN_SPACE


def cached_tokens_of(step: int, index: int) -> int:
    return CACHED_TOKENS * (index % 32) if step == 0 else 0


def tensor_value(position: int, index: int) -> float:
    """Element ``position`` of request ``index``'s tensor before the step's marks (exact in
    float32: a multiple of 1/64 under 16)."""
    return -float((position * 7 + index) % 1024) / 64.0


def tensor_width(case: str) -> int:
    """Elements of one request's tensor: 0 for ``tokens``."""
    return {TOKENS: 0, LOGPROBS: VOCAB, EMBEDDING: EMBEDDING_DIM}[case]


def step_tensor_bytes(case: str, batch: int) -> int:
    return tensor_width(case) * 4 * batch


def _tensor(case: str, index: int) -> Array:
    width = tensor_width(case)
    values = -(((np.arange(width, dtype=np.int64) * 7 + index) % 1024).astype(np.float32) / 64)
    return values.reshape(1, width) if case == LOGPROBS else values


def _flat(array: Array) -> Array:
    return array.reshape(-1)


@dataclass(frozen=True, slots=True, kw_only=True)
class StepSource:
    """An engine's prebuilt outputs of one case and batch size: :meth:`step` makes step ``n``."""

    case: str
    batch: int
    seed: int
    sets: tuple[tuple[Array, ...], ...]

    @classmethod
    def build(cls, case: str, batch: int, seed: int) -> StepSource:
        if case not in CASES:
            raise ValueError(f"unknown case {case!r}: one of {', '.join(CASES)}")
        if batch < 1:
            raise ValueError("a step needs at least one request")
        if case == TOKENS:
            sets: tuple[tuple[Array, ...], ...] = ((),) * SETS
        else:
            sets = tuple(tuple(_tensor(case, i) for i in range(batch)) for _ in range(SETS))
        return cls(case=case, batch=batch, seed=seed, sets=sets)

    def set_of(self, step: int) -> int:
        """Which tensor set step ``step`` uses (its buffers must be free to write)."""
        return step % SETS

    def step(self, step: int, *, last: bool) -> EngineCoreOutputs:
        """Step ``step``'s outputs (``last``: every request finishes, by length), its tensors
        marked. Writes the tensors of set :meth:`set_of` ``(step)``."""
        tensors = self.sets[self.set_of(step)]
        outputs = []
        for index in range(self.batch):
            output = EngineCoreOutput(
                request_id=rid(index),
                new_token_ids=[token_of(self.seed, step, index)],
                finish_reason=FinishReason.LENGTH if last else None,
                num_cached_tokens=cached_tokens_of(step, index),
            )
            if tensors:
                tensor = tensors[index]
                flat = _flat(tensor)
                flat[0] = step
                flat[-1] = index
                if self.case == LOGPROBS:
                    output.new_logprobs = LogprobsTensors(logprobs=tensor)
                else:
                    output.pooling_output = tensor
            outputs.append(output)
        return EngineCoreOutputs(
            engine_index=0,
            outputs=outputs,
            timestamp=time.monotonic(),
            finished_requests=[rid(i) for i in range(self.batch)] if last else None,
        )


def check_step(
    message: EngineCoreOutputs, case: str, batch: int, seed: int, step: int, *, last: bool
) -> str | None:
    """What is wrong with ``message`` as step ``step`` of (case, batch, seed), or None. Checks
    every output's id, token, finish and cache count, and of each tensor its dtype, shape, the
    step's marks and two inner values."""
    outputs = message.outputs
    if len(outputs) != batch:
        return f"step {step}: {len(outputs)} outputs, not {batch}"
    if message.engine_index != 0 or message.timestamp <= 0:
        return f"step {step}: engine index {message.engine_index}, timestamp {message.timestamp}"
    width = tensor_width(case)
    finish = FinishReason.LENGTH if last else None
    for index, output in enumerate(outputs):
        if output.request_id != rid(index):
            return f"step {step}: output {index} is {output.request_id!r}"
        if output.new_token_ids != [token_of(seed, step, index)]:
            return f"step {step}: {rid(index)} has tokens {output.new_token_ids}"
        if output.finish_reason != finish or output.stop_reason is not None:
            return f"step {step}: {rid(index)} finished {output.finish_reason!r}"
        if output.num_cached_tokens != cached_tokens_of(step, index):
            return f"step {step}: {rid(index)} cached {output.num_cached_tokens}"
        problem = _check_tensor(output, case, width, step, index)
        if problem:
            return f"step {step}: {rid(index)}: {problem}"
    finished = [rid(i) for i in range(batch)] if last else None
    if message.finished_requests != finished:
        return f"step {step}: finished requests {message.finished_requests!r}"
    return None


def _check_tensor(output: EngineCoreOutput, case: str, width: int, step: int, index: int) -> str:
    if case == LOGPROBS:
        if output.pooling_output is not None or output.new_logprobs is None:
            return "no logprobs"
        tensor = output.new_logprobs.logprobs
        shape: tuple[int, ...] = (1, width)
    elif case == EMBEDDING:
        if output.new_logprobs is not None or output.pooling_output is None:
            return "no embedding"
        tensor = output.pooling_output
        shape = (width,)
    else:
        if output.new_logprobs is not None or output.pooling_output is not None:
            return "a tensor in a tokens-only step"
        return ""
    if tensor.dtype != np.float32 or tensor.shape != shape:
        return f"a tensor of {tensor.dtype} {tensor.shape}"
    flat = _flat(tensor)
    middle = width // 2
    if (
        flat[0] != step
        or flat[-1] != index
        or flat[1] != tensor_value(1, index)
        or flat[middle] != tensor_value(middle, index)
    ):
        return "tensor values differ from those sent"
    return ""


def expected_tensors(case: str, batch: int, step: int) -> Sequence[Array]:
    """Every tensor of step ``step`` as sent (for a test's whole comparison)."""
    if case == TOKENS:
        return []
    tensors = []
    for index in range(batch):
        tensor = _tensor(case, index)
        flat = _flat(tensor)
        flat[0] = step
        flat[-1] = index
        tensors.append(tensor)
    return tensors
