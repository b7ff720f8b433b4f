"""``inferwire serve`` and ``inferwire proxy``: a transport's server (or the WAN-delay proxy)
in this process, until SIGINT or SIGTERM.

    python -m inferwire.transports.serve serve --transport http2 --codec protobuf
    python -m inferwire.transports.serve proxy --upstream 127.0.0.1:8000 --delay-ms 20

(the ``inferwire`` command offers the same two, through :func:`add_commands`).

The first line on stdout says where it listens (``listening on HOST:PORT``, and with a
generated test certificate ``ca=PATH`` of its CA), so a parent process that asked for port 0
learns the port. The simulated service plays the seeded workloads of
:mod:`inferwire.workloads`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire.codecs.delta_codec import default_registry
from inferwire.workloads import token_stream_source

from .proxy import DelayProxy


def _announce(host: str, port: int, extra: str = "") -> None:
    authority = f"[{host}]" if ":" in host else host
    print(f"listening on {authority}:{port}{extra}", flush=True)


async def _until_signalled(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def _serve(args: argparse.Namespace) -> None:
    service = it.SimulatedService(
        token_stream_source, prefill_s=args.prefill_ms / 1000, decode_s=args.decode_ms / 1000
    )
    extra = ""
    tls = None
    if args.tls:
        if args.certfile and args.keyfile:
            tls = it.ServerTls.from_files(args.certfile, args.keyfile)
        else:
            tls, client_tls = it.make_test_certificates()
            ca_path = (
                Path(args.ca_out)
                if args.ca_out
                else Path(tempfile.mkstemp(prefix="inferwire-ca-", suffix=".pem")[1])
            )
            ca_path.write_bytes(client_tls.ca_pem)
            extra = f" ca={ca_path}"
    options: dict[str, object] = {}
    if args.transport in ("http1", "http2"):
        options["registry"] = default_registry()
    server = it.server_class(args.transport)(
        service,
        ic.get(args.codec),
        host=args.host,
        port=args.port,
        tls=tls,
        limits=it.Limits(max_message_bytes=args.max_message_bytes),
        **options,
    )
    host, port = await server.start()
    _announce(host, port, extra)
    stop = asyncio.Event()
    serving = asyncio.ensure_future(server.serve_forever())
    try:
        await _until_signalled(stop)
    finally:
        # stop first: grpc's shutdown fails if its wait_for_termination was cancelled before
        await server.stop()
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await serving


async def _proxy(args: argparse.Namespace) -> None:
    host, port = it.split_address(args.listen)
    bandwidth = args.bandwidth_mbps * 1e6 / 8 if args.bandwidth_mbps else None
    proxy = DelayProxy(
        it.split_address(args.upstream),
        delay_s=args.delay_ms / 1000,
        bandwidth_bytes_per_s=bandwidth,
        host=host,
        port=port,
    )
    bound = await proxy.start()
    _announce(*bound)
    stop = asyncio.Event()
    try:
        await _until_signalled(stop)
    finally:
        await proxy.stop()


def serve(args: argparse.Namespace) -> int:
    asyncio.run(_serve(args))
    return 0


def proxy(args: argparse.Namespace) -> int:
    asyncio.run(_proxy(args))
    return 0


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    srv = commands.add_parser("serve", help="run one transport's server for the simulated service")
    srv.add_argument("--transport", required=True, choices=it.TRANSPORTS)
    srv.add_argument("--codec", default="orjson", choices=ic.names())
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    srv.add_argument(
        "--tls", action="store_true", help="TLS (a generated test CA unless given files)"
    )
    srv.add_argument("--certfile", help="PEM certificate chain for --tls")
    srv.add_argument("--keyfile", help="PEM private key for --tls")
    srv.add_argument("--ca-out", help="where to write the generated CA certificate")
    srv.add_argument("--prefill-ms", type=float, default=0.0, help="time to first token")
    srv.add_argument("--decode-ms", type=float, default=0.0, help="time per output token")
    srv.add_argument("--max-message-bytes", type=int, default=it.DEFAULT_MAX_MESSAGE_BYTES)
    srv.set_defaults(run=serve)

    prx = commands.add_parser("proxy", help="a TCP proxy adding one-way delay per direction")
    prx.add_argument("--listen", default="127.0.0.1:0")
    prx.add_argument("--upstream", required=True, help="HOST:PORT of the server")
    prx.add_argument("--delay-ms", type=float, default=20.0, help="one-way delay per direction")
    prx.add_argument("--bandwidth-mbps", type=float, help="optional cap per direction")
    prx.set_defaults(run=proxy)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m inferwire.transports.serve",
        description="one transport's server, or the WAN-delay proxy, until SIGINT or SIGTERM",
    )
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
