"""A tiny OpenAI-compatible streaming server, written for the load generator's tests with the
standard library only: none of inferwire's server code, so the generator is checked against a
server it did not write. Run: ``python tiny_openai_server.py --ttft-ms 60 --itl-ms 20``; it
prints ``listening on 127.0.0.1:PORT``.

It streams what real servers send: a role-only first delta, a keep-alive comment, an empty
delta mid-stream, ``n`` choices interleaved, a usage-only last chunk (``choices: []``) when
``stream_options.include_usage`` is set, then ``data: [DONE]``. The model name picks a fault:
``paced`` (none), ``no-done`` (no ``[DONE]``), ``lying-usage`` (usage three tokens short),
``error-mid`` (an error object after three tokens), ``no-finish`` (no ``finish_reason``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

MODELS = ("paced", "no-done", "lying-usage", "error-mid", "no-finish")


def _chunk(obj: dict[str, Any]) -> bytes:
    data = b"data: " + json.dumps(obj).encode() + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _stream(
    writer: asyncio.StreamWriter, request: dict[str, Any], chat: bool, args: argparse.Namespace
) -> None:
    model = request.get("model", "paced")
    n = int(request.get("n", 1))
    tokens = int(request.get("max_tokens") or args.tokens)
    include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    base = {"id": "cmpl-1", "created": int(time.time()), "model": model}
    base["object"] = "chat.completion.chunk" if chat else "text_completion"

    def choice(index: int, text: str | None, finish: str | None) -> dict[str, Any]:
        if chat:
            delta = {} if text is None else {"content": text}
            return {"index": index, "delta": delta, "finish_reason": finish}
        return {"index": index, "text": text or "", "finish_reason": finish}

    if chat:
        role = [{"index": i, "delta": {"role": "assistant", "content": ""}} for i in range(n)]
        writer.write(_chunk({**base, "choices": role}))
    writer.write(b"%x\r\n%s\r\n" % (len(b": keep-alive\n\n"), b": keep-alive\n\n"))
    await writer.drain()
    await asyncio.sleep(args.ttft_ms / 1000)
    for k in range(tokens):
        if k:
            await asyncio.sleep(args.itl_ms / 1000)
        if model == "error-mid" and k == 3:
            writer.write(_chunk({"error": {"message": "the engine died", "code": 500}}))
            break
        last = k == tokens - 1
        finish = "length" if last and model != "no-finish" else None
        writer.write(_chunk({**base, "choices": [choice(i, f" w{k}", finish) for i in range(n)]}))
        if k == tokens // 2:
            writer.write(_chunk({**base, "choices": [choice(0, None, None)]}))  # empty delta
        await writer.drain()
    if include_usage and model != "error-mid":
        completion = tokens * n - (3 if model == "lying-usage" else 0)
        usage = {"prompt_tokens": 7, "completion_tokens": completion}
        usage["total_tokens"] = 7 + completion
        writer.write(_chunk({**base, "choices": [], "usage": usage}))
    if model != "no-done":
        writer.write(b"%x\r\n%s\r\n" % (len(b"data: [DONE]\n\n"), b"data: [DONE]\n\n"))
    writer.write(b"0\r\n\r\n")
    await writer.drain()


async def _handle(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, args: argparse.Namespace
) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = dict(line.split(":", 1) for line in lines[1:] if ":" in line)
            headers = {k.strip().lower(): v.strip() for k, v in headers.items()}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            if method == "GET" and path == "/v1/models":
                data = json.dumps(
                    {"object": "list", "data": [{"id": m, "object": "model"} for m in MODELS]}
                ).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(data), data)
                )
            elif method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
                if (
                    args.require_key
                    and headers.get("authorization") != f"Bearer {args.require_key}"
                ):
                    data = b'{"error": {"message": "bad key", "code": 401}}'
                    writer.write(
                        b"HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\n"
                        b"content-length: %d\r\n\r\n%s" % (len(data), data)
                    )
                else:
                    request = json.loads(body)
                    await _stream(writer, request, path.endswith("chat/completions"), args)
            else:
                writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ttft-ms", type=float, default=60.0)
    parser.add_argument("--itl-ms", type=float, default=20.0)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--require-key", default="")
    args = parser.parse_args()
    server = await asyncio.start_server(lambda r, w: _handle(r, w, args), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    print(f"listening on 127.0.0.1:{port}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
