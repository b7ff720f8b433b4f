"""A stdlib-only OpenAI-compatible chat server that streams what reasoning models, tool-calling
models and multi-token chunks look like, written for the load generator's tests (none of
inferwire's code). Run: ``python kinds_server.py --ttft-ms 20 --itl-ms 5``; it prints
``listening on 127.0.0.1:PORT``.

Every stream opens with a role-only delta, paces its token-carrying chunks (``--ttft-ms`` before
the first, ``--itl-ms`` between the next), ends each choice with a ``finish_reason``, sends the
usage when ``stream_options.include_usage`` is set, then ``data: [DONE]``. The model picks what
it carries:

``two-per-chunk``         ``max_tokens`` tokens, two a content chunk; with ``return_token_ids``
                          each choice carries its two ids (as vLLM's), with
                          ``stream_options.continuous_usage_stats`` every chunk carries the
                          running usage (as vLLM's), else neither
``reasoning``             ``--reasoning`` deltas of ``reasoning_content``, then ``max_tokens``
                          of content; the usage gives ``completion_tokens_details``
``reasoning-counted``     the same with the field named ``reasoning`` and no details
``tool-call``             two tool calls: the first in argument fragments, the second whole
and faulty ones:
``tool-args-broken``      the first call's arguments never close their object
``tool-args-unstarted``   arguments for call 1, which no fragment started (no id, no name)
``content-after-finish``  a content delta after the choice's finish_reason
``reasoning-lying-usage`` more reasoning tokens in the usage than completion tokens
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

MODELS = (
    "two-per-chunk",
    "reasoning",
    "reasoning-counted",
    "tool-call",
    "tool-args-broken",
    "tool-args-unstarted",
    "content-after-finish",
    "reasoning-lying-usage",
)
PROMPT_TOKENS = 7
FIRST_CALL = ('{"city": ', '"Paris", ', '"unit": "c"}')
SECOND_CALL = '{"tz": "CET"}'


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(obj: dict[str, Any]) -> bytes:
    return _chunked(b"data: " + json.dumps(obj).encode() + b"\n\n")


def _usage(completion: int, reasoning: int | None = None) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": completion,
        "total_tokens": PROMPT_TOKENS + completion,
    }
    if reasoning is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return usage


def _deltas(model: str, request: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    """The stream's choice objects after the role-only one, each one chunk's, in order."""
    tokens = int(request.get("max_tokens") or args.tokens)
    if model == "two-per-chunk":
        ids = bool(request.get("return_token_ids"))
        out = []
        for k in range(0, tokens, 2):
            choice: dict[str, Any] = {"index": 0, "delta": {"content": f" w{k} w{k + 1}"}}
            if ids:
                choice["token_ids"] = [k, k + 1]
            out.append(choice)
        return out
    if model.startswith("reasoning"):
        field = "reasoning" if model == "reasoning-counted" else "reasoning_content"
        thinking = [{"index": 0, "delta": {field: f" r{k}"}} for k in range(args.reasoning)]
        return thinking + [{"index": 0, "delta": {"content": f" w{k}"}} for k in range(tokens)]
    if model == "content-after-finish":
        return [{"index": 0, "delta": {"content": f" w{k}"}} for k in range(tokens)]
    # a tool call streamed as OpenAI streams it: id and name first, then argument fragments
    first = (*FIRST_CALL[:-1], '"unit": "c"') if model == "tool-args-broken" else FIRST_CALL
    opening = {"name": "get_weather", "arguments": ""}
    calls: list[dict[str, Any]] = [
        {"index": 0, "id": "call_0", "type": "function", "function": opening}
    ]
    calls += [{"index": 0, "function": {"arguments": part}} for part in first]
    if model == "tool-args-unstarted":
        calls.append({"index": 1, "function": {"arguments": SECOND_CALL}})
    else:
        second = {"name": "get_time", "arguments": SECOND_CALL}
        calls.append({"index": 1, "id": "call_1", "type": "function", "function": second})
    return [{"index": 0, "delta": {"tool_calls": [call]}} for call in calls]


def _final_usage(model: str, deltas: list[dict[str, Any]], args: argparse.Namespace) -> Any:
    if model == "two-per-chunk":
        return _usage(2 * len(deltas))
    if model == "reasoning":
        return _usage(len(deltas), args.reasoning)
    if model == "reasoning-counted":
        return _usage(len(deltas))
    if model == "reasoning-lying-usage":
        return _usage(len(deltas), len(deltas) + 5)
    return _usage(len(deltas))


async def _stream(
    writer: asyncio.StreamWriter, request: dict[str, Any], args: argparse.Namespace
) -> None:
    model = str(request.get("model", "two-per-chunk"))
    options = request.get("stream_options") or {}
    continuous = bool(options.get("continuous_usage_stats")) and model == "two-per-chunk"
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": int(time.time())}
    base["model"] = model
    role: dict[str, Any] = {**base, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}
    if continuous:
        role["usage"] = _usage(0)
    writer.write(_event(role))
    await writer.drain()
    await asyncio.sleep(args.ttft_ms / 1000)
    deltas = _deltas(model, request, args)
    finish = "tool_calls" if model.startswith("tool") else "length"
    for k, choice in enumerate(deltas):
        if k:
            await asyncio.sleep(args.itl_ms / 1000)
        last = k == len(deltas) - 1
        chunk: dict[str, Any] = {**base, "choices": [{**choice, "finish_reason": None}]}
        if last and not model.startswith("tool"):
            chunk["choices"][0]["finish_reason"] = finish
        if continuous:
            chunk["usage"] = _usage(2 * (k + 1))
        writer.write(_event(chunk))
        await writer.drain()
    if model.startswith("tool"):  # as OpenAI ends a tool call: an empty delta with the reason
        ending = {"index": 0, "delta": {}, "finish_reason": finish}
        writer.write(_event({**base, "choices": [ending]}))
    if model == "content-after-finish":
        late = {"index": 0, "delta": {"content": " late"}, "finish_reason": None}
        writer.write(_event({**base, "choices": [late]}))
    if options.get("include_usage"):
        writer.write(_event({**base, "choices": [], "usage": _final_usage(model, deltas, args)}))
    writer.write(_chunked(b"data: [DONE]\n\n"))
    writer.write(b"0\r\n\r\n")
    await writer.drain()


def _respond(writer: asyncio.StreamWriter, status: str, body: bytes) -> None:
    writer.write(
        b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
        % (status.encode(), len(body), body)
    )


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
                listing = {"object": "list", "data": [{"id": m, "object": "model"} for m in MODELS]}
                _respond(writer, "200 OK", json.dumps(listing).encode())
            elif method == "POST" and path == "/v1/chat/completions":
                await _stream(writer, json.loads(body), args)
            else:
                _respond(writer, "404 Not Found", b"{}")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ttft-ms", type=float, default=20.0)
    parser.add_argument("--itl-ms", type=float, default=5.0)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--reasoning", type=int, default=4, help="reasoning deltas a stream")
    args = parser.parse_args()
    server = await asyncio.start_server(lambda r, w: _handle(r, w, args), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    print(f"listening on 127.0.0.1:{port}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
