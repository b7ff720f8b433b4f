"""``inferwire serve`` and ``inferwire proxy``: a transport's server (or the WAN-delay proxy)
in this process, until SIGINT or SIGTERM.

    python -m inferwire.transports.serve serve --transport http2 --codec protobuf
    python -m inferwire.transports.serve proxy --upstream 127.0.0.1:8000 --delay-ms 20

(the ``inferwire`` command offers the same two, through :func:`add_commands`).

The first line on stdout says where it listens (``listening on HOST:PORT``, and with a
generated test certificate ``ca=PATH`` of its CA), then ``loop=asyncio`` or ``loop=uvloop``
(the event loop that runs it, ``--loop``), then, with ``--metrics-port``, ``metrics=HOST:PORT``
(where its side HTTP server answers scrapes), and with ``--trace``, ``trace=URL`` (where its
spans go, :mod:`inferwire.transports.tracing`), so a parent process that asked for port 0
learns the ports. The simulated service plays the seeded workloads of
:mod:`inferwire.workloads`. A server records its Prometheus metrics
(:mod:`inferwire.transports.metrics`) unless ``--no-metrics``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import ssl
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire import workloads
from inferwire._runtime import loops
from inferwire._runtime.arguments import (
    CommandError,
    Commands,
    Parser,
    add_loop_argument,
    add_trace_arguments,
    authority,
    check_can_listen,
    check_trace_arguments,
    connect_address,
    existing_file,
    listen_address,
    listen_failure,
    non_negative,
    port,
    positive,
    positive_count,
    run,
    split_checked,
)
from inferwire._runtime.extras import needs_extras
from inferwire.codecs.delta_codec import default_registry
from inferwire.workloads import token_stream_source

from .proxy import DelayProxy
from .tracing import SERVER_SERVICE, Tracer

if TYPE_CHECKING:
    from inferwire.engine.client import EngineClient

    from .metrics import MetricsServer, ServerMetrics
    from .service import SimulatedService

UPSTREAM_PROBE_TIMEOUT_S: Final = 2.0


def _announce(host: str, port: int, extra: str = "") -> None:
    print(f"listening on {authority(host, port)}{extra}", flush=True)


def _stop_on_signals() -> asyncio.Event:
    """An event SIGINT and SIGTERM set. Made before the address is announced, so a parent that
    stops the process as soon as it has read the address gets a clean shutdown."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    return stop


def _server_tls(args: argparse.Namespace) -> tuple[it.ServerTls | None, str]:
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


async def _serve(args: argparse.Namespace) -> None:
    server_class = it.server_class(args.transport)
    if args.no_metrics and args.metrics_port is not None:
        raise CommandError("--metrics-port exposes the metrics that --no-metrics turns off")
    check_can_listen(args.host, args.port)
    if args.metrics_port:
        if args.metrics_port == args.port:
            raise CommandError("--metrics-port and --port must differ")
        check_can_listen(args.host, args.metrics_port)
    check_trace_arguments(args)
    tls, extra = _server_tls(args)
    codec = ic.get(args.codec)
    metrics = None if args.no_metrics else _metrics(args.transport, codec.name)
    tracer = None
    if args.trace:  # only then is OpenTelemetry imported
        tracer = Tracer.open(
            SERVER_SERVICE, args.trace_endpoint, transport=args.transport, codec=args.codec
        )
    engine = None
    if args.engine is None:
        service = it.SimulatedService(
            token_stream_source, prefill_s=args.prefill_ms / 1000, decode_s=args.decode_ms / 1000
        )
    else:
        engine, service = await _engine_service(args)
    options: dict[str, object] = {}
    if args.transport in ("http1", "http2"):
        options["registry"] = default_registry()
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
    stop = _stop_on_signals()
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
        if tracer is not None:
            await asyncio.sleep(0)  # the spans of streams that just ended are built
            await asyncio.to_thread(tracer.close)  # exports what is queued


async def _engine_service(args: argparse.Namespace) -> tuple[EngineClient, SimulatedService]:
    """``--engine``'s service: the engine's client (started: it connects in the background
    and waits for the engine only when a stream asks) and the service that plays through it."""
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
    if not args.engine.startswith(("ipc://", "tcp://")):
        raise CommandError(f"--engine {args.engine}: not ipc://PATH nor tcp://HOST:PORT")
    client = EngineClient(args.engine, codec, liveness_timeout_s=args.engine_liveness_timeout)
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
    return client, EngineService(token_stream_source, client)


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


async def _proxy(args: argparse.Namespace) -> None:
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
    stop = _stop_on_signals()
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


def serve(args: argparse.Namespace) -> int:
    loops.run(_serve(args), args.loop)
    return 0


def proxy(args: argparse.Namespace) -> int:
    loops.run(_proxy(args), args.loop)
    return 0


SERVE_DESCRIPTION: Final = """\
Runs one transport's server for the simulated inference service in this process, until
SIGINT or SIGTERM. The first line on stdout is "listening on HOST:PORT" (with a generated test
certificate, also "ca=PATH" of its CA), then "loop=asyncio" or "loop=uvloop", the event loop
that runs it, then with --metrics-port "metrics=HOST:PORT", so a parent that asked for port 0
learns the ports and can record the loop.

It records Prometheus metrics of what it serves (requests by outcome, time to first token,
inter-token and end-to-end latency, encode time, bytes, tokens, streams in flight), which
http1 and http2 answer at GET /metrics and any transport at --metrics-port; --no-metrics
turns them off.

The service streams seeded token chunks of the workload a request names, paced by
--prefill-ms (time to the first token) and --decode-ms (time per token); with both at 0 a
client measures serialization and transport alone. With --engine ENDPOINT the server is a
frontend: it checks each request itself, and the engine process at ENDPOINT (inferwire engine)
schedules, batches and paces it, its chunks crossing the hop in --engine-codec; a stream the
engine cannot finish (it died, restarted or was overloaded) fails, never ends short."""

PROXY_DESCRIPTION: Final = """\
A TCP proxy that forwards every chunk it reads --delay-ms after it arrived, in each direction,
with an optional bandwidth cap: a 20 ms delay makes a round trip about 40 ms longer, like two
hosts 20 ms apart. Runs until SIGINT or SIGTERM; the first line on stdout is "listening on
HOST:PORT loop=KIND"."""


def add_commands(commands: Commands) -> None:
    srv = commands.add_parser(
        "serve",
        help="run one transport's server for the simulated service",
        description=SERVE_DESCRIPTION,
        epilog="workloads a request can name: " + ", ".join(workloads.names("stream")),
    )
    srv.add_argument(
        "--transport", required=True, choices=it.TRANSPORTS, help="the protocol to serve"
    )
    srv.add_argument(
        "--codec", default="orjson", choices=ic.names(), help="how token chunks become bytes"
    )
    srv.add_argument(
        "--host", default="127.0.0.1", help="address to listen on; 0.0.0.0 or :: for all"
    )
    srv.add_argument("--port", type=port, default=0, help="port to listen on; 0: any free port")
    srv.add_argument(
        "--tls", action="store_true", help="serve TLS: a generated test CA unless given files"
    )
    srv.add_argument("--certfile", type=existing_file, help="PEM certificate chain, for --tls")
    srv.add_argument("--keyfile", type=existing_file, help="PEM private key, for --tls")
    srv.add_argument(
        "--ca-out",
        help="where to write the generated test CA's certificate (default: a temporary file)",
    )
    srv.add_argument(
        "--prefill-ms", type=non_negative, default=0.0, help="time to the first token, ms"
    )
    srv.add_argument(
        "--decode-ms", type=non_negative, default=0.0, help="time per further token, ms"
    )
    srv.add_argument(
        "--max-message-bytes",
        type=positive_count,
        default=it.DEFAULT_MAX_MESSAGE_BYTES,
        help="largest message accepted",
    )
    srv.add_argument(
        "--metrics-port",
        type=port,
        help="also answer Prometheus scrapes (GET /metrics) on this port of --host, from a side "
        "HTTP server (0: any free port; announced as metrics=HOST:PORT); http1 and http2 "
        "answer GET /metrics on their own port as well",
    )
    srv.add_argument(
        "--no-metrics",
        action="store_true",
        help="record no metrics (the benchmarks' servers: a floor measures the transport alone)",
    )
    srv.add_argument(
        "--engine",
        metavar="ENDPOINT",
        help="serve the streams of the engine process at ENDPOINT (ipc://PATH or "
        "tcp://HOST:PORT, see inferwire engine) over the hop, as a frontend; without it the "
        "service plays them itself",
    )
    srv.add_argument(
        "--engine-codec",
        default="msgspec-msgpack",
        help="the hop's codec, the engine's --codec: a codec of --codec's list that carries "
        "token chunks, or pickle (with --allow-pickle)",
    )
    srv.add_argument(
        "--allow-pickle",
        action="store_true",
        help="allow --engine-codec pickle: it runs code from the bytes it reads, so only "
        "with an engine you trust",
    )
    srv.add_argument(
        "--engine-liveness-timeout",
        type=positive,
        default=5.0,
        help="seconds without a word from the engine before its open streams fail",
    )
    add_loop_argument(srv)
    add_trace_arguments(srv, "each stream's stages")
    srv.set_defaults(run=serve)

    prx = commands.add_parser(
        "proxy",
        help="a TCP proxy adding one-way delay per direction",
        description=PROXY_DESCRIPTION,
    )
    prx.add_argument(
        "--listen", type=listen_address, default="127.0.0.1:0", help="HOST:PORT; port 0: any free"
    )
    prx.add_argument(
        "--upstream", type=connect_address, required=True, help="HOST:PORT of the server"
    )
    prx.add_argument(
        "--delay-ms", type=non_negative, default=20.0, help="one-way delay per direction, ms"
    )
    prx.add_argument(
        "--bandwidth-mbps",
        type=positive,
        help="bandwidth cap per direction, Mbit/s (default: none)",
    )
    add_loop_argument(prx)
    prx.set_defaults(run=proxy)


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(
        prog="python -m inferwire.transports.serve",
        description="One transport's server, or the WAN-delay proxy, until SIGINT or SIGTERM.",
    )
    add_commands(parser.add_subparsers(dest="command", required=True))
    return run(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
