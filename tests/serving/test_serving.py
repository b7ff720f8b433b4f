"""inferwire.serving's framework-free core: negotiation (RFC 9110), the OpenAI request type,
the chunk builder, and a stream's bytes both ends in every token-stream codec."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import inferwire.codecs as ic
import inferwire.serving as iws
from inferwire import workloads
from inferwire.codecs.framing import StreamEncoder
from inferwire.serving.negotiation import parse_accept

STREAM_CODECS = [n for n in ic.names() if ic.TokenChunk in ic.get(n).types]
MESSAGES = [{"role": "user", "content": "hi"}]


# -- negotiation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("accept", "codec"),
    [
        (None, "orjson"),
        ("", "orjson"),
        ("*/*", "orjson"),
        ("application/json", "orjson"),  # the OpenAI SDK's Accept, on streams too
        ("text/event-stream", "orjson"),
        ("text/*", "orjson"),
        ("application/vnd.inferwire.delta", "delta"),
        ("application/vnd.inferwire.frames+protobuf", "protobuf"),
        ("application/vnd.inferwire.frames+msgpack", "msgspec-msgpack"),
        (
            "application/vnd.inferwire.delta;q=0.5, application/vnd.inferwire.frames+protobuf",
            "protobuf",
        ),
        ("application/vnd.inferwire.delta, */*;q=0.1", "delta"),
        ("text/event-stream;q=0, application/json;q=0, */*", "msgspec-msgpack"),
        ("application/*", "orjson"),  # application/json: the JSON events, first offered
        ("text/*;q=0, application/json;q=0, application/*;q=0.3", "msgspec-msgpack"),
        ("application/vnd.inferwire.delta; q=1.0", "delta"),
        ("APPLICATION/VND.INFERWIRE.DELTA", "delta"),
        ("garbage, application/vnd.inferwire.delta", "delta"),  # a malformed element is ignored
        ("application/vnd.inferwire.delta;q=2, text/event-stream;q=0.2", "orjson"),  # bad q
    ],
)
def test_negotiate_picks_the_highest_weight(accept: str | None, codec: str) -> None:
    assert iws.negotiate(accept).name == codec


def test_the_most_specific_range_decides() -> None:
    # RFC 9110, section 12.5.1's example: the weight of a type is its most specific range's
    accept = "text/*;q=0.3, text/plain;q=0.7, text/plain;format=flowed, */*;q=0.5"
    assert iws.quality(accept, "text/plain") == 0.7
    assert iws.quality(accept, "text/html") == 0.3
    assert iws.quality(accept, "image/jpeg") == 0.5
    assert iws.quality("text/event-stream;q=0, */*", "text/event-stream") == 0.0
    assert iws.quality(accept, "text/plain;format=flowed") == 1.0
    assert iws.quality(None, "anything/at-all") == 1.0
    # a range with parameters matches only a type with them: our streams have none
    assert iws.quality("text/event-stream;charset=utf-8", "text/event-stream") == 0.0


def test_equal_weights_follow_the_server_order() -> None:
    accept = "application/vnd.inferwire.delta, application/vnd.inferwire.frames+protobuf"
    assert iws.negotiate(accept, ["protobuf", "delta"]).name == "protobuf"
    assert iws.negotiate(accept, ["delta", "protobuf"]).name == "delta"
    assert iws.negotiate(None, ["msgspec-json", "delta"]).name == "msgspec-json"


@pytest.mark.parametrize(
    "accept", ["image/png", "text/event-stream;q=0, application/json;q=0", "*/*;q=0", "nonsense"]
)
def test_nothing_acceptable_lists_what_is_offered(accept: str) -> None:
    with pytest.raises(iws.NotAcceptableError) as raised:
        iws.negotiate(accept)
    assert raised.value.status == 406
    assert raised.value.offered == iws.offered()
    assert raised.value.offered[0] == "text/event-stream"
    assert all(media in str(raised.value) for media in raised.value.offered)


def test_qvalues_follow_the_grammar() -> None:
    assert parse_accept("a/b;q=0.123, c/d;q=1.000, e/f;q=1.001, g/h;q=0.1234, i/j;q=.5") == (
        ("a", "b", frozenset(), 0.123),
        ("c", "d", frozenset(), 1.0),
    )


def test_offers_must_carry_token_streams() -> None:
    with pytest.raises(ValueError, match="token streams"):
        iws.negotiate(None, ["tensor"])
    with pytest.raises(ValueError, match="at least one"):
        iws.negotiate(None, [])
    with pytest.raises(ic.UnknownCodecError):
        iws.negotiate(None, ["nope"])


def test_names_for_is_the_reverse_of_media_type() -> None:
    for name in ic.names():
        codec = ic.get(name)
        assert name in ic.names_for(codec.media_type)
        assert name in ic.names_for(codec.stream_media_type.upper() + "; charset=utf-8")
    assert ic.names_for("image/png") == []


# -- the request ---------------------------------------------------------------------------


def test_a_full_request_parses() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
        ],
        "model": "m",
        "max_completion_tokens": 7,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.5,
        "top_p": 1,
        "n": 1,
        "seed": -3,
        "stop": ["\n"],
        "logprobs": True,
        "top_logprobs": 5,
        "workload": "stream-16",  # unknown fields are ignored, as extra_body sends them
    }
    request = iws.ChatCompletionRequest.parse(msgspec.json.encode(body))
    assert request == iws.ChatCompletionRequest.from_obj(body)
    assert (request.streaming, request.include_usage, request.max_output_tokens) == (True, True, 7)
    assert (request.choices, request.stop_sequences, request.top_p) == (1, ("\n",), 1.0)
    assert request.messages[1].text() == "Hi"
    assert iws.ChatCompletionRequest.from_obj(request.to_obj()) == request
    assert iws.ChatCompletionRequest.parse(request.to_json()) == request


def test_defaults_are_openai_defaults() -> None:
    request = iws.ChatCompletionRequest.from_obj({"messages": MESSAGES, "stream": None})
    assert (request.streaming, request.include_usage, request.max_output_tokens) == (
        False,
        False,
        None,
    )
    assert request.choices == 1
    assert (
        iws.ChatCompletionRequest.from_obj(
            {"messages": MESSAGES, "max_tokens": 3}
        ).max_output_tokens
        == 3
    )


BAD_REQUESTS = [
    pytest.param({}, "messages", id="no-messages"),
    pytest.param({"messages": "hi"}, "messages", id="messages-not-a-list"),
    pytest.param({"messages": []}, "messages", id="messages-empty"),
    pytest.param({"messages": [{"role": "robot"}]}, "messages[0].role", id="unknown-role"),
    pytest.param({"messages": [{"content": "x"}]}, "messages[0].role", id="no-role"),
    pytest.param(
        {"messages": [{"role": "user", "content": 3}]}, "messages[0].content", id="content-int"
    ),
    pytest.param({"messages": MESSAGES, "stream": 1}, "stream", id="stream-an-int"),
    pytest.param(
        {"messages": MESSAGES, "stream_options": {}}, "stream_options", id="options-no-stream"
    ),
    pytest.param(
        {"messages": MESSAGES, "stream": True, "stream_options": {"include_usage": "yes"}},
        "stream_options.include_usage",
        id="include-usage-a-string",
    ),
    pytest.param({"messages": MESSAGES, "max_tokens": 0}, "max_tokens", id="max-tokens-0"),
    pytest.param(
        {"messages": MESSAGES, "max_completion_tokens": -1},
        "max_completion_tokens",
        id="mct-negative",
    ),
    pytest.param({"messages": MESSAGES, "max_tokens": 1.5}, "max_tokens", id="max-tokens-float"),
    pytest.param({"messages": MESSAGES, "n": 0}, "n", id="n-0"),
    pytest.param({"messages": MESSAGES, "n": True}, "n", id="n-a-bool"),
    pytest.param({"messages": MESSAGES, "temperature": 2.5}, "temperature", id="temperature"),
    pytest.param({"messages": MESSAGES, "top_p": -0.1}, "top_p", id="top-p"),
    pytest.param({"messages": MESSAGES, "seed": 1 << 63}, "seed", id="seed-past-64-bits"),
    pytest.param({"messages": MESSAGES, "stop": ["a"] * 5}, "stop", id="five-stops"),
    pytest.param(
        {"messages": MESSAGES, "top_logprobs": 2}, "top_logprobs", id="top-without-logprobs"
    ),
    pytest.param(
        {"messages": MESSAGES, "logprobs": True, "top_logprobs": 21}, "top_logprobs", id="top-21"
    ),
    pytest.param({"messages": MESSAGES, "model": 7}, "model", id="model-a-number"),
    pytest.param([MESSAGES], None, id="not-an-object"),
]


@pytest.mark.parametrize(("body", "param"), BAD_REQUESTS)
def test_a_bad_request_names_its_field(body: Any, param: str | None) -> None:
    parsers: list[Callable[[], iws.ChatCompletionRequest]] = [
        lambda: iws.ChatCompletionRequest.parse(msgspec.json.encode(body)),
        lambda: iws.ChatCompletionRequest.from_obj(body),
    ]
    for parse in parsers:
        with pytest.raises(iws.RequestError) as raised:
            parse()
        assert raised.value.param == param
        assert isinstance(raised.value, ValueError)
        assert raised.value.status == 400
        assert str(raised.value)


@pytest.mark.parametrize("body", [b"", b"{", b"\xff", b'{"messages": [}'])
def test_a_body_that_is_not_json_is_a_request_error(body: bytes) -> None:
    with pytest.raises(iws.RequestError, match="not JSON"):
        iws.ChatCompletionRequest.parse(body)


# -- the chunk builder ---------------------------------------------------------------------


def test_the_builder_numbers_and_finishes_as_openai_does() -> None:
    builder = iws.ChunkBuilder("m", include_usage=True, prompt_tokens=4, created=7, id="chatcmpl-x")
    first = builder.chunk("a", [1, 2])
    second = builder.chunk("b")
    last = builder.finish("c", [3], finish_reason="length")
    assert [c.seq for c in (first, second, last)] == [0, 1, 2]
    assert {(c.id, c.model, c.created, c.index) for c in (first, second, last)} == {
        ("chatcmpl-x", "m", 7, 0)
    }
    assert (first.finish_reason, first.usage, second.usage) == (None, None, None)
    assert last.finish_reason == "length"
    assert last.usage == ic.Usage(prompt_tokens=4, completion_tokens=3)
    with pytest.raises(iws.ChunkBuilderError, match="finished"):
        builder.chunk("d")


def test_usage_only_when_asked() -> None:
    builder = iws.ChunkBuilder("m")
    assert builder.id.startswith("chatcmpl-")
    assert len(builder.id) == 41
    assert builder.finish(completion_tokens=9).usage is None
    assert iws.ChunkBuilder("m", include_usage=True).finish(completion_tokens=9).usage == ic.Usage(
        prompt_tokens=0, completion_tokens=9
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda b: b.finish(finish_reason="done"),
        lambda b: b.chunk(b"bytes"),
        lambda b: b.chunk("x", [-1]),
        lambda b: b.chunk("x", [1 << 32]),
        lambda b: b.chunk("x", ["1"]),
    ],
)
def test_the_builder_refuses_what_openai_cannot_carry(make: Any) -> None:
    with pytest.raises(iws.ChunkBuilderError):
        make(iws.ChunkBuilder("m"))


def test_the_builder_needs_a_model() -> None:
    with pytest.raises(iws.ChunkBuilderError):
        iws.ChunkBuilder("")
    with pytest.raises(iws.ChunkBuilderError):
        iws.ChunkBuilder("m", prompt_tokens=-1)


# -- a stream's bytes, both ends -----------------------------------------------------------


def _chunks(*, include_usage: bool) -> list[ic.TokenChunk]:
    builder = iws.ChunkBuilder("m", include_usage=include_usage, prompt_tokens=3)
    return [builder.chunk("Hel", [1]), builder.chunk("lo", [2, 3]), builder.finish("!", [4])]


def _wire(chunks: list[ic.TokenChunk], codec: ic.Codec, **options: Any) -> bytes:
    async def collect() -> bytes:
        return b"".join([piece async for piece in iws.stream_body(chunks, codec, **options)])

    return asyncio.run(collect())


@pytest.mark.parametrize("name", STREAM_CODECS)
@pytest.mark.parametrize("include_usage", [False, True])
def test_every_codec_round_trips_through_the_reader(name: str, include_usage: bool) -> None:
    codec = ic.get(name)
    chunks = _chunks(include_usage=include_usage)
    wire = _wire(chunks, codec)
    reader = iws.reader_for(codec.stream_media_type + "; charset=utf-8", name)
    got: list[ic.TokenChunk] = []
    for i in range(len(wire)):  # one byte at a time: any split reads the same
        got += reader.feed(wire[i : i + 1])
    reader.close()
    assert reader.finished
    assert [c.text for c in got[:3]] == ["Hel", "lo", "!"]
    assert got[2].finish_reason == "stop"
    if iws.stream_quality("application/json", codec) and codec.media_type == iws.JSON:
        # OpenAI's bytes: no token ids, and usage in a chunk of its own
        assert wire.endswith(b"data: [DONE]\n\n")
        assert b'"seq"' not in wire
        assert b"token_ids" not in wire
        assert got[2].usage is None
        if include_usage:
            assert len(got) == 4
            assert (got[3].text, got[3].token_ids) == ("", ())
            assert got[3].usage == ic.Usage(prompt_tokens=3, completion_tokens=4)
            assert wire.count(b'"choices":[]') == 1
        else:
            assert len(got) == 3
            assert b"usage" not in wire
    else:
        assert got == chunks  # a binary codec carries everything


@pytest.mark.parametrize("name", ["json", "orjson", "msgspec-json"])
def test_extensions_write_inferwires_json(name: str) -> None:
    chunks = _chunks(include_usage=True)
    wire = _wire(chunks, ic.get(name), extensions=True)
    assert wire.count(b'"seq"') == 3
    assert wire.count(b'"usage"') == 1
    reader = iws.reader_for("text/event-stream")
    assert reader.feed(wire) == chunks
    reader.close()


def test_usage_placement_matches_the_transports() -> None:
    from inferwire.transports import openai_bodies

    chunks = _chunks(include_usage=True)
    codec = ic.get("orjson", extensions=False)
    import orjson

    from inferwire.codecs.framing import framed_encoder

    theirs = openai_bodies.UsageAsOpenAI(
        codec.stream_encoder(), framed_encoder("sse", orjson.dumps), include_usage=True
    )
    expected = b"".join(theirs.encode(c) for c in chunks) + theirs.end()
    assert _wire(chunks, ic.get("orjson")) == expected


@pytest.mark.parametrize("name", STREAM_CODECS)
def test_a_cut_stream_raises_at_close(name: str) -> None:
    codec = ic.get(name)
    wire = _wire(_chunks(include_usage=False), codec)
    for cut in (len(wire) - 1, len(wire) // 2, 0):
        reader = iws.reader_for(codec.stream_media_type, name)
        try:
            reader.feed(wire[:cut])
        except ic.DecodeError:
            continue  # some cuts are refused on sight
        with pytest.raises(ic.IncompleteStreamError):
            reader.close()


@pytest.mark.parametrize(
    "event",
    [
        b'data: {"object":"chat.completion.chunk","choices":[],"usage":null}\n\n',
        b'data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"m",'
        b'"choices":[]}\n\n',
        b"data: [1, 2]\n\n",
        b"data: {\n\n",
    ],
)
def test_a_corrupt_json_event_is_a_decode_error(event: bytes) -> None:
    with pytest.raises(ic.DecodeError):
        iws.reader_for("text/event-stream").feed(event)


@pytest.mark.parametrize("content_type", ["application/json", "text/html", ""])
def test_a_type_no_codec_streams_is_a_response_error(content_type: str) -> None:
    with pytest.raises(iws.ResponseError):
        iws.reader_for(content_type)


def test_error_bodies_are_openai_error_objects() -> None:
    status, body = iws.error_of(iws.RequestError("bad", param="n"))
    assert status == 400
    assert msgspec.json.decode(body) == {
        "error": {"message": "bad", "type": "invalid_request_error", "param": "n", "code": 400}
    }
    status, body = iws.error_of(iws.NotAcceptableError("x/y", ["a/b"]))
    assert status == 406
    assert b"a/b" in body


# -- the grpc (de)serializers --------------------------------------------------------------


@pytest.mark.parametrize("name", STREAM_CODECS)
def test_grpc_serializers_round_trip_each_message(name: str) -> None:
    serialize, deserialize = iws.grpc.serializers(name)
    for chunk in _chunks(include_usage=True):
        assert deserialize(serialize(chunk)) == chunk
    with pytest.raises(ic.DecodeError):
        deserialize(b"\xff\x00garbage")


def test_grpc_request_serializers() -> None:
    request = iws.ChatCompletionRequest.from_obj({"messages": MESSAGES, "stream": True})
    data = iws.grpc.request_serializer(request)
    assert iws.grpc.request_deserializer(data) == request
    with pytest.raises(iws.RequestError):
        iws.grpc.request_deserializer(b"{}")
    with pytest.raises(ValueError, match="carry"):
        iws.grpc.deserializer("delta", ic.EmbeddingBatch)


def test_grpc_serializers_in_a_real_call() -> None:
    grpc = pytest.importorskip("grpc")

    chunks = _chunks(include_usage=True)
    serialize, deserialize = iws.grpc.serializers("protobuf")
    method = "/inferwire.example.Chat/Generate"

    async def generate(request: iws.ChatCompletionRequest, context: Any) -> Any:
        assert request.max_output_tokens == 3
        for chunk in chunks:
            yield chunk

    async def run() -> list[ic.TokenChunk]:
        server = grpc.aio.server()
        handler = grpc.unary_stream_rpc_method_handler(
            generate,
            request_deserializer=iws.grpc.request_deserializer,
            response_serializer=serialize,
        )
        server.add_generic_rpc_handlers(
            [grpc.method_handlers_generic_handler("inferwire.example.Chat", {"Generate": handler})]
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = channel.unary_stream(
                    method,
                    request_serializer=iws.grpc.request_serializer,
                    response_deserializer=deserialize,
                )
                request = iws.ChatCompletionRequest.from_obj(
                    {"messages": MESSAGES, "max_tokens": 3}
                )
                return [chunk async for chunk in call(request)]
        finally:
            await server.stop(None)

    assert asyncio.run(run()) == chunks


# -- what importing the package costs ------------------------------------------------------


def test_importing_serving_imports_no_framework() -> None:
    code = (
        "import sys, inferwire.serving as iws; iws.negotiate('*/*'); "
        'iws.ChatCompletionRequest.parse(b\'{"messages":[{"role":"user"}]}\'); '
        "print(sorted(m for m in ('starlette', 'aiohttp', 'httpx', 'grpc', 'fastapi', 'pydantic') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    lazy = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, inferwire.serving as s; s.httpx; print('httpx' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert lazy.stdout.strip() == "True"


# -- OpenAI's events from a template -------------------------------------------------------


def _reference(codec: str) -> StreamEncoder:
    """The events as the codec writes them, chunk by chunk, with no template."""
    import orjson

    from inferwire.codecs.framing import framed_encoder

    plain = ic.get(codec, extensions=False)
    return iws.UsageAsOpenAI(
        framed_encoder("sse", plain.encode), framed_encoder("sse", orjson.dumps)
    )


@pytest.mark.parametrize("codec", ["orjson", "msgspec-json", "json"])
@pytest.mark.parametrize("workload", [w for w in workloads.names() if w.startswith("stream")])
def test_templated_events_are_the_codecs_bytes(codec: str, workload: str) -> None:
    chunks = list(workloads.token_stream_source(workload, 5))
    fast, slow = iws.response_encoder(ic.get(codec)), _reference(codec)
    assert [fast.encode(c) for c in chunks] == [slow.encode(c) for c in chunks]


@settings(max_examples=300)
@given(text=st.text(), model=st.text(min_size=1), id_=st.text())
def test_templated_events_hold_any_text(text: str, model: str, id_: str) -> None:
    builder = iws.ChunkBuilder(model, id=id_)
    chunks = [builder.chunk("a"), builder.chunk(text), builder.chunk(text + text)]
    for codec in ("orjson", "msgspec-json"):
        fast, slow = iws.response_encoder(ic.get(codec)), _reference(codec)
        assert [fast.encode(c) for c in chunks] == [slow.encode(c) for c in chunks]


@pytest.mark.parametrize("codec", ["orjson", "msgspec-json"])
def test_a_lone_surrogate_is_the_codecs_encode_error(codec: str) -> None:
    builder = iws.ChunkBuilder("m")
    encoder = iws.response_encoder(ic.get(codec))
    encoder.encode(builder.chunk("first"))
    encoder.encode(builder.chunk("templated"))
    with pytest.raises(ic.EncodeError):
        encoder.encode(builder.chunk("\ud800"))


def test_a_new_response_gets_its_own_template() -> None:
    encoder = iws.response_encoder(ic.get("orjson"))
    for model in ("a", "b"):
        builder = iws.ChunkBuilder(model)
        encoder.encode(builder.chunk("x"))
        event = encoder.encode(builder.chunk("y"))
        assert f'"model":"{model}"'.encode() in event
        assert builder.id.encode() in event
