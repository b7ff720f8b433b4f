"""The OpenAI API of ``inferwire serve``, checked with the official ``openai`` SDK (sync and
async) and raw HTTP: chat completions streamed and not, the ``.stream()`` helper, legacy
completions, ``/v1/models``, ``stream_options.include_usage``, OpenAI's error object, and
inferwire's extensions, asked for or not.

Sync clients talk to ``inferwire serve`` child processes on loopback; async ones to servers
in the test's own event loop. Both run on asyncio's loop and on uvloop (``event_loop_kind``,
tests/conftest.py): the child processes with ``--loop``, the async tests in a loop of that
kind. Expected tokens are what a local service makes of the same seeded workload.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, Final, TypeVar

import httpx
import openai
import orjson
import pytest

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire._runtime import loops
from inferwire.codecs.integrity import StreamVerifier
from inferwire.transports.openai_api import ApiError, chat_request_body, parse_request
from inferwire.transports.server_process import ServerProcess
from inferwire.workloads import MODEL, token_stream_source
from tests.helpers.faults import MESSAGES, server_process, serving

T = TypeVar("T")

HTTP: Final = ["http1", "http2"]
JSON_CODECS: Final = ["json", "orjson", "msgspec-json"]
CALL_TIMEOUT_S: Final = 60.0
SERVICE: Final = it.SimulatedService(token_stream_source)
WORKLOAD: Final = {"workload": "stream-16"}
VLLM_CHUNK_KEYS: Final = {"id", "object", "created", "model", "choices", "usage"}
VLLM_CHOICE_KEYS: Final = {"index", "delta", "logprobs", "finish_reason"}


def expected(workload: str = "stream-16", max_tokens: int | None = None) -> list[ic.TokenChunk]:
    request = it.GenerateRequest(workload=workload, max_tokens=max_tokens)
    return list(SERVICE.chunks(request))


def text_of(chunks: list[ic.TokenChunk]) -> str:
    return "".join(c.text for c in chunks)


def usage_of(chunks: list[ic.TokenChunk]) -> tuple[int, int]:
    usage = chunks[-1].usage
    assert usage is not None
    return usage.prompt_tokens, usage.completion_tokens


def run(coro: Coroutine[Any, Any, T], loop: str) -> T:
    return loops.run(asyncio.wait_for(coro, CALL_TIMEOUT_S), loop)


def _http_client(transport: str) -> httpx.Client:
    # the HTTP/2 server speaks h2 only: cleartext with prior knowledge (RFC 9113, 3.3)
    return httpx.Client(
        http1=transport == "http1", http2=transport == "http2", timeout=CALL_TIMEOUT_S
    )


def _sdk_http_client(transport: str) -> openai.DefaultHttpxClient:
    """:func:`_http_client` in the SDK's own HTTP library (``httpx2``)."""
    return openai.DefaultHttpxClient(
        http1=transport == "http1", http2=transport == "http2", timeout=CALL_TIMEOUT_S
    )


@pytest.fixture(scope="module")
def processes(
    tmp_path_factory: pytest.TempPathFactory, event_loop_kind: str
) -> Iterator[dict[str, ServerProcess]]:
    folder = tmp_path_factory.mktemp("openai-servers")
    args = ["--host", "127.0.0.1", "--loop", event_loop_kind]
    with contextlib.ExitStack() as stack:
        yield {
            transport: stack.enter_context(
                server_process(transport, "orjson", args, folder / transport)
            )
            for transport in HTTP
        }


@pytest.fixture(params=HTTP)
def client(request: pytest.FixtureRequest, processes: dict[str, ServerProcess]) -> Iterator[Any]:
    """The sync SDK against a server process, for each HTTP transport."""
    transport = request.param
    with openai.OpenAI(
        base_url=f"http://{processes[transport].address}/v1",
        api_key="unused",
        max_retries=0,
        http_client=_sdk_http_client(transport),
    ) as sdk:
        yield sdk


@contextlib.asynccontextmanager
async def async_client(
    transport: str, codec: str = "orjson", *, decode_s: float = 0.0
) -> AsyncIterator[tuple[openai.AsyncOpenAI, it.SimulatedService]]:
    """The async SDK against a server in this event loop."""
    async with serving(transport, codec, decode_s=decode_s) as srv:
        http = openai.DefaultAsyncHttpxClient(
            http1=transport == "http1", http2=transport == "http2", timeout=CALL_TIMEOUT_S
        )
        async with (
            http,
            openai.AsyncOpenAI(
                base_url=f"http://{srv.address}/v1",
                api_key="unused",
                max_retries=0,
                http_client=http,
            ) as sdk,
        ):
            yield sdk, srv.service


def chat(**fields: Any) -> dict[str, Any]:
    """Keyword arguments of ``chat.completions.create``, with the stream-16 workload."""
    extra = {**WORKLOAD, **fields.pop("extra_body", {})}
    return {"model": MODEL, "messages": MESSAGES, "extra_body": extra, **fields}


# -- chat completions ---------------------------------------------------------------------


def check_own_id(answer_id: str, created: int, prefix: str = "chatcmpl-") -> None:
    """An OpenAI answer has its own id, as vLLM's: the prefix and random hex digits, as many as
    the workload's id has (so the answer's bytes keep their length), and is created now."""
    workload_hex = expected()[0].id.removeprefix("chatcmpl-")
    assert answer_id.startswith(prefix)
    digits = answer_id.removeprefix(prefix)
    assert len(digits) == len(workload_hex)
    int(digits, 16)  # hex
    assert digits != workload_hex
    assert abs(created - time.time()) < 120
    assert len(str(created)) == len(str(expected()[0].created))


def check_completion(completion: Any, chunks: list[ic.TokenChunk], finish: str) -> None:
    assert completion.object == "chat.completion"
    check_own_id(completion.id, completion.created)
    assert completion.model == MODEL
    (choice,) = completion.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == text_of(chunks)
    assert choice.finish_reason == finish
    assert completion.usage is not None
    usage = completion.usage
    assert (usage.prompt_tokens, usage.completion_tokens) == usage_of(chunks)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_a_chat_completion_without_stream_is_one_json_body(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(**chat())
    assert isinstance(completion, openai.types.chat.ChatCompletion)
    check_completion(completion, expected(), "stop")
    explicit = client.chat.completions.create(**chat(stream=False))
    assert explicit.id != completion.id  # every answer its own, as vLLM's
    assert explicit.model_copy(update={"id": completion.id, "created": completion.created}) == (
        completion
    )


def test_a_cut_chat_completion_says_length(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(**chat(max_tokens=5))
    check_completion(completion, expected(max_tokens=5), "length")
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 5


def test_a_chat_stream_is_openai_chunks_without_usage(client: openai.OpenAI) -> None:
    want = expected()
    with client.chat.completions.create(**chat(stream=True)) as stream:
        events = list(stream)
    assert len(events) == len(want)
    assert "".join(e.choices[0].delta.content or "" for e in events) == text_of(want)
    assert events[0].choices[0].delta.role == "assistant"
    assert [e.choices[0].finish_reason for e in events] == [None] * (len(want) - 1) + ["stop"]
    assert all(e.usage is None for e in events)
    assert all(e.model_extra == {} for e in events)  # nothing but OpenAI's fields


def test_include_usage_adds_a_last_chunk_with_usage_only(client: openai.OpenAI) -> None:
    want = expected()
    with client.chat.completions.create(
        **chat(stream=True, stream_options={"include_usage": True})
    ) as stream:
        events = list(stream)
    *tokens, last = events
    assert len(tokens) == len(want)
    assert tokens[-1].choices[0].finish_reason == "stop"
    assert all(e.usage is None for e in tokens)
    assert last.choices == []
    assert {e.id for e in events} == {last.id}  # one answer, one id
    check_own_id(last.id, last.created)
    assert last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == usage_of(want)


def test_include_usage_false_is_the_default(client: openai.OpenAI) -> None:
    with client.chat.completions.create(
        **chat(stream=True, stream_options={"include_usage": False})
    ) as stream:
        events = list(stream)
    assert len(events) == len(expected())
    assert all(e.usage is None and e.choices for e in events)


def test_the_stream_helper_ends_without_an_error(client: openai.OpenAI) -> None:
    with client.chat.completions.stream(**chat()) as stream:
        deltas = [e.delta for e in stream if e.type == "content.delta"]
        final = stream.get_final_completion()
    assert "".join(deltas) == text_of(expected())
    assert final.choices[0].finish_reason == "stop"
    assert final.choices[0].message.content == text_of(expected())


def test_the_stream_helper_raises_when_max_tokens_cuts(client: openai.OpenAI) -> None:
    with client.chat.completions.stream(**chat(max_tokens=3)) as stream:
        deltas = [e.delta for e in stream if e.type == "content.delta"]
        with pytest.raises(openai.LengthFinishReasonError):
            stream.get_final_completion()
    assert "".join(deltas) == text_of(expected(max_tokens=3))


def test_max_completion_tokens_cuts_too(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(**chat(max_completion_tokens=4))
    check_completion(completion, expected(max_tokens=4), "length")


@pytest.mark.parametrize("transport", HTTP)
def test_async_chat_completions(event_loop_kind: str, transport: str) -> None:
    async def go() -> None:
        async with async_client(transport) as (sdk, _):
            completion = await sdk.chat.completions.create(**chat())
            check_completion(completion, expected(), "stop")
            stream = await sdk.chat.completions.create(
                **chat(stream=True, stream_options={"include_usage": True})
            )
            events = [event async for event in stream]
            assert "".join(e.choices[0].delta.content or "" for e in events[:-1]) == text_of(
                expected()
            )
            assert events[-1].choices == []
            assert events[-1].usage is not None
            async with sdk.chat.completions.stream(**chat()) as helper:
                await helper.until_done()
                final = await helper.get_final_completion()
            assert final.choices[0].finish_reason == "stop"
            async with sdk.chat.completions.stream(**chat(max_tokens=2)) as helper:
                await helper.until_done()
                with pytest.raises(openai.LengthFinishReasonError):
                    await helper.get_final_completion()

    run(go(), event_loop_kind)


def test_a_paced_answer_comes_after_its_tokens(event_loop_kind: str) -> None:
    """Without ``stream``, the answer waits for the whole paced generation."""

    async def go() -> None:
        async with async_client("http1", decode_s=0.0005) as (sdk, service):
            completion = await sdk.chat.completions.create(**chat())
            check_completion(completion, expected(), "stop")
            assert service.streams_started == 1
            assert service.active_streams == 0

    run(go(), event_loop_kind)


# -- inferwire's extensions ---------------------------------------------------------------


def test_extensions_through_extra_body(client: openai.OpenAI) -> None:
    """The SDK can ask for them: each chunk carries seq and token ids, the end marker usage."""
    want = expected()
    extensions = {"inferwire": {"extensions": True}}
    with client.chat.completions.create(
        **chat(stream=True, extra_body=extensions, stream_options={"include_usage": True})
    ) as stream:
        events = list(stream)
    assert len(events) == len(want)  # include_usage adds nothing: usage is on the end marker
    assert [e.model_extra for e in events] == [{"seq": c.seq} for c in want]
    assert [e.choices[0].model_extra for e in events] == [
        {"token_ids": list(c.token_ids)} for c in want
    ]
    assert events[-1].choices[0].finish_reason == "stop"
    assert events[-1].usage is not None
    assert (events[-1].usage.prompt_tokens, events[-1].usage.completion_tokens) == usage_of(want)
    completion = client.chat.completions.create(**chat(extra_body=extensions))
    assert completion.choices[0].model_extra == {
        "token_ids": [t for c in want for t in c.token_ids]
    }


# -- legacy completions -------------------------------------------------------------------


def completion_args(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "Say it", "extra_body": WORKLOAD, **fields}


def test_a_legacy_completion_without_stream(client: openai.OpenAI) -> None:
    want = expected()
    completion = client.completions.create(**completion_args())
    assert completion.object == "text_completion"
    check_own_id(completion.id, completion.created, "cmpl-")
    (choice,) = completion.choices
    assert choice.text == text_of(want)
    assert choice.finish_reason == "stop"
    assert choice.logprobs is None
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == usage_of(want)


def test_a_legacy_completion_streamed(client: openai.OpenAI) -> None:
    want = expected(max_tokens=6)
    with client.completions.create(
        **completion_args(stream=True, max_tokens=6, stream_options={"include_usage": True})
    ) as stream:
        events = list(stream)
    *tokens, last = events
    assert "".join(e.choices[0].text for e in tokens) == text_of(want)
    assert [e.choices[0].finish_reason for e in tokens][-1] == "length"
    assert all(e.object == "text_completion" and e.usage is None for e in tokens)
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.completion_tokens == 6


@pytest.mark.parametrize("prompt", ["text", "", [1, 2, 3], ["text"], [[1, 2]]])
def test_a_legacy_prompt_in_any_of_its_forms(client: openai.OpenAI, prompt: Any) -> None:
    completion = client.completions.create(**completion_args(prompt=prompt))
    assert completion.choices[0].text == text_of(expected())


def test_legacy_logprobs_are_the_legacy_shape(client: openai.OpenAI) -> None:
    want = expected("stream-16-top5")
    completion = client.completions.create(
        **completion_args(extra_body={"workload": "stream-16-top5"}, logprobs=5)
    )
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None
    tokens = [lp for c in want for lp in c.logprobs or ()]
    assert logprobs.tokens == [lp.token for lp in tokens]
    assert logprobs.token_logprobs == [lp.logprob for lp in tokens]
    assert logprobs.top_logprobs == [{t.token: t.logprob for t in lp.top} for lp in tokens]
    text = completion.choices[0].text
    assert logprobs.text_offset is not None
    assert [
        text[o : o + len(lp.token)] for o, lp in zip(logprobs.text_offset, tokens, strict=True)
    ] == [lp.token for lp in tokens]


@pytest.mark.parametrize("transport", HTTP)
def test_async_legacy_completions(event_loop_kind: str, transport: str) -> None:
    async def go() -> None:
        async with async_client(transport) as (sdk, _):
            completion = await sdk.completions.create(**completion_args())
            assert completion.choices[0].text == text_of(expected())
            stream = await sdk.completions.create(**completion_args(stream=True))
            events = [event async for event in stream]
            assert "".join(e.choices[0].text for e in events) == text_of(expected())
            assert events[-1].choices[0].finish_reason == "stop"

    run(go(), event_loop_kind)


# -- models -------------------------------------------------------------------------------


def test_models_list_and_retrieve(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert models.object == "list"
    assert [m.id for m in models.data] == [MODEL]
    assert {(m.object, m.owned_by) for m in models.data} == {("model", "inferwire")}
    model = client.models.retrieve(MODEL)  # the SDK sends the "/" of the name as %2F
    assert model == models.data[0]
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


@pytest.mark.parametrize("transport", HTTP)
def test_async_models(event_loop_kind: str, transport: str) -> None:
    async def go() -> None:
        async with async_client(transport) as (sdk, _):
            assert [m.id async for m in sdk.models.list()] == [MODEL]
            assert (await sdk.models.retrieve(MODEL)).id == MODEL
            with pytest.raises(openai.NotFoundError):
                await sdk.models.retrieve("nope")

    run(go(), event_loop_kind)


# -- errors -------------------------------------------------------------------------------

SDK_ERRORS = [
    pytest.param(chat(model="gpt-4o"), openai.NotFoundError, "model", id="unknown-model"),
    pytest.param(chat(messages=[]), openai.BadRequestError, "messages", id="no-messages"),
    pytest.param(chat(n=2), openai.BadRequestError, "n", id="two-choices"),
    pytest.param(
        chat(stream_options={"include_usage": True}),
        openai.BadRequestError,
        "stream_options",
        id="stream-options-without-stream",
    ),
    pytest.param(chat(max_tokens=0), openai.BadRequestError, "max_tokens", id="max-tokens-zero"),
    pytest.param(
        chat(extra_body={"workload": "nope"}), openai.BadRequestError, None, id="unknown-workload"
    ),
]


@pytest.mark.parametrize(("args", "error", "param"), SDK_ERRORS)
def test_bad_requests_are_the_sdks_error_types(
    client: openai.OpenAI,
    args: dict[str, Any],
    error: type[openai.APIStatusError],
    param: str | None,
) -> None:
    with pytest.raises(error) as raised:
        client.chat.completions.create(**args)
    body = raised.value.body
    assert isinstance(body, dict)
    assert body["type"] == "invalid_request_error"
    assert body["param"] == param
    assert body["code"] == raised.value.status_code
    assert body["message"]


@pytest.mark.parametrize("transport", HTTP)
def test_async_bad_request(event_loop_kind: str, transport: str) -> None:
    async def go() -> None:
        async with async_client(transport) as (sdk, service):
            with pytest.raises(openai.NotFoundError):
                await sdk.chat.completions.create(**chat(model="nope", stream=True))
            with pytest.raises(openai.BadRequestError):
                await sdk.completions.create(**completion_args(prompt=["a", "b"]))
            assert service.streams_started == 0

    run(go(), event_loop_kind)


RAW_ERRORS = [
    pytest.param("GET", "/v1/chat/completions", {}, b"", 405, id="chat-by-get"),
    pytest.param("DELETE", "/v1/models", {}, b"", 405, id="models-by-delete"),
    pytest.param("GET", "/v1/responses", {}, b"", 404, id="unknown-route"),
    pytest.param(
        "POST",
        "/v1/chat/completions",
        {"content-type": "text/plain"},
        b"{}",
        415,
        id="not-json",
    ),
    pytest.param(
        "POST",
        "/v1/chat/completions",
        {"content-type": "application/json", "accept": "text/html"},
        orjson.dumps(chat()),
        406,
        id="html-wanted",
    ),
    pytest.param(
        "POST",
        "/v1/chat/completions",
        {"content-type": "application/json"},
        orjson.dumps({"messages": MESSAGES, "timing": True}),
        400,
        id="timing-without-stream",
    ),
]


@pytest.mark.parametrize(("method", "path", "headers", "body", "status"), RAW_ERRORS)
def test_other_errors_are_openai_error_objects(
    processes: dict[str, ServerProcess],
    method: str,
    path: str,
    headers: dict[str, str],
    body: bytes,
    status: int,
) -> None:
    with _http_client("http1") as http:
        response = http.request(
            method, f"http://{processes['http1'].address}{path}", headers=headers, content=body
        )
    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status


@pytest.mark.parametrize("transport", HTTP)
def test_health_as_vllm_serves_it(processes: dict[str, ServerProcess], transport: str) -> None:
    with _http_client(transport) as http:
        response = http.get(f"http://{processes[transport].address}/health")
        refused = http.post(f"http://{processes[transport].address}/health")
    assert (response.status_code, response.content) == (200, b"")
    assert refused.status_code == 404


PARSE_ERRORS = [
    pytest.param({"messages": "hi"}, 400, "messages", id="messages-not-a-list"),
    pytest.param({"messages": [{"role": "robot"}]}, 400, "messages[0].role", id="unknown-role"),
    pytest.param({"messages": MESSAGES, "stream": 1}, 400, "stream", id="stream-an-int"),
    pytest.param(
        {"messages": MESSAGES, "stream": True, "stream_options": {"include_usage": "yes"}},
        400,
        "stream_options.include_usage",
        id="include-usage-a-string",
    ),
    pytest.param(
        {"messages": MESSAGES, "stream": True, "stream_options": []},
        400,
        "stream_options",
        id="stream-options-a-list",
    ),
    pytest.param({"messages": MESSAGES, "n": True}, 400, "n", id="n-a-bool"),
    pytest.param({"messages": MESSAGES, "model": 7}, 400, "model", id="model-a-number"),
    pytest.param(
        {"messages": MESSAGES, "inferwire": True}, 400, "inferwire", id="inferwire-a-bool"
    ),
    pytest.param(
        {"messages": MESSAGES, "inferwire": {"extensions": "on"}},
        400,
        "inferwire.extensions",
        id="extensions-a-string",
    ),
]


@pytest.mark.parametrize(("body", "status", "param"), PARSE_ERRORS)
def test_a_bad_chat_request_names_its_field(body: dict[str, Any], status: int, param: str) -> None:
    with pytest.raises(ApiError) as raised:
        parse_request(body, chat=True, models=(MODEL,))
    assert (raised.value.status, raised.value.param) == (status, param)


@pytest.mark.parametrize("prompt", [None, [], [[]], [-1], ["a", 1], [["a"]], {"a": 1}])
def test_a_bad_prompt_is_refused(prompt: Any) -> None:
    with pytest.raises(ApiError) as raised:
        parse_request({"prompt": prompt}, chat=False, models=(MODEL,))
    assert raised.value.param == "prompt"


def test_a_request_without_model_gets_the_first_served() -> None:
    request = parse_request({"messages": MESSAGES}, chat=True, models=("a", "b"))
    assert request.generate.model == "a"
    assert parse_request({"messages": MESSAGES, "model": "b"}, chat=True, models=("a", "b"))


# -- the bytes on the wire ----------------------------------------------------------------


def sse_events(body: bytes) -> list[Any]:
    """The JSON objects of an SSE body, which must end with ``data: [DONE]``."""
    events = body.split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""]
    assert all(e.startswith(b"data: ") for e in events[:-2])
    return [orjson.loads(e.removeprefix(b"data: ")) for e in events[:-2]]


async def _post(transport: str, codec: str, body: dict[str, Any], accept: str) -> httpx.Response:
    async with serving(transport, codec) as srv:
        http = httpx.AsyncClient(
            http1=transport == "http1", http2=transport == "http2", timeout=CALL_TIMEOUT_S
        )
        async with http:
            return await http.post(
                f"http://{srv.address}/v1/chat/completions",
                content=orjson.dumps(body),
                headers={"content-type": "application/json", "accept": accept},
            )


@pytest.mark.parametrize("transport", HTTP)
@pytest.mark.parametrize("codec", JSON_CODECS)
def test_the_default_stream_has_only_the_fields_vllm_sends(
    event_loop_kind: str, transport: str, codec: str
) -> None:
    want = expected("stream-16-top5")
    body = {"messages": MESSAGES, "stream": True, "workload": "stream-16-top5"}
    response = run(_post(transport, codec, body, "application/json"), event_loop_kind)
    assert response.headers["content-type"] == "text/event-stream"
    events = sse_events(response.content)
    assert len(events) == len(want)
    for event in events:
        assert set(event) <= VLLM_CHUNK_KEYS
        assert "usage" not in event
        assert set(event["choices"][0]) == VLLM_CHOICE_KEYS
    assert b'"seq"' not in response.content
    assert b"token_ids" not in response.content
    with_usage = run(
        _post(
            transport,
            codec,
            {**body, "stream_options": {"include_usage": True}},
            "text/event-stream",
        ),
        event_loop_kind,
    )
    *tokens, last = sse_events(with_usage.content)
    assert len({e["id"] for e in events}) == 1
    assert {e["id"] for e in tokens} == {last["id"]} != {events[0]["id"]}  # each its own
    own = {"id": events[0]["id"], "created": events[0]["created"]}
    assert [{**e, **own} for e in tokens] == events
    assert set(last) == VLLM_CHUNK_KEYS
    assert last["choices"] == []
    prompt_tokens, completion_tokens = usage_of(want)
    assert last["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


@pytest.mark.parametrize("transport", HTTP)
@pytest.mark.parametrize("codec", JSON_CODECS)
def test_our_clients_stream_proves_itself(event_loop_kind: str, transport: str, codec: str) -> None:
    """With the extensions inferwire's clients ask for, the body is the codec's own stream:
    it decodes chunk for chunk and passes the stream check."""
    request = it.GenerateRequest(workload="stream-16-top5")
    response = run(
        _post(transport, codec, orjson.loads(chat_request_body(request)), "text/event-stream"),
        event_loop_kind,
    )
    decoder = ic.get(codec, extensions=True).stream_decoder()
    chunks = decoder.feed(response.content)
    decoder.close()
    assert chunks == expected("stream-16-top5")
    verifier = StreamVerifier(expected("stream-16-top5"))
    for chunk in chunks:
        verifier.check(chunk)
    verifier.finish()


@pytest.mark.parametrize("transport", HTTP)
def test_a_binary_codec_server_speaks_json_to_the_sdk(event_loop_kind: str, transport: str) -> None:
    """The OpenAI API is JSON whatever the server's codec: its own frames go only to a client
    that asks for them by name (inferwire's clients, see test_transports)."""

    async def go() -> None:
        async with async_client(transport, "protobuf") as (sdk, _):
            stream = await sdk.chat.completions.create(**chat(stream=True))
            events = [event async for event in stream]
            assert "".join(e.choices[0].delta.content or "" for e in events) == text_of(expected())
            completion = await sdk.chat.completions.create(**chat())
            check_completion(completion, expected(), "stop")

    run(go(), event_loop_kind)
    codec = ic.get("protobuf", extensions=True)
    frames = run(
        _post(
            transport,
            "protobuf",
            {"messages": MESSAGES, "stream": True, **WORKLOAD},
            f"{codec.stream_media_type}, */*;q=0.1",
        ),
        event_loop_kind,
    )
    assert frames.headers["content-type"] == codec.stream_media_type
    decoder = codec.stream_decoder()
    assert decoder.feed(frames.content) == expected()
    decoder.close()
