"""The codec matrix: every codec x every workload x {encode, decode, decode and read}.

Token-stream workloads are timed as whole streams through ``stream_encoder``/``stream_decoder``
(framing included, one ``feed`` per frame as a transport delivers it): what a server and a
client do per response. Other workloads are one unary message. ``extra_info`` records the wire
size and whether the result equals the original; a wrong result fails the benchmark.

Beside the matrix, the wrapper group times each codec against the same work done directly and
against its library call alone (see :mod:`inferwire.bench.measure.baselines`), and the targets
group holds the baselines the report's targets are ratios against (a plain memcpy).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import inferwire.codecs as ic
from inferwire import workloads
from inferwire.bench.measure.baselines import BASELINES, read_all
from inferwire.bench.measure.paired import paired_ratio
from inferwire.codecs import delta_codec

MATRIX = [
    (codec, workload)
    for workload in workloads.names()
    for codec in ic.names()
    if type(workloads.get(workload).messages()[0]) in ic.get(codec).types
]
# One workload of each kind for the wrapper comparison, unary messages only.
PAIRS = 21
WRAPPER_WORKLOADS = ("stream-256-top5", "embed-32x1024", "image-fp32")
# The delta codec is a stream codec with no library underneath: it has no wrapper to weigh.
WRAPPER = [
    (codec, workload)
    for workload in WRAPPER_WORKLOADS
    for codec in ic.names()
    if codec in BASELINES and type(workloads.get(workload).messages()[0]) in ic.get(codec).types
]


def _is_stream(workload: str) -> bool:
    return workloads.get(workload).kind == "stream"


def encode_stream(codec: ic.Codec, messages: list[Any]) -> list[bytes]:
    encoder = codec.stream_encoder()
    frames = [encoder.encode(m) for m in messages]
    frames.append(encoder.end())
    return frames


def decode_stream(codec: ic.Codec, frames: list[bytes], type_: type[Any]) -> list[Any]:
    decoder = codec.stream_decoder(type_)
    out: list[Any] = []
    for frame in frames:
        out += decoder.feed(frame)
    decoder.close()
    return out


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


@pytest.mark.parametrize(("codec_name", "workload"), MATRIX)
@pytest.mark.parametrize("op", ["encode", "decode", "decode+read"])
def bench_codec(benchmark: Any, codec_name: str, workload: str, op: str) -> None:
    codec = ic.get(codec_name)
    messages = workloads.get(workload).messages()
    type_: type[Any] = type(messages[0])
    benchmark.group = f"codec {workload}"
    if _is_stream(workload):
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


@pytest.mark.parametrize(("codec_name", "workload"), WRAPPER)
@pytest.mark.parametrize(
    "level",
    [
        "codec-encode",
        "direct-encode",
        "library-encode",
        "codec-decode",
        "direct-decode",
        "library-decode",
    ],
)
def bench_wrapper(benchmark: Any, codec_name: str, workload: str, level: str) -> None:
    """Unary messages in a loop (a stream's chunks one by one) at the three levels."""
    codec = ic.get(codec_name)
    baseline = BASELINES[codec_name]
    messages = workloads.get(workload).messages()
    type_ = type(messages[0])
    encoded = [codec.encode(m) for m in messages]
    benchmark.group = f"wrapper {codec_name} {workload}"
    pairs = 1 if benchmark.disabled else PAIRS

    prepared = [baseline.prepare(m) for m in messages]
    levels = {
        "codec-encode": lambda: [codec.encode(m) for m in messages],
        "direct-encode": lambda: [baseline.direct_encode(m) for m in messages],
        "library-encode": lambda: [baseline.library_encode(p) for p in prepared],
        "codec-decode": lambda: [codec.decode(b, type_) for b in encoded],
        "direct-decode": lambda: [baseline.direct_decode(b, type_) for b in encoded],
        "library-decode": lambda: [baseline.library_decode(b, type_) for b in encoded],
    }
    out = benchmark(levels[level])
    kind, op = level.split("-")
    if kind == "library":
        # native objects: the encoder's bytes are checked, a parse result only counted
        correct = (
            all(map(baseline.library_output_ok, out, encoded))
            if op == "encode"
            else len(out) == len(messages)
        )
    else:
        correct = out == (encoded if op == "encode" else messages)
    if kind == "codec":
        codec_level = levels[level]
        benchmark.extra_info["paired_ratio"] = paired_ratio(
            codec_level, levels[f"direct-{op}"], pairs
        )
        benchmark.extra_info["pairs"] = pairs
        benchmark.extra_info["paired_library_share"] = paired_ratio(
            levels[f"library-{op}"], codec_level, pairs
        )
    _record(benchmark, codec_name, workload, level, sum(map(len, encoded)), len(messages), correct)


def _image_fp32() -> np.ndarray[Any, Any]:
    (message,) = workloads.get("image-fp32").messages()
    assert isinstance(message, ic.InferRequest)
    return message.inputs[0].data


def bench_memcpy(benchmark: Any) -> None:
    """A plain copy of the fp32 image's bytes into an existing buffer: the encode target's
    yardstick (tensor encode must move bytes at >= 50% of this rate)."""
    source = memoryview(_image_fp32()).cast("B")  # type: ignore[arg-type]
    target = bytearray(len(source))

    def copy() -> bytearray:
        target[:] = source
        return target

    benchmark.group = "targets"
    out = benchmark(copy)
    _record(
        benchmark, "memcpy", "image-fp32", "memcpy", len(source), 1, bytes(out) == bytes(source)
    )


def bench_bytes_copy(benchmark: Any) -> None:
    """``ndarray.tobytes()`` of the fp32 image: a copy into a new allocation."""
    data = _image_fp32()
    benchmark.group = "targets"
    out = benchmark(data.tobytes)
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
    orjson_codec = ic.get("orjson")

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

    pairs = 1 if benchmark.disabled else PAIRS
    benchmark.group = f"targets {workload}"
    benchmark.extra_info["path"] = path
    out = benchmark(delta_round_trip)
    benchmark.extra_info["paired_ratio"] = paired_ratio(
        delta_round_trip, orjson_stream_round_trip, pairs
    )
    benchmark.extra_info["paired_ratio_unary"] = paired_ratio(
        delta_round_trip, orjson_unary_round_trip, pairs
    )
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
