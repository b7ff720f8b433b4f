"""Triton's system shared memory extension on both KServe servers, each a real ``inferwire
serve`` process on loopback, driven by tritonclient as Triton's users drive it: regions made with
``tritonclient.utils.shared_memory``, registered, queried and unregistered with
``tritonclient.http`` and ``tritonclient.grpc``, inputs read from them and outputs written into
them; then every refusal the extension names, each answered with the protocol's error while the
server goes on serving; and a region whose object is unlinked or truncated underneath."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import mmap
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire.transports.errors import BadRequestError
from inferwire.transports.grpc_transport import GrpcServer
from inferwire.transports.http1.server import Http1Server
from inferwire.transports.http2.server import Http2Server
from inferwire.transports.kserve_shm import (
    BYTE_SIZE,
    DISABLED,
    MAX_REGION_BYTES,
    OFFSET,
    REGION,
    SystemSharedMemory,
)
from inferwire.transports.server_process import ServerProcess
from inferwire.workloads import token_stream_source
from tests.helpers.faults import server_process

BOUND_S = 30.0
PROTOCOLS = ("http", "grpc")
TRANSPORTS = ("http1", "http2", "grpc")
TRANSPORT = {"http": "http1", "grpc": "grpc"}
MODULE = {"http": triton_http, "grpc": triton_grpc}
NOT_FOUND = {"http": "404", "grpc": "StatusCode.NOT_FOUND"}
INVALID = {"http": "400", "grpc": "StatusCode.INVALID_ARGUMENT"}
EXISTS = {"http": "400", "grpc": "StatusCode.ALREADY_EXISTS"}
PIXELS = np.random.default_rng(7).standard_normal((1, 3, 64, 64), dtype=np.float32)
TOKENS = np.arange(1, 33, dtype=np.int32).reshape(1, 32)


@contextlib.contextmanager
def started(folder: Path, *, allow: bool) -> Iterator[dict[str, ServerProcess]]:
    """One ``inferwire serve`` process per protocol, taking client regions if ``allow``
    (``--allow-client-shm``)."""
    flags = ["--no-metrics", *(["--allow-client-shm"] if allow else [])]
    with contextlib.ExitStack() as stack:
        yield {
            protocol: stack.enter_context(
                server_process(TRANSPORT[protocol], "orjson", flags, folder / protocol)
            )
            for protocol in PROTOCOLS
        }


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ServerProcess]]:
    """The module's servers, which take client regions."""
    with started(tmp_path_factory.mktemp("shm-servers"), allow=True) as servers:
        yield servers


@pytest.fixture(params=PROTOCOLS)
def protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def client(servers: dict[str, ServerProcess], protocol: str) -> Iterator[Any]:
    module = MODULE[protocol]
    if protocol == "http":
        client = module.InferenceServerClient(servers[protocol].address, network_timeout=BOUND_S)
    else:
        client = module.InferenceServerClient(servers[protocol].address)
    try:
        yield client
    finally:
        client.unregister_system_shared_memory()  # each test leaves no region behind
        client.close()


@contextlib.contextmanager
def region(byte_size: int) -> Iterator[tuple[Any, str]]:
    """A shared memory object of ``byte_size`` bytes made by tritonclient's utilities; yields
    its handle and key, destroyed (unlinked) on exit."""
    key = f"/inferwire-test-{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region(key[1:], key, byte_size, create_only=True)
    try:
        yield handle, key
    finally:
        shm.destroy_shared_memory_region(handle)


def _status(client: Any, protocol: str, name: str = "") -> dict[str, tuple[str, int, int]]:
    """The registered regions, by name: (key, offset, byte_size)."""
    if protocol == "http":
        answer = client.get_system_shared_memory_status(name)
        return {r["name"]: (r["key"], r["offset"], r["byte_size"]) for r in answer}
    regions = client.get_system_shared_memory_status(name).regions
    return {n: (r.key, r.offset, r.byte_size) for n, r in regions.items()}


def _input(protocol: str, name: str, array: np.ndarray[Any, Any], datatype: str) -> Any:
    return MODULE[protocol].InferInput(name, list(array.shape), datatype)


def _output(protocol: str, name: str) -> Any:
    module = MODULE[protocol]
    return (
        module.InferRequestedOutput(name, binary_data=True)
        if protocol == "http"
        else (module.InferRequestedOutput(name))
    )


def _mapped(server: ServerProcess) -> set[str]:
    """The shared memory objects the server process has mapped (``/proc/PID/maps``)."""
    assert server.process is not None
    lines = Path(f"/proc/{server.process.pid}/maps").read_text().splitlines()
    prefix = "/dev/shm/"
    return {line.split(prefix, 1)[1].split()[0] for line in lines if prefix in line}


def _refused(call: Any, status: str, words: str) -> None:
    with pytest.raises(InferenceServerException) as caught:
        call()
    assert caught.value.status() == status, caught.value
    assert words in caught.value.message(), caught.value


def _assert_serves(client: Any) -> None:
    assert client.is_server_live()


# -- the round trip -------------------------------------------------------------------------


def test_register_status_infer_with_regions_unregister(
    client: Any, protocol: str, servers: dict[str, ServerProcess]
) -> None:
    """Inputs read from a region registered at an offset that is no page boundary, outputs
    written into another; a mixed request beside; status and unregister, one and all."""
    pixels_bytes, tokens_bytes = PIXELS.nbytes, TOKENS.nbytes
    offset = 100  # within the object: the server maps from the page below
    out_bytes = pixels_bytes + tokens_bytes + 128
    with (
        region(offset + pixels_bytes + tokens_bytes) as (inputs, in_key),
        region(out_bytes) as (
            outputs,
            out_key,
        ),
    ):
        shm.set_shared_memory_region(inputs, [PIXELS, TOKENS], offset=offset)
        client.register_system_shared_memory("in", in_key, pixels_bytes + tokens_bytes, offset)
        client.register_system_shared_memory("out", out_key, out_bytes)
        assert _status(client, protocol) == {
            "in": (in_key, offset, pixels_bytes + tokens_bytes),
            "out": (out_key, 0, out_bytes),
        }
        assert _status(client, protocol, "out") == {"out": (out_key, 0, out_bytes)}
        assert _mapped(servers[protocol]) >= {in_key[1:], out_key[1:]}

        given = [
            _input(protocol, "pixels", PIXELS, "FP32"),
            _input(protocol, "tokens", TOKENS, "INT32"),
        ]
        given[0].set_shared_memory("in", pixels_bytes)
        given[1].set_shared_memory("in", tokens_bytes, offset=pixels_bytes)
        wanted = [_output(protocol, "output_0"), _output(protocol, "output_1")]
        # the tokens land after a 64-byte gap: an output goes where its offset says
        wanted[0].set_shared_memory("out", pixels_bytes)
        wanted[1].set_shared_memory("out", tokens_bytes + 64, offset=pixels_bytes + 64)
        result = client.infer("echo", given, outputs=wanted)

        got_pixels = shm.get_contents_as_numpy(outputs, np.float32, PIXELS.shape)
        got_tokens = shm.get_contents_as_numpy(
            outputs, np.int32, TOKENS.shape, offset=pixels_bytes + 64
        )
        assert got_pixels.tobytes() == PIXELS.tobytes()
        assert got_tokens.tobytes() == TOKENS.tobytes()
        for name, array in (("output_0", PIXELS), ("output_1", TOKENS)):
            entry = result.get_output(name)
            if protocol == "http":  # no data, no binary data: the spec's "must not define data"
                assert set(entry) == {"name", "datatype", "shape"}
                assert entry["shape"] == list(array.shape)
            else:
                assert list(entry.shape) == list(array.shape)
        if protocol == "grpc":
            assert list(result.get_response().raw_output_contents) == [b"", b""]

        # mixed: one input in the region, one sent; one output in the region, one returned
        mixed = [
            _input(protocol, "pixels", PIXELS, "FP32"),
            _input(protocol, "tokens", TOKENS, "INT32"),
        ]
        mixed[0].set_shared_memory("in", pixels_bytes)
        mixed[1].set_data_from_numpy(TOKENS * 2)
        wanted = [_output(protocol, "output_0"), _output(protocol, "output_1")]
        wanted[1].set_shared_memory("out", tokens_bytes, offset=pixels_bytes + 64)
        result = client.infer("echo", mixed, outputs=wanted)
        assert result.as_numpy("output_0").tobytes() == PIXELS.tobytes()
        got_tokens = shm.get_contents_as_numpy(
            outputs, np.int32, TOKENS.shape, offset=pixels_bytes + 64
        )
        assert got_tokens.tolist() == (TOKENS * 2).tolist()

        client.unregister_system_shared_memory("in")
        client.unregister_system_shared_memory("never-registered")  # no error, as in Triton
        assert set(_status(client, protocol)) == {"out"}
        client.unregister_system_shared_memory()
        assert _status(client, protocol) == {}
        assert not _mapped(servers[protocol]) & {in_key[1:], out_key[1:]}  # unmapped
        _refused(
            lambda: client.infer("echo", given, outputs=None),
            NOT_FOUND[protocol],
            "Unable to find system shared memory region: 'in'",
        )


# -- refusals ------------------------------------------------------------------------------


def test_every_refusal_is_the_protocols_error(client: Any, protocol: str) -> None:
    size = TOKENS.nbytes
    with region(4096) as (handle, key):
        shm.set_shared_memory_region(handle, [TOKENS])
        client.register_system_shared_memory("r", key, 4096)

        def infer(region_name: str, byte_size: int, offset: int = 0, shape: Any = None) -> Any:
            tensor = MODULE[protocol].InferInput("tokens", shape or list(TOKENS.shape), "INT32")
            tensor.set_shared_memory(region_name, byte_size, offset=offset)
            return client.infer("echo", [tensor])

        def infer_out(byte_size: int, offset: int = 0) -> Any:
            tensor = _input(protocol, "tokens", TOKENS, "INT32")
            tensor.set_data_from_numpy(TOKENS)
            wanted = _output(protocol, "output_0")
            wanted.set_shared_memory("r", byte_size, offset=offset)
            return client.infer("echo", [tensor], outputs=[wanted])

        assert infer("r", size).as_numpy("output_0").tolist() == TOKENS.tolist()
        cases = [
            ("unknown region", lambda: infer("nope", size), NOT_FOUND, "Unable to find"),
            ("span past the region", lambda: infer("r", size, 4096 - 8), INVALID, "lie outside"),
            ("offset past the region", lambda: infer("r", 4, 5000, [1]), INVALID, "lie outside"),
            ("size not the tensor's", lambda: infer("r", size + 4), INVALID, "is 128 bytes"),
            ("size not the shape's", lambda: infer("r", size, 0, [1, 31]), INVALID, "124 bytes"),
            ("output past the region", lambda: infer_out(size, 4096 - 8), INVALID, "lie outside"),
            ("output span too small", lambda: infer_out(size - 4), INVALID, "cannot hold it"),
            (
                "duplicate name",
                lambda: client.register_system_shared_memory("r", key, 16),
                EXISTS,
                "already in manager",
            ),
            (
                "range past the object",
                lambda: client.register_system_shared_memory("r2", key, 4096, 1),
                INVALID,
                "run past the end of object",
            ),
            (
                "key of no object",
                lambda: client.register_system_shared_memory("r2", "/inferwire-none", 16),
                INVALID,
                "no shared memory object has the key",
            ),
            (
                "key leaving /dev/shm",
                lambda: client.register_system_shared_memory("r2", "/../etc/passwd", 16),
                INVALID,
                "is not a shared memory object's name",
            ),
            (
                "region too big",
                lambda: client.register_system_shared_memory("r2", key, MAX_REGION_BYTES + 1),
                INVALID,
                "more than this server maps",
            ),
            (
                "empty region",
                lambda: client.register_system_shared_memory("r2", key, 0),
                INVALID,
                "at least 1",
            ),
            (
                "CUDA shared memory",
                lambda: client.register_cuda_shared_memory("c", b"\0" * 64, 0, 16),
                INVALID,
                "GPUs not supported",
            ),
        ]
        for what, call, status, words in cases:
            try:
                _refused(call, status[protocol], words)
            except AssertionError as exc:
                raise AssertionError(f"{what}: {exc}") from None
        # nothing was registered by a refused call, and the server still serves
        assert set(_status(client, protocol)) == {"r"}
        assert infer("r", size).as_numpy("output_0").tolist() == TOKENS.tolist()
        _assert_serves(client)
    cuda = client.get_cuda_shared_memory_status()  # none: as a Triton without GPUs
    assert (cuda == []) if protocol == "http" else (len(cuda.regions) == 0)
    client.unregister_cuda_shared_memory()


def test_a_region_unlinked_or_truncated_underneath(client: Any, protocol: str) -> None:
    """The client destroys (unlinks) a registered region's object: on Linux the server's mapping
    stays valid, so the region still serves, and its key names no object any more. Truncated
    under the mapping, it is refused, never read (a page past the end raises SIGBUS)."""
    size = TOKENS.nbytes
    with contextlib.ExitStack() as stack:
        with region(size * 2) as (handle, key):
            shm.set_shared_memory_region(handle, [TOKENS])
            client.register_system_shared_memory("u", key, size * 2)
            fd = os.open(f"/dev/shm/{key[1:]}", os.O_RDWR)  # to look, once it is unlinked
            stack.callback(os.close, fd)
            mapped = stack.enter_context(mmap.mmap(fd, size * 2))
        assert not Path(f"/dev/shm/{key[1:]}").exists()
        tensor = _input(protocol, "tokens", TOKENS, "INT32")
        tensor.set_shared_memory("u", size)
        wanted = _output(protocol, "output_0")
        wanted.set_shared_memory("u", size, offset=size)
        client.infer("echo", [tensor], outputs=[wanted])
        assert mapped[size : size * 2] == TOKENS.tobytes()
        assert set(_status(client, protocol)) == {"u"}
        _refused(
            lambda: client.register_system_shared_memory("u2", key, size),
            INVALID[protocol],
            "no shared memory object has the key",
        )
        os.ftruncate(fd, size // 2)  # from here, touching mapped[size // 2 :] is SIGBUS
        _refused(
            lambda: client.infer("echo", [tensor]),
            INVALID[protocol],
            "was truncated to 64 bytes",
        )
        _assert_serves(client)
        client.unregister_system_shared_memory("u")
        assert _status(client, protocol) == {}


# -- what tritonclient never sends -----------------------------------------------------------

BAD_HTTP: list[tuple[str, str, bytes, int, str]] = [
    ("POST", "/v2/systemsharedmemory/region/r/register", b"{", 400, "invalid JSON"),
    ("POST", "/v2/systemsharedmemory/region/r/register", b"[]", 400, "a JSON object"),
    ("POST", "/v2/systemsharedmemory/region/r/register", b'{"byte_size": 8}', 400, "'key'"),
    (
        "POST",
        "/v2/systemsharedmemory/region/r/register",
        b'{"key": "/k", "offset": -1, "byte_size": 8}',
        400,
        "offset must be a byte count",
    ),
    (
        "POST",
        "/v2/systemsharedmemory/region/r/register",
        b'{"key": "/k", "byte_size": true}',
        400,
        "byte_size must be a byte count",
    ),
    ("POST", "/v2/systemsharedmemory/register", b"{}", 400, "'region name' is necessary"),
    ("GET", "/v2/systemsharedmemory/region/r/register", b"", 405, "use POST"),
    ("POST", "/v2/systemsharedmemory/status", b"", 405, "use GET"),
    ("GET", "/v2/systemsharedmemory/region/%ff/status", b"", 400, "UTF-8"),
    ("GET", "/v2/systemsharedmemory/region/none/status", b"", 404, "Unable to find"),
    ("GET", "/v2/systemsharedmemory/regions", b"", 404, "no route"),
    ("GET", "/v2/cudasharedmemory/region/c/status", b"", 404, "cuda shared memory region"),
]


def _shm_input(parameters: dict[str, Any], **entry: Any) -> bytes:
    body = {"name": "t", "datatype": "INT32", "shape": [2], "parameters": parameters, **entry}
    return orjson.dumps({"inputs": [body]})


BAD_INFER: list[tuple[bytes, str]] = [
    (_shm_input({REGION: "r", BYTE_SIZE: "8"}), "shared_memory_byte_size must be a byte count"),
    (_shm_input({REGION: "r", BYTE_SIZE: 8, OFFSET: -8}), "shared_memory_offset must be a byte"),
    (_shm_input({REGION: "r"}), "but no shared_memory_byte_size"),
    (_shm_input({BYTE_SIZE: 8}), "but no shared_memory_region"),
    (_shm_input({REGION: 7, BYTE_SIZE: 8}), "must be a region's name"),
    (_shm_input({REGION: "r", BYTE_SIZE: 8}, data=[1, 2]), "must set only one of"),
    (_shm_input({REGION: "r", BYTE_SIZE: 8}, shape=[-2]), "non-negative integers"),
    (_shm_input({REGION: "r", BYTE_SIZE: 2}, datatype="BOOL", shape=[2]), "a BOOL element"),
]


def test_http_refuses_malformed_extension_requests(servers: dict[str, ServerProcess]) -> None:
    """Bodies, paths and parameters tritonclient would never send: each a 4xx with the
    protocol's error object; a region's bytes stay unread unless every check passed."""
    with (
        region(64) as (handle, key),
        httpx.Client(base_url=f"http://{servers['http'].address}", timeout=BOUND_S) as http,
    ):
        shm.set_shared_memory_region(handle, [np.array([7, 2], dtype=np.int32)])
        answer = http.post(
            "/v2/systemsharedmemory/region/r/register", json={"key": key, "byte_size": 64}
        )
        assert answer.status_code == 200, answer.text
        try:
            for method, path, body, status, words in BAD_HTTP:
                answer = http.request(method, path, content=body)
                assert answer.status_code == status, (path, answer.text)
                assert words in answer.json()["error"], (path, answer.text)
            for body, words in BAD_INFER:
                answer = http.post("/v2/models/echo/infer", content=body)
                assert answer.status_code == 400, (body, answer.text)
                assert words in answer.json()["error"], (body, answer.text)
            good = _shm_input({REGION: "r", BYTE_SIZE: 8})
            answer = http.post("/v2/models/echo/infer", content=good)
            assert answer.json()["outputs"][0]["data"] == [7, 2]
            assert http.get("/v2/cudasharedmemory/status").json() == []
        finally:
            http.post("/v2/systemsharedmemory/unregister")


def test_grpc_refuses_an_input_with_both_contents_and_a_region(
    servers: dict[str, ServerProcess],
) -> None:
    """Triton refuses a shared memory input that also carries ``contents``; so does ours, and
    the call's status is ``INVALID_ARGUMENT``, not a crash of the handler."""
    client = triton_grpc.InferenceServerClient(servers["grpc"].address)
    try:
        tensor = triton_grpc.InferInput("t", [2], "INT32")
        tensor.set_shared_memory("r", 8)
        tensor._get_tensor().contents.int_contents.extend([1, 2])
        _refused(
            lambda: client.infer("echo", [tensor]),
            INVALID["grpc"],
            "unexpected 'contents' beside shared_memory_region",
        )
        _assert_serves(client)
    finally:
        client.close()


def test_a_server_takes_no_regions_unless_allowed(tmp_path: Path) -> None:
    """As Triton without ``--allow-client-shm``: register and unregister are refused with its
    "disabled" error (gRPC UNIMPLEMENTED, HTTP 501), status lists nothing, and an input naming
    a region finds none; the object is never opened."""
    with started(tmp_path, allow=False) as closed, region(64) as (_, key):
        for protocol in PROTOCOLS:
            module = MODULE[protocol]
            client = module.InferenceServerClient(closed[protocol].address)
            try:
                unimplemented = "501" if protocol == "http" else "StatusCode.UNIMPLEMENTED"
                register = functools.partial(client.register_system_shared_memory, "r", key, 64)
                _refused(register, unimplemented, DISABLED)
                _refused(client.unregister_system_shared_memory, unimplemented, DISABLED)
                assert _status(client, protocol) == {}
                tensor = module.InferInput("t", [2], "INT32")
                tensor.set_shared_memory("r", 8)
                infer = functools.partial(client.infer, "echo", [tensor])
                _refused(infer, NOT_FOUND[protocol], "'r'")
                assert key[1:] not in _mapped(closed[protocol])
            finally:
                client.close()


def _mapped_here() -> set[str]:
    lines = Path("/proc/self/maps").read_text().splitlines()
    return {line.split("/dev/shm/", 1)[1].split()[0] for line in lines if "/dev/shm/" in line}


def test_stop_unmaps_the_regions() -> None:
    """A server's ``stop()`` unregisters its clients' regions (not garbage collection, not
    exit): servers in this process, regions registered through each (tritonclient on http1 and
    grpc; http2, which tritonclient does not speak, through its app's registry), mapped here
    until the servers stop, then not, while the objects still exist."""
    service = it.SimulatedService(token_stream_source)
    codec = ic.get("orjson", extensions=True)

    async def run(keys: dict[str, str]) -> set[str]:
        http2 = Http2Server(service, codec, port=0, allow_client_shm=True)
        servers: dict[str, it.Server] = {
            "http1": Http1Server(service, codec, port=0, allow_client_shm=True),
            "http2": http2,
            "grpc": GrpcServer(service, codec, port=0, allow_client_shm=True),
        }
        for transport, server in servers.items():
            host, port = await server.start()
            address = f"{host}:{port}"
            if transport == "http2":
                http2.app.kserve.shm.register("r", keys[transport], 0, 64)
                continue
            module = triton_http if transport == "http1" else triton_grpc
            client = module.InferenceServerClient(address)
            try:
                await asyncio.to_thread(
                    client.register_system_shared_memory, "r", keys[transport], 64
                )
            finally:
                client.close()
        names = {key[1:] for key in keys.values()}
        assert names <= _mapped_here()
        for server in servers.values():
            await server.stop()
        return names & _mapped_here()

    # objects this process does not map itself (tritonclient's utilities would)
    keys = {transport: f"/inferwire-test-{uuid.uuid4().hex[:12]}" for transport in TRANSPORTS}
    try:
        for key in keys.values():
            fd = os.open(f"/dev/shm{key}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            os.ftruncate(fd, 64)
            os.close(fd)
        assert asyncio.run(run(keys)) == set()
    finally:
        for key in keys.values():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"/dev/shm{key}")


def test_a_registry_holds_at_most_its_regions() -> None:
    """The registry's own limit (256 by default; 2 here), in this process: the third region is
    refused and nothing is mapped for it; unregistering one makes room."""
    registry = SystemSharedMemory(allow=True, max_regions=2)
    with region(64) as (_, key):
        try:
            registry.register("a", key, 0, 64)
            registry.register("b", key, 32, 32)
            with pytest.raises(BadRequestError, match="the most this server holds"):
                registry.register("c", key, 0, 8)
            assert [s.name for s in registry.status()] == ["a", "b"]
            registry.unregister("a")
            registry.register("c", key, 0, 8)
        finally:
            registry.close()
        assert registry.status() == []
