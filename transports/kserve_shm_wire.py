"""Triton's shared memory extensions on the wire, for both KServe v2 servers: the HTTP routes
and the JSON of their requests, the shared memory parameters of a tensor in an infer request
(HTTP JSON and gRPC messages), and the gRPC calls; the regions and their checks are
:mod:`.kserve_shm`'s.

**CUDA shared memory** is answered as a Triton built without GPUs answers it
(``http_server.cc``, ``shared_memory_manager.cc`` of triton-inference-server/server): register
is refused (``INVALID_ARGUMENT``, "GPUs not supported"), status lists no region (one named
region is ``NOT_FOUND``), unregister has nothing to do; ``cuda_shared_memory`` is not among the
server's extensions.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import orjson

import inferwire.codecs as ic
from inferwire.codecs.kserve import RequestedOutput, load_json
from inferwire.codecs.kserve_proto import read_inputs, write_outputs
from inferwire.schemas.kserve import inference_pb2 as kpb

from .errors import BadRequestError
from .kserve_shm import (
    BYTE_SIZE,
    OFFSET,
    REGION,
    RegionNotFoundError,
    SystemSharedMemory,
    TensorSpan,
    check_name,
    tensor_span,
)

HTTP_PREFIXES: Final = ("/v2/systemsharedmemory", "/v2/cudasharedmemory")
MAX_RANK: Final = 64
"""The most dimensions a shape may have, as :mod:`inferwire.codecs.kserve` reads them."""

_SPAN_KEYS: Final = frozenset({REGION, OFFSET, BYTE_SIZE})
_HTTP_ROUTE: Final = re.compile(
    r"/v2/(system|cuda)sharedmemory(?:/region/([^/]+))?/(status|register|unregister)"
)


# -- HTTP: the routes and the JSON ---------------------------------------------------------


def span_from_json(parameters: Mapping[str, Any], where: str) -> TensorSpan | None:
    """The span a JSON tensor's ``parameters`` give, or None."""
    return tensor_span(
        parameters.get(REGION), parameters.get(OFFSET), parameters.get(BYTE_SIZE), where
    )


def http_route(path: str) -> tuple[str, str, str] | None:
    """``(kind, region, action)`` of an extension path (kind ``system`` or ``cuda``; region ""
    when the path names none), or None when it is no route of the extensions."""
    match = _HTTP_ROUTE.fullmatch(path)
    if match is None:
        return None
    kind, quoted, action = match.groups()
    if quoted is None:
        return kind, "", action
    try:
        region = urllib.parse.unquote(quoted, errors="strict")
    except UnicodeDecodeError:
        raise BadRequestError("a region name in the path must be UTF-8") from None
    check_name(region)
    return kind, region, action


def http_call(
    registry: SystemSharedMemory,
    kind: str,
    region: str,
    action: str,
    body: bytes,
    *,
    max_depth: int,
    max_elements: int,
) -> list[dict[str, Any]] | None:
    """Run one extension call; its JSON answer (status), or None (an empty 200)."""
    if kind == "cuda":
        return _cuda(region, action)
    if action == "status":
        return [status.as_json() for status in registry.status(region)]
    if action == "unregister":
        registry.unregister(region)
        return None
    if not region:
        raise BadRequestError("'region name' is necessary to register system shared memory region")
    try:
        request = load_json(body, max_depth, max_elements)
    except ic.DecodeError as exc:
        raise BadRequestError(f"register request: {exc}") from None
    if type(request) is not dict:
        raise BadRequestError("a register request is a JSON object: key, offset, byte_size")
    key = request.get("key")
    if type(key) is not str:
        raise BadRequestError("Shared memory register request has no 'key' string")
    registry.register(
        region,
        key,
        _count(request.get("offset", 0), "offset"),
        _count(request.get("byte_size"), "byte_size"),
    )
    return None


def _count(value: Any, field: str) -> int:
    if type(value) is not int or value < 0:
        raise BadRequestError(
            f"register request: {field} must be a byte count, not {value!r}"[:300]
        )
    return value


def _cuda(region: str, action: str) -> list[dict[str, Any]] | None:
    # As a Triton built without TRITON_ENABLE_GPU answers (http_server.cc,
    # shared_memory_manager.cc): there never is a CUDA region.
    if action == "register":
        raise BadRequestError(
            f"failed to register CUDA shared memory region: {region!r}, GPUs not supported"
        )
    if action == "status" and region:
        raise RegionNotFoundError(f"Unable to find cuda shared memory region: {region!r}")
    return [] if action == "status" else None


def split_json_inputs(
    obj: dict[str, Any], registry: SystemSharedMemory
) -> list[tuple[int, ic.Tensor]]:
    """Take the inputs that name a region out of a request's JSON ``obj`` (in place), read
    from their regions; returns them with their positions. The rest, data or binary data, stay
    for the request's decoder."""
    entries = obj.get("inputs")
    if type(entries) is not list:
        return []  # the decoder says what is wrong
    taken: list[tuple[int, ic.Tensor]] = []
    kept = []
    for i, entry in enumerate(entries):
        parameters = entry.get("parameters") if type(entry) is dict else None
        if type(parameters) is not dict or not _SPAN_KEYS & parameters.keys():
            kept.append(entry)
            continue
        where = f"inputs[{i}]"
        span = span_from_json(parameters, where)
        if span is None:  # _tensor_span refuses an offset or byte size without a region
            raise AssertionError(where)
        if "data" in entry or "binary_data_size" in parameters:
            raise BadRequestError(
                f"{where} must set only one of 'data', 'binary_data_size' in 'parameters' and "
                f"'{REGION}' in 'parameters'"
            )
        name, datatype, shape = _json_head(entry, where)
        taken.append((i, registry.read_tensor(name, datatype, shape, span)))
    obj["inputs"] = kept
    return taken


def _json_head(entry: dict[str, Any], where: str) -> tuple[str, str, tuple[int, ...]]:
    name, datatype, shape = entry.get("name"), entry.get("datatype"), entry.get("shape")
    if type(name) is not str or type(datatype) is not str:
        raise BadRequestError(f"{where} needs a name and a datatype, strings")
    # The shape's rules are the decoder's (codecs.kserve): at most numpy's rank, each
    # dimension a non-negative integer a signed 64-bit index holds.
    if (
        type(shape) is not list
        or len(shape) > MAX_RANK
        or not all(type(d) is int and 0 <= d < 1 << 63 for d in shape)
    ):
        raise BadRequestError(f"{where}.shape must be up to {MAX_RANK} non-negative integers")
    return name, datatype, tuple(shape)


def merge_inputs(
    decoded: Sequence[ic.Tensor], taken: Sequence[tuple[int, ic.Tensor]]
) -> tuple[ic.Tensor, ...]:
    """The inputs in the request's order: ``taken`` at their positions, ``decoded`` between."""
    rest = iter(decoded)
    places = dict(taken)
    merged = [places[i] if i in places else next(rest) for i in range(len(decoded) + len(taken))]
    names = [tensor.name for tensor in merged]
    if len(set(names)) != len(names):
        raise BadRequestError("two inputs have the same name")
    return tuple(merged)


def json_output_spans(outputs: Sequence[RequestedOutput] | None) -> dict[str, TensorSpan]:
    """The requested outputs that go to a region, by name."""
    spans = {}
    for i, wanted in enumerate(outputs or ()):
        span = span_from_json(wanted.parameters, f"outputs[{i}]")
        if span is None:
            continue
        if wanted.binary:
            raise BadRequestError(f"Output can't set both '{REGION}' and 'binary_data'")
        if "classification" in wanted.parameters:
            raise BadRequestError(f"Output can't set both '{REGION}' and 'classification'")
        spans[wanted.name] = span
    return spans


def with_region_outputs(
    text: bytes, order: Sequence[ic.Tensor], spans: Mapping[str, TensorSpan]
) -> bytes:
    """A response's JSON ``text`` (which lists the other outputs) with an entry for each
    output written to a region put back in its place: name, datatype and shape, no data."""
    obj = orjson.loads(text)
    others = iter(obj["outputs"])
    obj["outputs"] = [
        {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
        if t.name in spans
        else next(others)
        for t in order
    ]
    return orjson.dumps(obj)


# -- gRPC: the calls and the messages --------------------------------------------------------


def _proto_value(parameter: kpb.InferParameter | None) -> Any:
    if parameter is None:
        return None
    kind = parameter.WhichOneof("parameter_choice")
    return None if kind is None else getattr(parameter, kind)


def span_from_proto(parameters: Mapping[str, kpb.InferParameter], where: str) -> TensorSpan | None:
    """The span a tensor message's ``parameters`` give, or None."""
    region, offset, byte_size = (
        _proto_value(parameters.get(key)) for key in (REGION, OFFSET, BYTE_SIZE)
    )
    return tensor_span(region, offset, byte_size, where)


def read_proto_inputs(
    registry: SystemSharedMemory, request: kpb.ModelInferRequest
) -> tuple[ic.Tensor, ...]:
    """A ``ModelInferRequest``'s inputs, those that name a region read from it. As tritonclient
    sends them (and Triton reads them), ``raw_input_contents`` then holds the other inputs' data
    only, in order."""
    spans = [span_from_proto(t.parameters, f"input {t.name!r}") for t in request.inputs]
    try:
        if not any(spans):
            return read_inputs(request)
        taken: list[tuple[int, ic.Tensor]] = []
        rest = kpb.ModelInferRequest()
        for i, (tensor, span) in enumerate(zip(request.inputs, spans, strict=True)):
            if span is None:
                rest.inputs.append(tensor)
                continue
            if tensor.HasField("contents"):
                raise BadRequestError(
                    f"input {tensor.name!r}: unexpected 'contents' beside {REGION}"
                )
            shape = tuple(tensor.shape)
            taken.append((i, registry.read_tensor(tensor.name, tensor.datatype, shape, span)))
        rest.raw_input_contents.extend(request.raw_input_contents)
        return merge_inputs(read_inputs(rest), taken)
    except ic.DecodeError as exc:
        raise BadRequestError(str(exc)) from exc


def write_proto_outputs(
    registry: SystemSharedMemory,
    response: kpb.ModelInferResponse,
    request: kpb.ModelInferRequest,
    outputs: Iterable[ic.Tensor],
) -> None:
    """Append ``outputs`` to ``response``: those the request asks in a region are written there
    and carry no data (an empty raw entry keeps the others' in place, as Triton sends them)."""
    spans = {}
    for wanted in request.outputs:
        span = span_from_proto(wanted.parameters, f"output {wanted.name!r}")
        if span is not None:
            spans[wanted.name] = span
    if not spans:
        write_outputs(response, outputs)
        return
    for tensor in outputs:
        span = spans.get(tensor.name)
        if span is None:
            write_outputs(response, (tensor,))
            continue
        registry.write_tensor(tensor, span)
        response.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        response.raw_output_contents.append(b"")


def proto_status(
    registry: SystemSharedMemory, request: kpb.SystemSharedMemoryStatusRequest
) -> kpb.SystemSharedMemoryStatusResponse:
    response = kpb.SystemSharedMemoryStatusResponse()
    for status in registry.status(request.name):
        response.regions[status.name].CopyFrom(
            kpb.SystemSharedMemoryStatusResponse.RegionStatus(
                name=status.name, key=status.key, offset=status.offset, byte_size=status.byte_size
            )
        )
    return response


def cuda_proto_status(
    request: kpb.CudaSharedMemoryStatusRequest,
) -> kpb.CudaSharedMemoryStatusResponse:
    _cuda(request.name, "status")
    return kpb.CudaSharedMemoryStatusResponse()


def cuda_proto_register(
    request: kpb.CudaSharedMemoryRegisterRequest,
) -> kpb.CudaSharedMemoryRegisterResponse:
    _cuda(request.name, "register")
    return kpb.CudaSharedMemoryRegisterResponse()  # never reached: register is refused
