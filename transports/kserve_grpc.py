"""KServe v2 (the Open Inference Protocol) over gRPC: ``inference.GRPCInferenceService`` of
``schemas/kserve/inference.proto``, served on the gRPC server beside ``inferwire.v1.Inference``.

The protocol: https://kserve.github.io/website/latest/modelserving/data_plane/v2_protocol/
("GRPC"), with Triton's ``ModelStreamInfer`` (the bidirectional stream its decoupled models
answer on, https://github.com/triton-inference-server/server/blob/main/docs/user_guide/
decoupled_models.md), so ``tritonclient.grpc`` works unchanged.

**The models.** The simulated service, in version ``"1"``, under two kinds of name:

* each token-stream workload (``stream-256``, ...) is a *decoupled* model: ``ModelStreamInfer``
  answers a request with one ``ModelInferResponse`` per chunk, whose outputs are the chunk's
  ``text_output`` (BYTES ``[1]``, UTF-8), ``token_ids`` (UINT32 ``[n]``), ``seq`` (UINT64
  ``[1]``) and ``finish_reason`` (BYTES ``[1]``, empty until the last chunk). Its parameters
  ``seed``, ``max_tokens`` and ``prompt_tokens`` (integers) choose the stream as
  :class:`~inferwire.transports.GenerateRequest` does; it takes the inputs Triton's LLM models
  take, all optional: ``text_input`` (the prompt, which does not change the tokens), ``stream``
  (true) and ``max_tokens`` (as the parameter). ``ModelInfer`` refuses it, as
  Triton refuses a decoupled model there.
* any other name of 1 to 128 characters from ``[A-Za-z0-9_.-]`` is the echo model: input ``i``
  comes back as ``output_<i>`` (:meth:`SimulatedService.infer`), on ``ModelInfer`` or as the one
  response of a ``ModelStreamInfer`` request. Its metadata lists no inputs or outputs: it takes
  any tensors.

**The end of a stream**, as Triton signals it for a decoupled model: a request with the
parameter ``triton_enable_empty_final_response`` true gets ``triton_final_response`` false on
each chunk's response, then an empty response (no outputs) with ``triton_final_response`` true.
Without it nothing marks the end but the last chunk's ``finish_reason``, as in Triton.

**Tensors** come in ``raw_input_contents`` or in each input's typed ``contents``; outputs go
in ``raw_output_contents``, as Triton sends them. A requested output list selects outputs.
Triton's system shared memory extension (``SystemSharedMemory*``, :mod:`.kserve_shm`): inputs
and requested outputs whose parameters name a registered region are read from and written into
it; the ``CudaSharedMemory*`` calls answer as a Triton built without GPUs does.

**Errors.** A request the protocol or the model refuses is ``INVALID_ARGUMENT``; an unknown
model version or shared memory region ``NOT_FOUND``; a region name registered twice
``ALREADY_EXISTS``; register and unregister on a server that takes no client regions
``UNIMPLEMENTED`` (Triton's codes, :mod:`.kserve_shm`). On ``ModelStreamInfer`` a refused
request is answered with ``error_message`` and the call goes on, as Triton does; bytes that are
not a ``ModelInferRequest`` end the call with ``INVALID_ARGUMENT``. Every message is parsed
inside its handler (not in gRPC's deserializer), so malformed bytes are never gRPC's
``INTERNAL``.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import re
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Mapping,
    Sequence,
)
from typing import TYPE_CHECKING, Any, Final, TypeVar

import grpc
import grpc.aio
import numpy as np
from google.protobuf import message as protobuf_message

import inferwire.codecs as ic
from inferwire.codecs.kserve_proto import read_inputs, write_outputs
from inferwire.schemas.kserve import inference_pb2 as kpb

from . import kserve_shm, kserve_shm_wire
from .errors import BadRequestError, NotFoundError
from .service import GenerateRequest, SimulatedService, TokenStream
from .timing import now_ns

if TYPE_CHECKING:
    from .metrics import RequestMeter, ServerMetrics

DESCRIPTOR: Final = kpb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
SERVICE: Final = DESCRIPTOR.full_name
SERVER_NAME: Final = "inferwire"
MODEL_VERSION: Final = "1"
ECHO_PLATFORM: Final = "inferwire_echo"
STREAM_PLATFORM: Final = "inferwire_token_stream"
EXTENSIONS: Final = ("parameters", kserve_shm.EXTENSION)
"""The request and response ``parameters`` are read and written (Triton's final-response flag
travels in them); Triton's system shared memory extension."""
ENABLE_FINAL: Final = "triton_enable_empty_final_response"
FINAL: Final = "triton_final_response"
STREAM_OUTPUTS: Final = (
    ("text_output", "BYTES", (1,)),
    ("token_ids", "UINT32", (-1,)),
    ("seq", "UINT64", (1,)),
    ("finish_reason", "BYTES", (1,)),
)
"""The decoupled models' outputs: (name, datatype, shape), -1 for any size."""
STREAM_PARAMETERS: Final = ("seed", "max_tokens", "prompt_tokens")
LLM_INPUTS: Final = {
    "text_input": ("BYTES",),
    "stream": ("BOOL",),
    "max_tokens": ("INT32", "INT64", "UINT32", "UINT64"),
}
"""The inputs a decoupled model reads, as Triton's LLM models name them (see
:func:`_llm_inputs`)."""

_MODEL_NAME: Final = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
M = TypeVar("M", bound=protobuf_message.Message)


def _server_version() -> str:
    try:
        return importlib.metadata.version("inferwire")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return "unknown"


def _parse(message_type: type[M], data: bytes) -> M:
    try:
        return message_type.FromString(data)
    except protobuf_message.DecodeError as exc:
        raise BadRequestError(f"not a {message_type.DESCRIPTOR.name}: {exc}") from exc


def _status(exc: BadRequestError) -> grpc.StatusCode:
    code = getattr(exc, "grpc_code", None)  # the shared memory extension's (kserve_shm)
    if code is not None:
        return grpc.StatusCode[code]
    if isinstance(exc, NotFoundError):
        return grpc.StatusCode.NOT_FOUND
    return grpc.StatusCode.INVALID_ARGUMENT


def _int_parameter(parameters: Mapping[str, kpb.InferParameter], key: str) -> int | None:
    parameter = parameters.get(key)
    if parameter is None:
        return None
    kind = parameter.WhichOneof("parameter_choice")
    if kind not in ("int64_param", "uint64_param"):
        raise BadRequestError(f"parameter {key!r} must be an integer, not {kind}")
    value: int = getattr(parameter, kind)
    return value


def _flag(parameters: Mapping[str, kpb.InferParameter], key: str) -> bool:
    parameter = parameters.get(key)
    if parameter is None:
        return False
    if parameter.WhichOneof("parameter_choice") != "bool_param":
        raise BadRequestError(f"parameter {key!r} must be a bool")
    return parameter.bool_param


def _requested(request: kpb.ModelInferRequest, produced: Sequence[str]) -> list[str]:
    """The names of the outputs to send: those the request lists (each one produced), else
    every output."""
    if not request.outputs:
        return list(produced)
    wanted = [output.name for output in request.outputs]
    for name in wanted:
        if name not in produced:
            names = ", ".join(repr(n) for n in produced) or "none"
            raise BadRequestError(
                f"model {request.model_name!r} produces no output {name!r} (it produces {names})"
            )
    return wanted


def chunk_outputs(chunk: ic.TokenChunk) -> list[ic.Tensor]:
    """A token chunk as the decoupled models' outputs (:data:`STREAM_OUTPUTS`)."""
    return [
        ic.Tensor(
            name="text_output",
            datatype="BYTES",
            shape=(1,),
            data=_bytes_array(chunk.text.encode()),
        ),
        ic.Tensor(
            name="token_ids",
            datatype="UINT32",
            shape=(len(chunk.token_ids),),
            data=np.array(chunk.token_ids, dtype="<u4"),
        ),
        ic.Tensor(name="seq", datatype="UINT64", shape=(1,), data=np.array([chunk.seq], "<u8")),
        ic.Tensor(
            name="finish_reason",
            datatype="BYTES",
            shape=(1,),
            data=_bytes_array((chunk.finish_reason or "").encode()),
        ),
    ]


def _llm_inputs(request: kpb.ModelInferRequest, max_tokens: int | None) -> int | None:
    """Read the inputs Triton's LLM models take (TensorRT-LLM's ensemble, the vLLM backend):
    ``text_input`` (BYTES ``[1]``, the prompt: read, no effect on the tokens), ``stream``
    (BOOL ``[1]``, must be true: the stream is the model) and ``max_tokens`` (an integer
    ``[1]``, as the parameter of that name); returns the ``max_tokens`` in force."""
    try:
        inputs = {tensor.name: tensor for tensor in read_inputs(request)}
    except ic.DecodeError as exc:
        raise BadRequestError(str(exc)) from exc
    unknown = sorted(set(inputs) - set(LLM_INPUTS))
    if unknown:
        raise BadRequestError(
            f"model {request.model_name!r} takes the inputs {', '.join(LLM_INPUTS)}, "
            f"not {', '.join(repr(name[:64]) for name in unknown[:4])}"
        )
    for name, tensor in inputs.items():
        kinds = LLM_INPUTS[name]
        if tensor.datatype not in kinds or int(np.prod(tensor.shape)) != 1:
            raise BadRequestError(f"input {name!r} must be one element of {'/'.join(kinds)}")
    stream = inputs.get("stream")
    if stream is not None and not bool(np.asarray(stream.data).reshape(-1)[0]):
        raise BadRequestError(f"model {request.model_name!r} is decoupled: stream must be true")
    given = inputs.get("max_tokens")
    if given is None:
        return max_tokens
    value = int(np.asarray(given.data).reshape(-1)[0])
    if value < 1:
        raise BadRequestError("max_tokens must be at least 1")
    return value


def _bytes_array(element: bytes) -> np.ndarray[Any, Any]:
    out = np.empty(1, dtype=object)
    out[0] = element
    return out


# -- the service ------------------------------------------------------------------------------


class KServeGrpc:
    """``inference.GRPCInferenceService`` on ``service``: :meth:`handler` is what a
    ``grpc.aio`` server adds. With ``metrics``, each request is recorded there.
    ``allow_client_shm``: whether clients may register shared memory regions (off by
    default, ``serve --allow-client-shm``; :mod:`.kserve_shm`)."""

    def __init__(
        self,
        service: SimulatedService,
        *,
        metrics: ServerMetrics | None = None,
        allow_client_shm: bool = False,
    ) -> None:
        self.service = service
        self.version = _server_version()
        self.metrics = metrics
        self.shm = kserve_shm.SystemSharedMemory(allow=allow_client_shm)
        """The shared memory regions clients registered with this server."""

    def close(self) -> None:
        """Unregister every shared memory region (the server stops)."""
        self.shm.close()

    def handler(self) -> grpc.GenericRpcHandler:
        unary: dict[str, tuple[type[Any], Callable[[Any], protobuf_message.Message]]] = {
            "ServerLive": (kpb.ServerLiveRequest, self.server_live),
            "ServerReady": (kpb.ServerReadyRequest, self.server_ready),
            "ServerMetadata": (kpb.ServerMetadataRequest, self.server_metadata),
            "ModelReady": (kpb.ModelReadyRequest, self.model_ready),
            "ModelMetadata": (kpb.ModelMetadataRequest, self.model_metadata),
            "ModelInfer": (kpb.ModelInferRequest, self.model_infer),
            "SystemSharedMemoryStatus": (
                kpb.SystemSharedMemoryStatusRequest,
                self.system_shared_memory_status,
            ),
            "SystemSharedMemoryRegister": (
                kpb.SystemSharedMemoryRegisterRequest,
                self.system_shared_memory_register,
            ),
            "SystemSharedMemoryUnregister": (
                kpb.SystemSharedMemoryUnregisterRequest,
                self.system_shared_memory_unregister,
            ),
            "CudaSharedMemoryStatus": (
                kpb.CudaSharedMemoryStatusRequest,
                kserve_shm_wire.cuda_proto_status,
            ),
            "CudaSharedMemoryRegister": (
                kpb.CudaSharedMemoryRegisterRequest,
                kserve_shm_wire.cuda_proto_register,
            ),
            "CudaSharedMemoryUnregister": (
                kpb.CudaSharedMemoryUnregisterRequest,
                lambda _: kpb.CudaSharedMemoryUnregisterResponse(),  # there is no CUDA region
            ),
        }
        handlers = {
            name: grpc.unary_unary_rpc_method_handler(_unary(request_type, answer, self.metrics))
            for name, (request_type, answer) in unary.items()
        }
        handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(self._stream_infer)
        return grpc.method_handlers_generic_handler(SERVICE, handlers)

    # -- the protocol's calls, message in, message out; raise BadRequestError ---------------

    def server_live(self, request: kpb.ServerLiveRequest) -> kpb.ServerLiveResponse:
        return kpb.ServerLiveResponse(live=True)

    def server_ready(self, request: kpb.ServerReadyRequest) -> kpb.ServerReadyResponse:
        return kpb.ServerReadyResponse(ready=self.service.healthy())  # engine away: False

    def server_metadata(self, request: kpb.ServerMetadataRequest) -> kpb.ServerMetadataResponse:
        return kpb.ServerMetadataResponse(
            name=SERVER_NAME, version=self.version, extensions=EXTENSIONS
        )

    def model_ready(self, request: kpb.ModelReadyRequest) -> kpb.ModelReadyResponse:
        try:
            self._check_model(request.name, request.version)
        except BadRequestError:
            return kpb.ModelReadyResponse(ready=False)
        return kpb.ModelReadyResponse(ready=True)

    def model_metadata(self, request: kpb.ModelMetadataRequest) -> kpb.ModelMetadataResponse:
        self._check_model(request.name, request.version)
        response = kpb.ModelMetadataResponse(name=request.name, versions=[MODEL_VERSION])
        if self._streams(request.name):
            response.platform = STREAM_PLATFORM
            for name, datatype, shape in STREAM_OUTPUTS:
                response.outputs.add(name=name, datatype=datatype, shape=shape)
        else:
            response.platform = ECHO_PLATFORM
        return response

    def model_infer(self, request: kpb.ModelInferRequest) -> kpb.ModelInferResponse:
        self._check_model(request.model_name, request.model_version)
        if self._streams(request.model_name):
            raise BadRequestError(
                f"model {request.model_name!r} is decoupled: it streams its tokens on "
                "ModelStreamInfer"
            )
        return self._echo(request)

    def system_shared_memory_status(
        self, request: kpb.SystemSharedMemoryStatusRequest
    ) -> kpb.SystemSharedMemoryStatusResponse:
        return kserve_shm_wire.proto_status(self.shm, request)

    def system_shared_memory_register(
        self, request: kpb.SystemSharedMemoryRegisterRequest
    ) -> kpb.SystemSharedMemoryRegisterResponse:
        self.shm.register(request.name, request.key, request.offset, request.byte_size)
        return kpb.SystemSharedMemoryRegisterResponse()

    def system_shared_memory_unregister(
        self, request: kpb.SystemSharedMemoryUnregisterRequest
    ) -> kpb.SystemSharedMemoryUnregisterResponse:
        self.shm.unregister(request.name)
        return kpb.SystemSharedMemoryUnregisterResponse()

    async def stream_answers(
        self, request: kpb.ModelInferRequest, meter: RequestMeter | None = None
    ) -> AsyncGenerator[kpb.ModelStreamInferResponse, None]:
        """The answers to one request of a ``ModelStreamInfer`` call: a refused request is one
        answer with ``error_message``. ``meter`` hears of the refusal, the stream, and the time
        each chunk's response took to build."""
        opened: tuple[TokenStream, frozenset[str]] | kpb.ModelInferResponse
        try:
            self._check_model(request.model_name, request.model_version)
            final = _flag(request.parameters, ENABLE_FINAL)
            opened = (
                self._open(request) if self._streams(request.model_name) else self._echo(request)
            )
        except BadRequestError as exc:
            if meter is not None:
                meter.finish("bad_request")
            refused = self._response(request)
            yield kpb.ModelStreamInferResponse(error_message=str(exc), infer_response=refused)
            return
        if isinstance(opened, kpb.ModelInferResponse):  # the echo: its one response is the last
            if final:
                opened.parameters[FINAL].bool_param = True
            yield kpb.ModelStreamInferResponse(infer_response=opened)
            return
        stream, outputs = opened
        if meter is not None:
            meter.kind = "stream"
        chunks = self.service.generate(stream)
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                started = now_ns() if meter is not None else 0
                response = self._response(request)
                write_outputs(response, (t for t in chunk_outputs(chunk) if t.name in outputs))
                if final:
                    response.parameters[FINAL].bool_param = False
                if meter is not None:
                    meter.encoded(1, now_ns() - started)
                yield kpb.ModelStreamInferResponse(infer_response=response)
        if final:
            response = self._response(request)
            response.parameters[FINAL].bool_param = True
            yield kpb.ModelStreamInferResponse(infer_response=response)

    # -- helpers ------------------------------------------------------------------------------

    def _check_model(self, name: str, version: str) -> None:
        if not _MODEL_NAME.fullmatch(name):
            raise BadRequestError(
                f"model name {name[:140]!r} is not 1 to 128 characters of [A-Za-z0-9_.-]"
            )
        if version not in ("", MODEL_VERSION):
            raise NotFoundError(
                f"model {name!r} has no version {version[:64]!r}; it has {MODEL_VERSION!r}"
            )

    def _streams(self, name: str) -> bool:
        """Whether ``name`` is a token-stream workload's, so a decoupled model."""
        try:
            self.service.open(GenerateRequest(workload=name))
        except BadRequestError:
            return False
        return True

    def _response(self, request: kpb.ModelInferRequest) -> kpb.ModelInferResponse:
        return kpb.ModelInferResponse(
            model_name=request.model_name, model_version=MODEL_VERSION, id=request.id
        )

    def _echo(self, request: kpb.ModelInferRequest) -> kpb.ModelInferResponse:
        inputs = kserve_shm_wire.read_proto_inputs(self.shm, request)
        echoed = self.service.infer(
            ic.InferRequest(model=request.model_name, id=request.id, inputs=inputs)
        )
        produced = {tensor.name: tensor for tensor in echoed.outputs}
        response = self._response(request)
        chosen = (produced[name] for name in _requested(request, list(produced)))
        kserve_shm_wire.write_proto_outputs(self.shm, response, request, chosen)
        return response

    def _open(self, request: kpb.ModelInferRequest) -> tuple[TokenStream, frozenset[str]]:
        """The stream a decoupled model's request asks for, and the outputs to send."""
        outputs = frozenset(_requested(request, [name for name, _, _ in STREAM_OUTPUTS]))
        seed, max_tokens, prompt_tokens = (
            _int_parameter(request.parameters, key) for key in STREAM_PARAMETERS
        )
        if request.inputs or request.raw_input_contents:
            max_tokens = _llm_inputs(request, max_tokens)
        generate = GenerateRequest(
            workload=request.model_name,
            seed=seed or 0,
            max_tokens=max_tokens,
            prompt_tokens=prompt_tokens or 0,
        )
        return self.service.open(generate), outputs

    async def _stream_infer(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        # One request after another: each is answered in full before the next is read.
        async for data in requests:
            try:
                request = _parse(kpb.ModelInferRequest, data)
            except BadRequestError as exc:
                if self.metrics is not None:
                    self.metrics.answered("unary", "bad_request")
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            meter = None if self.metrics is None else self.metrics.start("unary")
            answers = self.stream_answers(request, meter)
            try:
                async with contextlib.aclosing(answers):
                    async for answer in answers:
                        message = answer.SerializeToString()
                        yield message
                        if meter is not None:
                            meter.written(len(message))
            except BaseException as exc:
                if meter is not None:
                    meter.failed(exc)
                raise
            if meter is not None:
                meter.finish("ok")  # a no-op after a refusal


def _unary(
    request_type: type[M],
    answer: Callable[[M], protobuf_message.Message],
    metrics: ServerMetrics | None = None,
) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]:
    """A unary handler, bytes in and out: a refused request ends the call with its status.
    With ``metrics``, each call is recorded there."""

    async def handle(data: bytes, context: grpc.aio.ServicerContext) -> bytes:
        meter = None if metrics is None else metrics.start("unary")
        try:
            message = answer(_parse(request_type, data)).SerializeToString()
        except BadRequestError as exc:
            if meter is not None:
                meter.finish("bad_request")
            await context.abort(_status(exc), str(exc))
            raise  # abort raises; this line is never reached
        except Exception:
            if meter is not None:
                meter.finish("error")
            raise
        if meter is not None:
            meter.written(len(message))  # what grpc sends when this returns
            meter.finish("ok")
        return message

    return handle
