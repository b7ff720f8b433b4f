"""examples/openai_server.py in a real process (FastAPI on uvicorn, 127.0.0.1, a free port):
the ``openai`` SDK in its JSON mode, streamed and not; inferwire's httpx helper in the binary
modes; a 406 for an ``Accept`` it cannot answer; and examples/openai_client.py against it."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

import inferwire.codecs as ic
import inferwire.serving as iws
from inferwire.serving import httpx as iws_httpx
from inferwire.workloads import MODEL, token_stream_source

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello."}]
EXPECTED = list(token_stream_source("stream-256", 0))
SEED_7 = list(token_stream_source("stream-256", 7))


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    process = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "openai_server.py"), "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    line: list[str] = []
    stdout = process.stdout
    assert stdout is not None
    reader = threading.Thread(target=lambda: line.append(stdout.readline()), daemon=True)
    reader.start()
    reader.join(60)
    match = re.search(r"listening on ([\d.]+):(\d+)", line[0] if line else "")
    try:
        assert match, f"the example did not start: {line!r}"
        yield f"http://{match.group(1)}:{match.group(2)}"
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        stdout.close()


@pytest.fixture
def client(base_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(api_key="unused", base_url=f"{base_url}/v1", max_retries=0) as sdk:
        yield sdk


def test_the_sdk_lists_the_model(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]


def test_the_sdk_streams_the_workloads_tokens(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    *tokens, usage_chunk = chunks
    assert "".join(c.choices[0].delta.content or "" for c in tokens) == "".join(
        c.text for c in EXPECTED
    )
    assert tokens[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in tokens][-2:] == [None, "stop"]
    assert usage_chunk.choices == []
    assert usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == sum(len(c.token_ids) for c in EXPECTED)
    assert len({c.id for c in chunks}) == 1


def test_the_sdk_gets_a_whole_answer(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=10,
        seed=7,
    )
    assert completion.choices[0].finish_reason == "length"
    assert completion.choices[0].message.content == "".join(c.text for c in SEED_7[:10])
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 10


def test_the_sdks_stream_helper_sees_the_length_cut(client: openai.OpenAI) -> None:
    with client.chat.completions.stream(
        model=MODEL,
        messages=MESSAGES,
        max_completion_tokens=5,
    ) as stream:
        deltas = [e.delta for e in stream if e.type == "content.delta"]
        with pytest.raises(openai.LengthFinishReasonError):
            stream.get_final_completion()
    assert "".join(deltas) == "".join(c.text for c in EXPECTED[:5])


def test_a_bad_request_is_the_sdks_bad_request_error(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            temperature=3,
        )
    assert raised.value.body is not None
    assert raised.value.body["param"] == "temperature"  # type: ignore[index]


@pytest.mark.parametrize("codec", ["msgspec-msgpack", "protobuf", "delta"])
def test_the_httpx_helper_reads_the_binary_modes(base_url: str, codec: str) -> None:
    body = {
        "messages": MESSAGES,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 40,
        "seed": 7,
    }
    with (
        httpx.Client(base_url=base_url) as http,
        http.stream(
            "POST", "/v1/chat/completions", json=body, headers={"accept": iws_httpx.accept(codec)}
        ) as response,
    ):
        assert response.headers["content-type"] == ic.get(codec).stream_media_type
        chunks = list(iws_httpx.iter_chunks(response, codec))
    assert [(c.text, c.token_ids) for c in chunks] == [(c.text, c.token_ids) for c in SEED_7[:40]]
    assert [c.seq for c in chunks] == list(range(40))
    assert chunks[-1].finish_reason == "length"
    assert chunks[-1].usage == ic.Usage(prompt_tokens=5, completion_tokens=40)


@pytest.mark.parametrize(
    ("accept", "stream"),
    [
        ("image/png", True),
        ("application/vnd.inferwire.frames+flatbuffers", True),
        ("text/event-stream;q=0, application/json;q=0", True),
        ("application/vnd.inferwire.delta", False),  # a whole answer is JSON only
    ],
)
def test_an_unacceptable_accept_is_406(base_url: str, accept: str, stream: bool) -> None:
    response = httpx.post(
        f"{base_url}/v1/chat/completions",
        json={"messages": MESSAGES, "stream": stream},
        headers={"accept": accept},
    )
    assert response.status_code == 406
    error = response.json()["error"]
    assert error["code"] == 406
    offered = iws.offered(("orjson", "msgspec-msgpack", "protobuf", "delta")) if stream else ()
    assert all(media in error["message"] for media in offered or (iws.JSON,))


def test_the_client_script(base_url: str) -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "openai_client.py"), base_url, "--codec", "delta"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "".join(c.text for c in EXPECTED) in out.stdout
    assert "finish_reason=stop" in out.stdout
    refused = subprocess.run(
        [sys.executable, str(EXAMPLES / "openai_client.py"), base_url, "--codec", "flatbuffers"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 1
    assert "406" in refused.stderr
