"""What the codec suite times: each codec's call for a workload and an operation (a whole
stream through the stream encoder/decoder, framing included, or one unary message), the
wrapper levels of :mod:`inferwire.bench.measure.baselines`, and the check of each result.

Beside the registered codecs, the suite times two variants: ``flatbuffers (builder)``, the
FlatBuffers codec on the official ``flatbuffers.Builder`` (its reference path), next to
``flatbuffers`` on its compiled encoder; and ``protobuf (upb)``, the protobuf codec marshalling
token chunks through upb's messages (its reference path), next to ``protobuf`` on its compiled
marshalling. The bytes (and decoded values) are the same, so each pair of rows tells the
format's cost from the library's. They are bench-side variants, not registered codec names:
every parametrized codec and transport test runs over ``ic.names()``, and would run them too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import inferwire.codecs as ic
from inferwire import workloads
from inferwire.bench.measure.baselines import BASELINES, read_all
from inferwire.codecs import flatbuffers_codec, protobuf_codec

ROUND_TRIP_OP: Final = "encode+decode"
FLATBUFFERS_BUILDER: Final = "flatbuffers (builder)"
"""The FlatBuffers codec on the official builder: the variant the suite times beside it."""
VARIANT_OPS: Final = ("encode",)
"""What a variant is timed for: the builder differs from the codec's default in encode only."""
PROTOBUF_UPB: Final = "protobuf (upb)"
"""The protobuf codec marshalling through upb's messages: the variant the suite times beside it."""
PROTOBUF_UPB_OPS: Final = ("encode", "decode")
"""Its marshalling differs from the codec's default both ways, for token chunks only."""


@functools.cache
def flatbuffers_builder() -> ic.Codec:
    """One instance, so :func:`stream_frames` encodes its streams once."""
    return ic.get("flatbuffers", builder="reference")


@functools.cache
def protobuf_upb() -> ic.Codec:
    """One instance, so :func:`stream_frames` encodes its streams once."""
    return ic.get("protobuf", marshal="upb")


def codecs_for(workload: str, op: str) -> dict[str, ic.Codec]:
    """Every registered codec that carries ``workload``, in registry order, and after
    ``flatbuffers`` its builder variant for :data:`VARIANT_OPS`, after ``protobuf`` (for token
    chunks) its upb variant for :data:`PROTOBUF_UPB_OPS` (each when the compiled path is the
    codec's default; without it the two would be the same path)."""
    type_ = type(workloads.get(workload).messages()[0])
    out: dict[str, ic.Codec] = {}
    for name in ic.names():
        codec = ic.get(name, extensions=True)
        if type_ not in codec.types:
            continue
        out[name] = codec
        if name == "flatbuffers" and op in VARIANT_OPS and flatbuffers_codec.accelerated():
            out[FLATBUFFERS_BUILDER] = flatbuffers_builder()
        if (
            name == "protobuf"
            and type_ is ic.TokenChunk
            and op in PROTOBUF_UPB_OPS
            and protobuf_codec.accelerated()
        ):
            out[PROTOBUF_UPB] = protobuf_upb()
    return out


def is_stream(workload: str) -> bool:
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


@functools.cache
def stream_frames(codec: ic.Codec, workload: str) -> list[bytes]:
    """``workload``'s stream as ``codec`` frames it: encoded once for the suite's benchmarks of
    the workload, not once each (a whole stream of flatbuffers takes about a second)."""
    return encode_stream(codec, workloads.get(workload).messages())


@dataclass(frozen=True, slots=True, kw_only=True)
class Operation:
    """One codec's timed call for a workload and an operation, and the check of its result."""

    call: Callable[[], Any]
    check: Callable[[Any], bool]
    wire_bytes: int


def operation(codec: ic.Codec, workload: str, op: str) -> Operation:
    messages = workloads.get(workload).messages()
    type_: type[Any] = type(messages[0])
    expected: Any
    read_back: Callable[[Any], Any]  # what an encode's output decodes to
    if is_stream(workload):
        frames = stream_frames(codec, workload)

        def decode_read_stream() -> list[Any]:
            decoded = decode_stream(codec, frames, type_)
            for m in decoded:
                read_all(m)
            return decoded

        calls: dict[str, Callable[[], Any]] = {
            "encode": lambda: encode_stream(codec, messages),
            "decode": lambda: decode_stream(codec, frames, type_),
            "decode+read": decode_read_stream,
            ROUND_TRIP_OP: lambda: decode_stream(codec, encode_stream(codec, messages), type_),
        }
        wire, expected = sum(map(len, frames)), messages

        def read_back(out: Any) -> Any:
            return decode_stream(codec, out, type_)

    else:
        (message,) = messages
        data = codec.encode(message)

        def decode_read() -> Any:
            decoded = codec.decode(data, type_)
            read_all(decoded)
            return decoded

        calls = {
            "encode": lambda: codec.encode(message),
            "decode": lambda: codec.decode(data, type_),
            "decode+read": decode_read,
            ROUND_TRIP_OP: lambda: codec.decode(codec.encode(message), type_),
        }
        wire, expected = len(data), message

        def read_back(out: Any) -> Any:
            return codec.decode(out, type_)

    def check(out: Any) -> bool:
        # an encode is checked by decoding what it wrote; the others by what they return
        return bool((read_back(out) if op == "encode" else out) == expected)

    return Operation(call=calls[op], check=check, wire_bytes=wire)


def wrapper_levels(
    name: str, messages: list[Any], op: str
) -> tuple[dict[str, tuple[Callable[[], Any], Callable[[Any], bool]]], int]:
    """The codec, direct and library levels of ``op`` over ``messages`` (each a call and the
    check of its result), and the codec's wire bytes for them."""
    codec, baseline = ic.get(name, extensions=True), BASELINES[name]
    type_ = type(messages[0])
    encoded = [codec.encode(m) for m in messages]
    wire = sum(map(len, encoded))
    if op == "encode":
        prepared = [baseline.prepare(m) for m in messages]

        def same_bytes(out: Any) -> bool:
            return bool(out == encoded)

        def library_bytes(out: Any) -> bool:
            return len(out) == len(encoded) and all(map(baseline.library_output_ok, out, encoded))

        return {
            "codec": (lambda: [codec.encode(m) for m in messages], same_bytes),
            "direct": (lambda: [baseline.direct_encode(m) for m in messages], same_bytes),
            "library": (lambda: [baseline.library_encode(p) for p in prepared], library_bytes),
        }, wire

    def same_messages(out: Any) -> bool:
        return bool(out == messages)

    def counted(out: Any) -> bool:  # native objects: a parse result only counted
        return len(out) == len(messages)

    return {
        "codec": (lambda: [codec.decode(b, type_) for b in encoded], same_messages),
        "direct": (lambda: [baseline.direct_decode(b, type_) for b in encoded], same_messages),
        "library": (lambda: [baseline.library_decode(b, type_) for b in encoded], counted),
    }, wire
