"""A request's stamps and what the OpenAI API and the metrics make of them, on the simulated
service in this process: vLLM's per-request ``metrics`` object (``--enable-per-request-metrics``)
read with the official ``openai`` SDK and from the raw JSON, the stamps file, and vLLM's request
histograms on every transport's ``/metrics``. With the engine behind a frontend, in real
processes: ``test_engine_frontend.py``.

The simulated service has no queue and paces tokens itself, so its figures have floors that
the test knows (the prefill and per-token pacing it was given) but no ceilings (a busy machine
only adds); every figure is also checked against the stamps it was made of, exactly."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any, Final, TypeVar

import httpx
import openai
import orjson
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire._runtime import loops
from inferwire.transports.metrics import VLLM_HISTOGRAMS, ServerMetrics, exposition
from inferwire.transports.metrics_core import VLLM_REQUEST_BUCKETS_S, VLLM_TTFT_BUCKETS_S
from inferwire.transports.openai_api import OpenAIOptions
from inferwire.transports.request_stamps import RequestStamps, StampsFile, metrics_object
from inferwire.workloads import MODEL, token_stream_source
from tests.helpers.faults import MESSAGES
from tests.transports.metrics_helpers import Scrape

T = TypeVar("T")

CALL_TIMEOUT_S: Final = 60.0
PREFILL_S: Final = 0.03
DECODE_S: Final = 0.002
WORKLOAD: Final = "stream-16"
TOKENS: Final = 16
METRICS_FIELDS: Final = [
    "time_to_first_token_ms",
    "generation_time_ms",
    "queue_time_ms",
    "mean_itl_ms",
    "tokens_per_second",
]
"""vLLM's fields, in vLLM's order (``PerRequestTimingMetrics``)."""
SLACK: Final = 0.9
"""A timer may fire a little early (uvloop's have millisecond resolution): floors are 90 %."""


def run(coro: Coroutine[Any, Any, T], loop: str) -> T:
    return loops.run(asyncio.wait_for(coro, CALL_TIMEOUT_S), loop)


# -- the figures, from stamps -------------------------------------------------------------


MS: Final = 1_000_000


@pytest.mark.parametrize(
    ("stamps", "tokens", "expected"),
    [
        pytest.param(
            RequestStamps(arrived_ns=1 * MS, scheduled_ns=3 * MS, first_token_ns=10 * MS,
                          last_token_ns=30 * MS),
            5,
            [7.0, 20.0, 2.0, 5.0, 5 / 0.027],
            id="all",
        ),
        pytest.param(
            RequestStamps(arrived_ns=1 * MS, scheduled_ns=1 * MS, first_token_ns=4 * MS,
                          last_token_ns=4 * MS),
            1,
            [3.0, 0.0, 0.0, None, 1 / 0.003],
            id="one-token",
        ),
        pytest.param(RequestStamps(), 5, [None] * 5, id="none-reached"),
        pytest.param(
            RequestStamps(arrived_ns=2 * MS, scheduled_ns=2 * MS),
            5,
            [None, None, 0.0, None, None],
            id="scheduled-only",
        ),
        pytest.param(
            RequestStamps(scheduled_ns=2 * MS, first_token_ns=2 * MS, last_token_ns=2 * MS),
            3,
            [0.0, 0.0, None, 0.0, None],
            id="no-inference-time",
        ),
    ],
)  # fmt: skip
def test_the_metrics_object_is_vllms(
    stamps: RequestStamps, tokens: int, expected: list[float | None]
) -> None:
    obj = metrics_object(stamps, tokens)
    assert list(obj) == METRICS_FIELDS
    for field, want in zip(METRICS_FIELDS, expected, strict=True):
        got = obj[field]
        assert (got is None) == (want is None), field
        if got is not None and want is not None:
            assert math.isclose(got, want, rel_tol=1e-12), field


def test_the_intervals_are_vllms_and_skip_what_was_not_reached() -> None:
    stamps = RequestStamps(
        model="m",
        arrived_ns=2 * MS,
        scheduled_ns=5 * MS,
        first_token_ns=9 * MS,
        last_token_ns=20 * MS,
        first_chunk_ns=10 * MS,
        last_chunk_ns=21 * MS,
    )
    assert stamps.intervals_s(1 * MS) == {
        "queue": 0.003,
        "prefill": 0.004,
        "decode": 0.011,
        "inference": 0.015,
        "ttft": 0.009,
        "e2e": 0.02,
    }
    assert set(RequestStamps(arrived_ns=1, scheduled_ns=2).intervals_s()) == {"queue"}


def test_a_stamps_line_names_every_stamp_and_null_for_those_not_reached(tmp_path: Path) -> None:
    stamps = RequestStamps(model="m", received_ns=1, arrived_ns=2, scheduled_ns=3)
    with StampsFile(tmp_path / "s.jsonl") as out:
        out.write(stamps.line("chatcmpl-x", "error", 7, stream=True))
    (line,) = (tmp_path / "s.jsonl").read_bytes().splitlines()
    assert orjson.loads(line) == {
        "request_id": "chatcmpl-x",
        "model": "m",
        "stream": True,
        "outcome": "error",
        "tokens": 7,
        "frontend_received_ns": 1,
        "engine_arrived_ns": 2,
        "engine_scheduled_ns": 3,
        "engine_first_token_ns": None,
        "engine_last_token_ns": None,
        "frontend_first_chunk_ns": None,
        "frontend_last_chunk_ns": None,
        "frontend_last_chunk_written_ns": None,
    }


def stamps_of(line: dict[str, Any]) -> RequestStamps:
    """The stamps a stamps-file line holds (null: 0)."""
    return RequestStamps(
        model=line["model"],
        received_ns=line["frontend_received_ns"] or 0,
        arrived_ns=line["engine_arrived_ns"] or 0,
        scheduled_ns=line["engine_scheduled_ns"] or 0,
        first_token_ns=line["engine_first_token_ns"] or 0,
        last_token_ns=line["engine_last_token_ns"] or 0,
        first_chunk_ns=line["frontend_first_chunk_ns"] or 0,
        last_chunk_ns=line["frontend_last_chunk_ns"] or 0,
        last_chunk_written_ns=line["frontend_last_chunk_written_ns"] or 0,
    )


def read_lines(path: Path) -> dict[str, dict[str, Any]]:
    """The stamps file's lines by request id (each id once)."""
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    by_id = {line["request_id"]: line for line in lines}
    assert len(by_id) == len(lines)
    return by_id


# -- the OpenAI API, in this process ------------------------------------------------------


@contextlib.asynccontextmanager
async def openai_server(
    transport: str,
    *,
    per_request_metrics: bool = True,
    stamps_file: StampsFile | None = None,
    prefill_s: float = PREFILL_S,
    decode_s: float = DECODE_S,
) -> AsyncIterator[tuple[str, ServerMetrics]]:
    """An OpenAI API server of ``transport`` on loopback, recording metrics; its base URL."""
    service = it.SimulatedService(token_stream_source, prefill_s=prefill_s, decode_s=decode_s)
    metrics = ServerMetrics(transport, "orjson")
    options = OpenAIOptions(per_request_metrics=per_request_metrics, stamps_file=stamps_file)
    server_class: Any = it.server_class(transport)  # the HTTP servers take ``openai``
    server = server_class(
        service, ic.get("orjson", extensions=True), metrics=metrics, openai=options
    )
    host, port = await server.start()
    try:
        yield f"http://{host}:{port}", metrics
    finally:
        await server.stop()


def sdk(transport: str, url: str) -> openai.AsyncOpenAI:
    http = openai.DefaultAsyncHttpxClient(
        http1=transport == "http1", http2=transport == "http2", timeout=CALL_TIMEOUT_S
    )
    return openai.AsyncOpenAI(
        base_url=f"{url}/v1", api_key="unused", max_retries=0, http_client=http
    )


def chat(**fields: Any) -> dict[str, Any]:
    """The SDK's arguments of a chat completion of the workload."""
    return {"model": MODEL, "messages": MESSAGES, "extra_body": {"workload": WORKLOAD}, **fields}


def body(**fields: Any) -> dict[str, Any]:
    """The raw body of a chat completion of the workload."""
    return {"model": MODEL, "messages": MESSAGES, "workload": WORKLOAD, **fields}


async def raw_stream(transport: str, url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON objects of a streamed answer, as the bytes carry them."""
    async with httpx.AsyncClient(
        http1=transport == "http1", http2=transport == "http2", timeout=CALL_TIMEOUT_S
    ) as http:
        response = await http.post(
            f"{url}/v1/chat/completions",
            content=orjson.dumps({**body, "stream": True}),
            headers={"content-type": "application/json"},
        )
    events = response.content.split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""]
    return [orjson.loads(e.removeprefix(b"data: ")) for e in events[:-2]]


def check_paced(metrics: dict[str, Any], tokens: int = TOKENS) -> None:
    """The simulated service's figures: no queue; a prefill of at least the pacing it was
    given, and a last token no earlier than the pacing allows (the service paces to
    deadlines, so a late first token leaves the decode less time, never the whole less);
    the means and the rate made of them as vLLM makes them."""
    assert list(metrics) == METRICS_FIELDS
    assert metrics["queue_time_ms"] == 0.0
    assert metrics["time_to_first_token_ms"] >= PREFILL_S * 1000 * SLACK
    assert metrics["generation_time_ms"] >= 0.0
    inference_ms = metrics["time_to_first_token_ms"] + metrics["generation_time_ms"]
    assert inference_ms >= (PREFILL_S + (tokens - 1) * DECODE_S) * 1000 * SLACK
    assert math.isclose(
        metrics["mean_itl_ms"], metrics["generation_time_ms"] / (tokens - 1), rel_tol=1e-9
    )
    inference_s = (metrics["time_to_first_token_ms"] + metrics["generation_time_ms"]) / 1000
    assert math.isclose(metrics["tokens_per_second"], tokens / inference_s, rel_tol=1e-6)


@pytest.mark.parametrize("transport", ["http1", "http2"])
def test_the_metrics_object_rides_the_usage_chunk_and_the_whole_answer(
    event_loop_kind: str, transport: str, tmp_path: Path
) -> None:
    async def go() -> None:
        with StampsFile(tmp_path / "stamps.jsonl") as stamps_file:
            async with openai_server(transport, stamps_file=stamps_file) as (url, _):
                async with sdk(transport, url) as client:
                    stream = await client.chat.completions.create(
                        **chat(stream=True, stream_options={"include_usage": True})
                    )
                    events = [event async for event in stream]
                    completion = await client.chat.completions.create(**chat())
                    plain = await client.chat.completions.create(**chat(stream=True))
                    plain_events = [event async for event in plain]
                raw = await raw_stream(transport, url, body(stream_options={"include_usage": True}))
        *tokens, last = events
        assert last.choices == []
        assert last.usage is not None
        assert last.usage.completion_tokens == TOKENS
        assert all(e.model_extra == {} for e in tokens)  # only the usage chunk has it
        assert last.model_extra is not None
        check_paced(last.model_extra["metrics"])
        # the raw bytes: after the usage, and the chunk still validates as OpenAI's
        *raw_tokens, raw_last = raw
        assert list(raw_last) == ["id", "object", "created", "model", "choices", "usage", "metrics"]
        assert all("metrics" not in e for e in raw_tokens)
        ChatCompletionChunk.model_validate(raw_last)
        check_paced(raw_last["metrics"])
        # a stream that did not ask for usage has no place for it
        assert all(e.model_extra == {} for e in plain_events)
        # the whole answer: after its usage
        assert isinstance(completion, ChatCompletion)
        assert completion.model_extra is not None
        check_paced(completion.model_extra["metrics"])
        # each figure is what the stamps of its answer make, exactly
        lines = read_lines(tmp_path / "stamps.jsonl")
        for answer_id, metrics in (
            (last.id, last.model_extra["metrics"]),
            (completion.id, completion.model_extra["metrics"]),
            (raw_last["id"], raw_last["metrics"]),
        ):
            line = lines[answer_id]
            assert line["outcome"] == "ok"
            assert line["tokens"] == TOKENS
            assert metrics == metrics_object(stamps_of(line), TOKENS)
        assert {line["stream"] for line in lines.values()} == {True, False}
        assert len(lines) == 4

    run(go(), event_loop_kind)


@pytest.mark.parametrize("transport", ["http1", "http2"])
def test_without_the_flag_no_answer_carries_metrics(event_loop_kind: str, transport: str) -> None:
    async def go() -> tuple[list[dict[str, Any]], dict[str, Any]]:
        async with openai_server(transport, per_request_metrics=False) as (url, _):
            raw = await raw_stream(transport, url, body(stream_options={"include_usage": True}))
            async with httpx.AsyncClient(
                http1=transport == "http1", http2=transport == "http2", timeout=CALL_TIMEOUT_S
            ) as http:
                whole = await http.post(f"{url}/v1/chat/completions", json=body())
            return raw, whole.json()

    raw, whole = run(go(), event_loop_kind)
    assert list(raw[-1]) == ["id", "object", "created", "model", "choices", "usage"]
    assert all("metrics" not in event for event in raw)
    assert "metrics" not in whole


def test_a_legacy_completion_carries_the_metrics_object_too(event_loop_kind: str) -> None:
    async def go() -> None:
        async with openai_server("http1") as (url, _), sdk("http1", url) as client:
            args: dict[str, Any] = {
                "model": MODEL,
                "prompt": "x",
                "extra_body": {"workload": WORKLOAD},
            }
            whole = await client.completions.create(**args)
            stream = await client.completions.create(
                **args, stream=True, stream_options={"include_usage": True}
            )
            events = [event async for event in stream]
        assert whole.model_extra is not None
        check_paced(whole.model_extra["metrics"])
        assert events[-1].choices == []
        assert events[-1].model_extra is not None
        check_paced(events[-1].model_extra["metrics"])

    run(go(), event_loop_kind)


def test_an_unpaced_answer_reports_no_queue_and_instant_tokens(event_loop_kind: str) -> None:
    """The unpaced service has every token at once: its whole answer is made at once, and its
    figures say so (zero, never null)."""

    async def go() -> dict[str, Any]:
        async with (
            openai_server("http1", prefill_s=0.0, decode_s=0.0) as (url, _),
            sdk("http1", url) as client,
        ):
            completion = await client.chat.completions.create(**chat())
        assert completion.model_extra is not None
        metrics: dict[str, Any] = completion.model_extra["metrics"]
        return metrics

    metrics = run(go(), event_loop_kind)
    assert metrics["queue_time_ms"] == metrics["time_to_first_token_ms"] == 0.0
    assert metrics["generation_time_ms"] == metrics["mean_itl_ms"] == 0.0
    assert metrics["tokens_per_second"] is None  # no inference time to divide by


# -- vLLM's histograms on /metrics --------------------------------------------------------


def vllm_scrape(metrics: ServerMetrics) -> Scrape:
    text, _ = exposition(metrics)
    return Scrape.parse(text.decode())


def test_the_vllm_histograms_exist_from_the_start_with_vllms_buckets_and_labels() -> None:
    metrics = ServerMetrics("tcp", "protobuf")
    metrics.serve_models((MODEL, "other"))
    scrape = vllm_scrape(metrics)
    for interval, name, _ in VLLM_HISTOGRAMS:
        kind, rows = scrape.families[name]
        assert kind == "histogram"
        labels = {tuple(sorted(s_labels.items())) for _, s_labels, _ in rows}
        assert {(("engine", "0"), ("model_name", m)) for m in (MODEL, "other")} <= {
            tuple((k, v) for k, v in label if k != "le") for label in labels
        }
        bounds = VLLM_TTFT_BUCKETS_S if interval == "ttft" else VLLM_REQUEST_BUCKETS_S
        buckets = scrape.buckets(name, model_name=MODEL)
        assert list(buckets) == [*(repr(float(b)) for b in bounds), "+Inf"]
        assert set(buckets.values()) == {0.0}


@pytest.mark.parametrize("transport", ["http1", "http2"])
def test_the_vllm_histograms_observe_each_answer_from_its_stamps(
    event_loop_kind: str, transport: str, tmp_path: Path
) -> None:
    async def go() -> ServerMetrics:
        with StampsFile(tmp_path / "stamps.jsonl") as stamps_file:
            async with (
                openai_server(transport, stamps_file=stamps_file) as (url, metrics),
                sdk(transport, url) as client,
            ):
                for _ in range(2):
                    stream = await client.chat.completions.create(**chat(stream=True))
                    assert [event async for event in stream]
                await client.chat.completions.create(**chat())
            return metrics

    metrics = run(go(), event_loop_kind)
    scrape = vllm_scrape(metrics)
    lines = read_lines(tmp_path / "stamps.jsonl").values()
    assert len(lines) == 3
    for interval, name, _ in VLLM_HISTOGRAMS:
        assert scrape.value(f"{name}_count", model_name=MODEL, engine="0") == 3
        want = sum(stamps_of(line).intervals_s()[interval] for line in lines)
        got = scrape.value(f"{name}_sum", model_name=MODEL, engine="0")
        assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12), name
    assert scrape.value("vllm:request_queue_time_seconds_sum") == 0.0
    prefill = scrape.value("vllm:request_prefill_time_seconds_sum")
    assert prefill >= 3 * PREFILL_S * SLACK


@pytest.mark.parametrize("transport", ["tcp", "grpc"])
def test_every_transport_feeds_the_vllm_histograms(event_loop_kind: str, transport: str) -> None:
    """Not only the OpenAI API: any stream a server plays observes them."""

    async def go() -> ServerMetrics:
        service = it.SimulatedService(token_stream_source, prefill_s=PREFILL_S)
        metrics = ServerMetrics(transport, "protobuf")
        server = it.server_class(transport)(
            service, ic.get("protobuf", extensions=True), metrics=metrics
        )
        host, port = await server.start()
        try:
            async with it.connect(transport, f"{host}:{port}", codec="protobuf") as client:
                for seed in range(2):
                    request = it.GenerateRequest(workload=WORKLOAD, seed=seed)
                    assert [c async for c in client.generate(request)]
        finally:
            await server.stop()
        return metrics

    scrape = vllm_scrape(run(go(), event_loop_kind))
    for _, name, _ in VLLM_HISTOGRAMS:
        assert scrape.value(f"{name}_count", model_name=MODEL) == 2, name
    assert scrape.value("vllm:request_prefill_time_seconds_sum") >= 2 * PREFILL_S * SLACK
    ttft = scrape.value("vllm:time_to_first_token_seconds_sum")
    assert ttft >= scrape.value("vllm:request_prefill_time_seconds_sum")
