"""An OpenAI-compatible endpoint on FastAPI whose token streams go out in the codec the client
asks for: OpenAI's JSON events by default (the ``openai`` SDK works unchanged), or a binary
codec's frames when ``Accept`` names its stream type (``inferwire.serving.httpx`` reads them).

    python examples/openai_server.py --port 8000          # prints "listening on HOST:PORT"
    python examples/openai_client.py http://127.0.0.1:8000 --codec delta

Routes: ``POST /v1/chat/completions`` (streamed and not), ``GET /v1/models``. The tokens are a
seeded workload's (``stream-256``: the request's ``seed`` picks the stream; the prompt does not
change it), cut by ``max_tokens`` / ``max_completion_tokens`` with ``finish_reason: "length"``.
Needs the serving extra, FastAPI and uvicorn (``pip install 'inferwire[bench]'`` has them).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import orjson
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response

import inferwire.codecs as ic
import inferwire.serving as iws
from inferwire.serving import starlette as iws_starlette
from inferwire.workloads import MODEL, token_stream_source

WORKLOAD = "stream-256"
OFFERS = ("orjson", "msgspec-msgpack", "protobuf", "delta")
"""What this server streams in, its default (OpenAI's JSON events) first."""


def make_app(*, decode_s: float = 0.0, models: Sequence[str] = (MODEL,)) -> FastAPI:
    """The app; ``decode_s`` paces the stream (seconds a token), as a model would."""
    app = FastAPI(title="inferwire serving example")
    iws_starlette.install(app)  # RequestError -> 400, NotAcceptableError -> 406, OpenAI-shaped
    created = int(time.time())

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        data = [
            {"id": m, "object": "model", "created": created, "owned_by": "inferwire"}
            for m in models
        ]
        return {"object": "list", "data": data}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        chat = iws.ChatCompletionRequest.parse(await request.body())
        model = chat.model or models[0]
        if model not in models:
            return iws_starlette.error_response(
                404, f"The model `{model}` does not exist.", param="model"
            )
        if chat.choices != 1:
            return iws_starlette.error_response(400, "only n=1 is served", param="n")
        accept = request.headers.get("accept")
        if not chat.streaming:
            if not iws.quality(accept, iws.JSON):  # a whole answer is JSON only
                raise iws.NotAcceptableError(accept or "", [iws.JSON])
            return Response(orjson.dumps(await _whole(chat, model)), media_type=iws.JSON)
        codec = iws.negotiate(accept, OFFERS)  # before the stream starts: a 406 is still possible
        return iws_starlette.stream_response(_generate(chat, model, decode_s), codec)

    return app


def _tokens(chat: iws.ChatCompletionRequest) -> list[ic.TokenChunk]:
    return list(token_stream_source(WORKLOAD, chat.seed or 0))


async def _generate(
    chat: iws.ChatCompletionRequest, model: str, decode_s: float
) -> AsyncIterator[ic.TokenChunk]:
    """The response's chunks, as a model loop would hand them over: text and token ids."""
    builder = iws.ChunkBuilder(model, include_usage=chat.include_usage, prompt_tokens=5)
    steps = _tokens(chat)
    limit = chat.max_output_tokens
    for i, step in enumerate(steps):
        if decode_s:
            await asyncio.sleep(decode_s)
        tokens = builder.completion_tokens + len(step.token_ids)
        if limit is not None and tokens >= limit and i < len(steps) - 1:
            yield builder.finish(step.text, step.token_ids, finish_reason="length")
            return
        if i == len(steps) - 1:
            yield builder.finish(step.text, step.token_ids, finish_reason="stop")
        else:
            yield builder.chunk(step.text, step.token_ids)


async def _whole(chat: iws.ChatCompletionRequest, model: str) -> dict[str, Any]:
    """The ``chat.completion`` object of a request that did not ask for a stream."""
    chunks = [c async for c in _generate(chat, model, 0.0)]
    last = chunks[-1]
    completion = sum(len(c.token_ids) for c in chunks)
    return {
        "id": last.id,
        "object": "chat.completion",
        "created": last.created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "".join(c.text for c in chunks)},
                "logprobs": None,
                "finish_reason": last.finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": 5,
            "completion_tokens": completion,
            "total_tokens": 5 + completion,
        },
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0: any free port (printed)")
    parser.add_argument("--decode-ms", type=float, default=0.0, help="time per output token")
    args = parser.parse_args(argv)
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    sock.listen(1024)
    host, port = sock.getsockname()[:2]
    print(f"listening on {host}:{port}", flush=True)
    config = uvicorn.Config(make_app(decode_s=args.decode_ms / 1000), log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
