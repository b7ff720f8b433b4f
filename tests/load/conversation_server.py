"""An OpenAI-compatible chat server that checks the history it receives, written for the load
generator's conversation tests with the standard library only (none of inferwire's code). Run:
``python conversation_server.py --ttft-ms 5 --itl-ms 1``; it prints ``listening on
127.0.0.1:PORT``.

Each reply is made from the messages before it and its length: its first word is
``h<digest>n<length>`` (the digest of the messages and the length), then ``w1`` ... up to
``length`` words, one word (a token) a chunk. A request whose history holds an assistant
message that is not the reply this server made to the messages before it (its first word
names the length, so any reply can be made again) is answered 400, as is one whose last
message is not the user's. So a conversation goes on only if the client sent back each reply
exactly as the server streamed it.

Usage counts words: ``prompt_tokens`` over every message's content, ``completion_tokens`` the
reply's; ``max_tokens`` (default ``--tokens``) is the reply's length. The model picks a fault:
``echo`` (none), ``fail-second-turn`` (a 500 for any request with two user messages).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import re
import time
from typing import Any

MODELS = ("echo", "fail-second-turn")
_FIRST = re.compile(r"h([0-9a-f]{12})n(\d+)")


def reply_for(messages: list[dict[str, Any]], length: int) -> str:
    """The reply this server makes to ``messages``, ``length`` words long."""
    digest = hashlib.sha256(json.dumps([messages, length], sort_keys=True).encode()).hexdigest()
    return " ".join([f"h{digest[:12]}n{length}", *(f"w{k}" for k in range(1, length))])


def history_fault(messages: object) -> str | None:
    """Why the history is not one this server could have had, or None."""
    if not isinstance(messages, list) or not messages:
        return "messages is not a non-empty list"
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            return f"message {i} is not an object with a string content"
        if message.get("role") != "assistant":
            continue
        found = _FIRST.match(message["content"])
        if found is None:
            return f"message {i}: an assistant message this server did not write"
        if message["content"] != reply_for(messages[:i], int(found.group(2))):
            return f"message {i}: the assistant message is not the reply this server sent"
    if messages[-1].get("role") != "user":
        return "the last message is not the user's"
    return None


def _chunk(obj: dict[str, Any]) -> bytes:
    data = b"data: " + json.dumps(obj).encode() + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


def _reply(writer: asyncio.StreamWriter, status: str, obj: object) -> None:
    data = json.dumps(obj).encode()
    writer.write(
        b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
        % (status.encode(), len(data), data)
    )


async def _chat(
    writer: asyncio.StreamWriter, request: dict[str, Any], args: argparse.Namespace
) -> None:
    messages = request.get("messages")
    fault = history_fault(messages)
    if fault is not None:
        _reply(writer, "400 Bad Request", {"error": {"message": fault, "code": 400}})
        return
    assert isinstance(messages, list)
    model = request.get("model", "echo")
    if model == "fail-second-turn" and sum(m.get("role") == "user" for m in messages) == 2:
        _reply(writer, "500 Internal Server Error", {"error": {"message": "failed", "code": 500}})
        return
    length = int(request.get("max_tokens") or args.tokens)
    words = reply_for(messages, length).split(" ")
    prompt_tokens = sum(len(m["content"].split()) for m in messages)
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    base = {"id": "chatcmpl-1", "created": int(time.time()), "model": model}
    base["object"] = "chat.completion.chunk"
    writer.write(_chunk({**base, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}))
    await writer.drain()
    await asyncio.sleep(args.ttft_ms / 1000)
    for k, word in enumerate(words):
        if k:
            await asyncio.sleep(args.itl_ms / 1000)
        finish = "length" if k == len(words) - 1 else None
        delta = {"content": word if k == 0 else " " + word}
        writer.write(
            _chunk({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
        await writer.drain()
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": length}
    usage["total_tokens"] = prompt_tokens + length
    writer.write(_chunk({**base, "choices": [], "usage": usage}))
    writer.write(b"%x\r\n%s\r\n" % (len(b"data: [DONE]\n\n"), b"data: [DONE]\n\n"))
    writer.write(b"0\r\n\r\n")


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
                _reply(writer, "200 OK", {"object": "list", "data": [{"id": m} for m in MODELS]})
            elif method == "POST" and path == "/v1/chat/completions":
                await _chat(writer, json.loads(body), args)
            else:
                writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ttft-ms", type=float, default=5.0)
    parser.add_argument("--itl-ms", type=float, default=1.0)
    parser.add_argument("--tokens", type=int, default=4)
    args = parser.parse_args()
    server = await asyncio.start_server(lambda r, w: _handle(r, w, args), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    print(f"listening on 127.0.0.1:{port}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
