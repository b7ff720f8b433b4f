"""The messages of the API-server <-> engine-core hop, shaped as vLLM V1's (our own structs with
their fields and types; see :mod:`inferwire.engine.vllm_hop` for the source read).

msgspec structs with ``array_like=True`` (a struct is a MessagePack array: no field names in
the bytes), ``omit_defaults=True`` (a field left at its default is not sent: a step's outputs
mostly carry a request id and one token) and ``gc=False`` (no cyclic-GC tracking of the many
small objects a step makes), as vLLM declares its engine-core messages.

Where ours differ from vLLM's, on purpose:

- tensors are numpy arrays, not torch tensors (the benchmark is model-free: nothing here needs
  torch, and vLLM encodes both as the same ``(dtype, shape, data)`` triple);
- ``new_logprobs`` is :class:`LogprobsTensors` (vLLM's ``LogprobsTensors`` of
  ``vllm/v1/outputs.py``: token ids, logprobs, ranks), so that a step can carry a whole
  vocabulary's logprobs as one array; ``logprob_token_ids`` may be None for the whole vocabulary
  in id order (the issue's 128k-float case), which vLLM would send as a second array;
- the sampling parameters are the few fields a frontend's decision depends on, not vLLM's
  whole ``SamplingParams``;
- ``num_cached_tokens`` is on the output, where vLLM carried it before ``PrefillStats``.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, Final

import msgspec
import numpy.typing as npt

MAX_ID_CHARS: Final = 256
MAX_NAME_CHARS: Final = 64

Array = npt.NDArray[Any]
"""A tensor field: encoded by :mod:`.codecs` as vLLM's ``(dtype, shape, data)`` triple."""


class FinishReason(enum.IntEnum):
    """Why a request finished: an int, not a string, for compact bytes (vLLM's reason)."""

    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3


class SamplingParams(
    msgspec.Struct, array_like=True, omit_defaults=True, gc=False, forbid_unknown_fields=True
):
    """The sampling parameters that shape the outputs: how many tokens, how random, and
    how many logprobs per token (``-1``: the whole vocabulary)."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    logprobs: int | None = None
    stop_token_ids: list[int] = []


class EngineCoreRequest(
    msgspec.Struct, array_like=True, omit_defaults=True, gc=False, forbid_unknown_fields=True
):
    """A request the frontend hands to the engine core (vLLM's ``EngineCoreRequest``): the
    tokenized prompt or its embeddings, the sampling parameters, when it arrived (the
    frontend's ``time.time()``), and the frontend that gets its outputs."""

    request_id: Annotated[str, msgspec.Meta(max_length=MAX_ID_CHARS)]
    prompt_token_ids: list[int] | None
    sampling_params: SamplingParams | None
    arrival_time: float
    cache_salt: str | None = None
    data_parallel_rank: int | None = None
    prompt_embeds: Array | None = None
    client_index: int = 0
    current_wave: int = 0
    priority: int = 0


class LogprobsTensors(
    msgspec.Struct, array_like=True, omit_defaults=True, gc=False, forbid_unknown_fields=True
):
    """One request's logprobs of one step: ``logprobs`` ``[tokens, k]`` float32, the ids they
    belong to (``None``: all of the vocabulary in id order, ``k`` its size) and the sampled
    tokens' ranks."""

    logprobs: Array
    logprob_token_ids: Array | None = None
    selected_token_ranks: Array | None = None


class EngineCoreOutput(
    msgspec.Struct, array_like=True, omit_defaults=True, gc=False, forbid_unknown_fields=True
):
    """One request's output of one engine step (vLLM's ``EngineCoreOutput``)."""

    request_id: Annotated[str, msgspec.Meta(max_length=MAX_ID_CHARS)]
    new_token_ids: list[int]
    new_logprobs: LogprobsTensors | None = None
    pooling_output: Array | None = None
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class EngineCoreOutputs(
    msgspec.Struct, array_like=True, omit_defaults=True, gc=False, forbid_unknown_fields=True
):
    """One engine step's outputs for one frontend (vLLM's ``EngineCoreOutputs``): which engine
    (data parallel rank), the outputs, when the step ended (the engine's ``time.monotonic()``)
    and the requests it finished."""

    engine_index: int = 0
    outputs: list[EngineCoreOutput] = []
    timestamp: float = 0.0
    finished_requests: list[str] | None = None


def arrays_of(outputs: EngineCoreOutputs) -> list[Array]:
    """Every tensor of a step, in the order the codecs meet them."""
    found: list[Array] = []
    for output in outputs.outputs:
        logprobs = output.new_logprobs
        if logprobs is not None:
            found.append(logprobs.logprobs)
            if logprobs.logprob_token_ids is not None:
                found.append(logprobs.logprob_token_ids)
            if logprobs.selected_token_ranks is not None:
                found.append(logprobs.selected_token_ranks)
        if output.pooling_output is not None:
            found.append(output.pooling_output)
    return found
