"""The API-server <-> engine-core hop as vLLM V1 builds it, model-free (issue 33): the messages,
their codecs, the two ZeroMQ sockets, and an engine process that sends N prebuilt steps of
B requests' outputs to a frontend that receives, decodes and checks each one, both timing their
own CPU. What ``bench/bench_vllm_hop.py`` measures.

Read in vLLM's source (vllm-project/vllm; our own code, written to the same shapes):

- ``vllm/v1/engine/__init__.py`` (vLLM 0.21.0, read as mirrored at
  DoraAiDreamer/vllm-0.21.0-chinese-tutorial commit c8ec54e1962abb270fe52b238c5dd6e7ea82727a,
  and at 22quinn/vllm commit 5752dd129ca4f3e28813b0025b296eb2798a172b for the older
  ``num_cached_tokens``-era shape): ``EngineCoreRequest``, ``EngineCoreOutput``,
  ``EngineCoreOutputs``, ``FinishReason`` as msgspec structs with ``array_like=True``,
  ``omit_defaults=True``, ``gc=False`` (:mod:`.messages`);
- ``vllm/v1/serial_utils.py`` (vllm-project/vllm commit
  61894fbde23f70d69271fab6e43c175ed06cac6a): ``MsgpackEncoder``/``MsgpackDecoder``, an array as
  ``(dtype, shape, data)`` with ``data`` an index into the message's further frames ("aux
  buffers", sent with ``copy=False``) or, under a 256-byte threshold, the bytes in band as
  extension type 3 (``CUSTOM_TYPE_RAW_VIEW``), decoded with ``np.frombuffer`` without a copy
  (:mod:`.codecs`);
- ``vllm/v1/engine/core.py`` and ``core_client.py`` (same versions), and ``make_zmq_socket`` of
  ``vllm/utils/network_utils.py`` (vllm-project/vllm commit
  6cf7b26bd4bff60bf378e1af14044280ac0d214c): a PULL socket binds and a PUSH connects, so the
  frontend binds and the engine core's output thread PUSHes each step with
  ``send_multipart(..., copy=False)`` to the frontend's PULL socket, ``ipc://`` under a
  temporary directory or ``tcp://``; no high-water mark there (bounded here, :mod:`.wire`).

Modules: :mod:`.messages` (the structs), :mod:`.codecs` (``msgspec-oob``, ``msgspec-inband``,
``pickle5-oob``, ``pickle-inband``; sans-IO, every decode checked), :mod:`.steps` (the steps sent
and their checks), :mod:`.token_hop` (the same step over inferwire's own hop codecs),
:mod:`.wire` (sockets, control messages, the engine's loop), :mod:`.engine_main` (the engine
process), :mod:`.frontend` (:class:`Frontend`, :class:`RunResult`).
"""

from .codecs import (
    CODECS,
    MSGSPEC_INBAND,
    MSGSPEC_OOB,
    PICKLE5_OOB,
    PICKLE_INBAND,
    StepCodec,
    frame_bytes,
    step_codec,
)
from .frontend import TRANSPORTS, Frontend, RunResult, Transport
from .messages import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    FinishReason,
    LogprobsTensors,
    SamplingParams,
)
from .steps import CASES, EMBEDDING, EMBEDDING_DIM, LOGPROBS, TOKENS, VOCAB, StepSource
from .token_hop import TOKEN_HOP_CODECS, TOKEN_HOP_PREFIX

__all__ = [
    "CASES",
    "CODECS",
    "EMBEDDING",
    "EMBEDDING_DIM",
    "LOGPROBS",
    "MSGSPEC_INBAND",
    "MSGSPEC_OOB",
    "PICKLE5_OOB",
    "PICKLE_INBAND",
    "TOKENS",
    "TOKEN_HOP_CODECS",
    "TOKEN_HOP_PREFIX",
    "TRANSPORTS",
    "VOCAB",
    "EngineCoreOutput",
    "EngineCoreOutputs",
    "EngineCoreRequest",
    "FinishReason",
    "Frontend",
    "LogprobsTensors",
    "RunResult",
    "SamplingParams",
    "StepCodec",
    "StepSource",
    "Transport",
    "frame_bytes",
    "step_codec",
]
