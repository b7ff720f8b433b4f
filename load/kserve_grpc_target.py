"""The ``kserve-v2-grpc`` target: one ``ModelStreamInfer`` call per request, on one channel.

The request is what Triton's LLM models read (TensorRT-LLM's ensemble, the vLLM backend):
inputs ``text_input`` (BYTES ``[1]``), ``stream`` (BOOL ``[1]``, true) and ``max_tokens``
(INT32 ``[1]``), the extra body fields as request parameters, and
``triton_enable_empty_final_response`` so the last response says it is the last
(``triton_final_response``). The responses' ``text_output`` (BYTES), ``token_ids`` or
``output_ids`` (integers, when the model sends them) and ``finish_reason`` make the chunks;
a response with ``error_message`` fails the request. A server that ignores the flag ends the
call with OK after the last response (the request side is closed once the request is sent):
that ends the stream too. The URL: ``grpc://host:port`` (or
``http://``), ``grpcs://`` (or ``https://``) for TLS.
"""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import grpc
import grpc.aio
import numpy as np
from google.protobuf import json_format
from google.protobuf import message as protobuf_message

from inferwire.schemas.kserve import inference_pb2 as kpb
from inferwire.transports import (
    ConnectError,
    ProtocolError,
    RemoteError,
    TransportError,
    TransportTimeoutError,
)
from inferwire.transports.timing import TRACEPARENT, StreamTiming, now_ns

from .api_streams import DONE, ApiChunk, ServerStreamError, perf_ns
from .endpoints import Endpoint, PromptLike

_SERVICE: Final = "/inference.GRPCInferenceService/"
_FINAL: Final = "triton_final_response"
_INTS: Final = {"INT32": "<i4", "UINT32": "<u4", "INT64": "<i8", "UINT64": "<u8"}
MAX_MESSAGE_BYTES: Final = 64 << 20


def _bytes_elements(raw: bytes) -> list[bytes]:
    """A BYTES tensor's raw contents: each element a 4-byte little-endian length, then it."""
    out = []
    at = 0
    while at < len(raw):
        if at + 4 > len(raw):
            raise ProtocolError("a BYTES output cut inside an element's length")
        (size,) = struct.unpack_from("<I", raw, at)
        at += 4
        if at + size > len(raw):
            raise ProtocolError("a BYTES output cut inside an element")
        out.append(raw[at : at + size])
        at += size
    return out


def _output(response: kpb.ModelInferResponse, index: int, name: str) -> Any:
    """An output as a list of values (bytes for BYTES), from raw or typed contents."""
    tensor = response.outputs[index]
    if index < len(response.raw_output_contents):
        raw = response.raw_output_contents[index]
        if tensor.datatype == "BYTES":
            return _bytes_elements(raw)
        dtype = _INTS.get(tensor.datatype)
        if dtype is None:
            return None
        if len(raw) % np.dtype(dtype).itemsize:
            raise ProtocolError(f"output {name!r}: {len(raw)} bytes is not whole elements")
        return np.frombuffer(raw, dtype).tolist()
    contents = tensor.contents
    if tensor.datatype == "BYTES":
        return list(contents.bytes_contents)
    for values in (contents.int_contents, contents.int64_contents, contents.uint_contents):
        if len(values):
            return list(values)
    return [] if tensor.datatype in _INTS else None


def chunk_of(data: bytes) -> ApiChunk:
    """One ``ModelStreamInferResponse``'s bytes as a chunk."""
    started_ns = perf_ns()
    message = kpb.ModelStreamInferResponse()
    try:
        message.ParseFromString(data)
    except protobuf_message.DecodeError as exc:
        raise ProtocolError(f"a response that is not a ModelStreamInferResponse: {exc}") from None
    if message.error_message:
        raise ServerStreamError(f"the server answered: {message.error_message[:500]}")
    response = message.infer_response
    final = _FINAL in response.parameters and response.parameters[_FINAL].bool_param
    text = ""
    ids: list[int] | None = None
    finish = ""
    for index, tensor in enumerate(response.outputs):
        values = _output(response, index, tensor.name)
        if tensor.name == "text_output" and values:
            text = b"".join(values).decode("utf-8", "replace")
        elif tensor.name in ("token_ids", "output_ids") and values is not None:
            ids = [int(v) for v in values]
        elif tensor.name == "finish_reason" and values:
            finish = values[0].decode("utf-8", "replace")
    if final and not response.outputs:
        return ApiChunk(end=True, parse_ns=perf_ns() - started_ns)
    return ApiChunk(
        text=text,
        token_ids=tuple(ids) if ids is not None else None,
        tokens=int(bool(text) or bool(ids)),
        finished=(0,) if finish else (),
        started=(0,),
        end=final,
        parse_ns=perf_ns() - started_ns,
    )


def _grpc_error(exc: grpc.aio.AioRpcError) -> TransportError:
    """A failed call as the transports' errors: no connection (UNAVAILABLE: refused, TLS
    refused) is a ConnectError, a deadline a timeout, anything else the server's answer."""
    code = exc.code()
    if code == grpc.StatusCode.UNAVAILABLE:
        return ConnectError(f"grpc: {exc.details() or code.name}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return TransportTimeoutError(f"grpc: {exc.details() or code.name}")
    return RemoteError(code.name, exc.details() or "")


def _bytes_tensor(value: bytes) -> bytes:
    return struct.pack("<I", len(value)) + value


def _parameter(value: Any) -> kpb.InferParameter:
    if isinstance(value, bool):
        return kpb.InferParameter(bool_param=value)
    if isinstance(value, int):
        return kpb.InferParameter(int64_param=value)
    if isinstance(value, float):
        return kpb.InferParameter(double_param=value)
    if isinstance(value, str):
        return kpb.InferParameter(string_param=value)
    raise ValueError(f"a KServe parameter must be a boolean, number or string, not {value!r}")


class KServeGrpcTarget:
    needs_finish = False

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        parts = urlsplit(endpoint.url)
        if parts.scheme not in ("grpc", "grpcs", "http", "https") or not parts.hostname:
            raise ValueError(f"{endpoint.url!r}: give grpc://host:port or grpcs://host:port")
        secure = parts.scheme in ("grpcs", "https")
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        target = f"{host}:{parts.port or (443 if secure else 80)}"
        options = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ]
        if secure:
            if endpoint.insecure:
                raise ValueError("grpcs: give the server's CA with --ca-cert (no --insecure)")
            roots = Path(endpoint.ca_cert).read_bytes() if endpoint.ca_cert else None
            credentials = grpc.ssl_channel_credentials(root_certificates=roots)
            self.channel = grpc.aio.secure_channel(target, credentials, options=options)
        else:
            self.channel = grpc.aio.insecure_channel(target, options=options)
        self.metadata = tuple(endpoint.headers)
        self.model = endpoint.model or ""
        self._stream = self.channel.stream_stream(
            _SERVICE + "ModelStreamInfer",
            request_serializer=kpb.ModelInferRequest.SerializeToString,
            response_deserializer=None,  # bytes: parsed in chunk_of, where its time is counted
        )
        self._counter = 0

    async def _unary(self, method: str, request: Any, answer: Any) -> dict[str, Any]:
        call = self.channel.unary_unary(
            _SERVICE + method,
            request_serializer=type(request).SerializeToString,
            response_deserializer=answer.FromString,
        )
        try:
            response = await call(request, metadata=self.metadata, timeout=self.endpoint.timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise _grpc_error(exc) from exc
        return json_format.MessageToDict(response)

    async def describe(self) -> dict[str, Any]:
        server = await self._unary(
            "ServerMetadata", kpb.ServerMetadataRequest(), kpb.ServerMetadataResponse
        )
        model = await self._unary(
            "ModelMetadata", kpb.ModelMetadataRequest(name=self.model), kpb.ModelMetadataResponse
        )
        return {"api": self.endpoint.api, "model": self.model, "server": server, "metadata": model}

    def _request(self, prompt: PromptLike) -> kpb.ModelInferRequest:
        self._counter += 1
        request = kpb.ModelInferRequest(model_name=self.model, id=f"inferwire-{self._counter}")
        inputs: list[tuple[str, str, bytes]] = [
            ("text_input", "BYTES", _bytes_tensor(prompt.text.encode())),
            ("stream", "BOOL", b"\x01"),
        ]
        max_tokens = prompt.max_tokens or self.endpoint.max_tokens
        if max_tokens is not None:
            inputs.append(("max_tokens", "INT32", struct.pack("<i", max_tokens)))
        for name, datatype, raw in inputs:
            request.inputs.add(name=name, datatype=datatype, shape=[1])
            request.raw_input_contents.append(raw)
        request.parameters["triton_enable_empty_final_response"].bool_param = True
        for name, value in self.endpoint.extra_body.items():
            request.parameters[name].CopyFrom(_parameter(value))
        return request

    async def generate(
        self, prompt: PromptLike, /, *, timing: StreamTiming | None = None
    ) -> AsyncIterator[ApiChunk]:
        request = self._request(prompt)
        metadata = self.metadata

        async def requests() -> AsyncIterator[kpb.ModelInferRequest]:
            yield request  # then the request side closes: the server ends the call after it
            if timing is not None:  # grpc has taken it to write: its write is the channel's
                timing.request_sent_ns = now_ns()

        if timing is not None:
            timing.acquired_ns = now_ns()  # one channel, multiplexed: nothing to wait for
            if timing.traceparent:
                metadata = (*metadata, (TRACEPARENT, timing.traceparent))
        call = self._stream(requests(), metadata=metadata)
        ended = False
        try:
            async for data in call:
                chunk = chunk_of(data)
                yield chunk
                if chunk.end:
                    ended = True
                    break
            if not ended:  # a server that ignores the flag: the call's OK end is the stream's
                yield DONE
        except grpc.aio.AioRpcError as exc:
            raise _grpc_error(exc) from exc
        finally:
            call.cancel()

    async def close(self) -> None:
        await self.channel.close()
