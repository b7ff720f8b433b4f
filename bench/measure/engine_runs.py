"""What the engine suite (``bench/bench_engine.py``) builds and reads: seeded request shapes
and virtual-clock traces, a simulated run's figures, the step model's parameters and source,
and, through the real stack, each request's stages (client timing joined with the frontend's
log line of it).

A request's shape (output and prompt tokens) is drawn from a seed, uniform in
:data:`OUTPUT_TOKENS` and :data:`PROMPT_TOKENS`: batching policies differ exactly where lengths
differ (a static batch waits for its longest member). With the default step model (LLaMA 7B on
an H100, FP8) these lengths put 50 req/s at about 90% of the engine's capacity
(:func:`capacity_rps`), a busy engine that keeps up.
"""

from __future__ import annotations

import dataclasses
import inspect
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Final

import numpy as np

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire import engine
from inferwire.engine import steps as steps_module
from inferwire.engine.hop_codecs import hop_codec
from inferwire.load.arrivals import Arrival, arrival_offsets_ns
from inferwire.workloads import token_stream_source

WORKLOAD: Final = "stream-256"
OUTPUT_TOKENS: Final = (16, 128)
"""Each request's output length, uniform in this range (inclusive), seeded."""
PROMPT_TOKENS: Final = (32, 512)
"""Each request's prompt length, uniform in this range (inclusive), seeded."""
DISTINCT_STREAMS: Final = 32
"""Requests reuse the chunks of this many seeds (their lengths still differ): building a
workload per request would cost more than the simulation."""
SEED: Final = 17


@dataclasses.dataclass(frozen=True, slots=True)
class RequestShape:
    output_tokens: int
    prompt_tokens: int
    seed: int


def request_shapes(count: int, seed: int = SEED) -> list[RequestShape]:
    """Seeded output and prompt lengths, uniform in :data:`OUTPUT_TOKENS` and
    :data:`PROMPT_TOKENS`; the chunks' seed cycles over :data:`DISTINCT_STREAMS`."""
    rng = np.random.default_rng(seed)
    outputs = rng.integers(OUTPUT_TOKENS[0], OUTPUT_TOKENS[1] + 1, size=count)
    prompts = rng.integers(PROMPT_TOKENS[0], PROMPT_TOKENS[1] + 1, size=count)
    return [
        RequestShape(int(o), int(p), i % DISTINCT_STREAMS)
        for i, (o, p) in enumerate(zip(outputs, prompts, strict=True))
    ]


def generate_request(shape: RequestShape) -> it.GenerateRequest:
    return it.GenerateRequest(
        workload=WORKLOAD,
        seed=shape.seed,
        max_tokens=shape.output_tokens,
        prompt_tokens=shape.prompt_tokens,
    )


SERVICE: Final = it.SimulatedService(token_stream_source, cache_size=DISTINCT_STREAMS)


def trace(
    rate_rps: float,
    count: int,
    *,
    arrival: Arrival = "poisson",
    burstiness: float = 1.0,
    seed: int = SEED,
) -> list[engine.EngineRequest]:
    """A seeded trace: arrivals from the load generator's schedules, lengths from
    :func:`request_shapes`."""
    offsets_ns = arrival_offsets_ns(
        rate_rps, arrival=arrival, burstiness=burstiness, seed=seed, requests=count
    )
    shapes = request_shapes(len(offsets_ns), seed)
    return [
        engine.EngineRequest(
            rid=f"r{i}",
            chunks=SERVICE.chunks(generate_request(shape)),
            prompt_tokens=shape.prompt_tokens,
            arrival_s=float(offset) / 1e9,
        )
        for i, (offset, shape) in enumerate(zip(offsets_ns.tolist(), shapes, strict=True))
    ]


def _tokens(request: engine.EngineRequest) -> int:
    return sum(len(chunk.token_ids) for chunk in request.chunks)


def percentiles_ms(values_s: Sequence[float]) -> dict[str, float]:
    """P50, P90 and P99 in milliseconds."""
    data = np.asarray(values_s, dtype=np.float64) * 1e3
    return {f"p{q:g}_ms": float(np.percentile(data, q)) for q in (50, 90, 99)}


def sim_figures(
    result: engine.SimResult, requests: Sequence[engine.EngineRequest]
) -> dict[str, Any]:
    """What one simulated run shows, and whether every request got exactly its tokens."""
    records = result.records
    decode_batches = [s.batch_size for s in result.steps if s.kind == "decode"]
    expected = {r.rid: _tokens(r) for r in requests}
    whole = (
        len(records) == len(requests)
        and not result.rejected
        and {r.rid: r.tokens for r in records} == expected
    )
    return {
        "requests": len(records),
        "output_tokens": int(sum(r.tokens for r in records)),
        "duration_s": float(result.duration_s),
        "throughput_tok_s": float(result.throughput_tok_s),
        "throughput_rps": len(records) / result.duration_s if result.duration_s else 0.0,
        "ttft": percentiles_ms([r.ttft_s for r in records]),
        "e2e": percentiles_ms([r.e2e_s for r in records]),
        "queue": percentiles_ms([r.queue_s for r in records]),
        "tpot": percentiles_ms(
            [(r.e2e_s - r.ttft_s) / (r.tokens - 1) for r in records if r.tokens > 1]
        ),
        "mean_batch": float(np.mean(decode_batches)) if decode_batches else 0.0,
        "steps": len(result.steps),
        "preemptions": int(sum(r.preemptions for r in records)),
        "correct": bool(whole),
    }


def step_model_info(step: engine.StepModel) -> dict[str, Any]:
    """The step model's parameters and the measurement its defaults come from (the paragraph
    of :mod:`inferwire.engine.steps` that cites it)."""
    return {
        "parameters": {f.name: getattr(step, f.name) for f in dataclasses.fields(step)},
        "source": doc_paragraph(steps_module, mentions=("Defaults",)),
    }


def doc_paragraph(obj: object, *, mentions: Sequence[str] = ()) -> str:
    """The first paragraph of ``obj``'s docstring that mentions every word of ``mentions``
    (the first paragraph when none is asked for), on one line."""
    doc = inspect.getdoc(obj) or ""
    paragraphs = [" ".join(p.split()) for p in doc.split("\n\n") if p.strip()]
    for paragraph in paragraphs:
        if all(word in paragraph for word in mentions):
            return paragraph
    return paragraphs[0] if paragraphs else ""


def capacity_rps(step: engine.StepModel, max_batch: int) -> float:
    """Requests/s the engine completes when it always runs a full batch of the trace's mean
    request (prefill, then decode steps at the mean KV size): the saturation rate the C13
    traces are set against."""
    mean_out = (OUTPUT_TOKENS[0] + OUTPUT_TOKENS[1]) / 2
    mean_prompt = (PROMPT_TOKENS[0] + PROMPT_TOKENS[1]) / 2
    kv_tokens = max_batch * (mean_prompt + mean_out / 2)
    per_request_s = (
        step.prefill_s(round(mean_prompt))
        + mean_out * step.decode_step_s(max_batch, round(kv_tokens)) / max_batch
    )
    return 1.0 / per_request_s


def unique_shapes(count: int, seed: int = SEED) -> list[RequestShape]:
    """:func:`request_shapes` with every (seed, output, prompt) distinct (a repeated one's prompt
    grows by a token until it is new): the key that joins a request's client timing with the
    frontend's log line of it."""
    seen: set[tuple[int, int, int]] = set()
    out = []
    for shape in request_shapes(count, seed):
        while (key := (shape.seed, shape.output_tokens, shape.prompt_tokens)) in seen:
            shape = dataclasses.replace(shape, prompt_tokens=shape.prompt_tokens + 1)
        seen.add(key)
        out.append(shape)
    return out


def request_key(request: it.GenerateRequest) -> tuple[int, int, int]:
    return (request.seed, request.max_tokens or 0, request.prompt_tokens)


class TimedTarget:
    """The frontend's http1 client asking for the server's stamps on every stream, each
    request's :class:`~inferwire.transports.StreamTiming` kept by its key."""

    def __init__(self, address: str) -> None:
        self.client = it.connect("http1", address, codec="orjson")
        self.timings: dict[tuple[int, int, int], it.StreamTiming] = {}

    async def generate(self, request: it.GenerateRequest, /) -> AsyncIterator[ic.TokenChunk]:
        timing = it.StreamTiming()
        self.timings[request_key(request)] = timing
        async for chunk in self.client.generate(request, timing=timing):
            yield chunk

    async def close(self) -> None:
        await self.client.close()


def client_decode_s(timing: it.StreamTiming) -> float:
    """The client's decode time of a stream: each read's bytes received to decoded, once per
    read (the chunks of one read share both stamps)."""
    reads = set(zip(timing.received_ns, timing.decoded_ns, strict=True))
    return sum(decoded - received for received, decoded in reads) / 1e9


def response_encode_s(timing: it.StreamTiming) -> float:
    """The frontend's encode time of a stream's chunks (its stamps: produced to encoded)."""
    server = timing.server.astype(np.int64)
    return float((server[:, 1] - server[:, 0]).sum()) / 1e9 if len(server) else 0.0


def request_split_s(
    line: dict[str, Any], timing: it.StreamTiming, e2e_s: float, hop_decode_per_chunk_s: float
) -> dict[str, float]:
    """One request's stages (seconds): the engine's log line for it, its client timing, its
    E2E from the intended send time, and the frontend's hop decode cost per chunk."""
    parts = {
        "engine_encode": float(line["encode_s"]),
        "hop_decode": hop_decode_per_chunk_s * int(line["chunks"]),
        "response_encode": response_encode_s(timing),
        "client_decode": client_decode_s(timing),
    }
    compute = float(line["prefill_s"]) + float(line["decode_s"])
    scheduling = float(line["queue_s"]) + float(line["batch_wait_s"])
    serialization = sum(parts.values())
    modelled = compute + scheduling + float(line["encode_s"])
    # the engine process's own time beyond its modelled steps and its encode (the Python
    # loop: scheduling bookkeeping, receiving, sending): a stage of its own, not "network"
    engine_loop = max(0.0, float(line["engine_s"]) - modelled)
    return {
        "compute": compute,
        "scheduling": scheduling,
        "serialization": serialization,
        "engine_loop": engine_loop,
        "network": e2e_s - compute - scheduling - serialization - engine_loop,
        "e2e": e2e_s,
        **parts,
    }


ENCODE_REPEATS: Final = 50


def encode_s_per_chunk(codec_name: str, chunks: Sequence[ic.TokenChunk]) -> float:
    """The frontend codec's stream encode of one chunk (this process, the median of
    :data:`ENCODE_REPEATS` whole streams, CPU time of this thread): what each chunk the
    frontend sends costs it."""
    codec = ic.get(codec_name, extensions=True)

    def stream() -> None:
        encoder = codec.stream_encoder()
        for chunk in chunks:
            encoder.encode(chunk)
        encoder.end()

    return _per_chunk_s(stream, len(chunks))


def hop_decode_s_per_chunk(hop: str, chunks: Sequence[ic.TokenChunk]) -> float:
    """The hop codec's stream decode of one chunk fed one frame at a time, as the frontend
    gets them (this process, the median of :data:`ENCODE_REPEATS` whole streams, CPU time of
    this thread): the isolated figure beside the frontend's own counter, which times each
    decode by the wall clock and so also counts a preemption in the middle of one."""
    codec = hop_codec(hop, allow_pickle=True)  # frames made here, read here
    encoder = codec.stream_encoder()
    frames = [encoder.encode(chunk) for chunk in chunks]
    frames[-1] += encoder.end()

    def stream() -> None:
        decoder = codec.stream_decoder()
        for frame in frames:
            decoder.feed(frame)
        decoder.close()

    return _per_chunk_s(stream, len(chunks))


def _per_chunk_s(stream: Callable[[], None], chunks: int) -> float:
    """``stream``'s CPU time (this thread) per chunk: the median of :data:`ENCODE_REPEATS`
    runs over its ``chunks``."""
    per_stream = []
    for _ in range(ENCODE_REPEATS):
        started = time.thread_time_ns()
        stream()
        per_stream.append(time.thread_time_ns() - started)
    return float(np.median(per_stream)) / chunks / 1e9
