"""The codec suite: every codec x every workload x {encode, decode, decode and read}.

Token-stream workloads are timed as whole streams through ``stream_encoder``/``stream_decoder``
(framing included, one ``feed`` per frame as a transport delivers it): what a server and a
client do per response. Other workloads are one unary message. A wrong result fails the
benchmark.

The standard run (``inferwire bench``) reads ``bench_codecs_interleaved``: one benchmark per
workload and operation whose every round times every codec once, in an order shuffled per
round, so each codec's speed-up against json (and orjson) is a ratio taken within rounds that
this machine's drift cannot skew (:mod:`inferwire.bench.measure.codec_rounds`). The whole
streams also get an ``encode+decode`` operation (a response's serialization, server and client
side). ``bench_codec``, one benchmark per codec, stays for ``pytest bench/
--benchmark-compare``; it is marked ``standalone`` and the standard run deselects it.

Beside them, the wrapper group times each codec against the same work done directly and
against its library call alone (see :mod:`inferwire.bench.measure.baselines`), interleaved the
same way, and the targets group holds the baselines the report's targets are ratios against (a
plain memcpy).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import numpy as np
import pytest

import inferwire.codecs as ic
from inferwire import workloads
from inferwire.bench.measure.baselines import BASELINES, read_all
from inferwire.bench.measure.codec_ops import (
    FLATBUFFERS_BUILDER,
    PROTOBUF_UPB,
    ROUND_TRIP_OP,
    codecs_for,
    decode_stream,
    encode_stream,
    is_stream,
    operation,
    wrapper_levels,
)
from inferwire.bench.measure.codec_rounds import Rounds, gc_off
from inferwire.bench.measure.paired import paired_ratio
from inferwire.codecs import delta_codec, flatbuffers_codec


def _supports(codec: str, workload: str) -> bool:
    return type(workloads.get(workload).messages()[0]) in ic.get(codec).types


MATRIX = [
    (codec, workload)
    for workload in workloads.names()
    for codec in ic.names()
    if _supports(codec, workload)
]
OPS: Final = ("encode", "decode", "decode+read")
WHOLE_STREAM_WORKLOADS: Final = ("stream-2048", "stream-2048-top5")
"""The whole responses the report's Whole streams table and claim C2 read, encode + decode."""
GROUPS: Final = [(workload, op) for workload in workloads.names() for op in OPS] + [
    (workload, ROUND_TRIP_OP) for workload in WHOLE_STREAM_WORKLOADS
]
PAIRS = 21
# One workload of each kind for the wrapper comparison, unary messages only.
WRAPPER_WORKLOADS: Final = ("stream-256-top5", "embed-32x1024", "image-fp32")
LEVELS: Final = ("codec", "direct", "library")
WRAPPER_BUDGET_S: Final = 0.6
WRAPPER_MIN_ROUNDS: Final = 7
WRAPPER_MIN_SAMPLE_S: Final = 1e-3
"""Longer samples than the codec group's: the wrapper ratios are read to within a few %."""


def _wrapper_codecs(workload: str) -> list[str]:
    # the delta codec is a stream codec with no library underneath: it has no wrapper to weigh
    return [c for c in ic.names() if c in BASELINES and _supports(c, workload)]


def _record(
    benchmark: Any,
    codec: str,
    workload: str,
    op: str,
    wire_bytes: int,
    messages: int,
    correct: bool,
) -> None:
    benchmark.extra_info.update(
        codec=codec,
        workload=workload,
        op=op,
        wire_bytes=wire_bytes,
        messages=messages,
        correct=correct,
    )
    assert correct, f"{codec} {op} of {workload} did not round trip"


@pytest.mark.standalone
@pytest.mark.parametrize(("codec_name", "workload"), MATRIX)
@pytest.mark.parametrize("op", ["encode", "decode", "decode+read"])
def bench_codec(benchmark: Any, codec_name: str, workload: str, op: str) -> None:
    """One codec on its own, for comparing a codec with itself across runs
    (``--benchmark-compare``). The standard run deselects it (``-m "not standalone"``) and the
    report reads ``bench_codecs_interleaved`` instead: codecs timed in separate benchmarks
    drift apart with the machine, so no ratio between them is read from here."""
    codec = ic.get(codec_name, extensions=True)
    messages = workloads.get(workload).messages()
    type_: type[Any] = type(messages[0])
    benchmark.group = f"codec {workload}"
    if is_stream(workload):
        frames = encode_stream(codec, messages)
        if op == "encode":
            frames = benchmark(encode_stream, codec, messages)
            result = decode_stream(codec, frames, type_)
        elif op == "decode":
            result = benchmark(decode_stream, codec, frames, type_)
        else:

            def decode_read_stream() -> list[Any]:
                decoded = decode_stream(codec, frames, type_)
                for m in decoded:
                    read_all(m)
                return decoded

            result = benchmark(decode_read_stream)
        wire = sum(map(len, frames))
        correct = result == messages
    else:
        (message,) = messages
        data = codec.encode(message)
        if op == "encode":
            data = benchmark(codec.encode, message)
            result = codec.decode(data, type_)
        elif op == "decode":
            result = benchmark(codec.decode, data, type_)
        else:

            def decode_read() -> Any:
                decoded = codec.decode(data, type_)
                read_all(decoded)
                return decoded

            result = benchmark(decode_read)
        wire = len(data)
        correct = result == message
    _record(benchmark, codec_name, workload, op, wire, len(messages), correct)


def _run(
    benchmark: Any, rounds: Rounds, checks: dict[str, Callable[[Any], bool]], **plan: Any
) -> dict[str, bool]:
    """Calibrate, then the rounds (pytest-benchmark's statistics are of whole rounds); returns
    whether each subject's results (calibration's and the last round's) were right."""
    correct = dict.fromkeys(checks, True)
    if benchmark.disabled:
        benchmark.pedantic(rounds.one_round, rounds=1, iterations=1)
    else:
        rounds.calibrate()
        correct = {name: check(rounds.first[name]) for name, check in checks.items()}
        rounds.first.clear()  # not kept alive through the rounds
        benchmark.pedantic(rounds.one_round, rounds=rounds.plan(**plan), iterations=1)
    return {name: correct[name] and check(rounds.last[name]) for name, check in checks.items()}


@pytest.mark.parametrize(("workload", "op"), GROUPS)
def bench_codecs_interleaved(benchmark: Any, workload: str, op: str) -> None:
    """Every codec that carries ``workload``, timed once per round in a shuffled order; for
    encode, ``flatbuffers (builder)`` too, and for a token stream's encode and decode,
    ``protobuf (upb)`` (:func:`~inferwire.bench.measure.codec_ops.codecs_for`).

    ``extra_info["codecs"][codec]``: ``median_s`` and ``iqr_s`` per call (a whole stream or
    message) over the rounds, ``loops`` (calls per sample), ``wire_bytes``, ``correct``;
    ``vs_json`` / ``vs_orjson``: per codec, the median over rounds of json's (orjson's) time
    / the codec's time in the same round, a speed-up (> 1 is faster)."""
    codecs = codecs_for(workload, op)
    names = list(codecs)
    ops = {name: operation(codec, workload, op) for name, codec in codecs.items()}
    rounds = Rounds({n: o.call for n, o in ops.items()}, seed=f"{workload} {op}")
    benchmark.group = f"codecs {workload}"
    correct = _run(benchmark, rounds, {n: o.check for n, o in ops.items()})
    info = benchmark.extra_info
    info.update(
        workload=workload,
        op=op,
        messages=len(workloads.get(workload).messages()),
        rounds=rounds.rounds,
        codecs={
            n: {
                "median_s": rounds.median_s(n),
                "iqr_s": rounds.iqr_s(n),
                "loops": rounds.loops[n],
                "wire_bytes": o.wire_bytes,
                "correct": correct[n],
            }
            for n, o in ops.items()
        },
    )
    for base in ("json", "orjson"):
        if base in ops:
            info[f"vs_{base}"] = {n: rounds.ratio(base, n) for n in names}
    wrong = [n for n, ok in correct.items() if not ok]
    assert not wrong, f"{', '.join(wrong)}: {op} of {workload} did not round trip"


@pytest.mark.parametrize("op", ["encode", "decode"])
@pytest.mark.parametrize("workload", WRAPPER_WORKLOADS)
def bench_wrapper(benchmark: Any, workload: str, op: str) -> None:
    """Unary messages in a loop (a stream's chunks one by one) at the three levels, every
    codec's levels timed back to back in a shuffled order in every round.

    ``extra_info["levels"][codec][level]``: ``median_s`` and ``iqr_s`` of the loop over the
    workload's messages; ``extra_info["levels"][codec]``: ``wire_bytes``, ``correct``. Paired
    within rounds, per codec: ``codec_vs_direct`` (codec / direct, the wrapper's cost),
    ``library_share`` (library / codec) and ``library_vs_json`` (stdlib json's library call /
    this codec's, a speed-up on prebuilt native objects)."""
    names = _wrapper_codecs(workload)
    messages = workloads.get(workload).messages()
    subjects: dict[str, Callable[[], Any]] = {}
    checks: dict[str, Callable[[Any], bool]] = {}
    wire: dict[str, int] = {}
    for name in names:
        levels, wire[name] = wrapper_levels(name, messages, op)
        for level, (call, check) in levels.items():
            subjects[f"{name} {level}"] = call
            checks[f"{name} {level}"] = check
    rounds = Rounds(
        subjects,
        seed=f"wrapper {workload} {op}",
        blocks=[[f"{n} {level}" for level in LEVELS] for n in names],
        min_sample_s=WRAPPER_MIN_SAMPLE_S,
        # levels within 1-5% of each other: each block starts from its own data in cache, not
        # from whatever the block before it left there
        warm_blocks=True,
    )
    benchmark.group = f"wrapper {workload}"
    correct = _run(
        benchmark, rounds, checks, budget_s=WRAPPER_BUDGET_S, min_rounds=WRAPPER_MIN_ROUNDS
    )
    benchmark.extra_info.update(
        workload=workload,
        op=op,
        messages=len(messages),
        rounds=rounds.rounds,
        levels={
            n: {
                **{
                    level: {
                        "median_s": rounds.median_s(f"{n} {level}"),
                        "iqr_s": rounds.iqr_s(f"{n} {level}"),
                    }
                    for level in LEVELS
                },
                "wire_bytes": wire[n],
                "correct": all(correct[f"{n} {level}"] for level in LEVELS),
            }
            for n in names
        },
        codec_vs_direct={n: rounds.ratio(f"{n} codec", f"{n} direct") for n in names},
        library_share={n: rounds.ratio(f"{n} library", f"{n} codec") for n in names},
    )
    if "json" in names:
        benchmark.extra_info["library_vs_json"] = {
            n: rounds.ratio("json library", f"{n} library") for n in names
        }
    wrong = [n for n, ok in correct.items() if not ok]
    assert not wrong, f"{', '.join(wrong)}: {op} of {workload} is wrong"


def _image_fp32() -> tuple[ic.InferRequest, np.ndarray[Any, Any]]:
    (message,) = workloads.get("image-fp32").messages()
    assert isinstance(message, ic.InferRequest)
    return message, message.inputs[0].data


MEMCPY_PAIRS: Final = 201
"""Single calls of ~20-100 us each: many pairs, still well under a second."""


def _vs_tensor_encode(benchmark: Any, copy: Callable[[], Any]) -> None:
    """``paired_ratio``: ``copy``'s time / the tensor codec's encode of the same image, in
    alternating back-to-back pairs: the share of ``copy``'s byte rate that encode reaches."""
    message, _ = _image_fp32()
    tensor = ic.get("tensor")
    pairs = 1 if benchmark.disabled else MEMCPY_PAIRS
    benchmark.extra_info["paired_ratio"] = paired_ratio(copy, lambda: tensor.encode(message), pairs)
    benchmark.extra_info["pairs"] = pairs


def bench_memcpy(benchmark: Any) -> None:
    """A plain copy of the fp32 image's bytes into an existing buffer: the encode target's
    yardstick (tensor encode must move bytes at >= 50% of this rate, read from the paired
    ratio memcpy / encode)."""
    source = memoryview(_image_fp32()[1]).cast("B")  # type: ignore[arg-type]
    target = bytearray(len(source))

    def copy() -> bytearray:
        target[:] = source
        return target

    benchmark.group = "targets"
    out = benchmark(copy)
    _vs_tensor_encode(benchmark, copy)
    _record(
        benchmark, "memcpy", "image-fp32", "memcpy", len(source), 1, bytes(out) == bytes(source)
    )


def bench_bytes_copy(benchmark: Any) -> None:
    """``ndarray.tobytes()`` of the fp32 image: a copy into a new allocation (paired against
    tensor encode as ``bench_memcpy`` is)."""
    _, data = _image_fp32()
    benchmark.group = "targets"
    out = benchmark(data.tobytes)
    _vs_tensor_encode(benchmark, data.tobytes)
    _record(
        benchmark,
        "tobytes",
        "image-fp32",
        "tobytes",
        len(out),
        1,
        np.array_equal(np.frombuffer(out, dtype=data.dtype).reshape(data.shape), data),
    )


DELTA_TIME_WORKLOADS = ("stream-256", "stream-256-top5")
DELTA_BUDGET_S: Final = 0.5
DELTA_MIN_ROUNDS: Final = 21
DELTA_MIN_SAMPLE_S: Final = 1e-3


@pytest.mark.parametrize("path", ["accelerated", "pure-python"])
@pytest.mark.parametrize("workload", DELTA_TIME_WORKLOADS)
def bench_delta_round_trip(benchmark: Any, workload: str, path: str) -> None:
    """The delta codec's stream encode + decode, paired against orjson's encode + decode of the
    same chunks as OpenAI JSON: as an SSE stream (each with the framing it goes on the wire
    with, the ratio the target is read from) and as bare unary messages (no framing at all).

    ``path``: the codec as installed, its steady state in the C extension (the target's
    figure), and its pure-Python reference (what an install without the extension gets)."""
    if path == "accelerated" and not delta_codec.accelerated():
        pytest.skip("the delta codec's C extension is not built, or INFERWIRE_PURE_PYTHON is set")
    messages = workloads.get(workload).messages()
    delta = ic.get("delta") if path == "accelerated" else ic.get("delta", pure_python=True)
    orjson_codec = ic.get("orjson", extensions=True)

    def stream_round_trip(codec: ic.Codec) -> list[Any]:
        encoder = codec.stream_encoder()
        decoder = codec.stream_decoder(ic.TokenChunk)
        out: list[Any] = []
        for message in messages:
            out += decoder.feed(encoder.encode(message))
        decoder.feed(encoder.end())
        decoder.close()
        return out

    def delta_round_trip() -> list[Any]:
        return stream_round_trip(delta)

    def orjson_stream_round_trip() -> list[Any]:
        return stream_round_trip(orjson_codec)

    def orjson_unary_round_trip() -> list[Any]:
        return [orjson_codec.decode(orjson_codec.encode(m), ic.TokenChunk) for m in messages]

    benchmark.group = f"targets {workload}"
    benchmark.extra_info["path"] = path
    out = benchmark(delta_round_trip)
    # interleaved rounds of calibrated samples: single calls of ~0.5 ms against ~10 ms moved
    # by a third between runs as paired pairs
    rounds = Rounds(
        {
            "delta": delta_round_trip,
            "orjson": orjson_stream_round_trip,
            "orjson-unary": orjson_unary_round_trip,
        },
        seed=f"delta {workload} {path}",
        min_sample_s=DELTA_MIN_SAMPLE_S,
    )
    with gc_off():
        if benchmark.disabled:
            rounds.one_round()
        else:
            rounds.calibrate()
            for _ in range(rounds.plan(budget_s=DELTA_BUDGET_S, min_rounds=DELTA_MIN_ROUNDS)):
                rounds.one_round()
    benchmark.extra_info["paired_ratio"] = rounds.ratio("delta", "orjson")
    benchmark.extra_info["paired_ratio_unary"] = rounds.ratio("delta", "orjson-unary")
    benchmark.extra_info["rounds"] = rounds.rounds
    _record(
        benchmark,
        "delta",
        workload,
        "round-trip-vs-orjson" + ("" if path == "accelerated" else "-pure-python"),
        sum(map(len, encode_stream(delta, messages))),
        len(messages),
        out == messages
        and orjson_stream_round_trip() == messages
        and orjson_unary_round_trip() == messages,
    )


@pytest.mark.parametrize("codec_name", ["flatbuffers", "tensor"])
def bench_flat_decode(benchmark: Any, codec_name: str) -> None:
    """Decode of the largest tensor workload against the smallest, paired back to back: the
    zero-copy target (flat in size) read from one ratio that machine drift cannot skew."""
    codec = ic.get(codec_name)
    (large,) = workloads.get("image-fp32").messages()
    (small,) = workloads.get("embed-1x384").messages()
    large_data, small_data = codec.encode(large), codec.encode(small)

    def decode_large() -> Any:
        return codec.decode(large_data, type(large))

    def decode_small() -> Any:
        return codec.decode(small_data, type(small))

    benchmark.group = "targets flat decode"
    out = benchmark(decode_large)
    benchmark.extra_info["paired_ratio"] = paired_ratio(
        decode_large, decode_small, 1 if benchmark.disabled else PAIRS
    )
    _record(
        benchmark,
        codec_name,
        "image-fp32",
        "decode-vs-smallest",
        len(large_data),
        1,
        out == large and decode_small() == small,
    )


FLATBUFFERS_TARGETS: Final = [
    ("stream-256", "protobuf"),
    ("stream-256-top5", "protobuf"),
    ("image-fp32", "protobuf"),
    ("image-fp32", "tensor"),
    ("embed-32x1024", "protobuf"),
    ("embed-32x1024", "tensor"),
]
FLATBUFFERS_BUDGET_S: Final = 0.5
FLATBUFFERS_MIN_ROUNDS: Final = 21
FLATBUFFERS_MIN_SAMPLE_S: Final = 1e-3


@pytest.mark.parametrize(("workload", "baseline"), FLATBUFFERS_TARGETS)
def bench_flatbuffers_encode(benchmark: Any, workload: str, baseline: str) -> None:
    """FlatBuffers encode on its compiled encoder against ``baseline``'s encode of the same
    messages (a stream's chunks through the stream encoder, framing included, as the codec
    tables time them), with the official builder timed in the same rounds: the target
    (flatbuffers <= protobuf per chunk and per tensor message) read from one paired ratio.

    ``paired_ratio``: flatbuffers / ``baseline`` per round, the median over interleaved rounds
    of calibrated samples; ``builder_paired_ratio``: the builder / ``baseline``;
    ``builder_vs_compiled``: the builder / flatbuffers (what the compiled encoder saves);
    ``upb_paired_ratio``: flatbuffers / protobuf through upb's messages, for token chunks
    (protobuf's own path there is compiled too)."""
    if not flatbuffers_codec.accelerated():
        pytest.skip("the FlatBuffers C extension is not built, or INFERWIRE_PURE_PYTHON is set")
    variants = codecs_for(workload, "encode")
    codecs = {
        "flatbuffers": ic.get("flatbuffers"),
        FLATBUFFERS_BUILDER: variants[FLATBUFFERS_BUILDER],
        baseline: ic.get(baseline, extensions=True),
    }
    # protobuf's chunks are marshalled in C too: its upb path beside it, the comparison the
    # target was first set against (both encoders then compiled, or the library's own)
    upb = baseline == "protobuf" and PROTOBUF_UPB in variants
    if upb:
        codecs[PROTOBUF_UPB] = variants[PROTOBUF_UPB]
    ops = {name: operation(codec, workload, "encode") for name, codec in codecs.items()}
    benchmark.group = f"targets {workload}"
    benchmark.extra_info["baseline"] = baseline
    out = benchmark(ops["flatbuffers"].call)
    rounds = Rounds(
        {name: op.call for name, op in ops.items()},
        seed=f"flatbuffers encode {workload} {baseline}",
        min_sample_s=FLATBUFFERS_MIN_SAMPLE_S,
    )
    with gc_off():
        if benchmark.disabled:
            rounds.one_round()
        else:
            rounds.calibrate()
            for _ in range(
                rounds.plan(budget_s=FLATBUFFERS_BUDGET_S, min_rounds=FLATBUFFERS_MIN_ROUNDS)
            ):
                rounds.one_round()
    benchmark.extra_info.update(
        paired_ratio=rounds.ratio("flatbuffers", baseline),
        builder_paired_ratio=rounds.ratio(FLATBUFFERS_BUILDER, baseline),
        builder_vs_compiled=rounds.ratio(FLATBUFFERS_BUILDER, "flatbuffers"),
        upb_paired_ratio=rounds.ratio("flatbuffers", PROTOBUF_UPB) if upb else None,
        rounds=rounds.rounds,
        median_s={name: rounds.median_s(name) for name in ops},
        wire_bytes_by_codec={name: op.wire_bytes for name, op in ops.items()},
    )
    _record(
        benchmark,
        "flatbuffers",
        workload,
        f"encode-vs-{baseline}",
        ops["flatbuffers"].wire_bytes,
        len(workloads.get(workload).messages()),
        all(op.check(rounds.last[name]) for name, op in ops.items())
        and ops["flatbuffers"].check(out),
    )
