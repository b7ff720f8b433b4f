"""Every transport with every codec, end to end, against ``inferwire serve`` subprocesses,
on both event loops.

The servers are ``python -m inferwire.cli serve`` processes, started once per
(transport, codec, tls, loop) on a free port of 127.0.0.1; the tests are clients in this
process. Every case runs twice (the ``event_loop_kind`` fixture of ``tests/conftest.py``): with
servers and client on asyncio's own loop, and with both on uvloop (``serve --loop uvloop``, the
client in a uvloop loop), the whole matrix each time: it costs about as much again as one loop
(the servers of one loop start together and stop before the other's start), which the suite's
time allows. Each server's announcement and each client's running loop are checked to be the
kind the case names. What a stream should carry is what a local :class:`SimulatedService` over the
same workload source says, chunk for chunk; unary inference must echo its tensors bitwise.
Independent clients (the OpenAI SDK, httpx over h2c) check that the HTTP servers speak the
protocols and not just our own clients' dialect of them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import re
import select
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

import httpx
import numpy as np
import openai
import pytest

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire import workloads
from inferwire._runtime import loops
from inferwire.codecs.delta_codec import DELTA_V2, SUBJECT, DeltaCodec, default_registry
from inferwire.codecs.errors import SchemaRegistryUnavailableError
from inferwire.codecs.schema_registry import Schema, SchemaRegistry
from inferwire.transports.grpc_transport import GrpcClient
from inferwire.transports.http1 import Http1Client
from inferwire.transports.openai_api import chat_request_body
from inferwire.transports.registry_client import HttpSchemaResolver, http_resolver
from inferwire.transports.tcp import OK, OP_INFER, infer_wire_bytes
from inferwire.workloads import token_stream_source

T = TypeVar("T")

CODECS: Final = ic.names()
STREAM_CODECS: Final = [n for n in CODECS if ic.TokenChunk in ic.get(n, extensions=True).types]
INFER_CODECS: Final = [n for n in CODECS if ic.InferRequest in ic.get(n, extensions=True).types]
SSE_CODECS: Final = [
    n for n in CODECS if ic.get(n, extensions=True).stream_media_type == "text/event-stream"
]
# A loaded 2-core machine can take tens of seconds to start a few dozen interpreters.
STARTUP_TIMEOUT_S: Final = 120.0
STOP_TIMEOUT_S: Final = 20.0
CALL_TIMEOUT_S: Final = 120.0
# The proxy adds 20 ms each way: a round trip at least 40 ms longer, less clock granularity.
PROXY_DELAY_MS: Final = 20
MIN_ADDED_ROUND_TRIP_S: Final = 0.038

SERVICE: Final = it.SimulatedService(token_stream_source)
_LISTENING: Final = re.compile(r"listening on \[?([^\s\]]+)\]?:(\d+)(?: ca=(\S+))? loop=(\w+)")


def expected(request: it.GenerateRequest) -> list[ic.TokenChunk]:
    return list(SERVICE.chunks(request))


def run(coro: Coroutine[Any, Any, T], loop: str) -> T:
    """Run a test's client code in a fresh event loop of the kind ``loop`` names (checked),
    bounded so a hang fails the test."""

    async def bounded() -> T:
        if loops.running() != loop:
            coro.close()
            raise AssertionError(f"the client runs on {loops.running()}, not {loop}")
        return await asyncio.wait_for(coro, CALL_TIMEOUT_S)

    return loops.run(bounded(), loop)


# -- the server processes ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Listening:
    """Where a CLI process said it listens, its test CA if it made one, and its loop."""

    process: subprocess.Popen[str]
    host: str
    port: int
    ca_path: Path | None
    loop: str

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def client_tls(self) -> it.ClientTls:
        assert self.ca_path is not None, "the server was not started with --tls"
        return it.ClientTls.from_file(self.ca_path)


class CliProcesses:
    """Starts ``serve`` and ``proxy`` processes, caches the servers, and stops them all."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.processes: list[subprocess.Popen[str]] = []
        self._servers: dict[tuple[str, str, bool, str], Listening] = {}

    def spawn(self, *args: str) -> subprocess.Popen[str]:
        log = self.folder / f"{len(self.processes)}-{args[0]}.stderr"
        with log.open("w") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", "inferwire.cli", *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        self.processes.append(process)
        return process

    def listening(self, process: subprocess.Popen[str]) -> Listening:
        """Wait for the process's first line: ``listening on HOST:PORT[ ca=PATH] loop=KIND``."""
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], STARTUP_TIMEOUT_S)
        line = process.stdout.readline() if ready else ""
        match = _LISTENING.fullmatch(line.strip())
        if match is None:
            raise AssertionError(
                f"{process.args!r} did not announce its address (got {line!r}, "
                f"exit code {process.poll()}): {self.stderr(process)}"
            )
        host, port, ca, loop = match.groups()
        return Listening(process, host, int(port), Path(ca) if ca else None, loop)

    def stderr(self, process: subprocess.Popen[str]) -> str:
        index = self.processes.index(process)
        (log,) = self.folder.glob(f"{index}-*.stderr")
        return log.read_text()

    def serve_args(self, transport: str, codec: str, tls: bool, loop: str) -> list[str]:
        args = ["serve", "--transport", transport, "--codec", codec, "--host", "127.0.0.1"]
        args += ["--loop", loop]
        if tls:
            ca = self.folder / f"ca-{transport}-{codec}-{loop}.pem"
            args += ["--tls", "--ca-out", str(ca)]
        return args

    def servers(self, keys: list[tuple[str, str, bool, str]]) -> None:
        """Start the servers of ``keys`` not yet running, all at once, and wait for each."""
        todo = [key for key in dict.fromkeys(keys) if key not in self._servers]
        started = [self.spawn(*self.serve_args(*key)) for key in todo]
        for key, process in zip(todo, started, strict=True):
            listening = self.listening(process)
            assert listening.loop == key[-1], f"{process.args!r} runs on {listening.loop}"
            self._servers[key] = listening

    def server(self, transport: str, codec: str, *, tls: bool, loop: str) -> Listening:
        self.servers([(transport, codec, tls, loop)])
        return self._servers[transport, codec, tls, loop]

    def proxy(self, upstream: str, *, delay_ms: float, loop: str) -> Listening:
        args = ["proxy", "--upstream", upstream, "--delay-ms", str(delay_ms), "--loop", loop]
        listening = self.listening(self.spawn(*args, "--listen", "127.0.0.1:0"))
        assert listening.loop == loop, f"the proxy runs on {listening.loop}"
        return listening

    def stop_servers(self, loop: str) -> list[str]:
        """Stop the cached servers of ``loop`` (all signalled first); the ones that needed
        SIGKILL."""
        keys = [key for key in self._servers if key[-1] == loop]
        stopping = [self._servers.pop(key).process for key in keys]
        for process in stopping:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        return [f"{p.args!r} ignored SIGTERM" for p in stopping if not self._reap(p)]

    def stop(self, process: subprocess.Popen[str]) -> bool:
        """SIGTERM, then SIGKILL if it outlives the timeout; whether SIGTERM was enough."""
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        return self._reap(process)

    def _reap(self, process: subprocess.Popen[str]) -> bool:
        graceful = True
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            graceful = False
            process.kill()
            process.wait(STOP_TIMEOUT_S)
        if process.stdout is not None:
            process.stdout.close()
        return graceful

    def stop_all(self) -> list[str]:
        """Stop every process (all signalled first, so they shut down in parallel); the ones
        that needed SIGKILL or are still running."""
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        problems = [f"{p.args!r} ignored SIGTERM" for p in self.processes if not self._reap(p)]
        problems += [f"{p.args!r} still running" for p in self.processes if p.poll() is None]
        return problems


@pytest.fixture(scope="session")
def processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliProcesses]:
    cli = CliProcesses(tmp_path_factory.mktemp("transport-servers"))
    yield cli
    assert cli.stop_all() == []


@dataclass(frozen=True, slots=True)
class Fleet:
    """The server processes of one kind of loop, and client code run on a loop of that kind."""

    cli: CliProcesses
    loop: str

    def server(self, transport: str, codec: str, *, tls: bool = False) -> Listening:
        return self.cli.server(transport, codec, tls=tls, loop=self.loop)

    def proxy(self, upstream: str, *, delay_ms: float) -> Listening:
        return self.cli.proxy(upstream, delay_ms=delay_ms, loop=self.loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return run(coro, self.loop)


@pytest.fixture(scope="session")
def servers(processes: CliProcesses, event_loop_kind: str) -> Iterator[Fleet]:
    """Every transport x codec in plain TCP on one kind of loop, started together (startup
    runs in parallel), stopped before the other kind's start."""
    processes.servers([(t, c, False, event_loop_kind) for t in it.TRANSPORTS for c in CODECS])
    yield Fleet(processes, event_loop_kind)
    assert processes.stop_servers(event_loop_kind) == []


# -- requests ------------------------------------------------------------------------------


def infer_request() -> ic.InferRequest:
    """An embedding row and a tensor of each other kind of element, signed zero and all."""
    vectors = workloads.get("embed-1x384").messages()[0]
    assert isinstance(vectors, ic.EmbeddingBatch)
    embedding = vectors.vectors.copy()
    embedding[0, :3] = (-0.0, np.finfo(np.float32).tiny, np.finfo(np.float32).max)
    ids = np.arange(-6, 6, dtype=np.int64).reshape(3, 4) * (1 << 40)
    half = np.array([[-0.0, 1.5, 65504.0], [-2.0, 0.000061, 3.0]], dtype=np.float16)
    text = np.array([b"hello", b"", "\u00e9t\u00e9".encode()], dtype=object)
    return ic.InferRequest(
        model="echo",
        id="r1",
        inputs=(
            ic.Tensor(name="embedding", datatype="FP32", shape=embedding.shape, data=embedding),
            ic.Tensor(name="ids", datatype="INT64", shape=ids.shape, data=ids),
            ic.Tensor(name="half", datatype="FP16", shape=half.shape, data=half),
            ic.Tensor(name="text", datatype="BYTES", shape=text.shape, data=text),
        ),
    )


async def stream_once(
    transport: str, address: str, codec: str | ic.Codec, request: it.GenerateRequest, **kw: Any
) -> list[ic.TokenChunk]:
    async with it.connect(transport, address, codec=codec, **kw) as client:
        return [chunk async for chunk in client.generate(request)]


async def infer_once(
    transport: str, address: str, codec: str, request: ic.InferRequest, **kw: Any
) -> ic.InferResponse:
    async with it.connect(transport, address, codec=codec, **kw) as client:
        return await client.infer(request)


def assert_echoed(response: ic.InferResponse, request: ic.InferRequest) -> None:
    assert response == SERVICE.infer(request)
    for sent, got in zip(request.inputs, response.outputs, strict=True):
        assert got.data.dtype == sent.data.dtype
        if not sent.data.dtype.hasobject:
            assert got.data.tobytes() == sent.data.tobytes()


# -- every transport x every codec ---------------------------------------------------------


@pytest.mark.parametrize("codec", STREAM_CODECS)
@pytest.mark.parametrize("transport", it.TRANSPORTS)
def test_stream_equals_the_service(servers: Fleet, transport: str, codec: str) -> None:
    server = servers.server(transport, codec)
    request = it.GenerateRequest(workload="stream-256", seed=7)
    chunks = servers.run(stream_once(transport, server.address, codec, request))
    assert len(chunks) == 256
    assert chunks == expected(request)


# one stream with top-5 logprobs (and one with several choices) per transport and codec family
RICH_STREAMS: Final = [
    ("tcp", "protobuf", "stream-256-top5"),
    ("tcp", "delta", "stream-256-multi"),
    ("http1", "orjson", "stream-256-top5"),
    ("http1", "msgspec-msgpack", "stream-256-top5"),
    ("http2", "json", "stream-256-multi"),
    ("http2", "flatbuffers", "stream-256-top5"),
    ("grpc", "delta", "stream-256-top5"),
    ("grpc", "msgpack", "stream-256-multi"),
]


@pytest.mark.parametrize(("transport", "codec", "workload"), RICH_STREAMS)
def test_rich_stream_equals_the_service(
    servers: Fleet, transport: str, codec: str, workload: str
) -> None:
    server = servers.server(transport, codec)
    # the OpenAI API answers for the models it serves only (another is a 404: test_openai_api)
    model = workloads.MODEL if transport.startswith("http") else "served-model"
    request = it.GenerateRequest(workload=workload, seed=1, model=model)
    chunks = servers.run(stream_once(transport, server.address, codec, request))
    assert chunks == expected(request)
    assert {chunk.model for chunk in chunks} == {model}


@pytest.mark.parametrize("codec", INFER_CODECS)
@pytest.mark.parametrize("transport", it.TRANSPORTS)
def test_infer_echoes_bitwise(servers: Fleet, transport: str, codec: str) -> None:
    server = servers.server(transport, codec)
    request = infer_request()
    assert_echoed(servers.run(infer_once(transport, server.address, codec, request)), request)


@pytest.mark.parametrize("codec", ["protobuf", "orjson"])
def test_tcp_infer_wire_bytes_are_what_the_server_exchanges(servers: Fleet, codec: str) -> None:
    """``tcp.infer_wire_bytes``, the byte counts of the bench's raw echo floor, against a
    request written by hand in the wire format and the answer read to its end."""
    server = servers.server("tcp", codec)
    request = infer_request()
    body = ic.get(codec, extensions=True).encode(request)
    sent, answered = infer_wire_bytes(
        ic.get(codec, extensions=True), request, SERVICE.infer(request)
    )

    async def exchange() -> bytes:
        reader, writer = await asyncio.open_connection(server.host, server.port)
        try:
            writer.write(OP_INFER + len(body).to_bytes(4, "big") + body)
            head = await reader.readexactly(5)
            return head + await reader.readexactly(int.from_bytes(head[1:], "big"))
        finally:
            writer.close()
            await writer.wait_closed()

    answer = servers.run(exchange())
    assert answer[:1] == OK
    assert (sent, answered) == (5 + len(body), len(answer))


def test_codec_coverage() -> None:
    """What the tables above leave out, and why: delta carries streams only, tensor only
    tensors."""
    assert sorted(set(CODECS) - set(INFER_CODECS)) == ["delta"]
    assert sorted(set(CODECS) - set(STREAM_CODECS)) == ["tensor"]


@pytest.mark.parametrize("transport", it.TRANSPORTS)
def test_stream_from_a_codec_without_token_chunks_fails_promptly(
    servers: Fleet, transport: str
) -> None:
    """A server whose codec cannot encode a chunk fails the call: an error, not a short
    stream, and not a stream left open until the client's read timeout."""
    server = servers.server(transport, "tensor")
    request = it.GenerateRequest(workload="stream-16")
    limits = it.Limits(timeout_s=10.0)
    with pytest.raises(it.TransportError) as raised:
        servers.run(stream_once(transport, server.address, "tensor", request, limits=limits))
    assert not isinstance(raised.value, it.TransportTimeoutError)


# -- TLS -----------------------------------------------------------------------------------

TLS_CASES: Final = [
    ("tcp", "protobuf"),
    ("http1", "orjson"),
    ("http2", "msgpack"),
    ("grpc", "json"),
]


@pytest.fixture(scope="session")
def tls_servers(servers: Fleet) -> Fleet:
    """The TLS servers of ``servers``' loop (stopped with them)."""
    servers.cli.servers([(t, c, True, servers.loop) for t, c in TLS_CASES])
    return servers


@pytest.mark.parametrize(("transport", "codec"), TLS_CASES)
def test_tls_with_the_servers_ca(tls_servers: Fleet, transport: str, codec: str) -> None:
    server = tls_servers.server(transport, codec, tls=True)
    tls = server.client_tls()
    request = it.GenerateRequest(workload="stream-256", seed=2)
    assert tls_servers.run(
        stream_once(transport, server.address, codec, request, tls=tls)
    ) == expected(request)
    unary = infer_request()
    assert_echoed(
        tls_servers.run(infer_once(transport, server.address, codec, unary, tls=tls)), unary
    )


@pytest.mark.parametrize(("transport", "codec"), TLS_CASES)
def test_tls_refuses_a_server_outside_the_trusted_ca(
    tls_servers: Fleet, transport: str, codec: str
) -> None:
    server = tls_servers.server(transport, codec, tls=True)
    _, other_ca = it.make_test_certificates()
    with pytest.raises(it.ConnectError):
        tls_servers.run(infer_once(transport, server.address, codec, infer_request(), tls=other_ca))


@pytest.mark.parametrize(("transport", "codec"), TLS_CASES)
def test_plaintext_client_to_a_tls_server_fails(
    tls_servers: Fleet, transport: str, codec: str
) -> None:
    server = tls_servers.server(transport, codec, tls=True)
    request = it.GenerateRequest(workload="stream-16")
    with pytest.raises(it.TransportError):
        tls_servers.run(stream_once(transport, server.address, codec, request))


# -- independent HTTP clients --------------------------------------------------------------


@pytest.mark.parametrize("codec", SSE_CODECS)
def test_openai_sdk_reads_the_stream(servers: Fleet, codec: str) -> None:
    server = servers.server("http1", codec)
    want = expected(it.GenerateRequest(workload="stream-256"))
    with openai.OpenAI(
        base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=CALL_TIMEOUT_S
    ) as client:
        stream = client.chat.completions.create(
            model=workloads.MODEL,
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            extra_body={"workload": "stream-256"},
        )
        with stream:
            events = list(stream)
    assert len(events) == len(want)
    assert "".join(e.choices[0].delta.content or "" for e in events) == "".join(
        c.text for c in want
    )
    (answer_id,) = {e.id for e in events}  # the answer's own, as long as the workload's
    assert answer_id != want[0].id
    assert len(answer_id) == len(want[0].id)
    assert answer_id.startswith("chatcmpl-")
    assert {e.model for e in events} == {workloads.MODEL}
    assert events[-1].choices[0].finish_reason == want[-1].finish_reason


def _h2c_client(url: str, **kw: Any) -> httpx.AsyncClient:
    """HTTP/2 only, over cleartext: h2c with prior knowledge (RFC 9113, section 3.3)."""
    return httpx.AsyncClient(
        base_url=url, http1=False, http2=True, timeout=httpx.Timeout(CALL_TIMEOUT_S), **kw
    )


def _decode_sse(body: bytes) -> list[ic.TokenChunk]:
    decoder = ic.get("orjson", extensions=True).stream_decoder()
    chunks = list(decoder.feed(body))
    decoder.close()
    assert decoder.finished
    return chunks


def test_httpx_h2c_reads_the_sse_stream(servers: Fleet) -> None:
    server = servers.server("http2", "orjson")
    request = it.GenerateRequest(workload="stream-256", seed=4)

    async def fetch() -> httpx.Response:
        async with _h2c_client(server.url) as client:
            response = await client.post(
                "/v1/chat/completions",
                content=chat_request_body(request),
                headers={"accept": "text/event-stream", "content-type": "application/json"},
            )
            await response.aclose()
            return response

    response = servers.run(fetch())
    assert response.http_version == "HTTP/2"
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream"
    assert response.content.endswith(b"data: [DONE]\n\n")
    assert _decode_sse(response.content) == expected(request)


def test_httpx_multiplexes_streams_on_one_connection(servers: Fleet) -> None:
    server = servers.server("http2", "orjson")
    requests = [it.GenerateRequest(workload="stream-256", seed=seed) for seed in range(6)]

    async def fetch_together() -> list[tuple[httpx.Response, bytes]]:
        # one connection at most: every stream must be open on it at the same time, since
        # all their headers are awaited before any body is read
        limits = httpx.Limits(max_connections=1)
        async with _h2c_client(server.url, limits=limits) as client:
            async with contextlib.AsyncExitStack() as open_streams:
                responses = [
                    await open_streams.enter_async_context(
                        client.stream(
                            "POST",
                            "/v1/chat/completions",
                            content=chat_request_body(request),
                            headers={"content-type": "application/json"},
                        )
                    )
                    for request in requests
                ]
                bodies = await asyncio.gather(*(r.aread() for r in responses))
            return list(zip(responses, bodies, strict=True))

    answers = servers.run(fetch_together())
    assert {id(r.extensions["network_stream"]) for r, _ in answers} == {
        id(answers[0][0].extensions["network_stream"])
    }
    assert len({r.extensions["stream_id"] for r, _ in answers}) == len(requests)
    for (response, body), request in zip(answers, requests, strict=True):
        assert response.http_version == "HTTP/2"
        assert _decode_sse(body) == expected(request)


# -- the WAN-delay proxy -------------------------------------------------------------------


def test_proxy_adds_its_delay_to_each_round_trip(servers: Fleet) -> None:
    server = servers.server("tcp", "protobuf")
    proxy = servers.proxy(server.address, delay_ms=PROXY_DELAY_MS)
    request = infer_request()

    async def round_trips(address: str) -> list[float]:
        async with it.connect("tcp", address, codec="protobuf") as client:
            assert_echoed(await client.infer(request), request)  # connect outside the timing
            seconds = []
            for _ in range(5):
                start = time.perf_counter()
                response = await client.infer(request)
                seconds.append(time.perf_counter() - start)
                assert_echoed(response, request)
            return seconds

    direct = servers.run(round_trips(server.address))
    proxied = servers.run(round_trips(proxy.address))
    assert min(proxied) - min(direct) >= MIN_ADDED_ROUND_TRIP_S
    assert statistics.median(proxied) < 2.0


def test_stream_through_the_proxy_is_complete(servers: Fleet) -> None:
    server = servers.server("tcp", "msgpack")
    proxy = servers.proxy(server.address, delay_ms=PROXY_DELAY_MS)
    request = it.GenerateRequest(workload="stream-256", seed=5)
    assert servers.run(stream_once("tcp", proxy.address, "msgpack", request)) == expected(request)


# -- the schema registry over HTTP ---------------------------------------------------------


def test_delta_reader_resolves_the_writer_schema_over_http(servers: Fleet) -> None:
    server = servers.server("http1", "delta")
    resolver = http_resolver(server.url)
    # each reader's own registry is empty: it registers its reader schema as id 1, while
    # the server writes id 3, which only the remote registry can resolve
    readers = [DeltaCodec(registry=SchemaRegistry(), resolver=resolver) for _ in range(3)]
    assert {reader.schema_id for reader in readers} == {1}
    requests = [it.GenerateRequest(workload="stream-256", seed=seed) for seed in range(2)]

    async def read_all() -> list[list[ic.TokenChunk]]:
        return [
            await stream_once("http1", server.address, reader, request)
            for reader in readers
            for request in requests
        ]

    streams = servers.run(read_all())
    assert streams == [expected(request) for _ in readers for request in requests]
    assert resolver.lookups == 1


@pytest.mark.parametrize("transport", ["http1", "http2"])
def test_registry_routes(servers: Fleet, transport: str) -> None:
    server = servers.server(transport, "orjson")

    async def get_all() -> list[httpx.Response]:
        http2 = transport == "http2"
        async with httpx.AsyncClient(
            base_url=server.url, http1=not http2, http2=http2, timeout=CALL_TIMEOUT_S
        ) as client:
            paths = ["/schemas/ids/2", "/schemas/ids/999", f"/subjects/{SUBJECT}/versions"]
            return [await client.get(path) for path in paths]

    schema, missing, versions = servers.run(get_all())
    assert schema.status_code == 200
    document = schema.json()
    assert document["schemaType"] == "PROTOBUF"
    assert Schema(base64.b64decode(document["schema"])) == DELTA_V2
    assert missing.status_code == 404
    assert "999" in missing.json()["error"]["message"]
    assert versions.status_code == 200
    assert versions.json() == default_registry().versions(SUBJECT) == [1, 2, 3]


def test_http_resolver_unknown_id(servers: Fleet) -> None:
    server = servers.server("http1", "delta")
    resolver = http_resolver(server.url)
    assert resolver.resolve(2) == DELTA_V2
    for _ in range(3):
        with pytest.raises(ic.UnknownSchemaError):
            resolver.resolve(999)
    assert resolver.lookups == 2  # the unknown id is cached too


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_unreachable_registry(servers: Fleet) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(SchemaRegistryUnavailableError):
        HttpSchemaResolver(url, timeout_s=10).resolve(2)
    # met inside a stream: a protocol error caused by the registry, not a silent short stream
    server = servers.server("http1", "delta")
    reader = DeltaCodec(registry=SchemaRegistry(), resolver=http_resolver(url))
    request = it.GenerateRequest(workload="stream-16")
    with pytest.raises(it.TransportError) as raised:
        servers.run(stream_once("http1", server.address, reader, request))
    assert isinstance(raised.value.__cause__, SchemaRegistryUnavailableError)


# -- connections ---------------------------------------------------------------------------


@pytest.mark.parametrize(("new_connection_per_request", "opened"), [(False, 1), (True, 5)])
def test_http1_pool_reuses_one_connection(
    servers: Fleet, new_connection_per_request: bool, opened: int
) -> None:
    server = servers.server("http1", "orjson")
    stream_request = it.GenerateRequest(workload="stream-256", seed=6)
    unary = infer_request()

    async def five_in_turn() -> int:
        async with it.connect(
            "http1",
            server.address,
            codec="orjson",
            new_connection_per_request=new_connection_per_request,
        ) as client:
            assert isinstance(client, Http1Client)
            for turn in range(5):
                if turn % 2:
                    assert_echoed(await client.infer(unary), unary)
                else:
                    chunks = [c async for c in client.generate(stream_request)]
                    assert chunks == expected(stream_request)
            return client.connections_opened

    assert servers.run(five_in_turn()) == opened


SESSION_REQUESTS: Final = [
    it.GenerateRequest(workload="stream-256", seed=0),
    it.GenerateRequest(workload="stream-256-top5", seed=1),
    it.GenerateRequest(workload="stream-16", seed=2, model="other"),
    it.GenerateRequest(workload="stream-256", seed=3, max_tokens=100),
    it.GenerateRequest(workload="stream-256-multi", seed=4),
]


@pytest.mark.parametrize("codec", ["protobuf", "msgspec-json", "delta"])
def test_grpc_session_serves_requests_in_turn(servers: Fleet, codec: str) -> None:
    server = servers.server("grpc", codec)

    async def in_turn() -> list[list[ic.TokenChunk]]:
        async with it.connect("grpc", server.address, codec=codec) as client:
            assert isinstance(client, GrpcClient)
            async with client.session() as session:
                return [[c async for c in session.generate(r)] for r in SESSION_REQUESTS]

    assert servers.run(in_turn()) == [expected(request) for request in SESSION_REQUESTS]


# -- shutdown ------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", it.TRANSPORTS)
def test_server_exits_cleanly_on_sigterm(
    processes: CliProcesses, event_loop_kind: str, transport: str
) -> None:
    """SIGTERM with a client still connected: exit code 0, nothing on stderr."""
    args = processes.serve_args(transport, "protobuf", tls=False, loop=event_loop_kind)
    process = processes.spawn(*args)
    server = processes.listening(process)
    assert server.loop == event_loop_kind
    request = it.GenerateRequest(workload="stream-16")

    async def stop_while_connected() -> list[ic.TokenChunk]:
        async with it.connect(transport, server.address, codec="protobuf") as client:
            chunks = [c async for c in client.generate(request)]
            process.send_signal(signal.SIGTERM)
            await asyncio.to_thread(process.wait, STOP_TIMEOUT_S)
            return chunks

    assert run(stop_while_connected(), event_loop_kind) == expected(request)
    processes.stop(process)
    assert (process.returncode, processes.stderr(process)) == (0, "")


@pytest.mark.parametrize("transport", it.TRANSPORTS)
def test_server_stops_after_serve_forever_was_cancelled(
    event_loop_kind: str, transport: str
) -> None:
    """``serve_forever`` runs until cancelled; ``stop`` afterwards must still work (the
    order an application's shutdown naturally takes)."""

    async def serve_cancel_stop() -> None:
        service = it.SimulatedService(token_stream_source)
        server = it.server_class(transport)(
            service, ic.get("protobuf", extensions=True), host="127.0.0.1"
        )
        await server.start()
        serving = asyncio.ensure_future(server.serve_forever())
        await asyncio.sleep(0.2)
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        await server.stop()

    run(serve_cancel_stop(), event_loop_kind)


def test_proxy_exits_cleanly_on_sigterm(servers: Fleet) -> None:
    server = servers.server("tcp", "protobuf")
    proxy = servers.proxy(server.address, delay_ms=1)
    request = it.GenerateRequest(workload="stream-16")
    assert servers.run(stream_once("tcp", proxy.address, "protobuf", request)) == expected(request)
    assert servers.cli.stop(proxy.process)
    assert (proxy.process.returncode, servers.cli.stderr(proxy.process)) == (0, "")


def test_http2_client_waits_for_a_stream_past_the_servers_limit(event_loop_kind: str) -> None:
    """More requests at once than the server's MAX_CONCURRENT_STREAMS (256): the client waits
    for a stream to close (RFC 9113 5.1.2) instead of failing the requests over the limit."""
    from inferwire.transports.http2 import MAX_CONCURRENT_STREAMS
    from tests.helpers.faults import serving

    wanted = MAX_CONCURRENT_STREAMS + 44
    request = it.GenerateRequest(workload="stream-16", max_tokens=4)

    async def past_the_limit() -> list[int]:
        async with serving("http2", decode_s=0.01) as running:
            client = it.connect("http2", running.address, codec="orjson")
            try:

                async def one() -> int:
                    return sum([len(chunk.token_ids) async for chunk in client.generate(request)])

                await one()  # the connection is up and the server's SETTINGS are in
                return await asyncio.wait_for(asyncio.gather(*(one() for _ in range(wanted))), 60)
            finally:
                await client.close()

    assert run(past_the_limit(), event_loop_kind) == [4] * wanted
