"""``inferwire load`` against endpoints of any server: the SSE reader, the tolerant stream
readers, the checks that hold for any server, and runs against a tiny OpenAI-compatible server
written inside the tests (tests/load/tiny_openai_server.py, none of inferwire's server code) and
against inferwire's own servers through the public APIs (no content check)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from inferwire.cli import main as cli
from inferwire.codecs.errors import FrameTooLargeError
from inferwire.codecs.framing import SseDecoder
from inferwire.load import api_streams, endpoints, openloop, targets
from inferwire.load.api_streams import (
    ApiChunk,
    ApiStreamCheck,
    ServerStreamError,
    UsageMismatchError,
)
from inferwire.transports import ConnectError, ProtocolError, StreamTruncatedError, server_process

TINY = Path(__file__).with_name("tiny_openai_server.py")
TTFT_MS = 60.0
ITL_MS = 20.0


@dataclass(frozen=True)
class Prompt:
    text: str
    max_tokens: int | None = None


# -- the SSE reader (the codecs' SseDecoder, as the API targets read any server's events) --------

STREAM = (
    b"\xef\xbb\xbf: keep-alive\r\n\r\n"
    b"data: one\n\n"
    b"event: error\ndata: two\ndata: lines\r\n\r\n"
    b"data:three\r\rid: 4\nretry: 10\ndata: four\n\n"
    b"data: [DONE]\n\n"
)
DATA = [b"one", b"two\nlines", b"three", b"four"]
NAMED = [(b"error", b"two\nlines")]


def _reader(max_event_bytes: int = 1 << 20) -> tuple[SseDecoder[bytes], list[tuple[bytes, bytes]]]:
    named: list[tuple[bytes, bytes]] = []
    reader = SseDecoder(
        bytes, max_event_bytes, on_named_event=lambda name, data: named.append((name, data))
    )
    return reader, named


def test_sse_reads_every_line_ending_comments_and_fields() -> None:
    reader, named = _reader()
    assert reader.feed(STREAM) == DATA
    assert named == NAMED
    assert reader.finished


@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_sse_any_split_gives_the_same_events(size: int) -> None:
    reader, named = _reader()
    events = []
    for at in range(0, len(STREAM), size):
        events += reader.feed(STREAM[at : at + size])
    assert events == DATA
    assert named == NAMED
    assert not reader.pending


def test_sse_an_unfinished_event_is_pending() -> None:
    reader, _ = _reader()
    reader.feed(b"data: one\n\ndata: tw")
    assert reader.pending
    reader.feed(b"o\n")
    assert reader.pending
    assert reader.feed(b"\n") == [b"two"]
    assert not reader.pending


def test_sse_bounds_a_line_that_never_ends() -> None:
    reader, _ = _reader(max_event_bytes=1000)
    for _ in range(9):
        reader.feed(b"data: " + b"x" * 100)
    with pytest.raises(FrameTooLargeError):
        reader.feed(b"x" * 100)


def test_sse_bounds_an_event_of_many_lines() -> None:
    reader, _ = _reader(max_event_bytes=1000)
    with pytest.raises(FrameTooLargeError):
        reader.feed((b"data: " + b"y" * 20 + b"\n") * 100)


# -- the stream readers ------------------------------------------------------------------------


def _chat(**obj: Any) -> bytes:
    return orjson.dumps({"object": "chat.completion.chunk", **obj})


def test_a_usage_only_chunk_and_a_role_only_delta_carry_no_token() -> None:
    usage = api_streams.openai_chunk(
        _chat(choices=[], usage={"prompt_tokens": 3, "completion_tokens": 5}), chat=True
    )
    assert usage.tokens == 0
    assert usage.usage == api_streams.Usage(3, 5)
    role = api_streams.openai_chunk(
        _chat(choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}}]), chat=True
    )
    assert role.tokens == 0
    assert role.started == (0,)


def test_several_choices_count_each() -> None:
    chunk = api_streams.openai_chunk(
        _chat(
            choices=[
                {"index": 1, "delta": {"content": "b"}, "finish_reason": "stop"},
                {"index": 0, "delta": {"reasoning_content": "a"}},
            ]
        ),
        chat=True,
    )
    assert (chunk.tokens, chunk.text, chunk.finished, chunk.started) == (2, "b", (1,), (1, 0))
    assert (chunk.reasoning, chunk.reasoning_choices) == ("a", 1)  # reasoning kept out of text


def test_legacy_completions_and_token_ids() -> None:
    chunk = api_streams.openai_chunk(
        orjson.dumps({"choices": [{"index": 0, "text": "hi", "token_ids": [5, 6]}]}), chat=False
    )
    assert (chunk.text, chunk.token_ids, chunk.tokens) == ("hi", (5, 6), 1)


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b'{"error": {"message": "overloaded"}}', ServerStreamError),
        (b"not json", ProtocolError),
        (b"[1, 2]", ProtocolError),
        (b'{"choices": 3}', ProtocolError),
        (b'{"choices": [1]}', ProtocolError),
    ],
)
def test_bad_events_are_typed_errors(data: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        api_streams.openai_chunk(data, chat=True)


def test_generate_extension_events() -> None:
    chunk = api_streams.generate_chunk(
        b'{"model_name": "m", "text_output": "x", "token_ids": [1], "finish_reason": "stop"}'
    )
    assert (chunk.text, chunk.token_ids, chunk.finished) == ("x", (1,), (0,))
    with pytest.raises(ServerStreamError):
        api_streams.generate_chunk(b'{"error": "the model failed"}')


# -- the checks --------------------------------------------------------------------------------


def _run_check(chunks: list[ApiChunk], **kwargs: Any) -> ApiStreamCheck:
    check = ApiStreamCheck(**kwargs)
    counted = sum(check.check(chunk) for chunk in chunks)
    check.finish(counted)
    return check


def _token(
    text: str = "t", *, finish: bool = False, ids: tuple[int, ...] | None = None
) -> ApiChunk:
    return ApiChunk(text=text, token_ids=ids, tokens=1, started=(0,), finished=(0,) * finish)


USAGE_5 = ApiChunk(usage=api_streams.Usage(2, 5))


def test_usage_is_the_count_where_the_server_gives_one() -> None:
    check = _run_check([_token(), _token(), _token(finish=True), USAGE_5, api_streams.DONE])
    assert (check.output_tokens, check.input_tokens, check.source) == (5, 2, "usage")


def test_without_usage_the_chunks_are_counted_and_said_so() -> None:
    check = _run_check([_token(), _token(finish=True), api_streams.DONE])
    assert (check.output_tokens, check.source) == (2, "chunks")


class _Words:
    def count(self, text: str) -> int:
        return len(text.split())


def test_a_tokenizer_counts_and_must_agree_with_usage() -> None:
    check = _run_check(
        [_token("a b"), _token("c", finish=True), api_streams.DONE], counter=_Words()
    )
    assert (check.output_tokens, check.source) == (3, "tokenizer")
    with pytest.raises(UsageMismatchError):
        _run_check(
            [_token("a b"), _token("c", finish=True), USAGE_5, api_streams.DONE], counter=_Words()
        )


def test_token_ids_must_agree_with_usage() -> None:
    chunks = [_token(ids=(1, 2)), _token(ids=(3,), finish=True), USAGE_5, api_streams.DONE]
    with pytest.raises(UsageMismatchError):
        _run_check(chunks)


def test_more_token_chunks_than_usage_is_an_altered_stream() -> None:
    chunks = [_token() for _ in range(6)] + [_token(finish=True), USAGE_5, api_streams.DONE]
    with pytest.raises(UsageMismatchError):
        _run_check(chunks)


def test_no_end_marker_is_truncated() -> None:
    with pytest.raises(StreamTruncatedError):
        _run_check([_token(finish=True)])


def test_a_choice_without_finish_reason_is_truncated() -> None:
    with pytest.raises(StreamTruncatedError):
        _run_check([_token(), api_streams.DONE])
    # an API without finish reasons (the generate extension) ends with its body
    assert _run_check([_token(), api_streams.DONE], needs_finish=False).output_tokens == 1


# -- against a server inferwire did not write --------------------------------------------------


@contextlib.contextmanager
def tiny_server(*options: str) -> Iterator[str]:
    process = subprocess.Popen(
        [sys.executable, str(TINY), "--ttft-ms", str(TTFT_MS), "--itl-ms", str(ITL_MS), *options],
        stdout=subprocess.PIPE,
        text=True,
    )
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


def _point(
    url: str, api: str, model: str | None, *, requests: int = 12, rate: float = 20.0, **kw: Any
) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        endpoint = endpoints.Endpoint(url=url, api=api, model=model, **kw)
        target = targets.open_api_target(endpoint)
        try:
            await target.describe()
            needs = target.needs_finish
            return await openloop.run_point(
                target,
                openloop.LoadSpec(requests=requests),
                rate_rps=rate,
                request_for=lambda i: Prompt(f"prompt {i}"),
                checks=lambda parse: lambda: ApiStreamCheck(parse=parse, needs_finish=needs),
            )
        finally:
            await target.close()

    return asyncio.run(run())


@pytest.mark.parametrize("api", ["openai-chat", "openai-completions"])
def test_the_report_recovers_a_known_ttft_and_itl(api: str) -> None:
    with tiny_server() as url:
        point = _point(url, api, "paced", max_tokens=16)
    assert point["requests_completed"] == 12, point["error_examples"]
    assert point["token_count"] == {"usage": 12}
    assert point["output_tokens"] == 12 * 16
    # the server waits TTFT_MS, then ITL_MS a token: the generator can only add time (its own
    # and the machine's), so the lower bounds are tight and the upper ones generous
    assert TTFT_MS <= point["ttft"]["p50_ms"] <= TTFT_MS + 150
    assert 0.7 * ITL_MS <= point["itl_per_chunk"]["p50_ms"] <= ITL_MS + 60
    assert ITL_MS * 0.9 <= point["tpot"]["p50_ms"] <= ITL_MS + 60
    assert point["client_parse"]["count"] > 12 * 16
    assert point["integrity"]["verified"] == 12


def test_several_choices_are_counted_from_usage() -> None:
    with tiny_server() as url:
        point = _point(url, "openai-chat", "paced", max_tokens=4, extra_body={"n": 2})
    assert point["requests_completed"] == 12, point["error_examples"]
    assert point["output_tokens"] == 12 * 8


@pytest.mark.parametrize(
    ("model", "error", "kind"),
    [
        ("no-done", "StreamTruncatedError", "truncated"),
        ("no-finish", "StreamTruncatedError", "truncated"),
        ("lying-usage", "UsageMismatchError", "altered"),
        ("error-mid", "ServerStreamError", None),
    ],
)
def test_a_broken_stream_is_an_error_never_a_success(
    model: str, error: str, kind: str | None
) -> None:
    with tiny_server() as url:
        point = _point(url, "openai-chat", model, requests=4, max_tokens=8)
    assert point["requests_completed"] == 0
    assert next(iter(point["errors"])).endswith(error), point["errors"]
    if kind is not None:
        assert point["integrity"][kind] == 4


def test_headers_reach_the_server() -> None:
    with tiny_server("--require-key", "sekrit") as url:
        refused = _point(url, "openai-chat", "paced", requests=2, max_tokens=2)
        good = _point(
            url,
            "openai-chat",
            "paced",
            requests=2,
            max_tokens=2,
            headers=(("authorization", "Bearer sekrit"),),
        )
    assert refused["errors"] == {"RemoteError": 2}
    assert good["requests_completed"] == 2


# -- inferwire's own servers, through the public APIs ------------------------------------------

OWN = [
    ("openai-chat", "http1", "http", None),
    ("openai-completions", "http1", "http", None),
    ("kserve-v2-http", "http1", "http", "stream-16"),
    ("kserve-v2-grpc", "grpc", "grpc", "stream-16"),
]


@pytest.mark.parametrize(("api", "transport", "scheme", "model"), OWN)
def test_own_servers_in_the_external_mode(
    api: str, transport: str, scheme: str, model: str | None
) -> None:
    with server_process.serve(transport, "orjson", "--decode-ms", "1") as server:
        point = _point(f"{scheme}://{server.address}", api, model, max_tokens=12)
    assert point["requests_completed"] == 12, point["error_examples"]
    assert point["output_tokens"] == 12 * 12
    assert point["integrity"]["content_checked"] is False
    source = "usage" if api.startswith("openai") else "token_ids"
    assert point["token_count"] == {source: 12}


# -- the command -------------------------------------------------------------------------------


def _command(tmp_path: Path, *args: str) -> dict[str, Any]:
    out = tmp_path / "load.json"
    code = cli.main(["load", *args, "--warmup", "1", "--quiet", "--out", str(out)])
    assert code == 0
    report: dict[str, Any] = orjson.loads(out.read_bytes())
    return report


def test_the_command_against_any_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TINY_KEY", "sekrit")
    with tiny_server("--require-key", "sekrit") as url:
        report = _command(
            tmp_path,
            *("--url", url, "--api", "openai-chat", "--model", "paced"),
            *("--api-key-env", "TINY_KEY", "--header", "X-Trace: 1"),
            *("--extra-body", '{"n": 2}', "--max-tokens", "4"),
            *("--prompts", "synthetic", "--input-tokens", "32"),
            *("--requests", "6", "--rate", "20"),
        )
    parameters = report["parameters"]
    endpoint = parameters["endpoint"]
    assert endpoint["api"] == "openai-chat"
    assert endpoint["model"] == "paced"
    assert endpoint["extra_body"] == {"n": 2}
    assert ["authorization", "(redacted)"] in endpoint["headers"]
    assert "sekrit" not in json.dumps(report)
    assert endpoint["target"]["models"][0]["id"] == "paced"
    # nothing is known of another server's pacing: nothing is invented
    assert parameters["prefill_ms"] is None
    assert parameters["decode_ms"] is None
    (point,) = report["points"]
    assert point["requests_completed"] == 6, point["error_examples"]
    assert point["output_tokens"] == 6 * 8
    assert point["token_count"] == {"usage": 6}
    assert "integrity (sequence only): 6 verified" in capsys.readouterr().out


@pytest.mark.parametrize("api", ["openai-chat", "kserve-v2-http", "kserve-v2-grpc"])
def test_the_command_spawns_our_server_behind_a_public_api(tmp_path: Path, api: str) -> None:
    transport = "grpc" if api == "kserve-v2-grpc" else "http1"
    report = _command(
        tmp_path,
        *("--spawn", "--transport", transport, "--api", api, "--workload", "stream-16"),
        *("--decode-ms", "1", "--requests", "6", "--rate", "30", "--max-tokens", "10"),
    )
    assert report["parameters"]["decode_ms"] == 1.0
    (point,) = report["points"]
    assert point["requests_completed"] == 6, point["error_examples"]
    assert point["output_tokens"] == 60
    assert point["client_parse"]["count"] >= 60


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--url", "http://127.0.0.1:9"], "--url needs --api"),
        (["--api", "openai-chat", "--address", "127.0.0.1:9"], "not --address"),
        (["--url", "ftp://x", "--api", "openai-chat"], "http:// or https://"),
        (["--url", "http://x", "--api", "kserve-v2-http"], "needs --model"),
        (["--url", "http://x", "--api", "openai-chat", "--header", "nocolon"], "Name: value"),
        (["--address", "127.0.0.1:9"], "need --transport"),
    ],
)
def test_the_command_refuses_a_target_it_cannot_name(
    args: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["load", *args]) != 0
    assert words in capsys.readouterr().err


def test_the_command_refuses_extra_body_that_is_not_an_object(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["load", "--url", "http://x", "--api", "openai-chat", "--extra-body", "[1]"])
    assert exited.value.code != 0
    assert "JSON object" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("api", "transport", "scheme", "model"),
    [("openai-chat", "http1", "https", None), ("kserve-v2-grpc", "grpc", "grpcs", "stream-16")],
)
def test_tls_with_the_servers_ca_and_refused_without(
    tmp_path: Path, api: str, transport: str, scheme: str, model: str | None
) -> None:
    with server_process.serve(transport, "orjson", "--tls") as server:
        assert server.ca_pem is not None
        ca = tmp_path / "ca.pem"
        ca.write_bytes(server.ca_pem)
        url = f"{scheme}://{server.address}"
        trusted = _point(url, api, model, requests=4, max_tokens=4, ca_cert=str(ca))
        if scheme == "https":
            insecure = _point(url, api, model, requests=4, max_tokens=4, insecure=True)
            assert insecure["requests_completed"] == 4, insecure["error_examples"]
        with pytest.raises(ConnectError):  # the system's CAs do not know the test CA
            _point(url, api, model, requests=4, max_tokens=4)
    assert trusted["requests_completed"] == 4, trusted["error_examples"]


def _stream_response(raw: bytes, datatype: str = "BYTES") -> bytes:
    from inferwire.schemas.kserve import inference_pb2 as kpb

    message = kpb.ModelStreamInferResponse()
    message.infer_response.outputs.add(name="text_output", datatype=datatype, shape=[1])
    message.infer_response.raw_output_contents.append(raw)
    return message.SerializeToString()


@pytest.mark.parametrize(
    "data",
    [
        b"\xff\xff\xff",  # not a ModelStreamInferResponse
        _stream_response(b"\x05\x00"),  # cut inside an element's length
        _stream_response(b"\x09\x00\x00\x00abc"),  # an element longer than the bytes
    ],
    ids=["not-protobuf", "cut-length", "cut-element"],
)
def test_a_bad_grpc_response_is_a_protocol_error(data: bytes) -> None:
    from inferwire.load.kserve_grpc_target import chunk_of

    with pytest.raises(ProtocolError):
        chunk_of(data)


def test_a_grpc_response_with_an_error_message_fails_the_request() -> None:
    from inferwire.load.kserve_grpc_target import chunk_of
    from inferwire.schemas.kserve import inference_pb2 as kpb

    with pytest.raises(ServerStreamError):
        chunk_of(kpb.ModelStreamInferResponse(error_message="the model failed").SerializeToString())
    assert chunk_of(_stream_response(b"\x02\x00\x00\x00hi")).text == "hi"
