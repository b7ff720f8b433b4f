"""Every codec x every workload against hostile bytes: decode or ``DecodeError``.

What test_codecs.py checks on small hand-made messages (every strict prefix, single-byte
flips), this file checks on the encodings of every workload each codec carries, unary and
streamed, and with more kinds of damage:

- every strict prefix of a unary encoding (a seeded sample with every boundary region for
  the large ones) is a ``DecodeError``. Protobuf is the documented exception: proto3 has no
  end marker, so a prefix that ends at a top-level field boundary *is* a message. It may
  decode, and then only to exactly those fields (re-encoding it gives the prefix back);
- every strict prefix of a stream delivers exactly the frames it holds whole, and ``close()``
  then raises ``IncompleteStreamError``: a cut stream is never complete;
- hypothesis damage (byte flips, insertions, deletions, splices of two encodings, length
  fields overwritten with extreme values), decoded into the encoded type or another one the
  codec carries: a well-formed value of the requested type, or ``DecodeError``. Nothing else
  (any ``BaseException`` but ``KeyboardInterrupt`` fails the test with its repr), and nothing
  hangs: each decode runs under a 5 s alarm, and a C-level hang, which no Python alarm
  interrupts, kills the run after a per-test backstop (faulthandler) with every traceback.

The delta codec runs twice: on its C extension and on its pure-Python path ("delta-pure").
What is sampled rather than exhaustive, to keep the file near 40 s on a busy 2-core machine:
large JSON encodings (0.7 to 3 MB, 6 to 100 ms a parse) get fewer cuts, and are damaged as a
cropped copy of the same message (same fields, a 2x8 matrix or a 1x3x4x4 image) besides a
few examples on the whole one; streams of 256 and 2048 chunks are damaged as their last 16
chunks. In all, about 4,800 hypothesis examples, derandomized so CI replays the same ones.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import faulthandler
import functools
import random
import signal
import struct
import types
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import inferwire.codecs as ic
from inferwire import workloads
from inferwire.codecs.delta_codec import DeltaCodec
from inferwire.workloads import hostile
from tests.codecs.test_codecs import as_model, check_well_formed, encode_stream

CODECS: dict[str, ic.Codec] = {name: ic.get(name, extensions=True) for name in ic.names()}
CODECS["delta-pure"] = DeltaCodec(pure_python=True)
JSON_CODECS = {name for name, codec in CODECS.items() if codec.media_type == "application/json"}
SEED = workloads.DEFAULT_SEED


def _carries(codec: str, workload: str) -> bool:
    return type(workloads._built(workload, SEED)[0]) in CODECS[codec].types


PAIRS = [
    pytest.param(codec, workload, id=f"{codec}-{workload}")
    for workload in workloads.names()
    for codec in CODECS
    if _carries(codec, workload)
]

HANG_SECONDS = 5.0
BACKSTOP_SECONDS = 120.0
LARGE_BYTES = 64 * 1024
"""Above this, a unary encoding gets a sample of cuts rather than all of them."""
LARGE_JSON_CUTS = 12
"""Random cuts in a large JSON encoding besides its head and tail (each costs a full parse)."""
BINARY_CUTS = 200
LONG_STREAM_FRAMES = 64
"""Longer streams are fuzzed on their last 16 chunks (a full decode per example is too slow)."""


# -- no hang, nothing else escapes ---------------------------------------------------------


class Hang(BaseException):
    """Raised by the alarm. A BaseException: no codec's ``except Exception`` can swallow it."""


@contextlib.contextmanager
def alarm(seconds: float = HANG_SECONDS) -> Iterator[None]:
    """Raise :class:`Hang` in the main thread if the block runs longer than ``seconds``."""

    def ring(signum: int, frame: types.FrameType | None) -> None:
        raise Hang(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(autouse=True)
def _backstop() -> Iterator[None]:
    """A hang inside C code never returns to the interpreter to take the alarm: dump every
    thread's traceback and exit, rather than hang CI."""
    faulthandler.dump_traceback_later(BACKSTOP_SECONDS, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def describe(data: bytes) -> str:
    shown = data if len(data) <= 200 else data[:160] + b"..." + data[-40:]
    return f"{len(data)} bytes {shown!r}"


def decode_or_none(label: str, data: bytes, type_: type[Any]) -> Any:
    """The decoded value read through (a view materialized), or None for a DecodeError."""
    codec = CODECS[label]
    try:
        with alarm():
            value = as_model(codec.decode(data, type_))
    except ic.DecodeError:
        return None
    except KeyboardInterrupt:
        raise
    except Hang:
        pytest.fail(f"{label}: decode into {type_.__name__} hung on {describe(data)}")
    except BaseException as exc:  # the property under test: nothing else escapes
        pytest.fail(f"{label}: {exc!r} escaped decode into {type_.__name__} of {describe(data)}")
    assert isinstance(value, type_), f"{label}: asked for {type_.__name__}, got {value!r}"
    check_well_formed(value)
    return value


@dataclasses.dataclass
class Fed:
    """What a stream decoder made of some pieces: the chunks it delivered, and whether it
    ended (``close()`` returned) or raised a DecodeError (``error``)."""

    chunks: list[Any]
    error: ic.DecodeError | None


def feed_all(label: str, pieces: Sequence[bytes], type_: type[Any]) -> Fed:
    decoder = CODECS[label].stream_decoder(type_)
    chunks: list[Any] = []
    error = None
    try:
        with alarm():
            for piece in pieces:
                chunks += [as_model(chunk) for chunk in decoder.feed(piece)]
            decoder.close()
    except ic.DecodeError as exc:
        error = exc
    except KeyboardInterrupt:
        raise
    except Hang:
        pytest.fail(f"{label}: stream decoder hung on {describe(b''.join(pieces))}")
    except BaseException as exc:
        pytest.fail(f"{label}: {exc!r} escaped the stream decoder on {describe(b''.join(pieces))}")
    for chunk in chunks:
        assert isinstance(chunk, type_), f"{label}: asked for {type_.__name__}, got {chunk!r}"
        check_well_formed(chunk)
    return Fed(chunks, error)


# -- the payloads --------------------------------------------------------------------------


cropped = hostile.cropped


def prefix_messages(workload: str) -> list[Any]:
    """A stream's first chunk (seq 0: fields at their defaults) and its last (finish reason
    and usage); a tensor or embedding workload's one message."""
    messages = workloads._built(workload, SEED)
    return [messages[0], messages[-1]] if len(messages) > 1 else messages


@functools.cache
def encoded(label: str, workload: str, index: int) -> bytes:
    """The encoding of prefix message ``index``."""
    return CODECS[label].encode(prefix_messages(workload)[index])


@functools.cache
def fuzz_messages(label: str, workload: str) -> tuple[Any, ...]:
    """What hypothesis damages: the prefix messages, cropped when a JSON parse is slow."""
    messages = prefix_messages(workload)
    if label in JSON_CODECS:
        messages = [
            m if len(encoded(label, workload, i)) <= LARGE_BYTES else cropped(m)
            for i, m in enumerate(messages)
        ]
    return tuple(messages)


@functools.cache
def fuzz_encoding(label: str, workload: str, index: int) -> tuple[bytes, tuple[int, ...]]:
    """The encoding of fuzzed message ``index``, and where its arrays' edges are."""
    message = fuzz_messages(label, workload)[index]
    encoded = CODECS[label].encode(message)
    return encoded, tuple(sorted(array_landmarks(encoded, message)))


@functools.cache
def fuzz_stream(label: str, workload: str) -> tuple[tuple[Any, ...], bytes, tuple[int, ...]]:
    """The chunks of the stream hypothesis damages, its bytes, and the first 8 bytes of each
    frame (length prefixes, ``data: ``, the delta header)."""
    messages = workloads._built(workload, SEED)
    if len(messages) > LONG_STREAM_FRAMES:
        messages = messages[-16:]
    elif len(messages) == 1:
        messages = list(fuzz_messages(label, workload))
    frames = encode_stream(CODECS[label], list(messages))
    starts = np.cumsum([0, *(len(f) for f in frames[:-1])]).tolist()
    landmarks = sorted({start + k for start in starts for k in range(8)})
    return tuple(messages), b"".join(frames), tuple(landmarks)


@functools.cache
def splice_pool(label: str) -> tuple[bytes, ...]:
    """Other encodings of the same codec, to splice onto: every workload's fuzzed messages."""
    pool: list[bytes] = []
    for workload in workloads.names():
        if _carries(label, workload):
            pool += [CODECS[label].encode(m) for m in fuzz_messages(label, workload)]
            pool.append(fuzz_stream(label, workload)[1])
    return tuple(pool)


def array_landmarks(data: bytes, message: Any) -> set[int]:
    """Where each array's raw bytes start and end in ``data`` (binary codecs write them as
    they are), give or take 16 bytes: the length fields in front of them live there."""
    arrays = [message.vectors] if isinstance(message, ic.EmbeddingBatch) else []
    if isinstance(message, ic.InferRequest):
        arrays = [t.data for t in message.inputs]
    found: set[int] = set()
    for array in arrays:
        raw = np.ascontiguousarray(array).tobytes()
        start = data.find(raw[:64]) if raw else -1
        if start >= 0:
            for edge in (start, start + len(raw)):
                found.update(range(max(0, edge - 16), min(len(data), edge + 16)))
    return found


def prefix_cuts(label: str, data: bytes, message: Any) -> list[int]:
    """Every cut for a small encoding. For a large one: its first 256 bytes, the region
    around each array's bytes, its last 64 bytes and 200 seeded random cuts; for a large
    JSON one, whose every cut past the head costs a full parse, its last 4 and 12 random."""
    size = len(data)
    if size <= LARGE_BYTES:
        return list(range(size))
    rng = random.Random(f"{label}/{size}")
    tail = 4 if label in JSON_CODECS else 64
    count = LARGE_JSON_CUTS if label in JSON_CODECS else BINARY_CUTS
    cuts = {*range(256), *range(size - tail, size), *array_landmarks(data, message)}
    cuts.update(rng.randrange(size) for _ in range(count))
    return sorted(cuts)


def field_ends(data: bytes) -> set[int]:
    """Where each top-level protobuf field ends (and 0): the cuts that leave a message."""
    ends = {0}
    pos = 0
    while pos < len(data):
        key, pos = read_varint(data, pos)
        wire = key & 7
        if wire == 0:
            _, pos = read_varint(data, pos)
        elif wire == 2:
            length, pos = read_varint(data, pos)
            pos += length
        else:
            pos += {1: 8, 5: 4}[wire]
        ends.add(pos)
    return ends


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


# -- strict prefixes -----------------------------------------------------------------------


@pytest.mark.parametrize(("label", "workload"), PAIRS)
def test_every_strict_prefix_of_a_message_is_a_decode_error(label: str, workload: str) -> None:
    codec = CODECS[label]
    for index, message in enumerate(prefix_messages(workload)):
        data = encoded(label, workload, index)
        ends = field_ends(data) if label == "protobuf" else set()
        for end in prefix_cuts(label, data, message):
            decoded = decode_or_none(label, data[:end], type(message))
            if decoded is None:
                continue
            # proto3 has no end marker: a cut at a field boundary is the message of the
            # fields before it, and must decode to exactly those
            assert end in ends, f"{label} decoded a {end}-byte prefix of {len(data)}"
            assert codec.encode(decoded) == data[:end], f"{label}: {end}-byte prefix"


def stream_cuts(frames: Sequence[bytes], label: str) -> tuple[list[int], set[int]]:
    """Cuts in a stream, and those at which ``close()`` is asked too (it copies the decoder).

    Every cut of a stream up to 16 KB; of a longer one, each frame boundary and the byte after
    it, and 200 seeded random cuts. Asked at all the edges: the first 256 bytes, the region
    around the first and last 16 frame boundaries (length prefixes, ``data: ``, the blank
    line) and the end marker whole; and at every 16th of the other cuts.
    """
    size = sum(len(f) for f in frames)
    bounds = [0, *np.cumsum([len(f) for f in frames]).tolist()]
    edges = set(range(min(size, 256))) | set(range(bounds[-2], size))
    for i, bound in enumerate(bounds[:-1]):
        if i < 16 or i >= len(bounds) - 18:
            edges.update(range(bound - 4, bound + 12))
    if size <= 16 * 1024:
        others = set(range(size))
    else:
        rng = random.Random(f"{label}/{size}")
        others = {b + k for b in bounds[:-1] for k in (0, 1)}
        others.update(rng.randrange(size) for _ in range(200))
    edges = {c for c in edges if 0 <= c < size}
    others = {c for c in others if c < size} - edges
    return sorted(edges | others), edges | set(sorted(others)[::16])


def closes_incomplete(decoder: Any) -> bool:
    """Whether ``close()`` raises IncompleteStreamError, asked of a copy so that the decoder
    can go on (shared: the codec and the C extension module it holds, if any)."""
    shared = {
        id(v): v
        for v in getattr(decoder, "__dict__", {}).values()
        if isinstance(v, types.ModuleType | ic.Codec)
    }
    try:
        copy.deepcopy(decoder, shared).close()
    except ic.IncompleteStreamError:
        return True
    return False


@pytest.mark.parametrize(("label", "workload"), PAIRS)
def test_every_strict_prefix_of_a_stream_is_incomplete(label: str, workload: str) -> None:
    """Fed up to each cut (in pieces: the cuts before it), a decoder has delivered exactly the
    frames it holds whole, is not finished, and close() says so. Fed a sample of the prefixes
    in one piece, a fresh decoder does the same."""
    codec = CODECS[label]
    messages = workloads._built(workload, SEED)
    type_ = type(messages[0])
    frames = encode_stream(codec, messages)
    stream = b"".join(frames)
    bounds = np.cumsum([len(f) for f in frames[:-1]])
    cuts, asked = stream_cuts(frames, label)
    decoder = codec.stream_decoder(type_)
    delivered: list[Any] = []
    at = 0
    with alarm(4 * HANG_SECONDS):
        for cut in cuts:
            delivered += [as_model(c) for c in decoder.feed(stream[at:cut])]
            at = cut
            whole = int(np.searchsorted(bounds, cut, side="right"))
            assert len(delivered) == whole, f"{label}: {len(delivered)} chunks at byte {cut}"
            assert not decoder.finished, f"{label}: finished at byte {cut} of {len(stream)}"
            if cut in asked:
                assert closes_incomplete(decoder), f"{label}: close() at {cut} of {len(stream)}"
        delivered += [as_model(c) for c in decoder.feed(stream[at:])]
        decoder.close()
    assert delivered == messages
    rng = random.Random(f"{label}/{workload}")
    # a fresh decoder fed a deep cut decodes every frame before it: sample the short streams
    shallow = [c for c in cuts if len(messages) <= LONG_STREAM_FRAMES or c < 64 * 1024]
    for cut in sorted(rng.sample(shallow, min(24, len(shallow)))):
        fed = feed_all(label, [stream[:cut]], type_)
        assert isinstance(fed.error, ic.IncompleteStreamError), f"{label}: cut at {cut}"
        assert fed.chunks == messages[: int(np.searchsorted(bounds, cut, side="right"))]


# -- random damage -------------------------------------------------------------------------


def varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes([*out, value])


# Lengths and counts that lie: the widths and encodings each format uses for them.
LIES = (
    b"\xff\xff\xff\xff",
    b"\x7f\xff\xff\xff",
    b"\x80\x00\x00\x00",
    b"\x00\x00\x00\x00",
    b"\xff" * 8,
    struct.pack("<Q", 2**63),
    varint(2**31),
    varint(2**32 - 1),
    varint(2**64 - 1),
    b"\xff" * 10 + b"\x01",  # a varint longer than 10 bytes
    b"\xdd\xff\xff\xff\xff",  # msgpack array32 of 2**32 - 1 elements
    b"\xdf\xff\xff\xff\xff",  # msgpack map32
    b"\xc6\xff\xff\xff\xff",  # msgpack bin32
    b"\xdb\xff\xff\xff\xff",  # msgpack str32
    b"\x00\xff\xff\xff\xff",  # a length-prefixed frame header claiming 4 GiB
    b"1e999999",
    b"-1",
)


# One edit: what, where (a region, and an offset taken modulo its size) and with what. The
# regions are anywhere, the head, the tail, and the landmarks (frame starts, array edges):
# where lengths, counts and offsets live. Drawn apart from the bytes, so that a failure
# prints as a short list of edits.
WHERE = st.tuples(st.integers(0, 3), st.integers(0, 2**32 - 1))
EDIT = st.one_of(
    st.tuples(st.just("flip"), WHERE, st.integers(1, 255)),
    st.tuples(st.just("insert"), WHERE, st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("delete"), WHERE, st.integers(1, 16)),
    st.tuples(st.just("splice"), WHERE, st.tuples(st.integers(0, 255), st.integers(0, 2**32 - 1))),
    st.tuples(st.just("lie"), WHERE, st.tuples(st.sampled_from(LIES), st.booleans())),
)
EDITS = st.lists(EDIT, min_size=1, max_size=3)
TYPE_PICK = st.integers(0, 7)
"""Below 4 the encoded type, else one the codec carries: bytes of one type read as another."""


def locate(where: tuple[int, int], size: int, landmarks: Sequence[int]) -> int:
    region, offset = where
    head = min(size, 64) + 1
    near = [p for p in landmarks if p <= size]
    if region == 1:
        return offset % head
    if region == 2:
        return size - offset % head
    if region == 3 and near:
        return near[offset % len(near)]
    return offset % (size + 1)


def damage(
    data: bytes, edits: Sequence[Any], landmarks: Sequence[int], pool: Sequence[bytes]
) -> bytes:
    out = bytearray(data)
    for kind, where, arg in edits:
        pos = locate(where, len(out), landmarks)
        if kind == "flip" and pos < len(out):
            out[pos] ^= arg
        elif kind == "insert":
            out[pos:pos] = arg
        elif kind == "delete":
            del out[pos : pos + arg]
        elif kind == "splice":
            other = pool[arg[0] % len(pool)]
            out[pos:] = other[arg[1] % (len(other) + 1) :]
        elif kind == "lie":
            lie, overwrite = arg
            out[pos : pos + len(lie) if overwrite else pos] = lie
    return bytes(out)


def target_type(label: str, real: type[Any], pick: int) -> type[Any]:
    carried = sorted(CODECS[label].types, key=lambda t: t.__name__)
    return real if pick < 4 else carried[pick % len(carried)]


FUZZ = settings(
    deadline=None,
    derandomize=True,
    database=None,  # nothing written into the checkout; derandomize replays any failure
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
        HealthCheck.filter_too_much,
    ],
)
MESSAGE_EXAMPLES = 30
STREAM_EXAMPLES = 15
FULL_JSON_EXAMPLES = 10


@pytest.mark.parametrize(("label", "workload"), PAIRS)
@settings(FUZZ, max_examples=MESSAGE_EXAMPLES)
@given(edits=EDITS, index=st.integers(0, 1), pick=TYPE_PICK)
def test_damaged_messages_decode_or_raise_decode_error(
    label: str, workload: str, edits: list[Any], index: int, pick: int
) -> None:
    messages = fuzz_messages(label, workload)
    index %= len(messages)
    encoded, landmarks = fuzz_encoding(label, workload, index)
    bad = damage(encoded, edits, landmarks, splice_pool(label))
    decode_or_none(label, bad, target_type(label, type(messages[index]), pick))


LARGE_JSON_PAIRS = [
    pytest.param(codec, workload, id=f"{codec}-{workload}")
    for workload in workloads.names()
    for codec in sorted(JSON_CODECS)
    if len(workloads._built(workload, SEED)) == 1 and len(encoded(codec, workload, 0)) > LARGE_BYTES
]


@pytest.mark.parametrize(("label", "workload"), LARGE_JSON_PAIRS)
@settings(FUZZ, max_examples=FULL_JSON_EXAMPLES)
@given(edits=EDITS)
def test_damaged_large_json_messages_uncropped(label: str, workload: str, edits: list[Any]) -> None:
    (message,) = workloads._built(workload, SEED)
    bad = damage(encoded(label, workload, 0), edits, (), splice_pool(label))
    decode_or_none(label, bad, type(message))


@pytest.mark.parametrize(("label", "workload"), PAIRS)
@settings(FUZZ, max_examples=STREAM_EXAMPLES)
@given(edits=EDITS, splits=st.lists(st.integers(0, 2**32 - 1), max_size=3), pick=TYPE_PICK)
def test_damaged_streams_decode_or_raise_decode_error(
    label: str, workload: str, edits: list[Any], splits: list[int], pick: int
) -> None:
    """Damaged, then fed in up to four pieces, then closed."""
    messages, stream, landmarks = fuzz_stream(label, workload)
    bad = damage(stream, edits, landmarks, splice_pool(label))
    cuts = sorted(at % (len(bad) + 1) for at in splits)
    pieces = [bad[a:b] for a, b in zip([0, *cuts], [*cuts, len(bad)], strict=True)]
    feed_all(label, pieces, target_type(label, type(messages[0]), pick))
