"""The servers users deploy instead of ours, serving the same work, for the peers comparison.

A Starlette app answers ``POST /v1/chat/completions`` (``"stream": true``) with a
``StreamingResponse`` of the same :class:`~inferwire.transports.SimulatedService` and the same
codec stream encoder as inferwire's HTTP servers, so the body on the wire is byte for byte
theirs (SSE events ending with ``data: [DONE]`` for the JSON codecs; inferwire's clients ask
for the codec's own chunks, extensions included, which is what this app writes). The request is
parsed and checked as inferwire's OpenAI route does (orjson,
:func:`~inferwire.transports.openai_api.parse_request`), so the two sides do the same work;
only the HTTP stack differs. It runs as users deploy it:

* uvicorn: HTTP/1.1 parsed by httptools, uvloop, one worker, no access log (what
  ``uvicorn[standard]`` picks by itself: ``loop="auto"`` and ``http="auto"`` are uvloop and
  httptools when installed; here both are named);
* Hypercorn: HTTP/2 in cleartext with prior knowledge (h2c), on uvloop (its
  ``worker_class="uvloop"`` runs ``worker_serve`` in a loop from ``uvloop.new_event_loop``;
  ``hypercorn.asyncio.serve``, used here, takes the loop it is called in, which is made the
  same way). Hypercorn reads the connection preface ``PRI * HTTP/2.0`` on its HTTP/1.1 port and
  switches to h2, so no TLS is needed;
* granian (written against 2.8.9): its HTTP/1.1 or its HTTP/2 (h2c, prior knowledge), both
  Rust (hyper on tokio), in front of the same ASGI app, run by the class its command runs
  (``granian.server.Server``) with the settings of
  ``granian --interface asgi --http 1|2 --workers 1 --loop uvloop --log-level warning``
  (``--loop``: the run's, below), everything else its defaults (one runtime thread in its
  multi-threaded runtime mode, asyncio tasks, websockets on for HTTP/1.1, access log off; its
  logs go to stderr). Like the command it is two processes: this one, which reserves the port
  and watches, and one worker it forks, which binds and serves; a benchmark counts the CPU of
  both (every thread of each). The worker announces the address once it accepts connections,
  with the loop it made, and ends with this process, however that ends.

``--loop`` (default: ``auto``, uvloop when installed) picks the loop, so the peers run on the
same loop as the inferwire server they are compared with
(:func:`~inferwire.bench.procs.loops.requested_loop`); the announcement names it.

Response headers are the stacks' own defaults (``date``, ``server``, Starlette's
``; charset=utf-8`` on ``text/*``): what a user of them sends.

    python -m inferwire.bench.procs.peer_servers --server uvicorn --codec orjson --port 0
    python -m inferwire.bench.procs.peer_servers --server hypercorn --codec orjson --port 0 --http2
    python -m inferwire.bench.procs.peer_servers --server granian --codec orjson --port 0 --http2

print ``listening on HOST:PORT loop=KIND`` first, like ``inferwire serve``, and stop on SIGTERM
or SIGINT. :func:`peer` is the :class:`~inferwire.transports.server_process.ServerProcess` for one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import functools
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final

import orjson

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire._runtime import loops
from inferwire._runtime.extras import needs_extras
from inferwire.serving import error_body
from inferwire.transports import server_process
from inferwire.transports.openai_api import ApiError, parse_request
from inferwire.workloads import token_stream_source

if TYPE_CHECKING:
    from starlette.applications import Starlette

PEERS: Final = ("uvicorn", "hypercorn", "granian")
HTTP2_PEERS: Final = ("hypercorn", "granian")
"""The peers that serve HTTP/2 here (``--http2``)."""
_BACKLOG: Final = 1024
"""Backlog of the socket we bind, until the server takes it over and listens with its own:
a client that connects as soon as the address is printed waits here, not refused."""
_MISSING: Final = "the peer servers need the bench extra: pip install 'inferwire[bench]'"
ACCEPT_TIMEOUT_S: Final = 60.0
"""How long granian's worker may take to accept a first connection before it gives up
announcing (the start timeout of :class:`~inferwire._runtime.child.ChildProcess`)."""
_GRANIAN_LOGGING: Final[dict[str, Any]] = {
    # granian's own configuration with its two handlers moved from stdout to stderr: stdout
    # carries the announcement alone
    "handlers": {
        name: {
            "formatter": formatter,
            "class": "logging.StreamHandler",
            "stream": "ext://sys.stderr",
        }
        for name, formatter in (("console", "generic"), ("access", "access"))
    }
}


def make_app(service: it.SimulatedService, codec: ic.Codec) -> Starlette:
    """The Starlette app: the token stream route of :class:`HttpApp`, nothing else."""
    try:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import Response, StreamingResponse
        from starlette.routing import Route
    except ImportError as exc:
        raise ImportError(_MISSING) from exc
    if ic.TokenChunk not in codec.types:
        raise ValueError(f"codec {codec.name!r} does not carry token streams")

    async def chat_completions(request: Request) -> Response:
        try:
            obj = orjson.loads(await request.body())
            chat = parse_request(obj, chat=True, models=service.models)
            if not chat.stream:
                raise it.BadRequestError("only streaming completions are served: set stream")
            stream = service.open(chat.generate)  # a bad request is refused before a stream
        except (orjson.JSONDecodeError, it.BadRequestError) as exc:
            status = exc.status if isinstance(exc, ApiError) else 400
            return Response(error_body(status, str(exc)), status, media_type="application/json")
        return StreamingResponse(
            _frames(service, codec, stream),
            media_type=codec.stream_media_type,
            headers={"cache-control": "no-cache"},
        )

    routes = [Route("/v1/chat/completions", chat_completions, methods=["POST"])]
    return Starlette(routes=routes)


def _app(codec: str, prefill_s: float, decode_s: float) -> Starlette:
    service = it.SimulatedService(token_stream_source, prefill_s=prefill_s, decode_s=decode_s)
    return make_app(service, ic.get(codec, extensions=True))


async def _frames(
    service: it.SimulatedService, codec: ic.Codec, stream: it.TokenStream
) -> AsyncIterator[bytes]:
    """What an application written on the framework sends: one codec frame per chunk as the
    service produces it, then the end marker."""
    encoder = codec.stream_encoder()
    async with contextlib.aclosing(service.generate(stream)) as chunks:
        async for chunk in chunks:
            yield encoder.encode(chunk)
    yield encoder.end()


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket: bound here so that port 0 can be announced before serving."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(_BACKLOG)
    return sock


def _announce(sock: socket.socket) -> None:
    host, port = sock.getsockname()[:2]
    print(_announcement(host, port, loops.running()), flush=True)


def _announcement(host: str, port: int, loop: str) -> str:
    authority = f"[{host}]" if ":" in host else host
    return f"listening on {authority}:{port} loop={loop}"


def _stop_on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)


async def _until(stop: asyncio.Event, serving: asyncio.Task[None]) -> None:
    """Wait for a signal, or for the server to end by itself (it failed: re-raised)."""
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({stopping, serving}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if serving.done():
        serving.result()


async def _serve_uvicorn(app: Starlette, sock: socket.socket) -> None:
    try:
        import uvicorn
    except ImportError as exc:
        raise ImportError(_MISSING) from exc

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # the signals are ours (_stop_on_signals): uvicorn's own handling would re-raise
            # SIGTERM after shutting down, and the process would end by it, not with status 0
            yield

    config = uvicorn.Config(
        app,
        http="httptools",
        # informative only: Server.serve runs in the loop it is called in, made by main() of
        # the kind --loop names (uvicorn.run would make it from this setting the same way)
        loop=loops.kind(asyncio.get_running_loop()),
        workers=1,
        access_log=False,
        log_level="warning",
    )
    server = Server(config)
    stop = asyncio.Event()
    _stop_on_signals(stop)
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    _announce(sock)
    try:
        await _until(stop, serving)
    finally:
        server.should_exit = True
        await serving


async def _serve_hypercorn(app: Starlette, sock: socket.socket) -> None:
    try:
        from hypercorn.asyncio import serve
        from hypercorn.config import Config
    except ImportError as exc:
        raise ImportError(_MISSING) from exc
    config = Config()
    config.loglevel = "WARNING"
    config.accesslog = None
    config.workers = 1
    stop = asyncio.Event()
    _stop_on_signals(stop)
    _announce(sock)
    # Hypercorn binds from strings; "fd://N" adopts our socket (it takes over the descriptor)
    config.bind = [f"fd://{sock.detach()}"]
    await serve(app, config, shutdown_trigger=stop.wait, mode="asgi")  # type: ignore[arg-type]


def _reserve(host: str, port: int) -> socket.socket:
    """A bound socket that is not listening, with ``SO_REUSEPORT``: granian binds its listener
    itself (on Linux in its worker, with ``SO_REUSEPORT``) and cannot adopt ours as uvicorn and
    Hypercorn do, so this holds the port until granian binds it beside, and after, without ever
    taking a connection (the kernel hands connections to listening sockets only)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def _serve_granian(
    codec: str, prefill_s: float, decode_s: float, host: str, port: int, http2: bool, loop: str
) -> None:
    """granian in front of the app until SIGTERM or SIGINT (granian's own handlers: it stops its
    worker, then returns). Its worker builds the app and announces the address
    (:func:`_granian_worker_app`); this process prints nothing on stdout."""
    with needs_extras("the granian peer"):
        from granian.constants import HTTPModes, Interfaces, Loops
        from granian.log import LogLevels
        from granian.server import Server
    reserved = _reserve(host, port)
    port = reserved.getsockname()[1]
    try:
        server = Server(
            # granian loads the app by this name unless given a loader (below); here it only
            # names the process (its title, when setproctitle is installed)
            "inferwire.bench.procs.peer_servers:make_app",
            address=host,
            port=port,
            interface=Interfaces.ASGI,
            http=HTTPModes.http2 if http2 else HTTPModes.http1,
            workers=1,
            loop=Loops(loops.resolve(loop)),
            log_level=LogLevels.warning,
            log_dictconfig=_GRANIAN_LOGGING,
        )
        # a loader of module-level parts: picklable, for a spawned worker as for a forked one
        loader = functools.partial(
            _granian_worker_app, codec, prefill_s, decode_s, host, port, os.getpid()
        )
        server.serve(target_loader=loader, wrap_loader=False)
    finally:
        reserved.close()


def _granian_worker_app(
    codec: str, prefill_s: float, decode_s: float, host: str, port: int, main_pid: int
) -> Starlette:
    """In granian's worker, once it has made its event loop and before it binds: the app, and a
    thread that announces the address when the worker accepts a connection (a client that
    connects on the announcement must not be refused)."""
    _end_with(main_pid)
    app = _app(codec, prefill_s, decode_s)
    # the loop granian made for this worker is the current one (granian's loop builders set it)
    loop = loops.kind(asyncio.get_event_loop())
    announcer = threading.Thread(
        target=_announce_when_accepting, args=(host, port, loop), name="announce", daemon=True
    )
    announcer.start()
    return app


def _end_with(main_pid: int) -> None:
    """SIGTERM this worker when granian's main process ends, however it ends: a stop that
    times out kills the process it started (SIGKILL), and granian's worker would outlive it,
    serving and holding the port. Linux's ``PR_SET_PDEATHSIG``; elsewhere, nothing."""
    if not sys.platform.startswith("linux"):
        return
    pr_set_pdeathsig = 1  # <linux/prctl.h>
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != main_pid:  # it ended before the request: nobody will signal
        os.kill(os.getpid(), signal.SIGTERM)


def _announce_when_accepting(host: str, port: int, loop: str) -> None:
    deadline = time.monotonic() + ACCEPT_TIMEOUT_S
    while True:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                break
        except OSError as exc:
            if time.monotonic() > deadline:
                print(f"granian did not accept on {host}:{port}: {exc}", file=sys.stderr)
                return
            time.sleep(0.01)
    print(_announcement(host, port, loop), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m inferwire.bench.procs.peer_servers", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--server", required=True, choices=PEERS)
    parser.add_argument("--codec", default="orjson", choices=ic.names())
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    parser.add_argument(
        "--http2",
        action="store_true",
        help="HTTP/2 (h2c, prior knowledge): Hypercorn and granian only. Hypercorn serves "
        "HTTP/1.1 and h2c on the same port either way, and this states which the client will "
        "speak; granian serves the one it is told (--http 2, else --http 1)",
    )
    parser.add_argument("--prefill-ms", type=float, default=0.0, help="time to first token")
    parser.add_argument("--decode-ms", type=float, default=0.0, help="time per output token")
    parser.add_argument(
        "--loop",
        choices=loops.LOOPS,
        default="auto",
        help="the event loop: auto is uvloop when installed",
    )
    args = parser.parse_args(argv)
    if args.http2 and args.server not in HTTP2_PEERS:
        parser.error(
            "--http2: hypercorn and granian only (uvicorn's HTTP/2 needs zttp, not installed here)"
        )
    prefill_s, decode_s = args.prefill_ms / 1000, args.decode_ms / 1000
    app = _app(args.codec, prefill_s, decode_s)  # a codec without token streams fails here
    if args.server == "granian":
        # granian runs its own processes, and its worker makes its loop and its app (the same)
        _serve_granian(args.codec, prefill_s, decode_s, args.host, args.port, args.http2, args.loop)
        return 0
    sock = _listen(args.host, args.port)
    serve = _serve_hypercorn if args.server == "hypercorn" else _serve_uvicorn
    loops.run(serve(app, sock), args.loop)
    return 0


def peer(server: str, codec: str = "orjson", *options: str) -> server_process.ServerProcess:
    """A peer server (not started; use ``with``), as ``server_process.serve`` is one of ours,
    on the run's loop unless ``options`` name one."""
    if server not in PEERS:
        raise ValueError(f"unknown peer {server!r}; choose from {', '.join(PEERS)}")
    process = server_process.ServerProcess()
    process.args = [
        sys.executable,
        "-m",
        "inferwire.bench.procs.peer_servers",
        "--server",
        server,
        "--codec",
        codec,
        *loops.with_loop(options),
    ]
    return process


if __name__ == "__main__":
    sys.exit(main())
