"""A stdlib-only server of OpenAI's Responses API (streamed) and embeddings API, written for the
load generator's tests: none of inferwire's server code. Run: ``python apis_server.py``; it
prints ``listening on 127.0.0.1:PORT``.

``POST /v1/responses`` streams what OpenAI documents, each event as ``event: TYPE`` and
``data: JSON`` with a ``sequence_number``: ``response.created``, ``response.in_progress``, a
reasoning item (``response.reasoning_text.delta``), a message (``response.output_text.delta``),
a function call (``response.function_call_arguments.delta``), then ``response.completed`` with
``usage`` (``output_tokens`` = all the deltas, ``reasoning_tokens`` = the reasoning ones), no
``[DONE]``. ``max_output_tokens`` sets the message's deltas (default 4). The model picks the
stream: ``responses`` (that one), ``vllm`` (as vLLM's ``serving_responses.py`` sends it: the
message announced at the reasoning item's index, its deltas under the next index, its
``output_item.done`` never sent, a ``data: [DONE]`` after the end), ``capped`` (ends with
``response.incomplete``, reason ``max_output_tokens``), and faults: ``failed``
(``response.failed`` mid-stream), ``out-of-order`` (two sequence numbers swapped),
``delta-before-item`` (a text delta before any ``output_item.added``), ``no-completed`` (the
body ends without the end event), ``usage-lies`` (``output_tokens`` two short), ``filtered``
(``response.incomplete``, reason ``content_filter``), ``after-end`` (an event after
``response.completed``), ``error-event`` (``event: error`` mid-stream).

``POST /v1/embeddings`` answers ``input`` (a string or a list of strings) with 8-value vectors
derived from each text, as floats or base64 float32 (``encoding_format``), and
``usage.prompt_tokens`` = the inputs' words. Models: ``embed`` (right), ``wrong-count`` (one
embedding fewer), ``nan`` (a NaN value), ``ragged`` (the last vector one value short),
``bad-base64`` (a vector of 6 bytes: not whole float32), ``dup-index`` (index 0 twice).

``GET /stats`` says what the server received: request counts, inputs, formats, the last body.
Bodies that break the API's shape are answered 400.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import struct
from typing import Any

RESPONSES_MODELS = (
    "responses",
    "vllm",
    "capped",
    "failed",
    "out-of-order",
    "delta-before-item",
    "no-completed",
    "usage-lies",
    "filtered",
    "after-end",
    "error-event",
)
EMBEDDINGS_MODELS = ("embed", "wrong-count", "nan", "ragged", "bad-base64", "dup-index")
TTFT_S = 0.02
ITL_S = 0.002
REASONING_DELTAS = 3
ARGUMENT_DELTAS = ('{"city": ', '"Paris"}')
DIMENSIONS = 8

STATS: dict[str, Any] = {
    "responses": 0,
    "embeddings_requests": 0,
    "embeddings_inputs": 0,
    "formats": {},
    "last_responses_body": None,
}


def _piece(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _json_response(writer: asyncio.StreamWriter, status: str, obj: Any) -> None:
    data = json.dumps(obj).encode()  # NaN written as NaN, as Python servers do
    writer.write(
        b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
        % (status.encode(), len(data), data)
    )


class _Events:
    """Writes one Responses stream's events, numbering them."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.sequence = 0

    def send(self, kind: str, sequence: int | None = None, **fields: Any) -> None:
        number = self.sequence if sequence is None else sequence
        self.sequence += 1
        obj = {"type": kind, "sequence_number": number, **fields}
        self.writer.write(
            _piece(b"event: %s\ndata: %s\n\n" % (kind.encode(), json.dumps(obj).encode()))
        )

    async def delta(
        self, kind: str, index: int, text: str, sequence: int | None = None, **extra: Any
    ) -> None:
        await asyncio.sleep(ITL_S)
        self.send(kind, sequence, output_index=index, item_id=f"item_{index}", delta=text, **extra)
        await self.writer.drain()


def _response(status: str, usage: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"id": "resp_1", "object": "response", "status": status, "usage": usage, **extra}


async def _responses(writer: asyncio.StreamWriter, request: dict[str, Any]) -> None:
    model = request.get("model", "responses")
    words = int(request.get("max_output_tokens") or 4)
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    events = _Events(writer)
    events.send("response.created", response=_response("in_progress"))
    events.send("response.in_progress", response=_response("in_progress"))
    writer.write(_piece(b": keep-alive\n\n"))
    await writer.drain()
    await asyncio.sleep(TTFT_S)
    if model == "delta-before-item":
        await events.delta("response.output_text.delta", 0, "early")
    vllm = model == "vllm"
    events.send("response.output_item.added", output_index=0, item={"type": "reasoning", "id": "r"})
    for k in range(REASONING_DELTAS):
        await events.delta("response.reasoning_text.delta", 0, f" think{k}", content_index=0)
    events.send("response.reasoning_text.done", output_index=0, text="...")
    events.send("response.output_item.done", output_index=0, item={"type": "reasoning"})
    # vLLM announces the message at the reasoning item's index and streams it under the next
    message = 0 if vllm else 1
    events.send("response.output_item.added", output_index=message, item={"type": "message"})
    events.send("response.content_part.added", output_index=1, content_index=0, part={})
    for k in range(words):
        if model == "failed" and k == 2:
            error = {"code": "server_error", "message": "the engine died"}
            events.send("response.failed", response=_response("failed", error=error))
            await writer.drain()
            writer.write(b"0\r\n\r\n")
            return
        if model == "error-event" and k == 2:
            events.send("error", code="server_error", message="overloaded")
        sequence = None
        if model == "out-of-order" and k in (1, 2):  # the two deltas' numbers swapped
            sequence = events.sequence + (1 if k == 1 else -1)
        await events.delta("response.output_text.delta", 1, f" w{k}", sequence, content_index=0)
    events.send("response.output_text.done", output_index=1, content_index=0, text="...")
    events.send("response.content_part.done", output_index=1, content_index=0, part={})
    if not vllm:
        events.send("response.output_item.done", output_index=1, item={"type": "message"})
        call = {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": ""}
        events.send("response.output_item.added", output_index=2, item=call)
        for fragment in ARGUMENT_DELTAS:
            await events.delta("response.function_call_arguments.delta", 2, fragment)
        events.send("response.function_call_arguments.done", output_index=2, arguments="{}")
        events.send("response.output_item.done", output_index=2, item=call)
    calls = 0 if vllm else len(ARGUMENT_DELTAS)
    output = REASONING_DELTAS + words + calls - (2 if model == "usage-lies" else 0)
    usage = {
        "input_tokens": len(str(request.get("input")).split()),
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": REASONING_DELTAS},
        "total_tokens": output + 7,
    }
    if model in ("capped", "filtered"):
        reason = "max_output_tokens" if model == "capped" else "content_filter"
        details = {"reason": reason}
        events.send(
            "response.incomplete",
            response=_response("incomplete", usage, incomplete_details=details),
        )
    elif model != "no-completed":
        events.send("response.completed", response=_response("completed", usage))
    if model == "after-end":
        events.send("response.output_text.delta", output_index=1, delta="late")
    if vllm:
        writer.write(_piece(b"data: [DONE]\n\n"))
    writer.write(b"0\r\n\r\n")
    await writer.drain()


def _vector(text: str) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    return [(byte - 128) / 128 for byte in digest[:DIMENSIONS]]


def _embeddings(request: dict[str, Any]) -> tuple[str, Any]:
    model = request.get("model", "embed")
    given = request.get("input")
    texts = [given] if isinstance(given, str) else given
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        return "400 Bad Request", {"error": {"message": "input: a string or a list of strings"}}
    encoding = request.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        return "400 Bad Request", {"error": {"message": "encoding_format: float or base64"}}
    STATS["embeddings_requests"] += 1
    STATS["embeddings_inputs"] += len(texts)
    STATS["formats"][encoding] = STATS["formats"].get(encoding, 0) + 1
    vectors = [_vector(text) for text in texts]
    indices = list(range(len(texts)))
    if model == "wrong-count":
        vectors, indices = vectors[:-1], indices[:-1]
    elif model == "nan":
        vectors[0][3] = float("nan")
    elif model == "ragged":
        vectors[-1] = vectors[-1][:-1]
    elif model == "dup-index":
        indices[-1] = 0
    data = []
    for index, vector in zip(indices, vectors, strict=True):
        embedding: Any = vector
        if encoding == "base64":
            raw = struct.pack(f"<{len(vector)}f", *vector)
            embedding = base64.b64encode(raw[:6] if model == "bad-base64" else raw).decode()
        elif model == "bad-base64":
            embedding = "not base64!"
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    words = sum(len(text.split()) for text in texts)
    usage = {"prompt_tokens": words, "total_tokens": words}
    return "200 OK", {"object": "list", "data": data, "model": model, "usage": usage}


def _responses_request_error(request: dict[str, Any]) -> str | None:
    given = request.get("input")
    if not isinstance(given, str) and not (
        isinstance(given, list) and all(isinstance(item, dict) for item in given)
    ):
        return "input: a string or a list of input items"
    if request.get("stream") is not True:
        return "this server only streams"
    cap = request.get("max_output_tokens")
    if cap is not None and (type(cap) is not int or cap < 1):
        return "max_output_tokens: a positive integer"
    return None


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = dict(line.split(":", 1) for line in lines[1:] if ":" in line)
            headers = {k.strip().lower(): v.strip() for k, v in headers.items()}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            if method == "GET" and path == "/v1/models":
                models = [*RESPONSES_MODELS, *EMBEDDINGS_MODELS]
                listing = [{"id": m, "object": "model"} for m in models]
                _json_response(writer, "200 OK", {"object": "list", "data": listing})
            elif method == "GET" and path == "/stats":
                _json_response(writer, "200 OK", STATS)
            elif method == "POST" and path == "/v1/responses":
                request = json.loads(body)
                error = _responses_request_error(request)
                if error:
                    _json_response(writer, "400 Bad Request", {"error": {"message": error}})
                else:
                    STATS["responses"] += 1
                    STATS["last_responses_body"] = request
                    await _responses(writer, request)
            elif method == "POST" and path == "/v1/embeddings":
                _json_response(writer, *_embeddings(json.loads(body)))
            else:
                writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main() -> None:
    server = await asyncio.start_server(_handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    print(f"listening on 127.0.0.1:{port}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
