"""``inferwire load``'s workloads beyond one prompt a request: conversations (the history each
turn sends, checked by a server written in the tests, tests/load/conversation_server.py),
shared prefixes (the expected prefix cache hits beside a fake vLLM's own counters,
tests/helpers/fake_engines.py), and trace replay (the bundled Mooncake and Azure samples at
their own times); and the typed errors of bad traces, datasets and histories."""

from __future__ import annotations

import contextlib
import importlib.resources
import itertools
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
from inferwire.load import conversations, prefix_cache, traces, workload_page
from inferwire.load.conversations import ContextLimitError, ThinkTime, ThinkTimeError
from inferwire.load.prompt_files import PromptFileError
from inferwire.load.prompt_sets import Lengths, SyntheticPrompts, WithSharedPrefix
from tests.helpers.fake_engines import running
from tests.load.conversation_server import history_fault, reply_for

SERVER = Path(__file__).with_name("conversation_server.py")
DATA = importlib.resources.files("inferwire.load") / "data"
MOONCAKE = Path(str(DATA / "trace_mooncake_sample.jsonl"))
AZURE = Path(str(DATA / "trace_azure_sample.csv"))
THINK_S = 0.05


@contextlib.contextmanager
def _server() -> Iterator[str]:
    process = subprocess.Popen(
        [sys.executable, str(SERVER), "--ttft-ms", "2", "--itl-ms", "0.5"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        found = re.search(r"listening on (\S+)", line)
        assert found, line
        yield f"http://{found.group(1)}"
    finally:
        process.terminate()
        process.wait(10)
        if process.stdout is not None:
            process.stdout.close()


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with _server() as found:
        yield found


def _load(tmp_path: Path, url: str, *args: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``inferwire load --url URL --api openai-chat ARGS``: its point and its records."""
    out, records = tmp_path / "load.json", tmp_path / "records.jsonl"
    argv = ["load", "--url", url, "--api", "openai-chat", "--quiet", "--no-attribution"]
    code = cli.main([*argv, *args, "--out", str(out), "--records", str(records)])
    assert code == 0
    (point,) = orjson.loads(out.read_bytes())["points"]
    rows = [orjson.loads(line) for line in records.read_bytes().splitlines() if line.strip()]
    return point, rows


def _refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    capsys.readouterr()
    assert cli.main(["load", "--quiet", *args]) != 0
    return capsys.readouterr().err


# -- conversations ------------------------------------------------------------------------------


def test_each_turn_sends_the_history_with_the_replies_as_the_server_sent_them(
    tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    point, rows = _load(
        tmp_path,
        url,
        *("--model", "echo", "--turns", "3", "--think-time-s", str(THINK_S)),
        *("--requests", "4", "--rate", "40", "--input-tokens", "8", "--max-tokens", "3"),
        *("--warmup", "1"),
    )
    # the server answers 400 to any history holding a reply it did not send: all went through
    assert point["requests_completed"] == 12, point["error_examples"]
    assert point["requests_failed"] == 0
    talk = point["conversations"]
    assert talk["conversations_whole"] == 4
    assert (talk["turns_planned"], talk["turns_sent"], talk["turns_not_sent"]) == (12, 12, 0)
    by_turn = talk["by_turn"]
    assert [t["completed"] for t in by_turn] == [4, 4, 4]
    assert all(t["ttft"]["p50_ms"] is not None and t["e2e"]["p99_ms"] for t in by_turn)
    # the server's usage counts the history: each turn's input holds the turns before it
    means = [t["input_tokens"]["mean"] for t in by_turn]
    assert means == [8, 8 + 3 + 8, 8 + 3 + 8 + 3 + 8]
    assert "conversations: 4/4 whole, 12/12 turns sent" in capsys.readouterr().out
    page = workload_page.section(point)  # the HTML report's section
    assert page.count("<tr>") == 1 + 3
    assert "4 of 4 conversations whole; 12 of 12 turns sent; think time 0.05 s" in page
    assert {(r["conversation"], r["turn"]) for r in rows} == {
        (c, k) for c in range(4) for k in range(3)
    }
    for c in range(4):
        turns = sorted((r for r in rows if r["conversation"] == c), key=lambda r: r["turn"])
        for before, after in itertools.pairwise(turns):
            ended_s = before["intended_s"] + before["e2e_ms"] / 1000
            assert after["intended_s"] >= ended_s + THINK_S - 1e-6  # the think time, a floor
            assert after["index"] == before["index"] + 1


def test_a_failed_turn_ends_its_conversation(tmp_path: Path, url: str) -> None:
    point, rows = _load(
        tmp_path,
        url,
        *("--model", "fail-second-turn", "--turns", "3", "--requests", "3", "--rate", "40"),
        *("--input-tokens", "4", "--max-tokens", "2", "--warmup", "0"),
    )
    talk = point["conversations"]
    assert point["requests_completed"] == 3
    assert point["requests_failed"] == 3  # every second turn: a 500
    assert talk["turns_not_sent"] == 3
    assert talk["not_sent_because"] == {conversations.EARLIER_TURN_FAILED: 3}
    assert sorted((r["turn"], r["ok"]) for r in rows) == [(0, True)] * 3 + [(1, False)] * 3


def test_a_history_past_the_limit_as_the_run_goes_ends_the_conversation(
    tmp_path: Path, url: str
) -> None:
    # no --max-tokens: the replies are not bounded, so the limit is checked as the run goes;
    # the server's 4-word replies make turn 1's history 8 + 4 + 8 = 20 words, past 19
    point, rows = _load(
        tmp_path,
        url,
        *("--model", "echo", "--turns", "3", "--requests", "2", "--rate", "40"),
        *("--input-tokens", "8", "--max-context-tokens", "19", "--warmup", "0"),
    )
    assert point["requests_completed"] == 2
    assert list(point["errors"]) == [f"{ContextLimitError.__module__}.ContextLimitError"]
    assert "conversation 0, turn 1: its history reaches 20 tokens" in str(
        point["error_examples"]
    ) or "conversation 1, turn 1: its history reaches 20 tokens" in str(point["error_examples"])
    assert point["conversations"]["turns_not_sent"] == 2
    assert all(r["ok"] == (r["turn"] == 0) for r in rows)


def test_a_history_that_could_pass_the_limit_fails_the_run_before_it_starts(
    capsys: pytest.CaptureFixture[str], url: str
) -> None:
    # each turn 8 words, each reply at most 4: turn 2 may send 8 + 4 + 8 + 4 + 8 = 32
    err = _refused(
        capsys,
        *("--url", url, "--api", "openai-chat", "--model", "echo", "--turns", "3"),
        *("--input-tokens", "8", "--max-tokens", "4", "--max-context-tokens", "31"),
    )
    assert "conversation 0, turn 2: its history may reach 32 tokens" in err


def test_a_dataset_is_read_and_checked_against_the_limit_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "talks.jsonl"
    sharegpt = {
        "conversations": [
            {"from": "system", "value": "be brief"},
            {"from": "human", "value": "one two three"},
            {"from": "gpt", "value": "a b"},
            {"from": "human", "value": "four five"},
        ]
    }
    long_reply = {
        "messages": [
            {"role": "user", "content": "x y"},
            {"role": "assistant", "content": " ".join(["z"] * 30)},
            {"role": "user", "content": [{"type": "text", "text": "again"}]},
        ]
    }
    lines = [orjson.dumps(sharegpt), b"", orjson.dumps(long_reply), orjson.dumps({"messages": []})]
    path.write_bytes(b"\n".join(lines) + b"\n")
    found = conversations.read_conversations(path)
    assert found.skipped == 1
    first, second = found.scripts
    assert first.system == "be brief"
    assert first.system_tokens == 2
    assert [(t.text, t.tokens, t.max_tokens) for t in first.turns] == [
        ("one two three", 3, 2),
        ("four five", 2, None),
    ]
    assert (first.line, second.line) == (1, 3)
    assert [t.max_tokens for t in second.turns] == [30, None]
    conversations.check_context(found.scripts, 40, None, path=path)
    with pytest.raises(ContextLimitError) as raised:
        conversations.check_context(found.scripts, 32, None, path=path)
    assert raised.value.line == 3
    assert str(raised.value) == (
        f"{path}:3: conversation 1, turn 1: its history may reach 33 tokens, past"
        " --max-context-tokens 32"
    )
    assert [len(s.turns) for s in conversations.read_conversations(path, turns=1).scripts] == [1, 1]


@pytest.mark.parametrize(
    ("line", "words"),
    [
        (b"{not json", "not JSON"),
        (b'{"messages": "hi"}', "'messages' is not a list"),
        (b'{"conversations": [{"from": "human"}]}', "content"),
        (b'{"prompt": "a", "messages": []}', "exactly one of"),
    ],
)
def test_a_malformed_dataset_names_its_line(tmp_path: Path, line: bytes, words: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"prompt": "fine"}\n' + line + b"\n")
    with pytest.raises(PromptFileError, match=re.escape(words)) as raised:
        conversations.read_conversations(path)
    assert raised.value.line == 2


def test_the_servers_history_check_refuses_an_altered_reply() -> None:
    asked = [{"role": "user", "content": "hello there"}]
    reply = {"role": "assistant", "content": reply_for(asked, 3)}
    good = [*asked, reply, {"role": "user", "content": "and?"}]
    assert history_fault(good) is None
    altered = [*asked, {**reply, "content": reply["content"] + " w3"}, good[-1]]
    assert "not the reply this server sent" in str(history_fault(altered))
    assert "last message" in str(history_fault(good[:2]))


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--api", "openai-completions", "--turns", "2"], "--api openai-chat, not openai-comp"),
        (["--api", "openai-chat", "--turns", "2", "--prefix-tokens", "8"], "do not go together"),
        (["--api", "openai-chat", "--think-time-s", "1"], "go with --turns"),
        (["--api", "openai-chat", "--turns", "2", "--part", "0/2"], "not of conversations"),
    ],
)
def test_conversation_options_that_cannot_work_are_refused(
    capsys: pytest.CaptureFixture[str], args: list[str], words: str
) -> None:
    assert words in _refused(capsys, "--url", "http://127.0.0.1:9", *args)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0", [0.0]), ("2.5", [2.5]), ("uniform:1,3", None), ("lognormal:1,0.5", None)],
)
def test_think_times_parse_and_draw_seeded(text: str, seconds: list[float] | None) -> None:
    think = ThinkTime.parse(text)
    assert ThinkTime.parse(str(think)) == think
    drawn = think.draw_ns(np.random.default_rng(7), (3, 4))
    assert np.array_equal(drawn, think.draw_ns(np.random.default_rng(7), (3, 4)))
    assert (drawn >= 0).all()
    if seconds is not None:
        assert set(drawn.ravel().tolist()) == {round(s * 1e9) for s in seconds}
    if text.startswith("uniform"):
        assert ((drawn >= 1e9) & (drawn <= 3e9)).all()


@pytest.mark.parametrize("text", ["-1", "x", "uniform:3,1", "gamma:1,2", "normal:1", "9999"])
def test_bad_think_times_are_refused(text: str) -> None:
    with pytest.raises(ThinkTimeError):
        ThinkTime.parse(text)


# -- shared prefixes ----------------------------------------------------------------------------


def test_prompts_of_a_group_share_exactly_its_prefix() -> None:
    base = SyntheticPrompts(input_tokens=Lengths.parse("12"), output_tokens=None)
    shared = WithSharedPrefix(base=base, prefix_tokens=20, groups=3)
    prompts = shared.draw(9, seed=4)
    assert shared.draw(9, seed=4) == prompts
    words = [p.text.split() for p in prompts]
    own = [p.text.split() for p in base.draw(9, seed=4)]
    prefixes = [p.split() for p in shared.prefixes(seed=4)]
    for i, prompt in enumerate(prompts):
        assert words[i] == prefixes[i % 3] + own[i]  # the group's prefix, then the base prompt
        assert prompt.input_tokens == 20 + 12
    assert len({tuple(p) for p in prefixes}) == 3
    hits, total = prefix_cache.group_hits(prompts, prefix_tokens=20, groups=3, seen=set())
    assert (hits, total) == ((9 - 3) * 20, 9 * 32)  # each group's first request misses


def test_the_expected_hit_rate_is_reported_beside_the_servers_counters(tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    pacing = ("--frontend-ms", "0", "--queue-ms", "0", "--prefill-ms", "1", "--decode-ms", "0")
    with running("vllm", "--prefix-cache", *pacing, "--tokens", "2") as engine:
        code = cli.main(
            [
                *("load", "--url", engine.url, "--api", "openai-chat", "--quiet"),
                *("--prefix-tokens", "32", "--prefix-groups", "2", "--input-tokens", "16"),
                *("--requests", "8", "--rate", "40", "--warmup", "0", "--max-tokens", "2"),
                *("--out", str(out)),
            ]
        )
    assert code == 0
    (point,) = orjson.loads(out.read_bytes())["points"]
    assert point["requests_completed"] == 8, point["error_examples"]
    found = point["prefix_cache"]
    # 8 prompts of 32 + 16 words in 2 groups: 6 find their group's 32 words cached
    assert found["expected_hit_tokens"] == 6 * 32
    assert found["input_tokens"] == 8 * 48
    assert found["expected_hit_rate"] == pytest.approx(0.5)
    server = found["server"]
    assert (server["engine"], server["source"]) == ("vllm", "counters")
    assert server["hit_tokens"] == 6 * 32  # the fake's cache: whole 16-word blocks
    assert server["queried_tokens"] == 8 * 48
    assert server["hit_rate"] == pytest.approx(found["expected_hit_rate"])
    page = workload_page.section(point)
    assert page.count("<td>50.0%</td>") == 2  # expected, and the server's
    assert "vllm:prefix_cache_hits, vllm:prefix_cache_queries" in page


# -- traces -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "speed"), [(MOONCAKE, 40.0), (AZURE, 10.0)])
def test_a_bundled_trace_is_replayed_at_its_times_and_lengths(
    tmp_path: Path, url: str, path: Path, speed: float
) -> None:
    trace = traces.read_trace(path)
    point, rows = _load(
        tmp_path,
        url,
        *("--model", "echo", "--trace-file", str(path), "--trace-speed", str(speed)),
        *("--warmup", "0"),
    )
    count = len(trace.requests)
    assert point["requests_completed"] == count, point["error_examples"]
    assert point["rate_rps"] == pytest.approx(trace.rate_rps(speed))
    rows.sort(key=lambda r: r["index"])
    assert [r["index"] for r in rows] == list(range(count))
    first_ns = trace.requests[0].time_ns
    for row, request in zip(rows, trace.requests, strict=True):
        assert row["intended_s"] == pytest.approx(
            (request.time_ns - first_ns) / speed / 1e9, abs=1e-6
        )
        assert row["output_tokens"] == max(request.output_tokens, 1)  # what max_tokens asked
        assert row["input_tokens"] == request.input_tokens  # the server counts the words
    if path == MOONCAKE:
        assert point["prefix_cache"]["shared_by"] == "trace hash ids"
        assert point["prefix_cache"]["expected_hit_tokens"] > 0


def test_the_bundled_traces_parse_as_their_publishers_define_them() -> None:
    mooncake = traces.read_trace(MOONCAKE)
    assert mooncake.format == "mooncake"
    for request in mooncake.requests:
        assert request.hash_ids is not None
        assert len(request.hash_ids) == -(-request.input_tokens // traces.BLOCK_TOKENS)
    azure = traces.read_trace(AZURE)
    assert azure.format == "azure"
    assert len(azure.requests) == 30
    # seven fractional digits: 100 ns ticks, kept to the nanosecond
    stamp = traces.parse_datetime_ns("2023-11-16 18:15:46.6805900", AZURE, 1)
    assert stamp % 1_000_000_000 == 680_590_000
    zoned = traces.parse_datetime_ns("2023-11-16T19:15:46.68059+01:00", AZURE, 1)
    assert zoned == stamp
    assert traces.read_trace(AZURE, limit=5).requests == azure.requests[:5]


def test_requests_sharing_hash_ids_share_that_prefix() -> None:
    requests = [
        traces.TraceRequest(time_ns=0, input_tokens=600, output_tokens=0, hash_ids=(7, 8), line=1),
        traces.TraceRequest(time_ns=1, input_tokens=700, output_tokens=3, hash_ids=(7, 9), line=2),
        traces.TraceRequest(time_ns=2, input_tokens=100, output_tokens=3, hash_ids=None, line=3),
    ]
    prompts = traces.make_prompts(requests, seed=3)
    words = [p.text.split() for p in prompts]
    assert [len(w) for w in words] == [600, 700, 100]
    assert words[0][:512] == words[1][:512]
    assert words[0][512:] != words[1][512:600]
    assert [p.max_tokens for p in prompts] == [1, 3, 3]  # an output of 0 asks for 1
    assert traces.expected_block_hits(requests, set()) == (512, 1400)


@pytest.mark.parametrize(
    ("content", "line", "words"),
    [
        (b'{"timestamp": 0, "input_length": 5, "output_length": 1}\n{oops\n', 2, "not JSON"),
        (b'{"timestamp": 0, "input_length": 5}\n', 1, "no 'output_length'"),
        (b'\n\n{"timestamp": 0, "input_length": -5, "output_length": 1}\n', 3, "input_length"),
        (b'{"timestamp": true, "input_length": 5, "output_length": 1}\n', 1, "timestamp"),
        (b'{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": 3}\n', 1, "list"),
        (
            b'{"timestamp": 9, "input_length": 5, "output_length": 1}\n'
            b'{"timestamp": 3, "input_length": 5, "output_length": 1}\n',
            2,
            "before the line above",
        ),
        (b"[1, 2]\n", 1, "not a JSON object"),
    ],
)
def test_a_malformed_mooncake_line_is_a_typed_error_with_its_line(
    tmp_path: Path, content: bytes, line: int, words: str
) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_bytes(content)
    with pytest.raises(traces.TraceFileError, match=re.escape(words)) as raised:
        traces.read_trace(path)
    assert raised.value.line == line
    assert str(raised.value).startswith(f"{path}:{line}: ")


@pytest.mark.parametrize(
    ("content", "line", "words"),
    [
        ("TIMESTAMP,ContextTokens\n", 1, "no GeneratedTokens column"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,x,3\n", 2, "ContextTokens"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,4,3\n", 2, "not a date and time"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-02-30 10:00:00,4,3\n", 2, "date and time"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46\n", 2, "columns"),
        ('TIMESTAMP,ContextTokens,GeneratedTokens\n"2023-11-16 18:15:46,4,3\n', 2, "not CSV"),
    ],
)
def test_a_malformed_azure_line_is_a_typed_error_with_its_line(
    tmp_path: Path, content: str, line: int, words: str
) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(content)
    with pytest.raises(traces.TraceFileError, match=re.escape(words)) as raised:
        traces.read_trace(path)
    assert raised.value.line == line


def test_the_command_names_a_bad_trace_line_and_refuses_a_schedule_beside_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_bytes(b'{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1}\n')
    target = ("--url", "http://127.0.0.1:9", "--api", "openai-chat")
    err = _refused(capsys, *target, "--trace-file", str(path))
    assert f"--trace-file: {path}:2: no 'input_length', 'output_length'" in err
    err = _refused(capsys, *target, "--trace-file", str(MOONCAKE), "--duration", "3")
    assert "no --duration" in err
    assert "needs --api" in _refused(capsys, "--spawn", "--transport", "tcp", "--trace-file", "x")
