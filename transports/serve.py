"""``inferwire serve`` and ``inferwire proxy``: a transport's server (or the WAN-delay proxy)
in this process, until SIGINT or SIGTERM (:mod:`inferwire.cli.serve` parses their options).

    python -m inferwire.cli serve --transport http2 --codec protobuf
    python -m inferwire.cli proxy --upstream 127.0.0.1:8000 --delay-ms 20

The first line on stdout says where it listens (``listening on HOST:PORT``, and with a
generated test certificate ``ca=PATH`` of its CA), then ``loop=asyncio`` or ``loop=uvloop``
(the event loop that runs it, ``--loop``), then, with ``--metrics-port``, ``metrics=HOST:PORT``
(where its side HTTP server answers scrapes), and with ``--trace``, ``trace=URL`` (where its
spans go, :mod:`inferwire.transports.tracing`), so a parent process that asked for port 0
learns the ports. The simulated service plays the seeded workloads of
:mod:`inferwire.workloads`. A server records its Prometheus metrics
(:mod:`inferwire.transports.metrics`) unless ``--no-metrics``.

The OpenAI API (``http1``, ``http2``) takes vLLM's ``--enable-per-request-metrics`` and
inferwire's ``--stamps-file PATH`` (:mod:`inferwire.transports.openai_api`). A frontend
(``--engine``) asks the engine for each request's stamps whenever something reads them: the
metrics, a trace, the per-request metrics or the stamps file.

``--compress`` (:data:`COMPRESS_CHOICES`, off by default): ``auto`` answers http1 and http2
requests in the coding their ``Accept-Encoding`` weighs highest (zstd, gzip, br; streams flushed
per event, :mod:`inferwire.transports.compression`) and decodes compressed request bodies;
on grpc it compresses the answers' messages with gzip.

``--allow-client-shm`` (off, as Triton's): KServe clients (http1, http2, grpc) may register
system shared memory regions (:mod:`inferwire.transports.kserve_shm`); the server unmaps them
when it stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire._runtime import loops, signals
from inferwire._runtime.arguments import (
    CommandError,
    authority,
    check_can_listen,
    check_trace_arguments,
    listen_failure,
    split_checked,
)
from inferwire._runtime.extras import needs_extras
from inferwire.codecs.delta_codec import default_registry
from inferwire.workloads import token_stream_source

from .compression import CODINGS, Compression
from .openai_api import OpenAIOptions
from .proxy import DelayProxy
from .request_stamps import StampsFile
from .tracing import SERVER_SERVICE, Tracer

if TYPE_CHECKING:
    from inferwire.engine.client import EngineClient

    from .metrics import MetricsServer, ServerMetrics
    from .service import SimulatedService

UPSTREAM_PROBE_TIMEOUT_S: Final = 2.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeOptions:
    """What ``inferwire serve`` is told; the defaults are the command's."""

    transport: str
    codec: str = "orjson"
    host: str = "127.0.0.1"
    port: int = 0
    """0: any free port."""
    tls: bool = False
    certfile: Path | None = None
    keyfile: Path | None = None
    ca_out: str | None = None
    prefill_ms: float = 0.0
    decode_ms: float = 0.0
    max_message_bytes: int = it.DEFAULT_MAX_MESSAGE_BYTES
    metrics_port: int | None = None
    no_metrics: bool = False
    engine: str | None = None
    engine_codec: str = "msgspec-msgpack"
    allow_pickle: bool = False
    engine_liveness_timeout: float = 5.0
    loop: str = "auto"
    trace: bool = False
    trace_endpoint: str | None = None
    enable_per_request_metrics: bool = False
    stamps_file: str | None = None
    compress: str = "off"
    """``--compress``: :data:`COMPRESS_CHOICES` (:func:`_compression` says what each is)."""
    allow_client_shm: bool = False
    """``--allow-client-shm``: KServe clients may register system shared memory regions."""


OPENAI_TRANSPORTS: Final = ("http1", "http2")
"""The transports that serve the OpenAI API."""
KSERVE_TRANSPORTS: Final = ("http1", "http2", "grpc")
"""The transports that serve KServe v2, and so its shared memory extension."""
COMPRESS_CHOICES: Final = ("off", "auto", "zstd", "br", "gzip", "deflate")
"""``--compress``: off by default, as vLLM, SGLang and TGI serve (a frontend's CPU is what
limits it, and on loopback or a LAN the bytes cost less than compressing them); ``auto``
negotiates ``Accept-Encoding`` on http1/http2 (zstd, gzip, br) and gzips gRPC answers; a coding
offers only it (gRPC: gzip or deflate)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProxyOptions:
    """What ``inferwire proxy`` is told; the defaults are the command's."""

    upstream: str
    listen: str = "127.0.0.1:0"
    delay_ms: float = 20.0
    bandwidth_mbps: float | None = None
    loop: str = "auto"


def _announce(host: str, port: int, extra: str = "") -> None:
    print(f"listening on {authority(host, port)}{extra}", flush=True)


def _server_tls(args: ServeOptions) -> tuple[it.ServerTls | None, str]:
    """The server's TLS material, and what to add to the announcement (the generated CA)."""
    if not args.tls:
        given = [name for name in ("certfile", "keyfile", "ca_out") if getattr(args, name)]
        if given:
            raise CommandError(f"--{given[0].replace('_', '-')} is for --tls, which is not given")
        return None, ""
    if args.certfile or args.keyfile:
        if not (args.certfile and args.keyfile):
            raise CommandError("--certfile and --keyfile go together")
        if args.ca_out:
            raise CommandError(
                "--ca-out writes the generated test CA; with --certfile there is none"
            )
        try:
            tls = it.ServerTls.from_files(args.certfile, args.keyfile)
            tls.ssl_context()  # a certificate and key that do not load, or do not match
        except (OSError, ssl.SSLError) as exc:
            raise CommandError(f"cannot use --certfile/--keyfile: {exc}") from None
        return tls, ""
    tls, client_tls = it.make_test_certificates()
    try:
        ca_path = (
            Path(args.ca_out)
            if args.ca_out
            else Path(tempfile.mkstemp(prefix="inferwire-ca-", suffix=".pem")[1])
        )
        ca_path.write_bytes(client_tls.ca_pem)
    except OSError as exc:
        raise CommandError(f"cannot write the test CA: {exc}") from None
    return tls, f" ca={ca_path}"


async def _serve(args: ServeOptions) -> None:
    server_class = it.server_class(args.transport)
    if args.no_metrics and args.metrics_port is not None:
        raise CommandError("--metrics-port exposes the metrics that --no-metrics turns off")
    check_can_listen(args.host, args.port)
    if args.metrics_port:
        if args.metrics_port == args.port:
            raise CommandError("--metrics-port and --port must differ")
        check_can_listen(args.host, args.metrics_port)
    check_trace_arguments(args)
    _check_openai_arguments(args)
    tls, extra = _server_tls(args)
    codec = ic.get(args.codec, extensions=True)  # the stream inferwire's clients check
    metrics = None if args.no_metrics else _metrics(args.transport, codec.name)
    tracer = None
    if args.trace:  # only then is OpenTelemetry imported
        tracer = Tracer.open(
            SERVER_SERVICE, args.trace_endpoint, transport=args.transport, codec=args.codec
        )
    stamps_file = _stamps_file(args.stamps_file)
    engine = None
    if args.engine is None:
        service = it.SimulatedService(
            token_stream_source, prefill_s=args.prefill_ms / 1000, decode_s=args.decode_ms / 1000
        )
    else:
        stamped = bool(metrics or tracer or stamps_file or args.enable_per_request_metrics)
        engine, service = await _engine_service(args, want_stamps=stamped)
    options: dict[str, object] = _compression(args)
    if args.allow_client_shm:
        if args.transport not in KSERVE_TRANSPORTS:
            raise CommandError(
                f"--allow-client-shm is for KServe v2, which --transport "
                f"{', '.join(KSERVE_TRANSPORTS[:-1])} and {KSERVE_TRANSPORTS[-1]} serve, "
                f"not {args.transport}"
            )
        options["allow_client_shm"] = True
    if args.transport in OPENAI_TRANSPORTS:
        options["registry"] = default_registry()
        options["openai"] = OpenAIOptions(
            per_request_metrics=args.enable_per_request_metrics, stamps_file=stamps_file
        )
    if args.transport == "websocket":  # the OpenAI chat route, over a WebSocket
        options["openai"] = OpenAIOptions(
            per_request_metrics=args.enable_per_request_metrics, stamps_file=stamps_file
        )
    server = server_class(
        service,
        codec,
        host=args.host,
        port=args.port,
        tls=tls,
        limits=it.Limits(max_message_bytes=args.max_message_bytes),
        metrics=metrics,
        tracer=tracer,
        **options,
    )
    with signals.stop_event() as stop:
        side = None
        if metrics is not None and args.metrics_port is not None:
            side = _metrics_server(metrics, args.host, args.metrics_port)
        try:
            host, port = await _started(server, args.host, args.port)
            extra += f" loop={loops.running()}"
            if side is not None:
                extra += f" metrics={authority(*side.address)}"
            if tracer is not None:
                extra += f" trace={tracer.endpoint}"
            _announce(host, port, extra)
            serving = asyncio.ensure_future(server.serve_forever())
            try:
                await stop.wait()
            finally:
                # stop first: grpc's shutdown fails if its wait_for_termination was cancelled before
                await server.stop()
                serving.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await serving
        finally:
            if side is not None:
                side.stop()
            if engine is not None:
                await engine.close()
            if stamps_file is not None:
                stamps_file.close()
            if tracer is not None:
                await asyncio.sleep(0)  # the spans of streams that just ended are built
                await asyncio.to_thread(tracer.close)  # exports what is queued


def _check_openai_arguments(args: ServeOptions) -> None:
    """The OpenAI API's options go with a transport that serves it."""
    given = [
        flag
        for flag, value in (
            ("--enable-per-request-metrics", args.enable_per_request_metrics),
            ("--stamps-file", args.stamps_file),
        )
        if value
    ]
    serving = (*OPENAI_TRANSPORTS, "websocket")
    if given and args.transport not in serving:
        raise CommandError(
            f"{given[0]} is for the OpenAI API, which --transport "
            f"{', '.join(serving[:-1])} and {serving[-1]} serve, not {args.transport}"
        )


def _compression(args: ServeOptions) -> dict[str, object]:
    """The server's ``compression`` option for ``--compress`` (nothing when off)."""
    choice = args.compress
    if choice == "off":
        return {}
    if args.transport in OPENAI_TRANSPORTS:
        if choice == "deflate":
            raise CommandError(
                "--compress deflate is for grpc; HTTP answers are zstd, gzip or br (deflate's "
                "two readings, zlib or raw, make it the one coding clients disagree on)"
            )
        codings = CODINGS if choice == "auto" else (choice,)
        limit = args.max_message_bytes
        return {"compression": Compression(codings=codings, max_request_bytes=limit)}
    if args.transport == "grpc":
        if choice not in ("auto", "gzip", "deflate"):
            raise CommandError(f"--compress {choice}: grpc compresses with gzip or deflate")
        return {"compression": "gzip" if choice == "auto" else choice}
    raise CommandError(f"--compress is for http1, http2 and grpc, not {args.transport}")


def _stamps_file(path: str | None) -> StampsFile | None:
    if path is None:
        return None
    try:
        return StampsFile(path)
    except OSError as exc:
        raise CommandError(f"cannot write --stamps-file {path}: {exc.strerror or exc}") from None


async def _engine_service(
    args: ServeOptions, *, want_stamps: bool = False
) -> tuple[EngineClient, SimulatedService]:
    """``--engine``'s service: the engine's client (started: it connects in the background
    and waits for the engine only when a stream asks) and the service that plays through it,
    asking the engine for each request's stamps if ``want_stamps``."""
    if args.prefill_ms or args.decode_ms:
        raise CommandError("--prefill-ms and --decode-ms pace the local service; the engine paces")
    with needs_extras("--engine"):
        from inferwire.engine.client import EngineClient
        from inferwire.engine.hop import EngineGoneError, HopError, HopRefusedError
        from inferwire.engine.hop_codecs import hop_codec

        from .engine_service import EngineService
    try:
        codec = hop_codec(args.engine_codec, allow_pickle=args.allow_pickle)
    except (HopError, ic.CodecError) as exc:
        raise CommandError(f"--engine-codec {args.engine_codec}: {exc}") from None
    endpoint = args.engine or ""
    if not endpoint.startswith(("ipc://", "tcp://")):
        raise CommandError(f"--engine {args.engine}: not ipc://PATH nor tcp://HOST:PORT")
    client = EngineClient(endpoint, codec, liveness_timeout_s=args.engine_liveness_timeout)
    await client.start()
    try:
        await client.wait_ready(UPSTREAM_PROBE_TIMEOUT_S)
    except HopRefusedError as exc:
        await client.close()
        raise CommandError(f"the engine at {args.engine} refused this frontend: {exc}") from None
    except EngineGoneError:
        # not an error: the engine may start after its frontends (ZeroMQ connects when it does)
        print(
            f"inferwire serve: warning: no engine answers at {args.engine} now; each stream "
            "waits for one up to --engine-liveness-timeout",
            file=sys.stderr,
        )
    return client, EngineService(token_stream_source, client, want_stamps=want_stamps)


def _metrics(transport: str, codec: str) -> ServerMetrics:
    with needs_extras("recording metrics (--no-metrics turns it off)"):
        from .metrics import ServerMetrics
    return ServerMetrics(transport, codec)


def _metrics_server(metrics: ServerMetrics, host: str, port: int) -> MetricsServer:
    """``--metrics-port``'s server, a failure to listen as a CommandError."""
    from .metrics import MetricsServer  # imported by _metrics already

    try:
        return MetricsServer(metrics, host, port)
    except OSError as exc:
        raise CommandError(listen_failure(host, port, exc)) from None


async def _started(server: it.Server | DelayProxy, host: str, port: int) -> tuple[str, int]:
    """``server.start()``, a failure to listen as a CommandError: the port was free when
    checked but taken since (grpc raises RuntimeError, or reports port 0 as ConnectError)."""
    try:
        return await server.start()
    except (OSError, RuntimeError, it.ConnectError) as exc:
        raise CommandError(listen_failure(host, port, exc)) from None


async def _proxy(args: ProxyOptions) -> None:
    host, port = it.split_address(args.listen)
    upstream = split_checked(args.upstream)
    check_can_listen(host, port)
    _warn_if_unreachable(upstream)
    bandwidth = args.bandwidth_mbps * 1e6 / 8 if args.bandwidth_mbps else None
    proxy = DelayProxy(
        upstream,
        delay_s=args.delay_ms / 1000,
        bandwidth_bytes_per_s=bandwidth,
        host=host,
        port=port,
    )
    with signals.stop_event() as stop:
        bound = await _started(proxy, host, port)
        _announce(*bound, f" loop={loops.running()}")
        try:
            await stop.wait()
        finally:
            await proxy.stop()


def _warn_if_unreachable(upstream: tuple[str, int]) -> None:
    """Not an error: the upstream may start after its proxy (each connection through the
    proxy opens its own upstream connection), but a mistyped port should not go unnoticed."""
    try:
        with socket.create_connection(upstream, timeout=UPSTREAM_PROBE_TIMEOUT_S):
            pass
    except OSError as exc:
        print(
            f"inferwire proxy: warning: {authority(*upstream)} does not accept connections "
            f"now ({exc.strerror or exc}); each connection through the proxy tries it again",
            file=sys.stderr,
        )


def serve(options: ServeOptions) -> int:
    """Runs the server until SIGINT or SIGTERM; exit status 0. A mistake found before it
    listens is a :class:`~inferwire._runtime.arguments.CommandError`."""
    loops.run(_serve(options), options.loop)
    return 0


def proxy(options: ProxyOptions) -> int:
    """Runs the proxy until SIGINT or SIGTERM; exit status 0."""
    loops.run(_proxy(options), options.loop)
    return 0
