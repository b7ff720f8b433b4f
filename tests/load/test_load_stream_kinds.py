"""What a stream carries besides plain text: chunks of several tokens, reasoning, tool calls.
The readers and the check, event shape by event shape, then ``inferwire load`` against a
server written here (tests/load/kinds_server.py, none of inferwire's code): the figures each
output gives, and the typed errors of streams whose events come out of order or broken."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from inferwire.cli import main as cli
from inferwire.load import api_streams, hdr_merge, html_report, stream_content
from inferwire.load.api_streams import ApiChunk, ApiStreamCheck, Usage, UsageMismatchError
from inferwire.load.live_metrics import LiveMetrics
from inferwire.load.metrics import Recorder
from inferwire.load.stream_content import (
    EventOrderError,
    StreamContent,
    ToolCallArgumentsError,
    ToolCallDelta,
    tokens_per_chunk,
)
from inferwire.transports import ProtocolError
from tests.load.load_metrics_helpers import scrape, value

SERVER = Path(__file__).with_name("kinds_server.py")
TTFT_MS = 20.0
ITL_MS = 5.0
REASONING = 4
TOKENS = 8
REQUESTS = 4


def _chat(*choices: dict[str, Any], **more: Any) -> ApiChunk:
    obj = {"object": "chat.completion.chunk", "choices": list(choices), **more}
    return api_streams.openai_chunk(orjson.dumps(obj), chat=True)


def _delta(index: int = 0, finish: str | None = None, **delta: Any) -> dict[str, Any]:
    return {"index": index, "delta": delta, "finish_reason": finish}


def _call(index: int, **fields: Any) -> dict[str, Any]:
    """A ``tool_calls[]`` item: ``id``, and ``name``/``arguments`` into ``function``."""
    function = {k: fields.pop(k) for k in ("name", "arguments") if k in fields}
    return {"index": index, **fields, "function": function}


def _checked(chunks: list[ApiChunk], **kwargs: Any) -> tuple[ApiStreamCheck, list[int]]:
    check = ApiStreamCheck(**kwargs)
    counts = [check.check(chunk) for chunk in chunks]
    check.finish(sum(counts))
    return check, counts


# -- the reader ------------------------------------------------------------------------------


def test_reasoning_is_kept_out_of_the_text() -> None:
    chunk = _chat(_delta(reasoning_content="think"))
    assert (chunk.text, chunk.reasoning, chunk.tokens, chunk.reasoning_choices) == (
        "",
        "think",
        1,
        1,
    )
    newer = _chat(_delta(reasoning="think"))  # vLLM's newer name
    assert (newer.text, newer.reasoning, newer.reasoning_choices) == ("", "think", 1)
    both = _chat(_delta(reasoning_content="a", reasoning="a"))  # one delta sent under both names
    assert both.reasoning == "a"


def test_a_delta_with_reasoning_and_content_is_output() -> None:
    chunk = _chat(_delta(reasoning_content="</think>", content="Hi"))
    assert (chunk.text, chunk.reasoning, chunk.tokens, chunk.reasoning_choices) == (
        "Hi",
        "</think>",
        1,
        0,
    )


def test_the_texts_of_a_stream_join_into_the_reply() -> None:
    """What another helper relies on: ``text`` is the reply, whatever else the stream carries."""
    chunks = [
        _chat(_delta(role="assistant", content="")),
        _chat(_delta(reasoning_content="let me think")),
        _chat(_delta(content="Hello")),
        _chat(_delta(content=", world", finish="stop")),
    ]
    assert "".join(c.text for c in chunks) == "Hello, world"


def test_tool_call_fragments_are_read() -> None:
    chunk = _chat(
        _delta(tool_calls=[_call(0, id="c0", name="f", arguments=""), _call(1, arguments="{")])
    )
    assert chunk.tokens == 1
    assert chunk.tool_calls == (
        ToolCallDelta(0, 0, "c0", "f", None),
        ToolCallDelta(0, 1, None, None, "{"),
    )
    legacy = _chat(_delta(function_call={"name": "f", "arguments": "{}"}))
    assert legacy.tool_calls == (ToolCallDelta(0, stream_content.FUNCTION_CALL, None, "f", "{}"),)


@pytest.mark.parametrize(
    "calls",
    [
        "not a list",
        ["not an object"],
        [{"index": "0", "function": {"arguments": "{}"}}],
        [{"index": -1, "function": {"arguments": "{}"}}],
        [{"index": 0, "function": ["not", "an", "object"]}],
        [{"index": 0, "id": 5, "function": {"name": "f"}}],
        [{"index": 0, "function": {"name": "f", "arguments": {"a": 1}}}],
    ],
)
def test_bad_tool_calls_are_protocol_errors(calls: Any) -> None:
    with pytest.raises(ProtocolError):
        _chat(_delta(tool_calls=calls))


def test_a_bad_function_call_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        _chat(_delta(function_call="f()"))


def test_usage_details_give_the_reasoning_tokens() -> None:
    usage = {"prompt_tokens": 3, "completion_tokens": 9}
    chunk = _chat(usage={**usage, "completion_tokens_details": {"reasoning_tokens": 4}})
    assert chunk.usage == Usage(3, 9, 4)
    not_given: tuple[Any, ...] = (None, {}, {"reasoning_tokens": -1}, {"reasoning_tokens": "4"}, [])
    for details in not_given:
        assert _chat(usage={**usage, "completion_tokens_details": details}).usage == Usage(3, 9)


# -- the check -------------------------------------------------------------------------------

USAGE_DONE = [api_streams.DONE]


def _usage_chunk(completion: int, reasoning: int | None = None) -> ApiChunk:
    return ApiChunk(usage=Usage(2, completion, reasoning))


def test_a_plain_stream_has_no_content_figures() -> None:
    chunks = [_chat(_delta(content="a")), _chat(_delta(content="b", finish="stop")), *USAGE_DONE]
    check, counts = _checked(chunks)
    assert counts == [1, 1, 0]
    assert check.content is None
    assert check.chunk_source == "chunks"


def test_reasoning_first_is_counted_apart_and_delays_the_first_output() -> None:
    chunks = [
        _chat(_delta(reasoning_content="r0")),
        _chat(_delta(reasoning_content="r1")),
        _chat(_delta(content="a")),
        _chat(_delta(content="b", finish="stop")),
        *USAGE_DONE,
    ]
    check = ApiStreamCheck()
    for chunk in chunks[:2]:
        check.check(chunk)
    assert check.first_output_ns == 0  # reasoning came first: TTFOT waits for output
    stamped_after = api_streams.arrival_ns()
    for chunk in chunks[2:]:
        check.check(chunk)
    check.finish(4)
    assert check.first_output_ns is not None
    assert check.first_output_ns >= stamped_after
    assert check.content == StreamContent(
        reasoning_tokens=2,
        reasoning_source="chunks",
        tool_calls=0,
        first_output_ns=check.first_output_ns,
    )
    assert check.output_tokens == 4  # reasoning included, as OpenAI's completion tokens


def test_the_servers_reasoning_tokens_are_taken_and_checked() -> None:
    thinking = [_chat(_delta(reasoning_content="r")), _chat(_delta(content="a", finish="stop"))]
    check, _ = _checked([*thinking, _usage_chunk(9, 6), *USAGE_DONE])
    assert check.content is not None
    assert (check.content.reasoning_tokens, check.content.reasoning_source) == (6, "usage")
    for lying in (_usage_chunk(9, 10), _usage_chunk(9, 0)):  # over the total; under the deltas
        with pytest.raises(UsageMismatchError):
            _checked([*thinking, lying, *USAGE_DONE])


def test_hidden_reasoning_counts_without_changing_the_first_output() -> None:
    """OpenAI's reasoning models stream no reasoning, and report its tokens in the usage."""
    check, _ = _checked(
        [_chat(_delta(content="a", finish="stop")), _usage_chunk(5, 4), *USAGE_DONE]
    )
    assert check.content == StreamContent(
        reasoning_tokens=4, reasoning_source="usage", first_output_ns=None
    )


def test_output_first_then_reasoning_is_not_reasoning_first() -> None:
    chunks = [
        _chat(_delta(content="a")),
        _chat(_delta(reasoning_content="r")),
        _chat(_delta(content="b", finish="stop")),
        *USAGE_DONE,
    ]
    check, _ = _checked(chunks)
    assert check.content is not None
    assert check.content.first_output_ns is None
    assert check.content.reasoning_tokens == 1


class _Words:
    def count(self, text: str) -> int:
        return len(text.split())


def test_a_tokenizer_splits_a_chunk_of_both_kinds() -> None:
    chunks = [
        _chat(_delta(reasoning_content="one two three")),
        _chat(_delta(reasoning_content="four </think>", content="five six", finish="stop")),
        *USAGE_DONE,
    ]
    check, counts = _checked(chunks, counter=_Words())
    assert counts == [3, 4, 0]
    assert check.content is not None
    assert check.content.reasoning_tokens == 5
    assert check.chunk_source == "tokenizer"


def test_token_ids_count_each_chunk_and_its_reasoning() -> None:
    chunks = [
        _chat({**_delta(reasoning_content="r"), "token_ids": [1, 2, 3]}),
        _chat({**_delta(content="ab", finish="stop"), "token_ids": [4, 5]}),
        _usage_chunk(5),
        *USAGE_DONE,
    ]
    check, counts = _checked(chunks)
    assert counts == [3, 2, 0, 0]
    assert check.content is not None
    assert check.content.reasoning_tokens == 3
    assert check.chunk_source == "token_ids"


def test_running_usage_gives_each_chunks_tokens() -> None:
    """vLLM's ``continuous_usage_stats``: each chunk of one choice carries that choice's running
    completion tokens; their rises are the chunks' tokens."""
    chunks = [
        _chat(_delta(role="assistant"), usage={"prompt_tokens": 2, "completion_tokens": 0}),
        _chat(_delta(content="a b"), usage={"prompt_tokens": 2, "completion_tokens": 2}),
        _chat(_delta(content="c d e"), usage={"prompt_tokens": 2, "completion_tokens": 5}),
        _chat(
            _delta(content="f", finish="stop"), usage={"prompt_tokens": 2, "completion_tokens": 5}
        ),
        _usage_chunk(5),
        *USAGE_DONE,
    ]
    check, counts = _checked(chunks)
    assert counts == [0, 2, 3, 1, 0, 0]  # no rise on the last: one for its choice
    assert check.chunk_source == "usage_deltas+chunks"
    assert check.output_tokens == 5


def test_running_usage_is_each_choices_own() -> None:
    def step(index: int, running: int, finish: str | None = None) -> ApiChunk:
        return _chat(
            _delta(index, finish, content="x"),
            usage={"prompt_tokens": 2, "completion_tokens": running},
        )

    chunks = [step(0, 2), step(1, 3), step(0, 4, "stop"), step(1, 4, "stop")]
    check, counts = _checked([*chunks, _usage_chunk(8), *USAGE_DONE])
    assert counts == [2, 3, 2, 1, 0, 0]
    assert check.chunk_source == "usage_deltas"


def test_tool_calls_are_assembled_per_choice_and_index() -> None:
    chunks = [
        _chat(_delta(tool_calls=[_call(0, id="c0", name="weather", arguments="")])),
        _chat(_delta(tool_calls=[_call(0, arguments='{"city": ')])),
        _chat(_delta(tool_calls=[_call(1, id="c1", name="time", arguments='{"tz": "CET"}')])),
        _chat(_delta(tool_calls=[_call(0, id="c0", arguments='"Paris"}')])),  # id repeated
        _chat(_delta(finish="tool_calls")),
        *USAGE_DONE,
    ]
    check, counts = _checked(chunks)
    assert counts == [1, 1, 1, 1, 0, 0]  # tool-call deltas are output tokens
    assert check.content == StreamContent(tool_calls=2)


@pytest.mark.parametrize(
    ("calls", "error"),
    [
        ([_call(0, id="c0", name="f", arguments='{"a": ')], ToolCallArgumentsError),
        ([_call(0, id="c0", name="f")], ToolCallArgumentsError),  # no arguments at all
        ([_call(0, arguments="{}")], EventOrderError),  # never started
        ([_call(0, id="c0", name="f", arguments="{}"), _call(0, id="c9")], EventOrderError),
    ],
)
def test_broken_tool_calls_are_typed_errors(
    calls: list[dict[str, Any]], error: type[Exception]
) -> None:
    chunks = [_chat(_delta(tool_calls=[call])) for call in calls]
    with pytest.raises(error):
        _checked([*chunks, _chat(_delta(finish="tool_calls")), *USAGE_DONE])


def test_tool_call_arguments_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stream_content, "MAX_TOOL_ARGUMENT_CHARS", 10)
    check = ApiStreamCheck()
    check.check(_chat(_delta(tool_calls=[_call(0, id="c", name="f", arguments='{"a": ')])))
    with pytest.raises(ProtocolError, match="over 10 characters"):
        check.check(_chat(_delta(tool_calls=[_call(0, arguments='"bbbbbbbb"}')])))


def test_a_delta_after_its_choices_finish_is_out_of_order() -> None:
    check = ApiStreamCheck()
    check.check(_chat(_delta(content="a", finish="stop")))
    check.check(_chat(_delta(finish="stop")))  # a bare finish again carries nothing: tolerated
    with pytest.raises(EventOrderError, match="choice 0"):
        check.check(_chat(_delta(content="late")))


def test_other_choices_go_on_after_one_finishes() -> None:
    chunks = [
        _chat(_delta(0, "stop", content="a"), _delta(1, content="b")),
        _chat(_delta(1, "stop", content="c")),
        _usage_chunk(3),
        *USAGE_DONE,
    ]
    check, _ = _checked(chunks)
    assert check.output_tokens == 3
    late = [_chat(_delta(0, "stop", content="a")), _chat(_delta(0, tool_calls=[_call(0, id="c")]))]
    with pytest.raises(EventOrderError):
        _checked(late)


# -- the figures -------------------------------------------------------------------------------


def test_tokens_per_chunk_bins_against_counting_by_hand() -> None:
    rng = np.random.default_rng(31)
    sizes = rng.integers(1, 100, 500)
    counts = np.bincount(sizes.clip(0, stream_content.CHUNK_TOKENS_TOP))
    binned = tokens_per_chunk(counts)
    for name, fewest, most in stream_content.TOKENS_PER_CHUNK_BINS:
        top = 10**9 if name == "65+" else most
        assert binned[name] == int(((sizes >= fewest) & (sizes <= top)).sum()), name
    assert tokens_per_chunk(np.bincount([1, 1, 2])) == {
        "1": 2, "2": 1, "3-4": 0, "5-8": 0, "9-16": 0, "17-32": 0, "33-64": 0, "65+": 0,
    }  # fmt: skip


def test_the_recorder_reports_what_streams_carried() -> None:
    live = LiveMetrics()
    recorder = Recorder(live=live)
    ms = 1_000_000
    recorder.completed_stream(  # reasoned for 30 ms, then two output chunks of two tokens
        intended_ns=0, first_token_ns=10 * ms, done_ns=50 * ms, output_tokens=6,
        gaps_ns=[30 * ms, 10 * ms], chunk_tokens=[2, 2], first_chunk_tokens=2,
        chunk_source="token_ids", input_tokens=7,
        content=StreamContent(
            reasoning_tokens=2, reasoning_source="usage", tool_calls=1, first_output_ns=40 * ms
        ),
    )  # fmt: skip
    recorder.completed_stream(  # a plain one: its first token is its first output
        intended_ns=0, first_token_ns=20 * ms, done_ns=30 * ms, output_tokens=2,
        gaps_ns=[10 * ms], chunk_tokens=[1], chunk_source="chunks",
    )  # fmt: skip
    point = recorder.summary(start_ns=0, scheduled=2)
    assert point["ttfot"]["count"] == 2
    assert point["ttfot"]["max_ms"] == pytest.approx(40)
    assert point["ttft"]["max_ms"] == pytest.approx(20)
    assert (point["reasoning_tokens"], point["reasoning_token_count"]) == (2, {"usage": 1})
    assert point["tool_calls"] == 1
    assert point["tokens_per_chunk"]["2"] == 3
    assert point["tokens_per_chunk"]["1"] == 2
    assert point["chunk_token_count"] == {"token_ids": 1, "chunks": 1}
    assert (point["input_tokens"], point["inputs_completed"]) == (7, 2)
    assert point["itl_per_token"]["count"] == 2 * 2 + 1
    recorder.flush_live()
    families = scrape(live)
    assert value(families, "inferwire_load_reasoning_tokens_total") == 2
    assert value(families, "inferwire_load_tool_calls_total") == 1
    assert value(families, "inferwire_load_token_chunks_total") == 5
    assert value(families, "inferwire_load_time_to_first_output_token_seconds_count") == 2
    assert value(families, "inferwire_load_inter_token_latency_per_token_seconds_count") == 5


def test_ttfot_follows_ttft_until_a_stream_reasons_first() -> None:
    """Plain streams record no TTFOT of their own (it is their TTFT); the first stream that
    reasons first gives TTFOT its own histogram, the TTFTs so far in it, live twin included."""
    live = LiveMetrics()
    recorder = Recorder(live=live)
    ms = 1_000_000
    reasoned = StreamContent(reasoning_tokens=1, reasoning_source="chunks", first_output_ns=0)
    streams: list[tuple[int, StreamContent | None]] = [(5, None), (7, None)]
    for ttft_ms, content in streams:
        recorder.completed_stream(
            intended_ns=0, first_token_ns=ttft_ms * ms, done_ns=50 * ms, output_tokens=2,
            gaps_ns=[ms], chunk_tokens=[1], content=content,
        )  # fmt: skip
    assert recorder.ttfot is recorder.ttft
    recorder.flush_live()
    for ttft_ms, ttfot_ms in ((9, 30), (11, None), (13, 13)):
        content = None
        if ttfot_ms != 13:  # the last: plain, once TTFOT has its own histogram
            first_output = 0 if ttfot_ms is None else ttfot_ms * ms  # None: no output at all
            content = dataclasses.replace(reasoned, first_output_ns=first_output)
        recorder.completed_stream(
            intended_ns=0, first_token_ns=ttft_ms * ms, done_ns=50 * ms, output_tokens=2,
            gaps_ns=[ms], chunk_tokens=[1], content=content,
        )  # fmt: skip
    point = recorder.summary(start_ns=0, scheduled=5)
    assert point["ttft"]["count"] == 5
    assert point["ttfot"]["count"] == 4  # 5, 7, 30, 13: the stream without output has none
    assert recorder.histograms()["ttfot"].encode()["sum_ns"] == (5 + 7 + 30 + 13) * ms
    recorder.flush_live()
    families = scrape(live)
    name = "inferwire_load_time_to_first_output_token_seconds"
    assert value(families, name + "_count") == 4
    assert value(families, name + "_sum") == pytest.approx((5 + 7 + 30 + 13) / 1000)
    assert value(families, "inferwire_load_time_to_first_token_seconds_count") == 5


def test_the_parts_of_a_split_run_merge_the_new_figures() -> None:
    """Counts are summed, TTFOT's histogram merged, the input rates taken over the whole."""
    ms = 1_000_000
    parts = []
    for index in range(2):
        recorder = Recorder()
        recorder.completed_stream(
            intended_ns=0, first_token_ns=(10 + index) * ms, done_ns=40 * ms, output_tokens=4,
            gaps_ns=[ms], chunk_tokens=[2], first_chunk_tokens=2, chunk_source="usage_deltas",
            input_tokens=7, content=StreamContent(
                reasoning_tokens=2, reasoning_source="usage", tool_calls=1,
                first_output_ns=(20 + index) * ms,
            ),
        )  # fmt: skip
        point = recorder.summary(start_ns=0, scheduled=1)
        point.update(
            rate_rps=2.0, concurrency=None, client_cpu_s=0.1, server_cpu_s=None,
            offered_rate_rps=None, hdr={n: h.encode() for n, h in recorder.histograms().items()},
            part={"index": index, "parts": 2, "first_offset_s": 0.0, "last_offset_s": 0.5},
        )  # fmt: skip
        parts.append(point)
    merged = hdr_merge.merge_points(parts)
    assert (merged["reasoning_tokens"], merged["tool_calls"]) == (4, 2)
    assert merged["reasoning_token_count"] == {"usage": 2}
    assert merged["chunk_token_count"] == {"usage_deltas": 2}
    assert merged["tokens_per_chunk"]["2"] == 4
    assert (merged["input_tokens"], merged["inputs_completed"]) == (14, 2)
    assert merged["input_token_throughput_tps"] == pytest.approx(14 / merged["duration_s"])
    assert merged["ttfot"]["count"] == 2
    assert merged["ttfot"]["max_ms"] == pytest.approx(21)


def test_input_tokens_unknown_are_not_made_up() -> None:
    recorder = Recorder()
    recorder.completed_stream(intended_ns=0, first_token_ns=1, done_ns=2, output_tokens=1)
    point = recorder.summary(start_ns=0, scheduled=1)
    assert point["input_tokens"] is None
    assert point["input_token_throughput_tps"] is None
    assert point["inputs_completed"] == 1


# -- the command against a server written here --------------------------------------------------


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    argv = [sys.executable, str(SERVER), "--ttft-ms", str(TTFT_MS), "--itl-ms", str(ITL_MS)]
    argv += ["--tokens", str(TOKENS), "--reasoning", str(REASONING)]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
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


def _load(
    tmp_path: Path, url: str, model: str, *more: str, ok: bool = True
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One point of ``inferwire load`` against the model: its JSON point and its records."""
    out, records = tmp_path / f"{model}.json", tmp_path / f"{model}.jsonl"
    argv = ["load", "--url", url, "--api", "openai-chat", "--model", model, "--quiet"]
    argv += ["--requests", str(REQUESTS), "--rate", "40", "--warmup", "0"]
    argv += ["--out", str(out), "--records", str(records), *more]
    assert cli.main(argv) == (0 if ok else 1)
    (point,) = orjson.loads(out.read_bytes())["points"]
    rows = [orjson.loads(line) for line in records.read_bytes().splitlines()]
    return point, rows


@pytest.mark.parametrize(
    ("extra_body", "counted_by"),
    [
        ({"return_token_ids": True}, "token_ids"),
        (
            {"stream_options": {"include_usage": True, "continuous_usage_stats": True}},
            "usage_deltas",
        ),
    ],
)
def test_two_tokens_a_chunk(
    tmp_path: Path, url: str, extra_body: dict[str, Any], counted_by: str
) -> None:
    body = orjson.dumps(extra_body).decode()
    point, rows = _load(tmp_path, url, "two-per-chunk", "--extra-body", body)
    assert point["requests_completed"] == REQUESTS, point["error_examples"]
    assert point["output_tokens"] == REQUESTS * TOKENS
    assert point["chunk_token_count"] == {counted_by: REQUESTS}
    assert point["tokens_per_chunk"]["2"] == REQUESTS * TOKENS // 2
    assert sum(point["tokens_per_chunk"].values()) == REQUESTS * TOKENS // 2
    per_chunk, per_token = point["itl_per_chunk"], point["itl_per_token"]
    # every gap is spread over the two tokens its chunk carried: half as long, twice as many
    assert per_token["count"] == 2 * per_chunk["count"]
    assert 2 * per_token["mean_ms"] == pytest.approx(per_chunk["mean_ms"], rel=1e-3)
    assert 2 * per_token["p50_ms"] == pytest.approx(per_chunk["p50_ms"], rel=0.01)
    assert per_chunk["p50_ms"] >= 0.7 * ITL_MS
    assert all(row["max_tokens_per_chunk"] == 2 for row in rows)
    assert all(row["ttfot_ms"] == row["ttft_ms"] for row in rows)


def test_without_ids_or_running_usage_each_chunk_counts_one(tmp_path: Path, url: str) -> None:
    point, _ = _load(tmp_path, url, "two-per-chunk")
    assert point["requests_completed"] == REQUESTS, point["error_examples"]
    assert point["output_tokens"] == REQUESTS * TOKENS  # the usage's
    assert point["chunk_token_count"] == {"chunks": REQUESTS}
    assert point["tokens_per_chunk"]["1"] == REQUESTS * TOKENS // 2
    assert point["itl_per_token"]["count"] == point["itl_per_chunk"]["count"]


def test_reasoning_first(tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str]) -> None:
    html = tmp_path / "page.html"
    point, rows = _load(tmp_path, url, "reasoning", "--html", str(html))
    assert point["requests_completed"] == REQUESTS, point["error_examples"]
    assert point["reasoning_tokens"] == REQUESTS * REASONING
    assert point["reasoning_token_count"] == {"usage": REQUESTS}
    assert point["output_tokens"] == REQUESTS * (REASONING + TOKENS)
    for row in rows:
        assert row["reasoning_tokens"] == REASONING
        assert row["ttfot_ms"] > row["ttft_ms"]
    # the server spaces its deltas ITL_MS apart: the first output follows the first reasoning
    # by REASONING gaps (a floor, halved for a client that stamped the first one late)
    assert point["ttfot"]["p50_ms"] - point["ttft"]["p50_ms"] >= 0.5 * REASONING * ITL_MS
    line = capsys.readouterr().out
    assert f"{REQUESTS * REASONING} reasoning tokens;" in line
    assert "TTFOT p50" in line
    assert "ITL/chunk p50" in line
    assert "ITL/token p50" in line
    page = html.read_text()
    for metric in (
        "ttfot.p50_ms",
        "reasoning_tokens",
        "itl_per_chunk.p99_ms",
        "tokens_per_chunk.1",
    ):
        assert f'data-metric="{metric}"' in page
    assert html_report.render({"points": [point]}).count('data-metric="reasoning_tokens"') == 1


def test_reasoning_counted_from_its_deltas(tmp_path: Path, url: str) -> None:
    point, rows = _load(tmp_path, url, "reasoning-counted")
    assert point["requests_completed"] == REQUESTS, point["error_examples"]
    assert point["reasoning_tokens"] == REQUESTS * REASONING
    assert point["reasoning_token_count"] == {"chunks": REQUESTS}
    assert all(row["ttfot_ms"] > row["ttft_ms"] for row in rows)


def test_tool_calls_are_assembled(
    tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    point, rows = _load(tmp_path, url, "tool-call")
    assert point["requests_completed"] == REQUESTS, point["error_examples"]
    assert point["tool_calls"] == 2 * REQUESTS
    assert all(row["tool_calls"] == 2 for row in rows)
    assert point["output_tokens"] == REQUESTS * 5  # the usage's: one a fragment's chunk
    assert f"{2 * REQUESTS} tool calls;" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("model", "error", "kind"),
    [
        ("tool-args-broken", "ToolCallArgumentsError", "altered"),
        ("tool-args-unstarted", "EventOrderError", "reordered"),
        ("content-after-finish", "EventOrderError", "reordered"),
        ("reasoning-lying-usage", "UsageMismatchError", "altered"),
    ],
)
def test_broken_streams_are_typed_errors(
    tmp_path: Path, url: str, model: str, error: str, kind: str
) -> None:
    point, rows = _load(tmp_path, url, model, ok=False)
    assert point["requests_completed"] == 0
    (name,) = point["errors"]
    assert name.endswith(error), point["errors"]
    assert point["integrity"][kind] == REQUESTS
    assert all(not row["ok"] and row["tool_calls"] is None for row in rows)
