"""Bad bytes a peer should never send, made for every codec from the workloads it carries.

:func:`bad_inputs` gives, for one codec and each workload it carries, these kinds of input,
all drawn from a seeded ``random.Random`` (the same inputs on every machine):

- ``prefix``: strict prefixes of a unary encoding and of a stream (fed, then ``close()``);
- ``corruption``: one to three edits (byte flips, insertions, deletions, a splice onto another
  encoding of the same codec) of an encoding or a stream;
- ``lying-header``: lengths and counts that claim far more than follows: a MessagePack
  array32 (and map32, bin32, str32) of 2**32 - 1, a protobuf length varint of 2**31 (alone,
  and in place of each top-level length of the encoding), 0xFFFFFFFF written over each of the
  first 32 offsets and over the length fields in front of an array's bytes, and a
  length-prefixed frame header claiming 4 GiB (and a delta header or frame length of 2**32)
  fed to a stream decoder;
- ``too-deep``: the codec's message with an unknown key (or, in protobuf, an unknown group)
  nesting a million levels, and one level past the default limit;
- ``too-many``: a megabyte of empty containers (JSON ``[]``, MessagePack ``{}``, protobuf empty
  logprobs) under an unknown key, and a delta frame claiming more bytes than the budget;
- ``fan-out`` (flatbuffers): 2,000 logprobs that are all one table whose 2,000 alternatives are
  all one table, 4 million tables' worth of offsets in 16 kB, which the verifier's item budget
  must refuse.

Caveats: long token streams are damaged on their last 16 chunks, and JSON encodings over 64 KB
on a cropped copy of the same message (:func:`cropped`: a 2x8 matrix, a 1x3x4x4 image), as a
full parse of up to 3 MB for each of thousands of inputs would take minutes.
"""

from __future__ import annotations

import dataclasses
import importlib
import random
import struct
from collections.abc import Iterator
from typing import Any, Final

import numpy as np

import inferwire.codecs as ic
from inferwire import workloads
from inferwire.codecs import pbwire
from inferwire.codecs.base import DEFAULT_MAX_DEPTH

KINDS: Final = ("prefix", "corruption", "lying-header", "too-deep", "too-many", "fan-out")
JSON_TEXT: Final = ("json", "orjson", "msgspec-json")
MSGPACK: Final = ("msgpack", "msgspec-msgpack")
LARGE_JSON_BYTES: Final = 64 * 1024
LONG_STREAM_CHUNKS: Final = 64
TAIL_CHUNKS: Final = 16
STREAM_SHARE: Final = 0.25
"""Of the prefixes and corruptions, the share fed to a stream decoder rather than decode()."""

_MSGPACK_LENGTHS: Final = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4}
_MSGPACK_LENGTHS.update({0xDC: 2, 0xDD: 4, 0xDE: 2, 0xDF: 4})
"""MessagePack markers followed by a big-endian length or count, and its width."""


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    return pbwire.read_varint(data, pos, len(data))


@dataclasses.dataclass(frozen=True, slots=True)
class Input:
    """One bad input, and how it is fed."""

    data: bytes
    stream: bool
    """Fed to a stream decoder (then closed) rather than to ``decode``."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Subject:
    """What one codec x workload is fuzzed on: encodings of a few messages, and a stream."""

    messages: tuple[Any, ...]
    encodings: tuple[bytes, ...]
    stream: bytes
    type_: type[Any]


def cropped(message: Any, side: int = 4) -> Any:
    """The same message with its arrays cut to a few elements (same fields, same dtypes): an
    embedding batch to 2 x 8, each tensor's last two axes to ``side`` x ``side``."""
    if isinstance(message, ic.EmbeddingBatch):
        return dataclasses.replace(message, vectors=np.ascontiguousarray(message.vectors[:2, :8]))
    if isinstance(message, ic.InferRequest):
        inputs = []
        for tensor in message.inputs:
            data = np.ascontiguousarray(tensor.data[..., :side, :side])
            inputs.append(dataclasses.replace(tensor, shape=data.shape, data=data))
        return dataclasses.replace(message, inputs=tuple(inputs))
    return message


def _subject(codec: ic.Codec, workload: str) -> _Subject:
    messages = workloads.get(workload).messages()
    # a stream's first chunk (fields at their defaults) and last (finish reason and usage)
    unary = [messages[0], messages[-1]] if len(messages) > 1 else list(messages)
    if codec.media_type == "application/json":
        unary = [m if len(codec.encode(m)) <= LARGE_JSON_BYTES else cropped(m) for m in unary]
    streamed = messages[-TAIL_CHUNKS:] if len(messages) > LONG_STREAM_CHUNKS else messages
    if len(messages) == 1:
        streamed = unary
    encoder = codec.stream_encoder()
    stream = b"".join([*(encoder.encode(m) for m in streamed), encoder.end()])
    return _Subject(
        messages=tuple(unary),
        encodings=tuple(codec.encode(m) for m in unary),
        stream=stream,
        type_=type(messages[0]),
    )


def _pick(rng: random.Random, subject: _Subject) -> tuple[bytes, bool]:
    if rng.random() < STREAM_SHARE:
        return subject.stream, True
    return rng.choice(subject.encodings), False


def _prefixes(rng: random.Random, subject: _Subject, count: int) -> Iterator[Input]:
    for _ in range(count):
        data, stream = _pick(rng, subject)
        # half the cuts in the first 64 bytes, where the headers and lengths are
        end = rng.randrange(min(len(data), 64)) if rng.random() < 0.5 else rng.randrange(len(data))
        yield Input(data[:end], stream)


def _corruptions(
    rng: random.Random, subject: _Subject, pool: list[bytes], count: int
) -> Iterator[Input]:
    for _ in range(count):
        data, stream = _pick(rng, subject)
        out = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            near_head = rng.random() < 0.5
            pos = rng.randrange(min(len(out), 64) if near_head else len(out) + 1) if out else 0
            edit = rng.randrange(4)
            if edit == 0 and pos < len(out):
                out[pos] ^= rng.randint(1, 255)
            elif edit == 1:
                out[pos:pos] = rng.randbytes(rng.randint(1, 8))
            elif edit == 2:
                del out[pos : pos + rng.randint(1, 16)]
            else:
                other = rng.choice(pool)
                out[pos:] = other[rng.randrange(len(other) + 1) :]
        yield Input(bytes(out), stream)


def _array_offsets(data: bytes, message: Any) -> list[int]:
    """Where each array's raw bytes start in ``data`` (binary codecs write them as they are)."""
    if isinstance(message, ic.EmbeddingBatch):
        arrays = [message.vectors]
    elif isinstance(message, ic.InferRequest):
        arrays = [t.data for t in message.inputs]
    else:
        return []
    found = (data.find(np.ascontiguousarray(a).tobytes()[:64]) for a in arrays if a.size)
    return [start for start in found if start >= 0]


def _protobuf_lengths(data: bytes) -> Iterator[bytes]:
    """``data`` with each top-level length-delimited field's length replaced by 2**31."""
    pos = 0
    try:
        while pos < len(data):
            key, pos = _read_varint(data, pos)
            wire = key & 7
            if wire == 2:
                length, after = _read_varint(data, pos)
                yield data[:pos] + pbwire.varint(2**31) + data[after:]
                pos = after + length
            elif wire == 0:
                pos = _read_varint(data, pos)[1]
            elif wire in (1, 5):
                pos += 8 if wire == 1 else 4
            else:
                return
    except ic.DecodeError:
        return


def _lies(subject: _Subject) -> Iterator[Input]:
    junk = bytes(range(32))
    for marker in (0xDC, 0xDD, 0xDE, 0xDF, 0xC6, 0xDB):  # array, map, bin, str: all 1s
        yield Input(bytes([marker]) + b"\xff" * _MSGPACK_LENGTHS[marker] + junk, False)
    for key in (0x0A, 0x12, 0x1A, 0x22):  # fields 1-4, length-delimited, of 2 GiB
        yield Input(bytes([key]) + pbwire.varint(2**31) + junk, False)
    yield Input(b"\x0a" + pbwire.varint(2**64 - 1) + junk, False)
    for data, message in zip(subject.encodings, subject.messages, strict=True):
        for pos in range(min(len(data), 32)):
            yield Input(data[:pos] + b"\xff\xff\xff\xff" + data[pos + 4 :], False)
        arrays = _array_offsets(data, message)
        for start in arrays:  # the length or offset fields in front of an array's bytes
            for pos in range(max(0, start - 12), start - 3):
                yield Input(data[:pos] + b"\xff\xff\xff\xff" + data[pos + 4 :], False)
        headers = range(min([len(data), 4096, *arrays]))  # not in the array bytes themselves
        for pos in (p for p in headers if data[p] in _MSGPACK_LENGTHS):
            width = _MSGPACK_LENGTHS[data[pos]]
            yield Input(data[: pos + 1] + b"\xff" * width + data[pos + 1 + width :], False)
        for lied in _protobuf_lengths(data):
            yield Input(lied, False)
    # streams: a length-prefixed frame of 4 GiB; a delta header, then frame, of 2**32
    yield Input(struct.pack(">BI", 0, 0xFFFFFFFF) + junk, True)
    yield Input(subject.stream[:1] + b"\xff\xff\xff\xff" + subject.stream[5:], True)
    yield Input(b"\x00\x00\x00\x00\x02" + pbwire.varint(2**32) + junk, True)
    header_end = _delta_header_end(subject.stream)
    if header_end is not None:
        stream = subject.stream
        yield Input(stream[:header_end] + pbwire.varint(2**32) + junk, True)


def _with_unknown(name: str, codec: ic.Codec, message: Any, value: bytes) -> bytes:
    """``message`` encoded with one more key, unknown to the reader, whose value is ``value``
    (already encoded): unknown keys are skipped, so only the limits can refuse it."""
    data = codec.encode(message)
    if name in JSON_TEXT:
        return data[:-1] + b',"zz":' + value + b"}"
    size = data[0] & 0x0F if 0x80 <= data[0] <= 0x8E else None
    if size is None:  # not a fixmap: put the key in a map16 of its own
        raise ValueError("MessagePack encoding is not a fixmap")
    return bytes([0x80 | (size + 1)]) + data[1:] + b"\xa2zz" + value


def _limits(name: str, codec: ic.Codec, subject: _Subject) -> dict[str, list[Input]]:
    """The inputs of the ``too-deep``, ``too-many`` and ``fan-out`` kinds for one workload."""
    message = subject.messages[0]
    over = DEFAULT_MAX_DEPTH + 1
    if name in JSON_TEXT or name in MSGPACK:
        if name in JSON_TEXT:
            deep = [b"[" * n + b"]" * n for n in (over, 1_000_000)]
            many = b"[" + b"[]," * 350_000 + b"[]]"
        else:
            deep = [b"\x91" * (n - 1) + b"\x90" for n in (over, 1_000_000)]
            many = b"\xdd" + struct.pack(">I", 1 << 20) + b"\x80" * (1 << 20)
        try:
            return {
                "too-deep": [Input(_with_unknown(name, codec, message, d), False) for d in deep],
                "too-many": [Input(_with_unknown(name, codec, message, many), False)],
            }
        except ValueError:  # not a fixmap (a message type with more keys): nothing to add to
            return {}
    if name == "protobuf" and isinstance(message, ic.TokenChunk):
        group = pbwire.varint(100 << 3 | 3), pbwire.varint(100 << 3 | 4)
        deep = [codec.encode(message) + group[0] * n + group[1] * n for n in (101, 1_000_000)]
        empties = (pbwire.varint(1 << 3 | 2) + b"\x00") * 500_000  # logprobs.content entries
        many = (
            codec.encode(message)
            + pbwire.varint(8 << 3 | 2)
            + pbwire.varint(len(empties))
            + empties
        )
        return {
            "too-deep": [Input(d, False) for d in deep],
            "too-many": [Input(many, False)],
        }
    if name == "delta":
        header = codec.stream_encoder().encode(message)
        return {"too-many": [Input(header + pbwire.varint((1 << 20) + 1) + b"\x00" * 64, True)]}
    if name == "flatbuffers" and isinstance(message, ic.TokenChunk):
        return {"fan-out": [Input(_fan_out(2000, 2000), False)]}
    return {}


def _fan_out(tokens: int, alternatives: int) -> bytes:
    """A chunk of ``tokens`` logprobs that are all one table, whose ``alternatives`` top
    entries are all one table: a walk would visit tokens x alternatives tables."""
    import flatbuffers

    from inferwire.codecs.fbverify import FILE_IDENTIFIER

    def table(name: str) -> Any:
        return importlib.import_module(f"inferwire.schemas.fb.{name}")

    def offsets(b: Any, items: list[int]) -> int:
        b.StartVector(4, len(items), 4)
        for offset in reversed(items):
            b.PrependUOffsetTRelative(offset)
        return int(b.EndVector())

    top, logprob, chunk, envelope = map(
        table, ("TopLogprob", "TokenLogprob", "TokenChunk", "Envelope")
    )
    b = flatbuffers.Builder(1024)
    token = b.CreateString("t")
    top.Start(b)
    top.AddToken(b, token)
    tops = offsets(b, [top.End(b)] * alternatives)
    logprob.Start(b)
    logprob.AddToken(b, token)
    logprob.AddTop(b, tops)
    logprobs = offsets(b, [logprob.End(b)] * tokens)
    chunk.Start(b)
    chunk.AddLogprobs(b, logprobs)
    payload = chunk.End(b)
    envelope.Start(b)
    envelope.AddPayloadType(b, table("Payload").Payload.TokenChunk)
    envelope.AddPayload(b, payload)
    b.FinishSizePrefixed(envelope.End(b), file_identifier=FILE_IDENTIFIER)
    return bytes(b.Output())


def _delta_header_end(stream: bytes) -> int | None:
    """Where a delta stream's header ends (magic, schema id, varint length, Header)."""
    if len(stream) < 6 or stream[0] not in (0, 1):  # wire formats 0 and 1
        return None
    try:
        length, pos = _read_varint(stream, 5)
    except ic.DecodeError:
        return None
    return pos + length if pos + length <= len(stream) else None


@dataclasses.dataclass(frozen=True, slots=True)
class Batch:
    """The inputs of one kind for one codec x workload, decoded as ``type_``."""

    workload: str
    kind: str
    type_: type[Any]
    inputs: Iterator[Input]


def bad_inputs(name: str, codec: ic.Codec, seed: int = 0, per_codec: int = 2000) -> Iterator[Batch]:
    """The bad inputs for the codec ``codec`` registered as ``name``, one batch per workload it
    carries and kind, in the order of :data:`KINDS` (see the module docstring for each).

    ``per_codec`` prefixes and corruptions per codec, spread over the workloads it carries
    (2 in 5 prefixes, 3 in 5 corruptions); the lying headers are a fixed set per workload.
    The inputs are made as they are read: read each batch's before the next batch's.
    """
    carried = [w for w in workloads.names() if type(workloads.get(w).messages()[0]) in codec.types]
    subjects = {w: _subject(codec, w) for w in carried}
    pool = [data for s in subjects.values() for data in (*s.encodings, s.stream)]
    per_workload = max(2, per_codec // len(carried))
    for workload, subject in subjects.items():
        rng = random.Random(f"{seed}/{name}/{workload}")
        prefixes = max(1, per_workload * 2 // 5)
        inputs: dict[str, Iterator[Input]] = {
            "prefix": _prefixes(rng, subject, prefixes),
            "corruption": _corruptions(rng, subject, pool, per_workload - prefixes),
            "lying-header": _lies(subject),
        }
        if workload == carried[0]:  # once per codec: each is a megabyte or more
            inputs.update(
                {kind: iter(items) for kind, items in _limits(name, codec, subject).items()}
            )
        for kind, items in inputs.items():
            yield Batch(workload, kind, subject.type_, items)
