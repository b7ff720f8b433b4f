"""The hop's wire format (sans-IO) and its codecs: every message round-trips, and bad bytes
(truncated, corrupt, oversized, of the wrong shape) are a HopProtocolError, never a foreign
exception; pickle is refused unless allowed."""

from __future__ import annotations

import contextlib
import pickle

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

import inferwire.codecs as ic
from inferwire.engine import EngineError, hop
from inferwire.engine.hop_codecs import PICKLE, PickleCodec, hop_codec, hop_names
from inferwire.workloads import token_stream_source

ADD = hop.Add(
    rid="1f",
    workload="stream-256",
    seed=7,
    max_tokens=64,
    prompt_tokens=512,
    model="m",
    want_stage_times=True,
)

ADD_STAMPED = msgspec.structs.replace(ADD, want_stamps=True)
STAMPS = hop.EngineStamps("2", 10, 20, 30, 40)

FROM_FRONTEND = [
    (hop.hello("s1", "delta"), hop.Hello(session="s1", codec="delta")),
    (hop.add(ADD), ADD),
    (hop.add(ADD_STAMPED), ADD_STAMPED),
    (hop.rid_message(hop.ABORT, "1f"), hop.RidMessage(hop.ABORT, "1f")),
    (hop.rid_message(hop.PAUSE, "1f"), hop.RidMessage(hop.PAUSE, "1f")),
    (hop.rid_message(hop.RESUME, "1f"), hop.RidMessage(hop.RESUME, "1f")),
    (hop.ping(), hop.Bare(hop.PING)),
    (hop.stats_query(), hop.Bare(hop.STATS)),
]
FROM_ENGINE = [
    (hop.outputs([(b"1", b"abc"), (b"2", b"")]), hop.Outputs([("1", b"abc"), ("2", b"")])),
    (
        hop.outputs([(b"1", b"abc"), (b"2", b"")], [STAMPS]),
        hop.Outputs([("1", b"abc"), ("2", b"")], [STAMPS]),
    ),
    (
        hop.failure("1", "overloaded", "full"),
        hop.Failure(rid="1", kind="overloaded", message="full"),
    ),
    (hop.failure("", "refused", "no"), hop.Failure(rid="", kind="refused", message="no")),
    (hop.end_stats("1", {"queue_s": 0.5}), hop.StageTimes(rid="1", times={"queue_s": 0.5})),
    (hop.welcome("e", "delta"), hop.Welcome(session="e", codec="delta")),
    (hop.heartbeat("e", waiting=2, running=3), hop.Heartbeat(session="e", waiting=2, running=3)),
    (hop.stats_answer({"running": 1, "busy_s": 0.5, "session": "e"}), None),
]


@pytest.mark.parametrize(("frames", "expected"), FROM_FRONTEND)
def test_frontend_messages_round_trip(frames: list[bytes], expected: object) -> None:
    assert hop.parse_from_frontend(frames) == expected


@pytest.mark.parametrize(("frames", "expected"), FROM_ENGINE)
def test_engine_messages_round_trip(frames: list[bytes], expected: object) -> None:
    parsed = hop.parse_from_engine(frames)
    if expected is None:
        assert parsed == {"running": 1, "busy_s": 0.5, "session": "e"}
    else:
        assert parsed == expected


BAD_FROM_FRONTEND = [
    [],
    [b""],
    [b"AB", b""],
    [b"Z"],
    [hop.ADD],  # no payload
    [hop.ADD, hop.add(ADD)[1], b"extra"],
    [hop.ADD, hop.add(ADD)[1][:-3]],  # truncated
    [hop.ADD, b"\xff" * 12],  # corrupt
    [hop.ADD, msgspec.msgpack.encode(["1", "w", -1, None, 0, "", False])],  # negative seed
    [hop.ADD, msgspec.msgpack.encode(["1", "w", 0, 0, 0, "", False])],  # max_tokens 0
    [hop.ADD, msgspec.msgpack.encode(["x" * 65, "w", 0, None, 0, "", False])],  # long rid
    [hop.ADD, msgspec.msgpack.encode(["1", "w", (1 << 64) - 1, None, 0, "", False])],  # huge seed
    [hop.ADD, msgspec.msgpack.encode(["1", "w", 0, None, 0, "", False, "more"])],
    [hop.ADD, msgspec.msgpack.encode({"rid": "1", "workload": "w"})],  # a map, not an array
    [hop.ADD, b"\x97" + b"\xa1x" * (hop.MAX_CONTROL_BYTES // 2)],  # oversized
    [hop.HELLO, msgspec.msgpack.encode({"session": "s", "codec": "c", "evil": 1})],
    [hop.HELLO, msgspec.msgpack.encode({"session": "", "codec": "c"})],
    [hop.ABORT],
    [hop.ABORT, b""],
    [hop.ABORT, b"\xff\xfe"],
    [hop.ABORT, b"a\nb"],
    [hop.ABORT, b"1", b"2"],
    [hop.PING, b"x"],
]
BAD_FROM_ENGINE = [
    [],
    [hop.OUTPUTS],
    [hop.OUTPUTS, b"1"],  # a rid without its frame
    [hop.OUTPUTS, b"1", b"x", b"2"],
    [hop.OUTPUTS, b"", b"x"],
    [hop.OUTPUTS, b"1", b"x", msgspec.msgpack.encode([])],  # a stamps frame of none
    [hop.OUTPUTS, b"1", b"x", msgspec.msgpack.encode([["1", -1, 0, 0, 0]])],  # negative
    [hop.OUTPUTS, b"1", b"x", msgspec.msgpack.encode([["1", 1, 2, 3]])],  # a stamp short
    [hop.OUTPUTS, b"1", b"x", msgspec.msgpack.encode([["", 1, 2, 3, 4]])],  # no rid
    [hop.OUTPUTS, b"1", b"x", hop.outputs([], [STAMPS])[1][:-1]],  # truncated
    [hop.ERROR, msgspec.msgpack.encode(["1", "no-such-kind", "m"])],
    [hop.ERROR, b"\x93"],
    [hop.END_STATS, msgspec.msgpack.encode(["1", {"queue_s": "slow"}])],
    [hop.WELCOME, b""],
    [hop.HEARTBEAT, msgspec.msgpack.encode({"session": "e", "waiting": -1})],
    [hop.STATS_ANSWER, msgspec.msgpack.encode({"a": [1, 2]})],
    [hop.PING],  # a frontend's message, not the engine's
]


@pytest.mark.parametrize("frames", BAD_FROM_FRONTEND)
def test_bad_frontend_messages_are_protocol_errors(frames: list[bytes]) -> None:
    with pytest.raises(hop.HopProtocolError):
        hop.parse_from_frontend(frames)


@pytest.mark.parametrize("frames", BAD_FROM_ENGINE)
def test_bad_engine_messages_are_protocol_errors(frames: list[bytes]) -> None:
    with pytest.raises(hop.HopProtocolError):
        hop.parse_from_engine(frames)


def test_every_prefix_of_a_control_payload_is_refused() -> None:
    for frames, _ in FROM_FRONTEND:
        if len(frames) == 2 and frames[0] in (hop.HELLO, hop.ADD):
            for end in range(len(frames[1])):
                with pytest.raises(hop.HopProtocolError):
                    hop.parse_from_frontend([frames[0], frames[1][:end]])


def test_the_errors_share_the_engine_root() -> None:
    for error in (
        hop.HopProtocolError,
        hop.HopRefusedError,
        hop.EngineGoneError,
        hop.EngineOverloadedError,
        hop.EngineRequestError,
        hop.StreamFailedError,
    ):
        assert issubclass(error, hop.HopError)
        assert issubclass(error, EngineError)


@given(st.lists(st.binary(max_size=64), max_size=6))
def test_any_bytes_from_a_frontend_parse_or_raise_protocol_error(frames: list[bytes]) -> None:
    with contextlib.suppress(hop.HopProtocolError):
        hop.parse_from_frontend(frames)


@given(
    st.lists(
        st.one_of(st.binary(max_size=64), st.sampled_from([b"O", b"E", b"T", b"W", b"!", b"s"])),
        max_size=6,
    )
)
def test_any_bytes_from_the_engine_parse_or_raise_protocol_error(frames: list[bytes]) -> None:
    with contextlib.suppress(hop.HopProtocolError):
        hop.parse_from_engine(frames)


@given(st.integers(0, 200), st.binary(min_size=1, max_size=8))
def test_a_mangled_add_is_refused_or_reads_as_an_add(cut: int, junk: bytes) -> None:
    payload = hop.add(ADD)[1]
    mangled = payload[:cut] + junk + payload[cut + len(junk) :]
    try:
        parsed = hop.parse_from_frontend([hop.ADD, mangled])
    except hop.HopProtocolError:
        return
    assert isinstance(parsed, hop.Add)


# -- hop codecs --


def test_pickle_is_refused_unless_allowed() -> None:
    with pytest.raises(hop.HopRefusedError, match="allow"):
        hop_codec(PICKLE)
    assert isinstance(hop_codec(PICKLE, allow_pickle=True), PickleCodec)
    assert PICKLE in hop_names()
    assert PICKLE not in ic.names()  # never a codec a server can be asked to speak
    with pytest.raises(ic.UnknownCodecError):
        ic.get(PICKLE)


def test_a_codec_without_token_chunks_is_refused() -> None:
    with pytest.raises(hop.HopRefusedError):
        hop_codec("tensor")
    assert "tensor" not in hop_names()


@pytest.mark.parametrize("name", hop_names())
def test_hop_codec_streams_round_trip(name: str) -> None:
    codec = hop_codec(name, allow_pickle=True)
    chunks = list(token_stream_source("stream-256", 3))
    encoder = codec.stream_encoder()
    frames = [encoder.encode(c) for c in chunks]
    frames[-1] += encoder.end()
    decoder = codec.stream_decoder()
    got = [c for frame in frames for c in decoder.feed(frame)]
    decoder.close()
    assert got == chunks


def test_pickle_decode_errors_are_codec_errors() -> None:
    codec = PickleCodec()
    with pytest.raises(ic.DecodeError):
        codec.decode(b"\x80\x05garbage", ic.TokenChunk)
    with pytest.raises(ic.DecodeError, match="not a TokenChunk"):
        codec.decode(pickle.dumps({"a": 1}), ic.TokenChunk)
    with pytest.raises(ic.EncodeError):
        codec.encode(ic.Usage(prompt_tokens=1, completion_tokens=1))  # type: ignore[arg-type]
