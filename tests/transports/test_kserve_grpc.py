"""KServe v2 / the Open Inference Protocol over gRPC, driven by ``tritonclient.grpc``.

Each test starts the gRPC server on loopback in its own event loop and stops it; the tests
that drive a server run once on asyncio's loop and once on uvloop (``event_loop_kind``,
tests/conftest.py). tritonclient's client is synchronous (its stream runs a thread of its own),
so its calls run in a worker thread while the server runs in the loop. Requests tritonclient
cannot send (typed ``contents``, malformed messages) go through a plain ``grpc.aio`` channel
with our messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import grpc.aio
import numpy as np
import pytest
import tritonclient.grpc as tg
from google.protobuf import descriptor
from tritonclient.grpc import service_pb2 as triton_pb
from tritonclient.utils import InferenceServerException

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire._runtime import loops
from inferwire.schemas.kserve import inference_pb2 as kpb
from inferwire.transports import kserve_grpc
from inferwire.workloads import token_stream_source
from tests.helpers.faults import Running, expected_chunks, serving, wait_until

BOUND_S = 60.0
"""Outer bound on any one wait: one that fires is a hang, not a slow machine."""
T = TypeVar("T")


async def call(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """A blocking tritonclient call, in a worker thread, bounded."""
    async with asyncio.timeout(BOUND_S):
        return await asyncio.to_thread(function, *args, **kwargs)


@contextlib.asynccontextmanager
async def triton(
    *, decode_s: float = 0.0
) -> AsyncIterator[tuple[Running, tg.InferenceServerClient]]:
    """A server of the simulated service and a tritonclient connected to it."""
    async with serving("grpc", "protobuf", decode_s=decode_s) as running:
        client = tg.InferenceServerClient(running.address)
        try:
            yield running, client
        finally:
            await call(client.close)  # stops its stream, if any, and closes the channel


@dataclass
class Answers:
    """What a tritonclient stream delivers: (result, error) pairs, in order."""

    queue: queue.Queue[tuple[Any, Any]] = field(default_factory=queue.Queue)

    def callback(self, result: Any, error: Any) -> None:
        self.queue.put((result, error))

    async def next(self) -> tuple[Any, Any]:
        return await call(self.queue.get, timeout=BOUND_S)

    async def until_final(self) -> list[Any]:
        """The results up to the one flagged ``triton_final_response``, that one included."""
        results = []
        while True:
            result, error = await self.next()
            assert error is None, error
            results.append(result)
            if result.get_response().parameters[kserve_grpc.FINAL].bool_param:
                return results


def _input(name: str, array: np.ndarray[Any, Any], datatype: str) -> tg.InferInput:
    tensor = tg.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def _text(result: Any) -> str:
    return bytes(result.as_numpy("text_output")[0]).decode()


def _assert_chunks(results: list[Any], chunks: list[ic.TokenChunk]) -> None:
    """One response per chunk, in order, each carrying that chunk."""
    assert len(results) == len(chunks)
    for result, chunk in zip(results, chunks, strict=True):
        assert _text(result) == chunk.text
        assert result.as_numpy("token_ids").tolist() == list(chunk.token_ids)
        assert result.as_numpy("seq").tolist() == [chunk.seq]
        finish = bytes(result.as_numpy("finish_reason")[0]).decode()
        assert finish == (chunk.finish_reason or "")


# -- the schema is the protocol's -----------------------------------------------------------


def _fields(message: descriptor.Descriptor) -> dict[str, tuple[int, int, bool, str]]:
    return {
        f.name: (
            f.number,
            f.type,
            f.is_repeated,
            f.message_type.full_name if f.message_type else "",
        )
        for f in message.fields
    }


def _messages(message: descriptor.Descriptor) -> list[descriptor.Descriptor]:
    return [message, *(m for nested in message.nested_types for m in _messages(nested))]


@pytest.mark.parametrize("name", sorted(kpb.DESCRIPTOR.message_types_by_name))
def test_every_message_is_tritonclients(name: str) -> None:
    """Each of our messages (nested ones included) has exactly the fields of tritonclient's
    message of the same name: same numbers, types, labels and message types."""
    ours = _messages(kpb.DESCRIPTOR.message_types_by_name[name])
    theirs = _messages(triton_pb.DESCRIPTOR.message_types_by_name[name])
    assert {m.full_name: _fields(m) for m in ours} == {m.full_name: _fields(m) for m in theirs}


def test_every_method_is_tritonclients() -> None:
    ours = kpb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    theirs = triton_pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert ours.full_name == theirs.full_name == kserve_grpc.SERVICE
    for method in ours.methods:
        triton = theirs.methods_by_name[method.name]
        shape = (method.input_type.full_name, method.output_type.full_name)
        assert shape == (triton.input_type.full_name, triton.output_type.full_name)
        assert (method.client_streaming, method.server_streaming) == (
            triton.client_streaming,
            triton.server_streaming,
        )
    assert {m.name for m in ours.methods} == {
        "ServerLive",
        "ServerReady",
        "ModelReady",
        "ServerMetadata",
        "ModelMetadata",
        "ModelInfer",
        "ModelStreamInfer",
        "SystemSharedMemoryStatus",
        "SystemSharedMemoryRegister",
        "SystemSharedMemoryUnregister",
        "CudaSharedMemoryStatus",
        "CudaSharedMemoryRegister",
        "CudaSharedMemoryUnregister",
    }


# -- health and metadata ----------------------------------------------------------------------


def test_server_and_model_metadata(event_loop_kind: str) -> None:
    async def run() -> None:
        async with triton() as (_, client):
            assert await call(client.is_server_live)
            assert await call(client.is_server_ready)
            server = await call(client.get_server_metadata)
            assert server.name == "inferwire"
            assert server.version
            assert await call(client.is_model_ready, "echo")
            assert await call(client.is_model_ready, "echo", "1")
            assert not await call(client.is_model_ready, "echo", "2")
            assert not await call(client.is_model_ready, "not/a/name")

            echo = await call(client.get_model_metadata, "echo")
            assert (echo.name, list(echo.versions), echo.platform) == (
                "echo",
                ["1"],
                "inferwire_echo",
            )
            assert (list(echo.inputs), list(echo.outputs)) == ([], [])

            stream = await call(client.get_model_metadata, "stream-16", as_json=True)
            assert stream["platform"] == "inferwire_token_stream"
            assert "inputs" not in stream  # takes none (empty lists are left out of the JSON)
            assert [(o["name"], o["datatype"], o["shape"]) for o in stream["outputs"]] == [
                ("text_output", "BYTES", ["1"]),
                ("token_ids", "UINT32", ["-1"]),
                ("seq", "UINT64", ["1"]),
                ("finish_reason", "BYTES", ["1"]),
            ]

            with pytest.raises(InferenceServerException) as info:
                await call(client.get_model_metadata, "echo", "7")
            assert info.value.status() == "StatusCode.NOT_FOUND"

    loops.run(run(), event_loop_kind)


# -- ModelInfer ---------------------------------------------------------------------------------

ARRAYS = [
    ("FP32", np.arange(6, dtype="<f4").reshape(2, 3) / 7),
    ("FP16", np.array([[0.5, -2.0], [65504.0, 1e-3]], dtype="<f2")),
    ("FP64", np.array([np.pi, -0.0, 1e300])),
    ("INT8", np.array([-128, 0, 127], dtype="<i1")),
    ("INT64", np.array([[-(2**63)], [2**63 - 1]], dtype="<i8")),
    ("UINT16", np.array([0, 65535], dtype="<u2")),
    ("UINT64", np.array([2**64 - 1], dtype="<u8")),
    ("BOOL", np.array([[True, False, True]])),
    ("BYTES", np.array([b"ab", b"", "\u00e9\u4e2d".encode(), b"\x00\xff"], dtype=object)),
]


def test_infer_echoes_numpy_inputs_bit_for_bit(event_loop_kind: str) -> None:
    """Every input back as ``output_<i>``, sent and returned as raw contents."""

    async def run() -> None:
        async with triton() as (_, client):
            inputs = [_input(f"in{i}", a, dt) for i, (dt, a) in enumerate(ARRAYS)]
            result = await call(client.infer, "echo", inputs, request_id="req-7")
            response = result.get_response()
            assert (response.model_name, response.model_version, response.id) == (
                "echo",
                "1",
                "req-7",
            )
            assert len(response.raw_output_contents) == len(ARRAYS)
            for i, (datatype, array) in enumerate(ARRAYS):
                got = result.as_numpy(f"output_{i}")
                assert response.outputs[i].datatype == datatype
                assert got.shape == array.shape
                if datatype == "BYTES":
                    assert got.tolist() == array.tolist()
                else:
                    assert got.dtype == array.dtype
                    assert got.tobytes() == array.tobytes()

    loops.run(run(), event_loop_kind)


def test_infer_returns_only_the_outputs_asked_for(event_loop_kind: str) -> None:
    async def run() -> None:
        async with triton() as (_, client):
            inputs = [_input(f"in{i}", a, dt) for i, (dt, a) in enumerate(ARRAYS[:3])]
            outputs = [tg.InferRequestedOutput("output_2"), tg.InferRequestedOutput("output_0")]
            result = await call(client.infer, "echo", inputs, outputs=outputs)
            names = [o.name for o in result.get_response().outputs]
            assert names == ["output_2", "output_0"]
            assert result.as_numpy("output_0").tobytes() == ARRAYS[0][1].tobytes()

    loops.run(run(), event_loop_kind)


CONTENTS = [
    ("INT8", "int_contents", [-128, 5, 127], "<i1"),
    ("UINT32", "uint_contents", [0, 2**32 - 1], "<u4"),
    ("INT64", "int64_contents", [-(2**63), 2**63 - 1], "<i8"),
    ("FP32", "fp32_contents", [0.5, -1.25], "<f4"),
    ("FP64", "fp64_contents", [0.1, -0.0], "<f8"),
    ("BOOL", "bool_contents", [True, False], "?"),
]


@pytest.mark.parametrize(("datatype", "member", "values", "dtype"), CONTENTS)
def test_infer_reads_typed_contents(
    datatype: str, member: str, values: list[Any], dtype: str
) -> None:
    """Inputs in ``contents`` (no raw contents) are read; the echo comes back raw."""

    async def run() -> None:
        request = kpb.ModelInferRequest(model_name="echo", id="typed")
        tensor = request.inputs.add(name="x", datatype=datatype, shape=[len(values)])
        getattr(tensor.contents, member).extend(values)
        tensor = request.inputs.add(name="s", datatype="BYTES", shape=[1, 2])
        tensor.contents.bytes_contents.extend([b"one", b""])
        async with serving("grpc", "protobuf") as running, _Channel(running.address) as channel:
            response = await channel.infer(request)
        assert [o.name for o in response.outputs] == ["output_0", "output_1"]
        assert response.raw_output_contents[0] == np.array(values, dtype=dtype).tobytes()
        assert response.raw_output_contents[1] == b"\x03\x00\x00\x00one\x00\x00\x00\x00"
        assert list(response.outputs[1].shape) == [1, 2]

    asyncio.run(run())


# -- ModelStreamInfer: a decoupled model's token stream -------------------------------------


def test_stream_infer_delivers_the_token_stream_whole_and_in_order(event_loop_kind: str) -> None:
    """One response per chunk, in order, then Triton's empty final response; a second
    request on the same stream, cut by ``max_tokens``, likewise."""

    async def run() -> None:
        async with triton() as (running, client):
            answers = Answers()
            await call(client.start_stream, callback=answers.callback)
            await call(
                client.async_stream_infer,
                "stream-256",
                [],
                request_id="first",
                enable_empty_final_response=True,
            )
            results = await answers.until_final()
            final = results.pop()
            assert final.get_response().id == "first"
            assert list(final.get_response().outputs) == []
            _assert_chunks(results, expected_chunks("stream-256"))
            for result in results:
                assert result.get_response().id == "first"
                assert not result.get_response().parameters[kserve_grpc.FINAL].bool_param

            await call(
                client.async_stream_infer,
                "stream-256",
                [],
                request_id="second",
                enable_empty_final_response=True,
                parameters={"max_tokens": 10, "seed": 3},
            )
            results = (await answers.until_final())[:-1]
            cut = running.service.chunks(
                it.GenerateRequest(workload="stream-256", max_tokens=10, seed=3)
            )
            _assert_chunks(results, list(cut))
            assert bytes(results[-1].as_numpy("finish_reason")[0]) == b"length"
            await call(client.stop_stream)
            assert await wait_until(lambda: running.service.active_streams == 0)

    loops.run(run(), event_loop_kind)


def test_stream_infer_without_the_final_flag_sends_the_chunks_only(event_loop_kind: str) -> None:
    """As Triton: no ``triton_final_response`` unless asked; the last chunk ends the stream."""

    async def run() -> None:
        async with triton() as (_, client):
            answers = Answers()
            await call(client.start_stream, callback=answers.callback)
            await call(client.async_stream_infer, "stream-16", [])
            chunks = expected_chunks("stream-16")
            results = []
            for _ in chunks:
                result, error = await answers.next()
                assert error is None, error
                assert kserve_grpc.FINAL not in result.get_response().parameters
                results.append(result)
            _assert_chunks(results, chunks)
            await call(client.stop_stream)
            assert answers.queue.empty()

    loops.run(run(), event_loop_kind)


def test_stream_infer_answers_the_echo_model_once(event_loop_kind: str) -> None:
    async def run() -> None:
        async with triton() as (_, client):
            answers = Answers()
            await call(client.start_stream, callback=answers.callback)
            array = np.arange(4, dtype="<i4")
            inputs = [_input("x", array, "INT32")]
            await call(client.async_stream_infer, "echo", inputs, enable_empty_final_response=True)
            (result,) = await answers.until_final()
            assert result.as_numpy("output_0").tobytes() == array.tobytes()

    loops.run(run(), event_loop_kind)


def test_bad_requests_raise_and_the_server_still_serves(event_loop_kind: str) -> None:
    """A refused ``ModelInfer`` is an InferenceServerException with the call's status; a
    refused stream request is an error for that request, and the stream goes on."""

    async def run() -> None:
        async with triton() as (_, client):
            with pytest.raises(InferenceServerException) as info:
                await call(client.infer, "stream-16", [])
            assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
            assert "ModelStreamInfer" in info.value.message()
            with pytest.raises(InferenceServerException) as info:
                await call(client.infer, "echo", [], model_version="9")
            assert info.value.status() == "StatusCode.NOT_FOUND"

            answers = Answers()
            await call(client.start_stream, callback=answers.callback)
            await call(client.async_stream_infer, "stream-16", [], parameters={"seed": "x"})
            result, error = await answers.next()
            assert isinstance(error, InferenceServerException)
            assert "'seed' must be an integer" in error.message()
            await call(client.async_stream_infer, "stream-16", [], enable_empty_final_response=True)
            results = (await answers.until_final())[:-1]
            _assert_chunks(results, expected_chunks("stream-16"))

            array = np.arange(3, dtype="<f8")
            result = await call(client.infer, "echo", [_input("x", array, "FP64")])
            assert result.as_numpy("output_0").tobytes() == array.tobytes()

    loops.run(run(), event_loop_kind)


# -- hostile requests, from a plain channel -------------------------------------------------


class _Channel:
    """Our messages on a plain ``grpc.aio`` channel: what tritonclient would not send."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.aio.insecure_channel(address)
        path = f"/{kserve_grpc.SERVICE}"
        self.infer = self.channel.unary_unary(
            f"{path}/ModelInfer",
            request_serializer=kpb.ModelInferRequest.SerializeToString,
            response_deserializer=kpb.ModelInferResponse.FromString,
        )
        self.infer_bytes = self.channel.unary_unary(f"{path}/ModelInfer")
        self.stream = self.channel.stream_stream(
            f"{path}/ModelStreamInfer",
            response_deserializer=kpb.ModelStreamInferResponse.FromString,
        )

    async def __aenter__(self) -> _Channel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.channel.close()


def _request(**fields: Any) -> kpb.ModelInferRequest:
    request = kpb.ModelInferRequest(model_name=fields.pop("model_name", "echo"), id="bad")
    for tensor in fields.pop("inputs", []):
        contents = tensor.pop("contents", None)
        added = request.inputs.add(**tensor)
        if contents is not None:
            for member, values in contents.items():
                getattr(added.contents, member).extend(values)
    request.raw_input_contents.extend(fields.pop("raw", []))
    for name in fields.pop("outputs", []):
        request.outputs.add(name=name)
    for key, (member, value) in fields.pop("parameters", {}).items():
        setattr(request.parameters[key], member, value)
    assert not fields, fields
    return request


FP32_2 = {"name": "x", "datatype": "FP32", "shape": [2]}


async def _assert_echoes(channel: _Channel) -> None:
    """The server still answers a good ``ModelInfer``."""
    good = _request(inputs=[FP32_2], raw=[b"\0" * 8])
    response = await asyncio.wait_for(channel.infer(good), BOUND_S)
    assert response.raw_output_contents == [b"\0" * 8]


BAD_REQUESTS = {
    "no model name": (_request(model_name=""), "model name"),
    "a model name with a slash": (_request(model_name="a/b"), "model name"),
    "the stream model": (_request(model_name="stream-16"), "decoupled"),
    "more raw entries than inputs": (_request(inputs=[FP32_2], raw=[b"\0" * 8] * 2), "one per"),
    "raw contents of the wrong length": (_request(inputs=[FP32_2], raw=[b"\0" * 7]), "bytes of"),
    "an unknown datatype": (
        _request(inputs=[{**FP32_2, "datatype": "FP8"}], raw=[b"\0\0"]),
        "unknown datatype",
    ),
    "a negative dimension": (
        _request(inputs=[{**FP32_2, "shape": [-1]}], raw=[b""]),
        "negative dimension",
    ),
    "contents beside raw contents": (
        _request(inputs=[{**FP32_2, "contents": {"fp32_contents": [1, 2]}}], raw=[b"\0" * 8]),
        "beside",
    ),
    "FP16 in typed contents": (
        _request(inputs=[{**FP32_2, "datatype": "FP16", "contents": {"fp32_contents": [1, 2]}}]),
        "only in raw",
    ),
    "values in another datatype's member": (
        _request(inputs=[{**FP32_2, "contents": {"fp64_contents": [1, 2]}}]),
        "goes in fp32_contents",
    ),
    "too few values": (
        _request(inputs=[{**FP32_2, "contents": {"fp32_contents": [1]}}]),
        "1 values",
    ),
    "an INT8 value out of range": (
        _request(
            inputs=[
                {"name": "x", "datatype": "INT8", "shape": [1], "contents": {"int_contents": [128]}}
            ]
        ),
        "out of range",
    ),
    "two inputs of one name": (_request(inputs=[FP32_2, FP32_2], raw=[b"\0" * 8] * 2), "same name"),
    "a BYTES element past the end": (
        _request(inputs=[{"name": "s", "datatype": "BYTES", "shape": [1]}], raw=[b"\x09\0\0\0ab"]),
        "overruns",
    ),
    "an output the model does not produce": (
        _request(inputs=[FP32_2], raw=[b"\0" * 8], outputs=["nope"]),
        "no output 'nope'",
    ),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_a_bad_model_infer_is_invalid_argument(case: str) -> None:
    request, words = BAD_REQUESTS[case]

    async def run() -> None:
        async with serving("grpc", "protobuf") as running, _Channel(running.address) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await asyncio.wait_for(channel.infer(request), BOUND_S)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert words in (info.value.details() or "")
            await _assert_echoes(channel)

    asyncio.run(run())


BAD_STREAM_REQUESTS = {
    "an input the stream model does not take": (
        _request(model_name="stream-16", inputs=[FP32_2], raw=[b"\0" * 8]),
        "takes the inputs text_input, stream, max_tokens, not 'x'",
    ),
    "max_tokens as a float input": (
        _request(
            model_name="stream-16",
            inputs=[{"name": "max_tokens", "datatype": "FP32", "shape": [1]}],
            raw=[b"\0" * 4],
        ),
        "input 'max_tokens' must be one element of INT32/INT64/UINT32/UINT64",
    ),
    "stream false": (
        _request(
            model_name="stream-16",
            inputs=[{"name": "stream", "datatype": "BOOL", "shape": [1]}],
            raw=[b"\0"],
        ),
        "stream must be true",
    ),
    "the seed as text": (
        _request(model_name="stream-16", parameters={"seed": ("string_param", "x")}),
        "must be an integer",
    ),
    "max_tokens of zero": (
        _request(model_name="stream-16", parameters={"max_tokens": ("int64_param", 0)}),
        "max_tokens",
    ),
    "a negative seed": (
        _request(model_name="stream-16", parameters={"seed": ("int64_param", -1)}),
        "seed",
    ),
    "the final flag as text": (
        _request(
            model_name="stream-16",
            parameters={kserve_grpc.ENABLE_FINAL: ("string_param", "yes")},
        ),
        "must be a bool",
    ),
    "an output the stream does not produce": (
        _request(model_name="stream-16", outputs=["logits"]),
        "no output 'logits'",
    ),
    "an unknown version": (
        kpb.ModelInferRequest(model_name="stream-16", model_version="2", id="bad"),
        "no version '2'",
    ),
    **{case: BAD_REQUESTS[case] for case in ("no model name", "raw contents of the wrong length")},
}


@pytest.mark.parametrize("case", list(BAD_STREAM_REQUESTS))
def test_a_bad_stream_request_is_answered_with_an_error_and_the_stream_goes_on(case: str) -> None:
    request, words = BAD_STREAM_REQUESTS[case]

    async def run() -> None:
        async with serving("grpc", "protobuf") as running, _Channel(running.address) as channel:
            call = channel.stream()
            async with asyncio.timeout(BOUND_S):
                await call.write(request.SerializeToString())
                refused = await call.read()
                assert words in refused.error_message
                assert refused.infer_response.id == "bad"
                good = kpb.ModelInferRequest(model_name="stream-16", id="good")
                await call.write(good.SerializeToString())
                for chunk in expected_chunks("stream-16"):
                    answer = await call.read()
                    assert answer.error_message == ""
                    assert answer.infer_response.id == "good"
                    text = answer.infer_response.raw_output_contents[0]
                    assert text[4:].decode() == chunk.text
                await call.done_writing()
                assert await call.read() == grpc.aio.EOF
                assert await call.code() == grpc.StatusCode.OK

    asyncio.run(run())


def test_bytes_that_are_no_request_are_invalid_argument(event_loop_kind: str) -> None:
    """Unary: the call fails; stream: the call ends. Either way the server goes on."""

    async def run() -> None:
        async with serving("grpc", "protobuf") as running, _Channel(running.address) as channel:
            async with asyncio.timeout(BOUND_S):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await channel.infer_bytes(b"\xff\xff\xff garbage")
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                call = channel.stream()
                await call.write(b"\x0a\xff\x01")  # a field longer than the message
                assert await call.code() == grpc.StatusCode.INVALID_ARGUMENT
                await _assert_echoes(channel)

    loops.run(run(), event_loop_kind)


def test_a_client_that_leaves_mid_stream_frees_the_handler(event_loop_kind: str) -> None:
    """A paced stream cancelled after two chunks: the service's stream ends, the server goes
    on serving."""

    async def run() -> None:
        async with serving("grpc", "protobuf", decode_s=0.01) as running:
            async with _Channel(running.address) as channel:
                call = channel.stream()
                async with asyncio.timeout(BOUND_S):
                    request = kpb.ModelInferRequest(model_name="stream-2048")
                    await call.write(request.SerializeToString())
                    for _ in range(2):
                        assert (await call.read()).infer_response.raw_output_contents
                    assert running.service.active_streams == 1
                    call.cancel()
            assert await wait_until(lambda: running.service.active_streams == 0)
            async with _Channel(running.address) as channel:
                await _assert_echoes(channel)

    loops.run(run(), event_loop_kind)


class _EngineAway(it.SimulatedService):
    """A service whose engine is away, as a frontend's is before its engine comes up."""

    def healthy(self) -> bool:
        return False


def test_server_ready_is_false_while_the_engine_is_away() -> None:
    away = kserve_grpc.KServeGrpc(_EngineAway(token_stream_source))
    here = kserve_grpc.KServeGrpc(it.SimulatedService(token_stream_source))
    assert away.server_live(kpb.ServerLiveRequest()).live
    assert not away.server_ready(kpb.ServerReadyRequest()).ready
    assert here.server_ready(kpb.ServerReadyRequest()).ready
