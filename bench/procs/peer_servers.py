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
  switches to h2, so no TLS is needed.

``--loop`` (default: ``auto``, uvloop when installed) picks the loop, so the peers run on the
same loop as the inferwire server they are compared with
(:func:`~inferwire.bench.procs.loops.requested_loop`); the announcement names it.

Response headers are the stacks' own defaults (``date``, ``server``, Starlette's
``; charset=utf-8`` on ``text/*``): what a user of them sends.

    python -m inferwire.bench.procs.peer_servers --server uvicorn --codec orjson --port 0
    python -m inferwire.bench.procs.peer_servers --server hypercorn --codec orjson --port 0 --http2

print ``listening on HOST:PORT loop=KIND`` first, like ``inferwire serve``, and stop on SIGTERM
or SIGINT. :func:`peer` is the :class:`~inferwire.transports.server_process.ServerProcess` for one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import TYPE_CHECKING, Final

import orjson

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire._runtime import loops
from inferwire.serving import error_body
from inferwire.transports import server_process
from inferwire.transports.openai_api import ApiError, parse_request
from inferwire.workloads import token_stream_source

if TYPE_CHECKING:
    from starlette.applications import Starlette

PEERS: Final = ("uvicorn", "hypercorn")
_BACKLOG: Final = 1024
"""Backlog of the socket we bind, until the server takes it over and listens with its own:
a client that connects as soon as the address is printed waits here, not refused."""
_MISSING: Final = "the peer servers need the bench extra: pip install 'inferwire[bench]'"


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
    authority = f"[{host}]" if ":" in host else host
    print(f"listening on {authority}:{port} loop={loops.running()}", flush=True)


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
        help="HTTP/2 (h2c, prior knowledge): Hypercorn only. Hypercorn serves HTTP/1.1 and "
        "h2c on the same port either way; this states which the client will speak",
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
    if args.http2 and args.server != "hypercorn":
        parser.error("--http2: only hypercorn (uvicorn's HTTP/2 needs zttp, not installed here)")
    service = it.SimulatedService(
        token_stream_source, prefill_s=args.prefill_ms / 1000, decode_s=args.decode_ms / 1000
    )
    app = make_app(service, ic.get(args.codec, extensions=True))
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
