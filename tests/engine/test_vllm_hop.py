"""The vLLM-shaped hop (issue 33): every codec's steps and requests round-trip through a real
engine process over ipc and tcp, whole and checked; the out-of-band arrays really are the
received frames (no copy); and hostile frames (wrong kind, truncated, bogus index or length,
a buffer of the wrong size, an unknown dtype, pickle not allowed) are a HopProtocolError or a
HopRefusedError, while the engine process survives a bad order."""

from __future__ import annotations

import pickle
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import msgspec
import numpy as np
import pytest
import zmq

from inferwire.engine.hop import HopError, HopProtocolError, HopRefusedError
from inferwire.engine.vllm_hop import (
    CASES,
    CODECS,
    MSGSPEC_INBAND,
    MSGSPEC_OOB,
    PICKLE5_OOB,
    PICKLE_INBAND,
    TOKEN_HOP_CODECS,
    TOKEN_HOP_PREFIX,
    TRANSPORTS,
    EngineCoreOutputs,
    EngineCoreRequest,
    Frontend,
    SamplingParams,
    StepSource,
    step_codec,
)
from inferwire.engine.vllm_hop import frontend as frontend_module
from inferwire.engine.vllm_hop.codecs import RAW_VIEW, BytesLike
from inferwire.engine.vllm_hop.steps import EMBEDDING, LOGPROBS, TOKENS, expected_tensors
from inferwire.engine.vllm_hop.wire import ACK_DECODER, ADD, QUIT, RUN, Engine

BATCH = 3
STEPS = 3


@pytest.fixture(scope="module", params=TRANSPORTS)
def frontend(request: pytest.FixtureRequest) -> Iterator[Frontend]:
    """One engine process per transport for the module."""
    with Frontend(request.param, allow_pickle=True) as running:
        yield running


def _array_frames(result_frames: Sequence[Any]) -> list[np.ndarray[Any, Any]]:
    return [np.frombuffer(f.buffer, dtype=np.uint8) for f in result_frames]


def _tensors(message: EngineCoreOutputs) -> list[np.ndarray[Any, Any]]:
    found = []
    for output in message.outputs:
        if output.new_logprobs is not None:
            found.append(output.new_logprobs.logprobs)
        if output.pooling_output is not None:
            found.append(output.pooling_output)
    return found


@pytest.mark.parametrize("codec", CODECS)
def test_steps_round_trip_whole_and_zero_copy(frontend: Frontend, codec: str) -> None:
    for case in CASES:
        result = frontend.run(codec, case, batch=BATCH, steps=STEPS, seed=5, keep_last=True)
        assert result.correct, (case, result.problems)
        assert result.last is not None
        tensors = _tensors(result.last)
        expected = expected_tensors(case, BATCH, STEPS - 1)
        assert len(tensors) == len(expected)
        for got, want in zip(tensors, expected, strict=True):
            assert got.dtype == want.dtype
            assert np.array_equal(got, want)
        frames = _array_frames(result.last_frames)
        if case == TOKENS:
            assert len(frames) == 1
        elif codec in (MSGSPEC_OOB, PICKLE5_OOB):
            # one frame per tensor, and the tensor is that frame's memory: no copy
            assert len(frames) == 1 + BATCH
            for got, frame in zip(tensors, frames[1:], strict=True):
                assert np.shares_memory(got, frame)
        elif codec == MSGSPEC_INBAND:
            assert len(frames) == 1
            assert all(np.shares_memory(got, frames[0]) for got in tensors)
        else:
            assert codec == PICKLE_INBAND
            assert len(frames) == 1
            assert not any(np.shares_memory(got, frames[0]) for got in tensors)


def test_token_hop_codecs_round_trip(frontend: Frontend) -> None:
    for codec in TOKEN_HOP_CODECS:
        result = frontend.run(TOKEN_HOP_PREFIX + codec, TOKENS, batch=BATCH, steps=STEPS, seed=2)
        assert result.correct, (codec, result.problems)


@pytest.mark.parametrize("codec", CODECS)
def test_requests_round_trip(frontend: Frontend, codec: str) -> None:
    embeds = np.arange(8 * 64, dtype=np.float32).reshape(8, 64) / 7
    for prompt_embeds in (None, embeds):
        request = EngineCoreRequest(
            request_id="r-1",
            prompt_token_ids=[1, 2, 3, 40_000],
            sampling_params=SamplingParams(max_tokens=9, logprobs=-1),
            arrival_time=12.5,
            prompt_embeds=prompt_embeds,
        )
        ack = frontend.add_request(codec, request)
        assert ack.ok, ack.error
        assert ack.summary["request_id"] == "r-1"
        assert ack.summary["token_sum"] == 40_006
        assert ack.summary["max_tokens"] == 9
        if prompt_embeds is None:
            assert ack.summary["embeds_shape"] == ""
        else:
            assert ack.summary["embeds_shape"] == "8x64"
            assert ack.summary["embeds_sum"] == pytest.approx(float(embeds.sum(dtype="f8")))


def test_engine_survives_bad_orders(frontend: Frontend) -> None:
    bad: list[list[BytesLike]] = [
        [b"z"],
        [RUN, b"\xc1garbage"],
        [RUN, msgspec.msgpack.encode(["no-such-codec", TOKENS, 1, 1, 0])],
        [RUN, msgspec.msgpack.encode([MSGSPEC_OOB, TOKENS, 0, 1, 0])],
        [b"a", b"msgspec-oob", b"\x80\x05not a request"],
        [b"a", b"pickle5-oob", b"\x80\x05not a request"],
    ]
    for frames in bad:
        ack = frontend.send_raw(frames)
        assert not ack.ok
        assert ack.error
    with pytest.raises(HopError, match="refused"):
        frontend.run(MSGSPEC_OOB, "no-such-case", batch=1, steps=1)
    assert frontend.run(MSGSPEC_OOB, LOGPROBS, batch=1, steps=2).correct


def test_a_step_that_does_not_decode_is_reported_and_the_next_run_is_in_step(
    frontend: Frontend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The frontend reads steps sent out of band with the in-band decoder: every step is a
    HopProtocolError, reported in the run's problems; the run is read to its end, so the next
    one decodes."""
    monkeypatch.setattr(
        frontend_module,
        "step_codec",
        lambda name, type_, allow_pickle=False: step_codec(MSGSPEC_INBAND, type_),
    )
    result = frontend.run(MSGSPEC_OOB, LOGPROBS, batch=2, steps=STEPS)
    assert not result.correct
    assert len(result.problems) == STEPS
    assert all("2 frames" in problem or "3 frames" in problem for problem in result.problems)
    monkeypatch.undo()
    assert frontend.run(MSGSPEC_OOB, LOGPROBS, batch=2, steps=STEPS).correct


def test_pickle_refused_unless_allowed() -> None:
    for name in (PICKLE5_OOB, PICKLE_INBAND):
        with pytest.raises(HopRefusedError):
            step_codec(name, EngineCoreOutputs)
    # and by an engine started without it, over its own sockets (in this process)
    context: zmq.Context[Any] = zmq.Context()
    orders, inputs = context.socket(zmq.PUSH), context.socket(zmq.PULL)
    outputs, answers = context.socket(zmq.PUSH), context.socket(zmq.PULL)
    orders.bind("inproc://orders")
    inputs.connect("inproc://orders")
    answers.bind("inproc://answers")
    outputs.connect("inproc://answers")
    engine = Engine(inputs, outputs, allow_pickle=False)
    serving = threading.Thread(target=engine.serve, daemon=True)
    serving.start()
    try:
        request = EngineCoreRequest(
            request_id="r", prompt_token_ids=[1], sampling_params=None, arrival_time=1.0
        )
        pickled = step_codec(PICKLE5_OOB, EngineCoreRequest, allow_pickle=True).encode(request)
        for frames in (
            [RUN, msgspec.msgpack.encode([PICKLE5_OOB, TOKENS, 1, 1, 0])],
            [ADD, PICKLE5_OOB.encode(), *pickled],
        ):
            orders.send_multipart(frames)
            ack = ACK_DECODER.decode(answers.recv())
            assert not ack.ok
            assert "refused unless" in ack.error
    finally:
        orders.send(QUIT)
        serving.join(10)
        for socket in (orders, inputs, outputs, answers):
            socket.close(linger=0)
        context.term()
    assert not serving.is_alive()


# -- hostile frames, sans-IO ---------------------------------------------------------------------


def _step(case: str = LOGPROBS) -> EngineCoreOutputs:
    return StepSource.build(case, 2, 1).step(0, last=False)


def _encoded(codec: str, case: str = LOGPROBS) -> list[bytes]:
    frames = step_codec(codec, EngineCoreOutputs, allow_pickle=True).encode(_step(case))
    return [bytes(f) for f in frames]


def _decode(codec: str, frames: Sequence[BytesLike]) -> EngineCoreOutputs:
    return step_codec(codec, EngineCoreOutputs, allow_pickle=True).decode(
        [memoryview(f) for f in frames]
    )


def _with_array(array: list[Any], frames: Sequence[bytes] = ()) -> list[bytes]:
    """A step of one output whose logprobs array is the raw triple ``array``."""
    head = msgspec.msgpack.encode([0, [["req-0", [5], [array]]], 1.0])
    return [head, *frames]


LOGPROBS_BYTES = 4 * 8

HOSTILE_MSGSPEC: list[tuple[str, list[bytes]]] = [
    ("index out of range", _with_array(["<f4", [1, 8], 2], [bytes(LOGPROBS_BYTES)])),
    ("index 0: frame 0 itself", _with_array(["<f4", [1, 8], 0], [bytes(LOGPROBS_BYTES)])),
    ("negative index", _with_array(["<f4", [1, 8], -1], [bytes(LOGPROBS_BYTES)])),
    ("length over the buffer", _with_array(["<f4", [1, 1 << 40], 1], [bytes(LOGPROBS_BYTES)])),
    ("buffer too short", _with_array(["<f4", [1, 8], 1], [bytes(LOGPROBS_BYTES - 4)])),
    ("buffer too long", _with_array(["<f4", [1, 8], 1], [bytes(LOGPROBS_BYTES + 1)])),
    ("unknown dtype", _with_array(["<c8", [1, 4], 1], [bytes(LOGPROBS_BYTES)])),
    ("object dtype", _with_array(["|O", [1, 4], 1], [bytes(LOGPROBS_BYTES)])),
    ("negative dimension", _with_array(["<f4", [-1, 8], 1], [bytes(LOGPROBS_BYTES)])),
    ("rank 9", _with_array(["<f4", [1] * 9, 1], [bytes(4)])),
    ("not a triple", _with_array(["<f4", [1, 8]], [bytes(LOGPROBS_BYTES)])),
    ("an unreferenced frame", _with_array(["<f4", [1, 8], 1], [bytes(32), bytes(32)])),
    (
        "in-band bytes of the wrong size",
        _with_array(["<f4", [1, 8], msgspec.msgpack.Ext(RAW_VIEW, bytes(31))]),
    ),
    ("another extension", _with_array(["<f4", [1, 8], msgspec.msgpack.Ext(9, bytes(32))])),
    ("a pickle in frame 0", _encoded(PICKLE5_OOB)),
    ("an empty frame 0", [b""]),
    ("no frames", []),
]


@pytest.mark.parametrize("codec", [MSGSPEC_OOB, MSGSPEC_INBAND])
@pytest.mark.parametrize(("case", "frames"), HOSTILE_MSGSPEC, ids=[c for c, _ in HOSTILE_MSGSPEC])
def test_msgspec_hostile_frames(codec: str, case: str, frames: list[bytes]) -> None:
    """Each case alone is wrong (the in-band codec gets frame 0 alone: an index is then out of
    range, as a frame of its own would be a wrong count)."""
    with pytest.raises(HopProtocolError):
        _decode(codec, frames if codec == MSGSPEC_OOB else frames[:1])


@pytest.mark.parametrize("codec", [MSGSPEC_OOB, MSGSPEC_INBAND, PICKLE5_OOB, PICKLE_INBAND])
def test_every_truncation_is_refused(codec: str) -> None:
    """Any prefix of frame 0, and any array frame cut short, raises HopProtocolError."""
    frames = _encoded(codec, EMBEDDING)
    assert _decode(codec, frames).outputs[1].request_id == "req-1"
    head = frames[0]
    for cut in sorted({*range(0, min(len(head), 64)), *range(64, len(head), 97)}):
        with pytest.raises(HopProtocolError):
            _decode(codec, [head[:cut], *frames[1:]])
    for index in range(1, len(frames)):
        shorter = [*frames]
        shorter[index] = frames[index][:-4]
        with pytest.raises(HopProtocolError):
            _decode(codec, shorter)


def test_pickle_hostile_frames() -> None:
    oob = _encoded(PICKLE5_OOB)
    cases: list[tuple[str, list[bytes]]] = [
        ("a MessagePack frame 0", _encoded(MSGSPEC_OOB)),
        ("a buffer missing", oob[:-1]),
        ("a buffer too many", [*oob, bytes(64)]),
        ("a buffer of the wrong size", [oob[0], oob[1][:-3], *oob[2:]]),
        ("another type", [msgspec.msgpack.encode(1), *oob[1:]]),
        ("a dict", [pickle.dumps({"outputs": []}, protocol=5)]),
    ]
    for label, frames in cases:
        with pytest.raises(HopProtocolError):
            _decode(PICKLE5_OOB, frames)
        if label == "a buffer too many":
            with pytest.raises(HopProtocolError):
                _decode(PICKLE_INBAND, [_encoded(PICKLE_INBAND)[0], bytes(8)])
