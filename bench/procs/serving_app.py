"""The serving benchmark's server: one FastAPI app on uvicorn streaming the same tokens the
ways serving code does today and through :mod:`inferwire.serving`, one route per way:

=======================================  ==================================================
route                                    each chunk
=======================================  ==================================================
``POST /pydantic/v1/chat/completions``   as vLLM's OpenAI server: its pydantic chunk models
                                         (:mod:`.vllm_protocol`), ``model_dump_json(
                                         exclude_unset=True)``, ``f"data: {data}\\n\\n"``
``POST /dicts/v1/chat/completions``      as a typical app: a dict, ``json.dumps``, an SSE
                                         string
``POST /helpers/{codec}/v1/chat/...``    :class:`~inferwire.serving.ChunkBuilder` and
                                         :func:`inferwire.serving.starlette.stream_response`
                                         in ``codec`` (negotiated from ``Accept``); the
                                         chunks ready at once in one write, unless
                                         ``?coalesce=1`` (one write a chunk)
=======================================  ==================================================

Every route parses the request the same way (:class:`~inferwire.serving.ChatCompletionRequest`,
once a request), takes the seeded ``stream-256`` tokens of the request's ``seed`` (built once
and cached, as a model's output is handed over already made), and yields one chunk per token
step from an async generator into a ``StreamingResponse``, the first chunk with the assistant
role and the last with ``finish_reason: "stop"``; only the chunk's making and encoding differ.

    python -m inferwire.bench.procs.serving_app --port 0   # "listening on HOST:PORT loop=KIND"
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Final

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

import inferwire.codecs as ic
import inferwire.serving as iws
from inferwire._runtime import loops
from inferwire.serving import starlette as iws_starlette
from inferwire.serving.stream import COALESCE
from inferwire.transports import server_process
from inferwire.workloads import MODEL, token_stream_source

from . import vllm_protocol

WORKLOAD: Final = "stream-256"
HELPER_CODECS: Final = ("orjson", "msgspec-json", "delta")
EVENT_STREAM: Final = "text/event-stream"


@functools.lru_cache(maxsize=16)
def steps(seed: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The text and token ids of each step of the seeded stream: every route's tokens."""
    return tuple((c.text, c.token_ids) for c in token_stream_source(WORKLOAD, seed))


async def _pydantic(model: str, seed: int) -> AsyncIterator[str]:
    """vLLM's ``chat_completion_stream_generator``, its per-token part."""
    request_id = f"chatcmpl-{vllm_protocol.random_uuid()}"
    created_time = int(time.time())
    tokens = steps(seed)
    last = len(tokens) - 1
    for i, (text, _) in enumerate(tokens):
        delta_message = (
            vllm_protocol.DeltaMessage(role="assistant", content=text)
            if i == 0
            else vllm_protocol.DeltaMessage(content=text)
        )
        choice_data = vllm_protocol.ChatCompletionResponseStreamChoice(
            index=0, delta=delta_message, logprobs=None, finish_reason="stop" if i == last else None
        )
        chunk = vllm_protocol.ChatCompletionStreamResponse(
            id=request_id,
            object="chat.completion.chunk",
            created=created_time,
            choices=[choice_data],
            model=model,
        )
        data = chunk.model_dump_json(exclude_unset=True)
        yield f"data: {data}\n\n"
    yield "data: [DONE]\n\n"


async def _dicts(model: str, seed: int) -> AsyncIterator[str]:
    """What an app written by hand does: a dict per chunk, ``json.dumps``."""
    request_id = f"chatcmpl-{vllm_protocol.random_uuid()}"
    created = int(time.time())
    tokens = steps(seed)
    last = len(tokens) - 1
    for i, (text, _) in enumerate(tokens):
        delta = {"role": "assistant", "content": text} if i == 0 else {"content": text}
        chunk = {
            "id": request_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "delta": delta,
                    "logprobs": None,
                    "finish_reason": "stop" if i == last else None,
                }
            ],
        }
        yield f"data: {json.dumps(chunk)}\n\n"
    yield "data: [DONE]\n\n"


async def _helpers(model: str, seed: int) -> AsyncIterator[ic.TokenChunk]:
    """The same tokens through :class:`~inferwire.serving.ChunkBuilder`."""
    builder = iws.ChunkBuilder(model)
    tokens = steps(seed)
    last = len(tokens) - 1
    for i, (text, ids) in enumerate(tokens):
        yield builder.finish(text, ids) if i == last else builder.chunk(text, ids)


def make_app() -> FastAPI:
    app = FastAPI()
    iws_starlette.install(app)

    async def parsed(request: Request) -> iws.ChatCompletionRequest:
        return iws.ChatCompletionRequest.parse(await request.body())

    @app.post("/pydantic/v1/chat/completions")
    async def pydantic_chunks(request: Request) -> Response:
        chat = await parsed(request)
        return StreamingResponse(
            _pydantic(chat.model or MODEL, chat.seed or 0), media_type=EVENT_STREAM
        )

    @app.post("/dicts/v1/chat/completions")
    async def dict_chunks(request: Request) -> Response:
        chat = await parsed(request)
        return StreamingResponse(
            _dicts(chat.model or MODEL, chat.seed or 0), media_type=EVENT_STREAM
        )

    @app.post("/helpers/{codec}/v1/chat/completions")
    async def helper_chunks(codec: str, request: Request, coalesce: int = COALESCE) -> Response:
        chat = await parsed(request)
        if codec not in HELPER_CODECS:
            return iws_starlette.error_response(404, f"no route for codec {codec!r}")
        chosen = iws_starlette.negotiated(request, [codec])
        chunks = _helpers(chat.model or MODEL, chat.seed or 0)
        return iws_starlette.stream_response(chunks, chosen, coalesce=coalesce)

    return app


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # ours: see _serve


async def _serve(sock: socket.socket) -> None:
    config = uvicorn.Config(
        make_app(),
        http="httptools",
        loop=loops.kind(asyncio.get_running_loop()),
        access_log=False,
        log_level="warning",
    )
    server = _Server(config)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    host, port = sock.getsockname()[:2]
    print(f"listening on {host}:{port} loop={loops.running()}", flush=True)
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({stopping, serving}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    server.should_exit = True
    await serving


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferwire.bench.procs.serving_app")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--loop", choices=loops.LOOPS, default="auto")
    args = parser.parse_args(argv)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    sock.listen(1024)
    loops.run(_serve(sock), args.loop)
    return 0


def serving_app(*options: str) -> server_process.ServerProcess:
    """The app in a process of its own (not started; use ``with``), on the run's loop."""
    process = server_process.ServerProcess()
    process.args = [
        sys.executable,
        "-m",
        "inferwire.bench.procs.serving_app",
        *loops.with_loop(options),
    ]
    return process


if __name__ == "__main__":
    sys.exit(main())
