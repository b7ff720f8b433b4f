"""KServe v2 / the Open Inference Protocol over HTTP, against real servers on loopback: the
official ``tritonclient.http`` (health, metadata, infer as JSON and with the binary tensor data
extension, errors it reports as ``InferenceServerException``), and plain HTTP/1.1 and HTTP/2
requests (httpx) for what the client does not send: nested data, no id, bad input."""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire.transports.kserve_http import HEADER_LENGTH, KServeHttp
from inferwire.workloads import token_stream_source
from tests.helpers.faults import assert_serves, serving

BOUND_S = 30.0


@contextlib.contextmanager
def server_thread(transport: str = "http1", codec: str = "orjson") -> Iterator[str]:
    """A real server on loopback, run by an event loop of its own thread, for a blocking client
    (tritonclient's is gevent's); stopped on exit. Yields its address."""
    started = threading.Event()
    state: dict[str, Any] = {}

    async def main() -> None:
        service = it.SimulatedService(token_stream_source)
        server = it.server_class(transport)(
            service, ic.get(codec, extensions=True), limits=it.Limits()
        )
        try:
            host, port = await server.start()
            state["address"] = f"{host}:{port}"
            state["loop"] = asyncio.get_running_loop()
            state["stop"] = asyncio.Event()
        finally:
            started.set()
        try:
            await state["stop"].wait()
        finally:
            await server.stop()

    thread = threading.Thread(target=asyncio.run, args=(main(),), name="kserve-server")
    thread.start()
    try:
        assert started.wait(BOUND_S)
        assert "address" in state, "the server did not start"
        yield state["address"]
    finally:
        if "loop" in state:
            state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join(BOUND_S)
        assert not thread.is_alive()


@pytest.fixture(scope="module")
def client() -> Iterator[triton.InferenceServerClient]:
    with server_thread() as address:
        client = triton.InferenceServerClient(address, network_timeout=BOUND_S)
        try:
            yield client
        finally:
            client.close()


# -- tritonclient.http ------------------------------------------------------------------------


def test_health_as_tritonclient_asks(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("echo")
    assert client.is_model_ready("echo", "1")
    assert not client.is_model_ready("echo", "2")


def test_metadata_as_tritonclient_reads_it(client: triton.InferenceServerClient) -> None:
    server = client.get_server_metadata()
    assert server["name"] == "inferwire"
    assert isinstance(server["version"], str)
    assert server["extensions"] == ["binary_tensor_data", "generate", "system_shared_memory"]
    model = client.get_model_metadata("resnet_50", "1")
    assert model == {
        "name": "resnet_50",
        "versions": ["1"],
        "platform": "inferwire_echo",
        "inputs": [],
        "outputs": [],
    }
    assert client.get_model_metadata("resnet_50") == model
    with pytest.raises(InferenceServerException, match="no version '9'") as caught:
        client.get_model_metadata("resnet_50", "9")
    assert caught.value.status() == "404"


def _inputs() -> list[np.ndarray[Any, Any]]:
    return [
        np.arange(-12, 12, dtype=np.float32).reshape(2, 3, 4) / 8,
        np.array([[1 << 40, -(1 << 40)], [0, 7]], dtype=np.int64),
        np.array([0.5, -0.0, 65504.0], dtype=np.float16),
        np.array([True, False, True]),
        np.array([[b"hello", b""], ["\u00e9t\u00e9".encode(), b"x"]], dtype=object),
        np.zeros((0, 3), dtype=np.uint8),
    ]


_TRITON_DATATYPES = {
    np.dtype(np.float32): "FP32",
    np.dtype(np.int64): "INT64",
    np.dtype(np.float16): "FP16",
    np.dtype(np.bool_): "BOOL",
    np.dtype(object): "BYTES",
    np.dtype(np.uint8): "UINT8",
}

# (how inputs travel, which outputs are asked for and how): None asks for none (tritonclient
# then sets binary_data_output), else one binary_data flag per output.
INFER_CASES = [
    pytest.param(False, [False] * 6, id="json-in-json-out"),
    pytest.param(True, [True] * 6, id="binary-in-binary-out"),
    pytest.param(False, [True] * 6, id="json-in-binary-out"),
    pytest.param(True, [False, True, True, False, False, True], id="binary-in-mixed-out"),
    pytest.param(True, None, id="binary-in-no-outputs-named"),
    pytest.param(False, None, id="json-in-no-outputs-named"),
]


@pytest.mark.parametrize(("binary_inputs", "binary_outputs"), INFER_CASES)
def test_infer_with_numpy_inputs_as_tritonclient_sends_them(
    client: triton.InferenceServerClient, binary_inputs: bool, binary_outputs: list[bool] | None
) -> None:
    arrays = _inputs()
    inputs = []
    for i, array in enumerate(arrays):
        tensor = triton.InferInput(f"in_{i}", list(array.shape), _TRITON_DATATYPES[array.dtype])
        # FP16 has no JSON form tritonclient writes: it goes binary either way
        tensor.set_data_from_numpy(array, binary_data=binary_inputs or array.dtype == np.float16)
        inputs.append(tensor)
    outputs = None
    if binary_outputs is not None:
        outputs = [
            triton.InferRequestedOutput(f"output_{i}", binary_data=binary)
            for i, binary in enumerate(binary_outputs)
        ]
    result = client.infer("echo", inputs, outputs=outputs, request_id="req-7")
    response = result.get_response()
    assert response["model_name"] == "echo"
    assert response["id"] == "req-7"
    sent_binary = [True] * len(arrays) if binary_outputs is None else binary_outputs
    for i, (array, binary) in enumerate(zip(arrays, sent_binary, strict=True)):
        output = result.get_output(f"output_{i}")
        assert ("binary_data_size" in output.get("parameters", {})) is binary
        got = result.as_numpy(f"output_{i}")
        assert got.shape == array.shape
        if array.dtype == object:
            # JSON carries BYTES as text, which tritonclient leaves as str
            assert [e if isinstance(e, bytes) else e.encode() for e in got.flat] == list(array.flat)
        else:
            assert got.dtype == array.dtype
            assert got.tobytes() == array.tobytes()


def test_infer_without_an_id_gets_none_back(client: triton.InferenceServerClient) -> None:
    tensor = triton.InferInput("x", [2], "INT32")
    tensor.set_data_from_numpy(np.array([1, 2], dtype=np.int32), binary_data=False)
    response = client.infer("echo", [tensor]).get_response()
    assert "id" not in response
    assert response["model_version"] == "1"


TRITON_ERRORS = [
    pytest.param({"model_version": "2"}, "404", "no version '2'", id="version"),
    pytest.param(
        {"outputs": [triton.InferRequestedOutput("nope")]}, "400", "no output 'nope'", id="output"
    ),
    pytest.param(
        {"request_compression_algorithm": "gzip"}, "415", "content-encoding 'gzip'", id="gzip"
    ),
    pytest.param(
        {"outputs": [triton.InferRequestedOutput("output_0", class_count=2)]},
        "400",
        "classification",
        id="classification",
    ),
]


@pytest.mark.parametrize(("options", "status", "words"), TRITON_ERRORS)
def test_an_error_is_an_inference_server_exception_with_our_message(
    client: triton.InferenceServerClient, options: dict[str, Any], status: str, words: str
) -> None:
    tensor = triton.InferInput("x", [2], "FP32")
    tensor.set_data_from_numpy(np.array([1, 2], dtype=np.float32))
    with pytest.raises(InferenceServerException) as caught:
        client.infer("echo", [tensor], **options)
    assert caught.value.status() == status
    assert words in caught.value.message()
    assert words in str(caught.value)
    assert client.is_server_live()  # and the server goes on


def test_non_finite_floats_asked_for_as_json_are_refused_and_served_as_binary(
    client: triton.InferenceServerClient,
) -> None:
    tensor = triton.InferInput("x", [2], "FP32")
    tensor.set_data_from_numpy(np.array([np.nan, -np.inf], dtype=np.float32))
    as_json = [triton.InferRequestedOutput("output_0", binary_data=False)]
    with pytest.raises(InferenceServerException, match="non-finite") as caught:
        client.infer("echo", [tensor], outputs=as_json)
    assert caught.value.status() == "400"
    got = client.infer("echo", [tensor]).as_numpy("output_0")
    assert got.tobytes() == np.array([np.nan, -np.inf], dtype=np.float32).tobytes()


# -- plain HTTP, over HTTP/1.1 and HTTP/2 -----------------------------------------------------

HTTP = ["http1", "http2"]


async def _request(
    transport: str,
    address: str,
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    http2 = transport == "http2"
    async with httpx.AsyncClient(http1=not http2, http2=http2, timeout=BOUND_S) as client:
        response = await client.request(
            method, f"http://{address}{path}", content=body, headers=headers or {}
        )
    assert response.http_version == ("HTTP/2" if http2 else "HTTP/1.1")
    return response


Exchange = tuple[str, str, bytes, dict[str, str]]
"""Method, path, body, headers."""


def _answers(
    transport: str, exchanges: list[Exchange], codec: str = "orjson"
) -> list[httpx.Response]:
    """Each request's answer from a fresh server, which must still serve after them all."""

    async def run() -> list[httpx.Response]:
        async with serving(transport, codec) as srv:
            answers = [await _request(transport, srv.address, *e) for e in exchanges]
            await assert_serves(transport, srv.address, codec, stream=False)
            return answers

    return asyncio.run(run())


@pytest.mark.parametrize("transport", HTTP)
def test_health_and_metadata_routes(transport: str) -> None:
    paths = [
        "/v2/health/live",
        "/v2/health/ready",
        "/v2/models/m/ready",
        "/v2/models/m/versions/1/ready",
        "/v2",
        "/v2/models/m",
        "/v2/models/m/versions/1?verbose=1",
    ]
    answers = _answers(transport, [("GET", path, b"", {}) for path in paths])
    assert [a.status_code for a in answers] == [200] * len(paths)
    assert [a.content for a in answers[:4]] == [b""] * 4  # the spec: "should be empty"
    assert answers[4].json()["extensions"] == [
        "binary_tensor_data",
        "generate",
        "system_shared_memory",
    ]
    assert answers[5].json() == answers[6].json()
    assert answers[5].json()["name"] == "m"


NESTED_REQUEST = {
    "inputs": [
        {"name": "a", "shape": [2, 2], "datatype": "UINT32", "data": [[1, 2], [3, 4]]},
        {"name": "b", "shape": [1, 2, 1], "datatype": "BYTES", "data": [[["x"], ["yz"]]]},
        {"name": "c", "shape": [3], "datatype": "BOOL", "data": [True, False, True]},
    ],
}


@pytest.mark.parametrize("content_type", [None, "application/json", "application/octet-stream"])
@pytest.mark.parametrize("transport", HTTP)
def test_a_request_as_the_spec_writes_it_nested_and_without_id(
    transport: str, content_type: str | None
) -> None:
    headers = {} if content_type is None else {"content-type": content_type}
    body = orjson.dumps(NESTED_REQUEST)
    (answer,) = _answers(transport, [("POST", "/v2/models/m/infer", body, headers)])
    assert answer.status_code == 200, answer.content
    assert answer.headers["content-type"] == "application/json"
    assert answer.json() == {
        "model_name": "m",
        "model_version": "1",
        "outputs": [
            {"name": "output_0", "shape": [2, 2], "datatype": "UINT32", "data": [1, 2, 3, 4]},
            {"name": "output_1", "shape": [1, 2, 1], "datatype": "BYTES", "data": ["x", "yz"]},
            {"name": "output_2", "shape": [3], "datatype": "BOOL", "data": [True, False, True]},
        ],
    }


def _binary_request() -> tuple[bytes, dict[str, str]]:
    header = orjson.dumps(
        {
            "id": "b1",
            "inputs": [
                {
                    "name": "a",
                    "shape": [2],
                    "datatype": "INT16",
                    "parameters": {"binary_data_size": 4},
                },
                {"name": "b", "shape": [1], "datatype": "FP64", "data": [0.25]},
            ],
            "outputs": [
                {"name": "output_1"},
                {"name": "output_0", "parameters": {"binary_data": True}},
            ],
        }
    )
    body = header + struct.pack("<2h", -3, 9)
    return body, {"content-type": "application/octet-stream", HEADER_LENGTH: str(len(header))}


def _check_binary_answer(answer: httpx.Response) -> None:
    assert answer.status_code == 200, answer.content
    assert answer.headers["content-type"] == "application/octet-stream"
    json_length = int(answer.headers[HEADER_LENGTH])
    header = orjson.loads(answer.content[:json_length])
    assert header["id"] == "b1"
    assert header["outputs"] == [  # in the order asked for
        {"name": "output_1", "shape": [1], "datatype": "FP64", "data": [0.25]},
        {
            "name": "output_0",
            "datatype": "INT16",
            "shape": [2],
            "parameters": {"binary_data_size": 4},
        },
    ]
    assert answer.content[json_length:] == struct.pack("<2h", -3, 9)


def test_the_binary_extension_over_http1() -> None:
    body, headers = _binary_request()
    (answer,) = _answers("http1", [("POST", "/v2/models/m/infer", body, headers)])
    _check_binary_answer(answer)


def test_the_binary_extension_over_http2() -> None:
    body, headers = _binary_request()
    (answer,) = _answers("http2", [("POST", "/v2/models/m/infer", body, headers)])
    _check_binary_answer(answer)


@pytest.mark.parametrize("transport", HTTP)
def test_a_codec_media_type_is_read_with_the_servers_codec_and_json_with_the_protocol(
    transport: str,
) -> None:
    """A protobuf server answers protobuf in protobuf (inferwire's own clients) and the
    protocol's JSON in JSON; a msgpack body is neither."""
    request = ic.InferRequest(
        model="m",
        id="p",
        inputs=(ic.Tensor(name="x", datatype="INT8", shape=(2,), data=np.array([1, -1], "i1")),),
    )
    codec = ic.get("protobuf", extensions=True)
    protobuf: Exchange = (
        "POST",
        "/v2/models/m/infer",
        codec.encode(request),
        {"content-type": codec.media_type},
    )
    as_json: Exchange = ("POST", "/v2/models/m/infer", orjson.dumps(NESTED_REQUEST), {})
    msgpack: Exchange = (
        "POST",
        "/v2/models/m/infer",
        b"\x80",
        {"content-type": "application/vnd.msgpack"},
    )
    first, second, third = _answers(transport, [protobuf, as_json, msgpack], codec="protobuf")
    assert first.status_code == 200
    assert first.headers["content-type"] == codec.media_type
    assert codec.decode(first.content, ic.InferResponse) == it.SimulatedService(
        token_stream_source
    ).infer(request)
    assert second.status_code == 200
    assert second.json()["outputs"][0]["data"] == [1, 2, 3, 4]
    assert third.status_code == 415
    assert "application/x-protobuf (this server's codec)" in third.json()["error"]


_JSON_HEADERS: dict[str, str] = {"content-type": "application/json"}
_INFER = "/v2/models/m/infer"

HTTP_REFUSED = [
    pytest.param("POST", _INFER, b"{oops", {}, 400, "invalid JSON", id="bad-json"),
    pytest.param(
        "POST",
        _INFER,
        b'{"inputs": [{"name": "a"}]}',
        {},
        400,
        "has no 'datatype'",
        id="no-datatype",
    ),
    pytest.param(
        "POST",
        _INFER,
        orjson.dumps(
            {"inputs": [{"name": "a", "shape": [3], "datatype": "INT32", "data": [1, 2]}]}
        ),
        _JSON_HEADERS,
        400,
        "has 2 elements; shape [3] holds 3",
        id="count-not-the-shape",
    ),
    pytest.param(
        "POST",
        _INFER,
        b'{"inputs": []}',
        {HEADER_LENGTH: "99"},
        400,
        "past the body",
        id="header-length-past-body",
    ),
    pytest.param(
        "POST",
        _INFER,
        b'{"inputs": []}',
        {HEADER_LENGTH: "-1"},
        400,
        "byte count",
        id="header-length-negative",
    ),
    pytest.param(
        "POST",
        _INFER,
        b'{"inputs": []}',
        {HEADER_LENGTH: "12abc"},
        400,
        "byte count",
        id="header-length-not-a-number",
    ),
    pytest.param(
        "POST",
        _INFER,
        b"{}",
        {"content-type": "text/plain"},
        415,
        "not 'text/plain'",
        id="text-plain",
    ),
    pytest.param(
        "POST",
        _INFER,
        b"{}",
        {"content-encoding": "br"},
        415,
        "content-encoding 'br'",
        id="encoded",
    ),
    pytest.param("GET", _INFER, b"", {}, 405, "use POST", id="infer-by-get"),
    pytest.param("POST", "/v2/health/live", b"", {}, 405, "use GET", id="live-by-post"),
    pytest.param("DELETE", "/v2/models/m", b"", {}, 405, "use GET", id="metadata-by-delete"),
    pytest.param(
        "GET", "/v2/models/m/versions/3/ready", b"", {}, 404, "no version '3'", id="unknown-version"
    ),
    pytest.param("GET", "/v2/models/m/explain", b"", {}, 404, "no route", id="unknown-route"),
    pytest.param("GET", "/v2/models/" + "m" * 129, b"", {}, 404, "no route", id="name-too-long"),
    pytest.param("GET", "/v2/", b"", {}, 404, "no route", id="v2-slash"),
]


@pytest.mark.parametrize(("method", "path", "body", "headers", "status", "words"), HTTP_REFUSED)
@pytest.mark.parametrize("transport", HTTP)
def test_bad_input_is_the_protocols_error_object_and_the_server_keeps_serving(
    transport: str,
    method: str,
    path: str,
    body: bytes,
    headers: dict[str, str],
    status: int,
    words: str,
) -> None:
    (answer,) = _answers(transport, [(method, path, body, headers)])
    assert answer.status_code == status, answer.content
    assert answer.headers["content-type"] == "application/json"
    error = answer.json()
    assert list(error) == ["error"]
    assert isinstance(error["error"], str)
    assert words in error["error"]
    if status == 405 and transport == "http1":
        assert answer.headers["allow"] in ("GET", "POST")


# -- Triton's generate extension ---------------------------------------------------------------


@pytest.mark.parametrize("transport", ["http1", "http2"])
def test_generate_stream_sends_one_event_a_chunk(transport: str) -> None:
    expected = list(
        it.SimulatedService(token_stream_source).chunks(
            it.GenerateRequest(workload="stream-16", seed=3, max_tokens=5)
        )
    )
    request = {"id": "7", "text_input": "hello", "parameters": {"max_tokens": 5, "seed": 3}}
    h2 = transport == "http2"
    with server_thread(transport) as address, httpx.Client(http1=not h2, http2=h2) as http:
        streamed = http.post(
            f"http://{address}/v2/models/stream-16/generate_stream", json=request, timeout=BOUND_S
        )
        whole = http.post(
            f"http://{address}/v2/models/stream-16/generate", json=request, timeout=BOUND_S
        )
        refused = http.post(
            f"http://{address}/v2/models/stream-16/generate",
            json={"text_input": 5},
            timeout=BOUND_S,
        )
    assert streamed.status_code == 200
    assert streamed.headers["content-type"].startswith("text/event-stream")
    events = [
        orjson.loads(line[len("data: ") :])
        for line in streamed.text.split("\n\n")
        if line.startswith("data: ")
    ]
    assert [e["text_output"] for e in events] == [c.text for c in expected]
    assert [e["token_ids"] for e in events] == [list(c.token_ids) for c in expected]
    assert events[-1]["finish_reason"] == "length"
    assert {e["id"] for e in events} == {"7"}
    assert whole.json()["text_output"] == "".join(c.text for c in expected)
    assert refused.status_code == 400
    assert "text_input" in refused.json()["error"]


class _EngineAway(it.SimulatedService):
    """A service whose engine is away, as a frontend's is before its engine comes up."""

    def healthy(self) -> bool:
        return False


def test_the_server_is_live_but_not_ready_while_its_engine_is_away() -> None:
    def status(service: it.SimulatedService, path: str) -> int:
        return KServeHttp(service, ic.get("orjson")).handle("GET", path, {}, b"").status

    away, here = _EngineAway(token_stream_source), it.SimulatedService(token_stream_source)
    assert status(away, "/v2/health/live") == 200
    assert status(away, "/v2/health/ready") == 400  # Triton's answer for "not ready"
    assert status(here, "/v2/health/ready") == 200
