"""``inferwire load --api openai-responses`` and ``--api openai-embeddings``: the readers of
:mod:`inferwire.load.api_events` on hand-made events, then runs against a server written in the
tests (tests/load/apis_server.py, stdlib only), its faults included."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import struct
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from inferwire.cli import main as cli
from inferwire.codecs.errors import DuplicateFrameError, ReorderedFrameError
from inferwire.load import api_events, endpoints, openloop, targets
from inferwire.load.api_events import (
    EmbeddingsCheck,
    EmbeddingsMismatchError,
    PromptBatch,
    ResponsesReader,
)
from inferwire.load.api_streams import (
    DONE,
    ApiChunk,
    ApiStreamCheck,
    EventOrderError,
    ServerStreamError,
    ToolCallArgumentsError,
    Usage,
)
from inferwire.load.stream_content import ToolCallDelta
from inferwire.transports import ProtocolError

SERVER = Path(__file__).with_name("apis_server.py")
REASONING = 3  # the server's reasoning deltas
CALL = 2  # its function call's argument deltas
SERVER_TTFT_MS = 20.0


@dataclass(frozen=True)
class Prompt:
    text: str
    max_tokens: int | None = None
    messages: tuple[dict[str, str], ...] | None = None


# -- the Responses reader ------------------------------------------------------------------------


def _event(kind: str, sequence: object, **fields: Any) -> bytes:
    obj: dict[str, Any] = {"type": kind, **fields}
    if sequence is not None:
        obj["sequence_number"] = sequence
    return orjson.dumps(obj)


def _completed(sequence: int, output: int = 3, status: str = "completed") -> bytes:
    usage = {
        "input_tokens": 5,
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 1},
    }
    return _event("response.completed", sequence, response={"status": status, "usage": usage})


CALL_ITEM = {"type": "function_call", "call_id": "call_9", "name": "f", "arguments": ""}
WHOLE = [
    _event("response.created", 0, response={"status": "in_progress"}),
    _event("response.output_item.added", 1, output_index=0, item={"type": "reasoning"}),
    _event("response.reasoning_text.delta", 2, output_index=0, delta="hm"),
    _event("response.output_item.done", 3, output_index=0),
    _event("response.output_item.added", 4, output_index=1, item={"type": "message"}),
    _event("response.content_part.added", 5, output_index=1, part={}),
    _event("response.output_text.delta", 6, output_index=1, delta="Hi"),
    _event("response.some_future_event", 7, whatever=[1]),
    _event("response.output_item.done", 8, output_index=1),
    _event("response.output_item.added", 9, output_index=2, item=CALL_ITEM),
    _event("response.function_call_arguments.delta", 10, output_index=2, delta='{"a": '),
    _event("response.function_call_arguments.delta", 11, output_index=2, delta="1}"),
    _event("response.output_item.done", 12, output_index=2),
    _completed(13, output=4),
]


def _read(events: list[bytes]) -> tuple[ResponsesReader, list[ApiChunk]]:
    reader = ResponsesReader()
    return reader, [reader(data) for data in events]


def _checked(chunks: list[ApiChunk]) -> ApiStreamCheck:
    check = ApiStreamCheck(needs_finish=False)
    counted = sum(check.check(chunk) for chunk in [*chunks, DONE])
    check.finish(counted)
    return check


def test_responses_events_become_text_reasoning_a_call_and_the_usage() -> None:
    reader, chunks = _read(WHOLE)
    assert reader.ended
    assert [c.tokens for c in chunks] == [0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 0, 0]
    assert "".join(c.text for c in chunks) == "Hi"  # the reply: no reasoning, no call
    assert "".join(c.reasoning for c in chunks) == "hm"
    assert chunks[-1].usage == Usage(5, 4, 1)
    assert all(c.parse_ns > 0 for c in chunks)
    first, second = (c.tool_calls for c in chunks[10:12])
    assert first == (ToolCallDelta(0, 2, "call_9", "f", '{"a": '),)  # the first names the call
    assert second == (ToolCallDelta(0, 2, None, None, "1}"),)
    # the chat API's checks hold: the call assembled whole, reasoning counted apart
    check = _checked(chunks)
    assert (check.output_tokens, check.input_tokens) == (4, 5)
    assert check.content is not None
    assert (check.content.tool_calls, check.content.reasoning_tokens) == (1, 1)


def test_a_function_call_never_announced_or_cut_is_refused() -> None:
    stray = [ADDED, _event("response.function_call_arguments.delta", 1, output_index=0, delta="{")]
    with pytest.raises(EventOrderError, match="never"):
        _checked(_read([*stray, _completed(2, output=1)])[1])
    call = _event("response.output_item.added", 0, output_index=0, item=CALL_ITEM)
    cut = [call, _event("response.function_call_arguments.delta", 1, output_index=0, delta="{")]
    with pytest.raises(ToolCallArgumentsError):
        _checked(_read([*cut, _completed(2, output=1)])[1])


def test_responses_as_vllm_sends_them_are_whole() -> None:
    # vLLM announces the message at the reasoning item's index and streams it under the next,
    # sends no sequence gap but no .done for the last item, and may add a [DONE]
    reader, chunks = _read(
        [
            _event("response.output_item.added", 0, output_index=0),
            _event("response.reasoning_text.delta", 1, output_index=0, delta="a"),
            _event("response.output_item.done", 2, output_index=0),
            _event("response.output_item.added", 3, output_index=0),
            _event("response.output_text.delta", 4, output_index=1, delta="b"),
            _completed(5, output=2),
        ]
    )
    assert reader.ended
    assert sum(c.tokens for c in chunks) == 2


def test_sequence_numbers_may_skip_or_be_absent() -> None:
    reader, _ = _read(
        [
            _event("response.output_item.added", None),
            _event("response.output_text.delta", 4, delta="x"),
            _event("response.output_text.delta", None, delta="y"),
            _event("response.output_text.delta", 9, delta="z"),
            _completed(12),
        ]
    )
    assert reader.ended


def test_an_incomplete_response_that_reached_its_cap_ends_whole() -> None:
    usage = {"input_tokens": 1, "output_tokens": 1}
    capped = _event(
        "response.incomplete",
        2,
        response={"incomplete_details": {"reason": "max_output_tokens"}, "usage": usage},
    )
    reader, chunks = _read(
        [
            _event("response.output_item.added", 0),
            _event("response.output_text.delta", 1, delta="x"),
            capped,
        ]
    )
    assert reader.ended
    assert chunks[-1].usage == Usage(1, 1)


ADDED = _event("response.output_item.added", 0)


@pytest.mark.parametrize(
    ("events", "error", "message"),
    [
        ([ADDED, _event("response.output_text.delta", 0, delta="x")], DuplicateFrameError, "again"),
        (
            [
                ADDED,
                _event("response.created", 5),
                _event("response.output_text.delta", 3, delta="x"),
            ],
            ReorderedFrameError,
            "3 after 5",
        ),
        ([_event("response.output_text.delta", 0, delta="x")], EventOrderError, "no output item"),
        (
            [
                ADDED,
                _event("response.output_item.done", 1),
                _event("response.reasoning_text.delta", 2, delta="x"),
            ],
            EventOrderError,
            "no output item",
        ),
        ([_event("response.output_item.done", 0)], EventOrderError, "no output item"),
        (
            [ADDED, _completed(1), _event("response.output_text.delta", 2, delta="x")],
            EventOrderError,
            "after the end",
        ),
        ([ADDED, _completed(1), _completed(2)], EventOrderError, "after the end"),
        (
            [ADDED, _event("response.output_text.delta", 1, delta={"content": "x"})],
            ProtocolError,
            "not a string",
        ),
        ([_event("response.created", "1")], ProtocolError, "not an integer"),
        ([b'{"sequence_number": 0}'], ProtocolError, "without a type"),
        ([b"not json"], ProtocolError, "not JSON"),
        ([b"[1]"], ProtocolError, "not a JSON object"),
        (
            [_event("response.failed", 0, response={"error": {"message": "engine died"}})],
            ServerStreamError,
            "engine died",
        ),
        (
            [
                _event(
                    "response.incomplete",
                    0,
                    response={"incomplete_details": {"reason": "content_filter"}},
                )
            ],
            ServerStreamError,
            "content_filter",
        ),
        ([_event("error", 0, message="overloaded")], ServerStreamError, "overloaded"),
        ([ADDED, _completed(1, status="cancelled")], ServerStreamError, "cancelled"),
    ],
    ids=[
        "repeated-sequence",
        "sequence-back",
        "delta-before-item",
        "delta-after-items-done",
        "done-before-added",
        "delta-after-end",
        "two-ends",
        "delta-not-text",
        "sequence-not-int",
        "no-type",
        "not-json",
        "not-object",
        "failed",
        "incomplete-filtered",
        "error",
        "cancelled",
    ],
)
def test_bad_responses_events_are_typed_errors(
    events: list[bytes], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        _read(events)


# -- the embeddings reader -----------------------------------------------------------------------


def _embeddings(vectors: list[Any], *, indices: list[Any] | None = None, usage: int = 6) -> bytes:
    indices = list(range(len(vectors))) if indices is None else indices
    data = [
        {"object": "embedding", "index": i, "embedding": v}
        for i, v in zip(indices, vectors, strict=True)
    ]
    return json.dumps({"data": data, "usage": {"prompt_tokens": usage}}).encode()


def _b64(*values: float) -> str:
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()


def test_embeddings_in_floats_and_base64() -> None:
    floats = api_events.embeddings_chunk(_embeddings([[0.5, 1.0], [2.0, -1.0]]), inputs=2)
    assert (floats.inputs, floats.dimensions, floats.usage, floats.tokens) == (2, 2, Usage(6, 0), 0)
    packed = api_events.embeddings_chunk(_embeddings([_b64(1.5, 2.5, 3.5)], usage=2), inputs=1)
    assert (packed.inputs, packed.dimensions, packed.usage) == (1, 3, Usage(2, 0))
    # the answer's order is the server's: indices say which input each vector is
    turned = api_events.embeddings_chunk(_embeddings([[1.0], [2.0]], indices=[1, 0]), inputs=2)
    assert turned.inputs == 2


@pytest.mark.parametrize(
    ("body", "inputs", "error", "message"),
    [
        (_embeddings([[1.0]]), 2, EmbeddingsMismatchError, "1 embeddings for 2 inputs"),
        (_embeddings([[1.0], [2.0]], indices=[0, 0]), 2, EmbeddingsMismatchError, "index 0"),
        (_embeddings([[1.0], [2.0]], indices=[0, 2]), 2, EmbeddingsMismatchError, "index 2"),
        (_embeddings([[1.0], [2.0]], indices=[0, "1"]), 2, EmbeddingsMismatchError, "index '1'"),
        (_embeddings([[1.0, 2.0], [2.0]]), 2, EmbeddingsMismatchError, "1 values"),
        (_embeddings([[1.0, float("nan")]]), 1, EmbeddingsMismatchError, "not finite"),
        (_embeddings([_b64(1.0, float("inf"))]), 1, EmbeddingsMismatchError, "not finite"),
        (_embeddings([[]]), 1, EmbeddingsMismatchError, "empty"),
        (_embeddings([[[1.0], [2.0]]]), 1, EmbeddingsMismatchError, "nested"),
        (_embeddings(["bm90IGZsb2F0"]), 1, ProtocolError, "not a whole number of float32"),
        (_embeddings(["not base64!"]), 1, ProtocolError, "not base64"),
        (_embeddings([["a", None]]), 1, ProtocolError, "not a list of numbers"),
        (_embeddings([7]), 1, ProtocolError, "neither"),
        (b'{"data": 3}', 1, ProtocolError, "without a data list"),
        (b'{"data": [1]}', 1, ProtocolError, "not an object"),
        (b"<html>", 1, ProtocolError, "not JSON"),
        (b"[]", 1, ProtocolError, "not a JSON object"),
        (b'{"error": {"message": "no such model"}}', 1, ServerStreamError, "no such model"),
    ],
)
def test_bad_embeddings_answers_are_typed_errors(
    body: bytes, inputs: int, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        api_events.embeddings_chunk(body, inputs=inputs)


def test_the_embeddings_check_counts_inputs_and_input_tokens() -> None:
    check = EmbeddingsCheck(needs_finish=False)
    chunk = api_events.embeddings_chunk(_embeddings([[1.0], [2.0], [3.0]], usage=9), inputs=3)
    assert check.check(chunk) == 0  # no output token: the request's latency is its E2E
    check.check(DONE)
    check.finish(0)
    assert (check.inputs, check.input_tokens, check.output_tokens) == (3, 9, 0)
    assert targets.check_type("openai-embeddings") is EmbeddingsCheck


def test_prompts_are_batched_whole() -> None:
    prompts = [Prompt(f"p{i}") for i in range(6)]
    grouped = api_events.batches(prompts, 3)
    assert [batch.texts for batch in grouped] == [["p0", "p1", "p2"], ["p3", "p4", "p5"]]
    assert (grouped[0].text, grouped[0].max_tokens) == ("p0", None)


def test_endpoint_options_are_checked() -> None:
    with pytest.raises(ValueError, match="embeddings-batch is for"):
        endpoints.Endpoint(url="http://h:1", api="openai-chat", embeddings_batch=2)
    with pytest.raises(ValueError, match="at least 1"):
        endpoints.Endpoint(url="http://h:1", api="openai-embeddings", embeddings_batch=0)
    with pytest.raises(ValueError, match="embeddings-format"):
        endpoints.Endpoint(url="http://h:1", api="openai-embeddings", embeddings_format="int8")


# -- against the test server ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    process = subprocess.Popen([sys.executable, str(SERVER)], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        match = re.search(r"listening on (\S+)", line)
        assert match, line
        yield f"http://{match.group(1)}"
    finally:
        process.terminate()
        process.wait(10)
        if process.stdout is not None:
            process.stdout.close()


def _stats(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/stats", timeout=10) as answer:
        stats: dict[str, Any] = json.load(answer)
    return stats


def _point(
    url: str,
    api: str,
    model: str,
    *,
    requests: int = 6,
    prompt: Any = None,
    **kw: Any,
) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        endpoint = endpoints.Endpoint(url=url, api=api, model=model, **kw)
        target = targets.open_api_target(endpoint)
        check = targets.check_type(api)
        try:
            await target.describe()
            needs = target.needs_finish
            return await openloop.run_point(
                target,
                openloop.LoadSpec(requests=requests),
                rate_rps=50.0,
                request_for=lambda i: prompt or Prompt(f"prompt number {i}"),
                checks=lambda parse: lambda: check(parse=parse, needs_finish=needs),
            )
        finally:
            await target.close()

    return asyncio.run(run())


def _names(point: dict[str, Any]) -> list[str]:
    """The point's error classes, unqualified (the codecs' are named with their module)."""
    return [name.rsplit(".", 1)[-1] for name in point["errors"]]


def test_a_responses_stream_is_measured(server: str) -> None:
    point = _point(server, "openai-responses", "responses", max_tokens=4)
    assert point["requests_completed"] == 6, point["error_examples"]
    assert point["token_count"] == {"usage": 6}
    assert point["output_tokens"] == 6 * (REASONING + 4 + CALL)
    assert point["ttft"]["p50_ms"] >= SERVER_TTFT_MS  # the server waits that long: a floor
    assert point["integrity"]["verified"] == 6
    assert point["reasoning_tokens"] == 6 * REASONING  # the server's usage says so
    assert point["tool_calls"] == 6
    assert point["ttfot"]["p50_ms"] >= point["ttft"]["p50_ms"]  # reasoning came first
    assert point["input_tokens"] == 6 * 3  # the server counts the prompt's words
    assert point["inputs_completed"] == 6
    body = _stats(server)["last_responses_body"]
    assert body["max_output_tokens"] == 4
    assert (body["stream"], body["store"], body["model"]) == (True, False, "responses")
    assert body["input"].startswith("prompt number")


@pytest.mark.parametrize("model", ["vllm", "capped"])
def test_responses_streams_real_servers_send_are_whole(server: str, model: str) -> None:
    point = _point(server, "openai-responses", model, requests=3, max_tokens=3)
    assert point["requests_completed"] == 3, point["error_examples"]
    calls = 0 if model == "vllm" else CALL
    assert point["output_tokens"] == 3 * (REASONING + 3 + calls)


def test_a_conversation_is_sent_as_input_items(server: str) -> None:
    history = (
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi"},
        {"role": "user", "content": "and now?"},
    )
    point = _point(
        server, "openai-responses", "responses", requests=1, prompt=Prompt("and now?", 2, history)
    )
    assert point["requests_completed"] == 1, point["error_examples"]
    assert _stats(server)["last_responses_body"]["input"] == list(history)


@pytest.mark.parametrize(
    ("model", "error", "kind"),
    [
        ("failed", "ServerStreamError", None),
        ("error-event", "ServerStreamError", None),
        ("filtered", "ServerStreamError", None),
        ("out-of-order", "ReorderedFrameError", "reordered"),
        ("delta-before-item", "EventOrderError", None),
        ("after-end", "EventOrderError", None),
        ("no-completed", "StreamTruncatedError", "truncated"),
        ("usage-lies", "UsageMismatchError", "altered"),
    ],
)
def test_a_broken_responses_stream_is_an_error(
    server: str, model: str, error: str, kind: str | None
) -> None:
    point = _point(server, "openai-responses", model, requests=2, max_tokens=4)
    assert point["requests_completed"] == 0
    assert _names(point) == [error], point["error_examples"]
    if kind is not None:
        assert point["integrity"][kind] == 2


@pytest.mark.parametrize("encoding", ["float", "base64"])
def test_embeddings_are_measured(server: str, encoding: str) -> None:
    before = _stats(server)
    point = _point(
        server, "openai-embeddings", "embed", embeddings_format=encoding, embeddings_batch=1
    )
    after = _stats(server)
    assert point["requests_completed"] == 6, point["error_examples"]
    assert point["output_tokens"] == 0
    assert point["e2e"]["count"] == 6
    assert point["input_tokens"] == 6 * 3  # usage.prompt_tokens: the server counts words
    assert point["inputs_completed"] == 6
    assert point["ttft"]["count"] == 0  # no token: nothing is a first token
    assert after["formats"][encoding] - before["formats"].get(encoding, 0) == 6


@pytest.mark.parametrize(
    ("model", "error", "encoding"),
    [
        ("wrong-count", "EmbeddingsMismatchError", "float"),
        ("dup-index", "EmbeddingsMismatchError", "float"),
        ("ragged", "EmbeddingsMismatchError", "float"),
        ("nan", "EmbeddingsMismatchError", "float"),
        ("nan", "EmbeddingsMismatchError", "base64"),
        ("bad-base64", "ProtocolError", "float"),
        ("bad-base64", "ProtocolError", "base64"),
    ],
)
def test_a_broken_embeddings_answer_is_an_error(
    server: str, model: str, error: str, encoding: str
) -> None:
    batch = PromptBatch(prompts=(Prompt("one two"), Prompt("three")))
    point = _point(
        server,
        "openai-embeddings",
        model,
        requests=2,
        prompt=batch,
        embeddings_batch=2,
        embeddings_format=encoding,
    )
    assert point["requests_completed"] == 0
    assert _names(point) == [error], point["error_examples"]
    if error == "EmbeddingsMismatchError":
        assert point["integrity"]["altered"] == 2


# -- the command ---------------------------------------------------------------------------------


def _command(tmp_path: Path, *args: str) -> dict[str, Any]:
    out = tmp_path / "load.json"
    code = cli.main(["load", *args, "--warmup", "1", "--quiet", "--out", str(out)])
    assert code == 0
    report: dict[str, Any] = orjson.loads(out.read_bytes())
    return report


def test_the_command_drives_the_responses_api(server: str, tmp_path: Path) -> None:
    report = _command(
        tmp_path,
        *("--url", server, "--api", "openai-responses", "--model", "responses"),
        *("--max-tokens", "3", "--requests", "5", "--rate", "40"),
    )
    endpoint = report["parameters"]["endpoint"]
    assert (endpoint["api"], endpoint["model"]) == ("openai-responses", "responses")
    (point,) = report["points"]
    assert point["requests_completed"] == 5, point["error_examples"]
    assert point["output_tokens"] == 5 * (REASONING + 3 + CALL)


def test_the_command_drives_the_embeddings_api_in_batches(server: str, tmp_path: Path) -> None:
    before = _stats(server)
    report = _command(
        tmp_path,
        *("--url", server, "--api", "openai-embeddings", "--model", "embed"),
        *("--embeddings-batch", "4", "--embeddings-format", "base64"),
        *("--prompts", "synthetic", "--input-tokens", "16"),
        *("--requests", "5", "--rate", "40"),
    )
    after = _stats(server)
    endpoint = report["parameters"]["endpoint"]
    assert endpoint["api"] == "openai-embeddings"
    assert (endpoint["embeddings_batch"], endpoint["embeddings_format"]) == (4, "base64")
    (point,) = report["points"]
    assert point["requests_completed"] == 5, point["error_examples"]
    sent = after["embeddings_requests"] - before["embeddings_requests"]
    assert sent >= 5  # the warm-up's too
    assert after["embeddings_inputs"] - before["embeddings_inputs"] == 4 * sent
    assert after["formats"]["base64"] - before["formats"].get("base64", 0) == sent
    assert point["inputs_completed"] == 5 * 4  # each input of a batch counts
    assert point["input_throughput_ips"] > point["request_throughput_rps"]


def test_the_new_apis_are_not_spawned(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(
        ["load", "--spawn", "--transport", "http1", "--api", "openai-embeddings", "--requests", "1"]
    )
    assert code != 0
    assert "does not serve it" in capsys.readouterr().err
