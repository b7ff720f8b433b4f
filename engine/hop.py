"""The frontend-engine hop's wire format, sans-IO: ZeroMQ multipart messages in, events out.

The engine process binds a ROUTER socket, each frontend connects a DEALER (the split vLLM's
OpenAI server and its engine core use, and SGLang's tokenizer manager and scheduler). A
message is a list of ZeroMQ frames (the ROUTER's routing id, which ZeroMQ adds and strips, is
not part of it); its first frame is one byte naming its kind::

    frontend -> engine
      b"H" HELLO     [kind, Hello]          first message of a session: its id, the hop codec
      b"A" ADD       [kind, Add]            a request: the workload, seed, max_tokens, ...
      b"X" ABORT     [kind, rid]            the client went away: free its KV blocks
      b"P" PAUSE     [kind, rid]            the frontend's queue of this stream is full
      b"R" RESUME    [kind, rid]            ... and has drained below its low-water mark
      b"?" PING      [kind]                 liveness, and asks for a HEARTBEAT back
      b"S" STATS     [kind]                 asks for the engine's counters (tests, benchmarks)
    engine -> frontend
      b"O" OUTPUTS   [kind, rid, frame, rid, frame, ..., [stamps]]   every output of this
                                            frontend's requests in one engine step; each frame
                                            is that request's hop-codec stream bytes for the
                                            step (the codec's end marker after its last chunk);
                                            an odd last frame: the EngineStamps of the requests
                                            that finished in it and asked for them
      b"E" ERROR     [kind, Failure]        a request failed (overloaded, bad request), or
                                            the frontend was refused (rid "")
      b"T" END_STATS [kind, StageTimes]     per-request stage times, after its last output,
                                            when the ADD asked for them
      b"W" WELCOME   [kind, Welcome]        HELLO accepted: the engine's session id
      b"!" HEARTBEAT [kind, Heartbeat]      liveness when there is nothing else to send, and
                                            the answer to PING
      b"s" STATS     [kind, counters]       the answer to STATS (msgpack map of numbers)

Control payloads are msgspec MessagePack structs, as vLLM's engine core requests are: compact,
fast to encode (a frontend at high rate pays for every ADD), and decoded against a declared
type, so a hostile payload is refused by the decoder (wrong type, unknown field, string too
long) rather than reaching the engine as a malformed dict. Token chunks never travel as control
payloads: they are the hop codec's stream bytes, chosen per deployment
(:mod:`inferwire.engine.hop_codecs`).

A request's stamps (:class:`EngineStamps`, when its ADD says ``want_stamps``) travel in the
OUTPUTS message of its last output, as a frame of their own after the pairs, MessagePack like
the control payloads: so they reach the frontend with the request's final chunk, whatever the
hop codec (the codecs carry token chunks only, and a stamp is not a chunk's field). They are
the engine's ``time.monotonic_ns()`` (CLOCK_MONOTONIC, the clock every process of a host
shares): when the ADD arrived, when the request was first scheduled (the start of the step
that first prefilled it), when its first and its last output left the engine (the end of
their steps, once the step's modelled time has passed).

Every failure to parse is a :class:`HopProtocolError`, never a ``struct.error``, an
``IndexError`` or a foreign ``msgspec`` error; the errors a frontend's caller sees when a stream
cannot finish are the other subclasses of :class:`HopError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Final, Literal, TypeAlias

import msgspec

from .errors import EngineError

MAX_RID_BYTES: Final = 64
MAX_NAME_BYTES: Final = 256
"""Longest workload, model, codec or session name a control payload may carry."""
MAX_CONTROL_BYTES: Final = 64 * 1024
"""Largest control payload (HELLO, ADD, ERROR, ...): they are tens of bytes."""
MAX_PART_BYTES: Final = 16 * 1024 * 1024
"""Largest frame of any message (ZeroMQ's ``MAXMSGSIZE`` on both sockets says the same, so
a larger one is dropped by ZeroMQ before it is read)."""
MAX_OUTPUTS: Final = 1 << 16
"""Most (rid, frame) pairs one OUTPUTS message may carry: an engine step's batch is far
smaller."""
MAX_TOKENS_LIMIT: Final = 1 << 20

HELLO: Final = b"H"
ADD: Final = b"A"
ABORT: Final = b"X"
PAUSE: Final = b"P"
RESUME: Final = b"R"
PING: Final = b"?"
STATS: Final = b"S"
OUTPUTS: Final = b"O"
ERROR: Final = b"E"
END_STATS: Final = b"T"
WELCOME: Final = b"W"
HEARTBEAT: Final = b"!"
STATS_ANSWER: Final = b"s"

PROTOCOL_VERSION: Final = 2
"""2: ADD's ``want_stamps`` and OUTPUTS' stamps frame."""

ErrorKind = Literal["overloaded", "bad-request", "refused", "protocol", "unknown-frontend"]
"""Why an ERROR was sent: ``overloaded`` (the engine's waiting queue is full), ``bad-request``
(the engine cannot play this request), ``refused`` (HELLO refused: another codec, or pickle
not allowed), ``protocol`` (a message the engine could not read), ``unknown-frontend`` (a
request before HELLO, e.g. from a frontend the engine has forgotten: send HELLO again)."""
ERROR_KINDS: Final[frozenset[str]] = frozenset(
    ("overloaded", "bad-request", "refused", "protocol", "unknown-frontend")
)


class HopError(EngineError):
    """Root of the hop's errors (an :class:`~inferwire.engine.errors.EngineError`)."""


class HopProtocolError(HopError, ValueError):
    """A message that does not parse: a wrong kind, a missing or extra frame, a payload that
    is not the declared struct, a frame over the limits."""


class HopRefusedError(HopError):
    """The engine refused this frontend (another hop codec, pickle not allowed), or the
    frontend refused to use a codec (pickle without ``allow_pickle``)."""


class EngineGoneError(HopError):
    """The engine process exited, stopped answering (no message within the liveness
    timeout), or restarted (a new session): a stream that was open then cannot finish."""


class EngineOverloadedError(HopError):
    """The engine's waiting queue was full (its ``max_waiting``): the request was refused.
    The frontend's servers fail the stream; a client may retry later."""


class EngineRequestError(HopError):
    """The engine refused a request it cannot play (an unknown workload, bad fields)."""


class StreamFailedError(HopError):
    """The hop bytes of one stream did not decode, or the stream ended without its codec's
    end marker: the stream's integrity check failed between engine and frontend."""


# -- control payloads (msgspec structs: decoded against their type, so shape is checked) --------

Rid = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_RID_BYTES)]
Name = Annotated[str, msgspec.Meta(max_length=MAX_NAME_BYTES)]
Count = Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)]


class Hello(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A frontend's first message: ``session`` is new each time a frontend starts (the engine
    forgets the requests of an older session), ``codec`` the hop codec it decodes."""

    session: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NAME_BYTES)]
    codec: Name
    version: int = PROTOCOL_VERSION


class Add(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """One request, as the frontend checked it (an array on the wire: no field names in the
    bytes of the message a frontend sends most)."""

    rid: Rid
    workload: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NAME_BYTES)]
    seed: Count = 0
    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=MAX_TOKENS_LIMIT)] | None = None
    prompt_tokens: Count = 0
    model: Name = ""
    want_stage_times: bool = False
    want_stamps: bool = False


class Failure(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """An ERROR's payload: ``rid`` "" when it is about the frontend, not one request."""

    rid: Annotated[str, msgspec.Meta(max_length=MAX_RID_BYTES)]
    kind: Name
    message: Annotated[str, msgspec.Meta(max_length=4096)]


class StageTimes(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """END_STATS: a request's stages in the engine, seconds (see
    :mod:`inferwire.engine.loop` for their definitions)."""

    rid: Rid
    times: dict[Name, float]


class EngineStamps(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """A finished request's times in the engine, ``time.monotonic_ns()`` (see the module
    docstring): ``arrived_ns`` (its ADD read), ``scheduled_ns`` (first scheduled),
    ``first_token_ns`` and ``last_token_ns`` (its first and last output sent)."""

    rid: Rid
    arrived_ns: Count
    scheduled_ns: Count
    first_token_ns: Count
    last_token_ns: Count


class Welcome(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """HELLO accepted: ``session`` names this run of the engine (a new one after a restart)."""

    session: Name
    codec: Name


class Heartbeat(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The engine is alive: its ``session``, and how many requests wait and run."""

    session: Name
    waiting: Count = 0
    running: Count = 0


_CONTROL_DECODERS: Final[dict[bytes, msgspec.msgpack.Decoder[Any]]] = {
    HELLO: msgspec.msgpack.Decoder(Hello),
    ADD: msgspec.msgpack.Decoder(Add),
    ERROR: msgspec.msgpack.Decoder(Failure),
    END_STATS: msgspec.msgpack.Decoder(StageTimes),
    WELCOME: msgspec.msgpack.Decoder(Welcome),
    HEARTBEAT: msgspec.msgpack.Decoder(Heartbeat),
    STATS_ANSWER: msgspec.msgpack.Decoder(dict[Name, float | int | str]),
}
_encode_control = msgspec.msgpack.Encoder().encode
_STAMPS_DECODER: Final = msgspec.msgpack.Decoder(list[EngineStamps])


# -- events ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RidMessage:
    """ABORT, PAUSE or RESUME of one request."""

    kind: bytes
    rid: str


@dataclass(frozen=True, slots=True)
class Bare:
    """PING or STATS (a query with no payload)."""

    kind: bytes


@dataclass(frozen=True, slots=True)
class Outputs:
    """One engine step's outputs for one frontend: ``(rid, hop-codec bytes)`` pairs, and the
    stamps of the requests that finished in it and asked for them."""

    items: list[tuple[str, bytes]]
    stamps: list[EngineStamps] = field(default_factory=list)


Stats: TypeAlias = dict[str, Any]
"""Counters by name: numbers, and the engine's session and policy as strings."""
FrontendMessage: TypeAlias = Hello | Add | RidMessage | Bare
"""What a frontend sends (the engine parses it with :func:`parse_from_frontend`)."""
EngineMessage: TypeAlias = Outputs | Failure | StageTimes | Welcome | Heartbeat | Stats
"""What the engine sends (the frontend parses it with :func:`parse_from_engine`)."""


# -- encoding -------------------------------------------------------------------------------


def hello(session: str, codec: str) -> list[bytes]:
    return [HELLO, _encode_control(Hello(session=session, codec=codec))]


def add(request: Add) -> list[bytes]:
    return [ADD, _encode_control(request)]


def rid_message(kind: bytes, rid: str) -> list[bytes]:
    """ABORT, PAUSE or RESUME of ``rid``."""
    return [kind, rid.encode("ascii")]


def ping() -> list[bytes]:
    return [PING]


def stats_query() -> list[bytes]:
    return [STATS]


def outputs(
    items: Sequence[tuple[bytes, bytes]], stamps: Sequence[EngineStamps] = ()
) -> list[bytes]:
    """OUTPUTS of ``(rid as bytes, frame)`` pairs, and the ``stamps`` of the requests whose
    last output is among them (a frame after the pairs, only when there are some)."""
    frames = [OUTPUTS]
    for rid, frame in items:
        frames.append(rid)
        frames.append(frame)
    if stamps:
        frames.append(_encode_control(stamps))
    return frames


def failure(rid: str, kind: ErrorKind, message: str) -> list[bytes]:
    return [ERROR, _encode_control(Failure(rid=rid, kind=kind, message=message[:4096]))]


def end_stats(rid: str, times: dict[str, float]) -> list[bytes]:
    return [END_STATS, _encode_control(StageTimes(rid=rid, times=times))]


def welcome(session: str, codec: str) -> list[bytes]:
    return [WELCOME, _encode_control(Welcome(session=session, codec=codec))]


def heartbeat(session: str, *, waiting: int = 0, running: int = 0) -> list[bytes]:
    return [HEARTBEAT, _encode_control(Heartbeat(session, waiting, running))]


def stats_answer(stats: Stats) -> list[bytes]:
    return [STATS_ANSWER, _encode_control(stats)]


# -- parsing --------------------------------------------------------------------------------

_RID_KINDS: Final = frozenset((ABORT, PAUSE, RESUME))
_BARE_KINDS: Final = frozenset((PING, STATS))
_FROM_FRONTEND_CONTROL: Final = frozenset((HELLO, ADD))
_FROM_ENGINE_CONTROL: Final = frozenset((ERROR, END_STATS, WELCOME, HEARTBEAT, STATS_ANSWER))


def parse_from_frontend(frames: Sequence[bytes]) -> FrontendMessage:
    """The message a frontend sent. Raises :class:`HopProtocolError`."""
    kind = _kind(frames)
    if kind in _FROM_FRONTEND_CONTROL:
        return _control(kind, frames)  # type: ignore[return-value]
    if kind in _RID_KINDS:
        _count(frames, 2, kind)
        return RidMessage(kind, parse_rid(frames[1]))
    if kind in _BARE_KINDS:
        _count(frames, 1, kind)
        return Bare(kind)
    raise HopProtocolError(f"unknown message kind {kind!r} from a frontend")


def parse_from_engine(frames: Sequence[bytes]) -> EngineMessage:
    """The message the engine sent. Raises :class:`HopProtocolError`."""
    kind = _kind(frames)
    if kind == OUTPUTS:
        parts = len(frames) - 1
        pairs = parts - parts % 2  # an odd last frame: the stamps
        if pairs < 2 or pairs // 2 > MAX_OUTPUTS:
            raise HopProtocolError(f"OUTPUTS of {len(frames)} frames")
        items = []
        for i in range(1, pairs + 1, 2):
            frame = frames[i + 1]
            if len(frame) > MAX_PART_BYTES:
                raise HopProtocolError(f"an OUTPUTS frame of {len(frame)} bytes")
            items.append((parse_rid(frames[i]), bytes(frame)))
        if parts == pairs:
            return Outputs(items)
        return Outputs(items, _stamps(frames[-1]))
    if kind in _FROM_ENGINE_CONTROL:
        message = _control(kind, frames)
        if isinstance(message, Failure) and message.kind not in ERROR_KINDS:
            raise HopProtocolError(f"an ERROR of unknown kind {message.kind!r}")
        return message  # type: ignore[return-value]
    raise HopProtocolError(f"unknown message kind {kind!r} from the engine")


def parse_rid(data: bytes) -> str:
    """A request id: 1 to 64 printable ASCII bytes."""
    if not 0 < len(data) <= MAX_RID_BYTES:
        raise HopProtocolError(f"a request id of {len(data)} bytes")
    try:
        rid = bytes(data).decode("ascii")
    except UnicodeDecodeError:
        raise HopProtocolError("a request id that is not ASCII") from None
    if not rid.isprintable():
        raise HopProtocolError("a request id that is not printable")
    return rid


def _stamps(data: bytes) -> list[EngineStamps]:
    if len(data) > MAX_PART_BYTES:
        raise HopProtocolError(f"a stamps frame of {len(data)} bytes")
    try:
        stamps = _STAMPS_DECODER.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise HopProtocolError(f"a stamps frame that does not decode: {exc}") from exc
    if not stamps or len(stamps) > MAX_OUTPUTS:
        raise HopProtocolError(f"a stamps frame of {len(stamps)} requests")
    return stamps


def _kind(frames: Sequence[bytes]) -> bytes:
    if not frames:
        raise HopProtocolError("an empty message")
    kind = bytes(frames[0])
    if len(kind) != 1:
        raise HopProtocolError(f"a kind frame of {len(kind)} bytes")
    return kind


def _count(frames: Sequence[bytes], expected: int, kind: bytes) -> None:
    if len(frames) != expected:
        raise HopProtocolError(f"{kind!r} takes {expected} frames, not {len(frames)}")


def _control(kind: bytes, frames: Sequence[bytes]) -> object:
    _count(frames, 2, kind)
    payload = frames[1]
    if len(payload) > MAX_CONTROL_BYTES:
        raise HopProtocolError(f"a {kind!r} payload of {len(payload)} bytes")
    try:
        return _CONTROL_DECODERS[kind].decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise HopProtocolError(f"a {kind!r} payload that does not decode: {exc}") from exc
