"""The four ways an engine step's outputs (or a request) cross the hop, sans-IO: a message in,
a list of ZeroMQ frames out, and back.

- ``msgspec-oob``: vLLM's way (``MsgpackEncoder``/``MsgpackDecoder`` of
  ``vllm/v1/serial_utils.py``). Frame 0 is the MessagePack of the struct; an array is the
  triple ``(dtype, shape, data)``, where ``data`` is the index of a further frame holding the
  array's bytes (its buffer, handed to ZeroMQ without a copy) or, under
  :data:`ZERO_COPY_THRESHOLD` bytes, the bytes themselves as a MessagePack extension
  (:data:`RAW_VIEW`). The decoder makes each array with ``np.frombuffer`` on the received
  frame: no copy on either side beyond the socket's.
- ``msgspec-inband``: the same triple with every array's bytes in frame 0 (the extension):
  one frame, one copy into it on encode; the decoder's arrays still point into frame 0.
- ``pickle5-oob``: ``pickle`` protocol 5 with out-of-band buffers (``buffer_callback`` on
  encode, ``buffers=`` on decode): numpy arrays as frames of their own, as above.
- ``pickle-inband``: plain ``pickle`` protocol 5, arrays copied into the pickle.

Every decode checks what it got before numpy or pickle see it: the kind of frame 0
(MessagePack array or protocol-5 pickle), the frame count (each further frame used by exactly
one array), each array's dtype (one of :data:`DTYPES`), rank, and byte length against
dtype x shape. Anything else is a :class:`~inferwire.engine.hop.HopProtocolError`, never a
numpy ``ValueError``, an ``IndexError`` or a read past a buffer. The pickle codecs run code
named by the bytes they read, so :func:`step_codec` refuses them without ``allow_pickle``
(:class:`~inferwire.engine.hop.HopRefusedError`), as :mod:`inferwire.engine.hop_codecs` does.

A codec object is not thread-safe (the encoder gathers a message's buffers on itself while
msgspec walks it, as vLLM's does).
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Sequence
from typing import Any, Final, Generic, Protocol, TypeAlias, TypeVar

import msgspec
import numpy as np

from ..hop import HopProtocolError, HopRefusedError
from .messages import (
    Array,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    arrays_of,
)

BytesLike: TypeAlias = bytes | bytearray | memoryview
"""A received frame: ``zmq.Frame.buffer`` (a memoryview on ZeroMQ's message) or bytes."""

MSGSPEC_OOB: Final = "msgspec-oob"
MSGSPEC_INBAND: Final = "msgspec-inband"
PICKLE5_OOB: Final = "pickle5-oob"
PICKLE_INBAND: Final = "pickle-inband"
CODECS: Final = (MSGSPEC_OOB, MSGSPEC_INBAND, PICKLE5_OOB, PICKLE_INBAND)
PICKLE_CODECS: Final = frozenset((PICKLE5_OOB, PICKLE_INBAND))

RAW_VIEW: Final = 3
"""The extension code of an array's bytes inside frame 0 (vLLM's ``CUSTOM_TYPE_RAW_VIEW``)."""
ZERO_COPY_THRESHOLD: Final = 256
"""Arrays of fewer bytes stay in frame 0 (vLLM's ``VLLM_MSGPACK_ZERO_COPY_THRESHOLD``
default): a frame of its own costs more than copying a few bytes."""
DTYPES: Final = frozenset(
    ("|b1", "|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f2", "<f4", "<f8")
)
"""The dtypes a tensor may have on the hop (little-endian numbers and bool)."""
MAX_RANK: Final = 8
MAX_FRAMES: Final = 1 + (1 << 16)
"""Frame 0 and at most 65,536 arrays: far above a step of 1,024 requests x 3 tensors."""
MAX_MESSAGE_BYTES: Final = 1 << 30
"""Largest frame either side accepts (ZeroMQ's ``MAXMSGSIZE`` on the sockets says the same)."""

_MSGPACK_ARRAY_FIRST: Final = frozenset((*range(0x90, 0xA0), 0xDC, 0xDD))
"""The first byte of a MessagePack array (fixarray, array 16, array 32): what an
``array_like`` struct is."""
_PICKLE5_HEAD: Final = b"\x80\x05"

M = TypeVar("M")


class StepCodec(Protocol[M]):
    """One codec of the hop: ``encode`` to frames (frame 0, then any array buffers, to be
    sent with ``copy=False``), ``decode`` frames back. Raises
    :class:`~inferwire.engine.hop.HopProtocolError`."""

    name: str

    def encode(self, message: M, /) -> list[BytesLike]: ...

    def decode(self, frames: Sequence[BytesLike], /) -> M: ...


def step_codec(name: str, type_: type[M], *, allow_pickle: bool = False) -> StepCodec[M]:
    """The codec ``name`` (one of :data:`CODECS`) for messages of ``type_``. Raises
    :class:`~inferwire.engine.hop.HopRefusedError` for a pickle codec without
    ``allow_pickle``, and ``ValueError`` for an unknown name."""
    if name in PICKLE_CODECS:
        if not allow_pickle:
            raise HopRefusedError(
                f"the {name} codec runs code from the bytes it reads: it is refused unless "
                "allowed (allow_pickle), and only for peers you trust"
            )
        return PickleCodec(name, type_, out_of_band=name == PICKLE5_OOB)
    if name in (MSGSPEC_OOB, MSGSPEC_INBAND):
        return MsgpackCodec(name, type_, out_of_band=name == MSGSPEC_OOB)
    raise ValueError(f"unknown hop codec {name!r}: one of {', '.join(CODECS)}")


def frame_bytes(frames: Sequence[BytesLike]) -> int:
    """All the bytes of a message's frames."""
    return sum(memoryview(f).nbytes for f in frames)


def _check_frames(frames: Sequence[BytesLike]) -> memoryview:
    if not frames:
        raise HopProtocolError("an empty message")
    if len(frames) > MAX_FRAMES:
        raise HopProtocolError(f"a message of {len(frames)} frames (at most {MAX_FRAMES})")
    head = memoryview(frames[0])
    if head.nbytes > MAX_MESSAGE_BYTES:
        raise HopProtocolError(f"a frame of {head.nbytes} bytes")
    return head


def _array_bytes(dtype: str, shape: Sequence[int]) -> int:
    """Bytes of an array of ``dtype`` and ``shape``, checked: a known dtype, a rank of at most
    :data:`MAX_RANK`, non-negative int dimensions."""
    if dtype not in DTYPES:
        raise HopProtocolError(f"an array of dtype {dtype!r}: not one of the hop's")
    if len(shape) > MAX_RANK:
        raise HopProtocolError(f"an array of rank {len(shape)}")
    for size in shape:
        if type(size) is not int or size < 0:
            raise HopProtocolError(f"an array of shape {list(shape)!r}")
    return math.prod(shape) * np.dtype(dtype).itemsize


class MsgpackCodec(Generic[M]):
    """``msgspec-oob`` and ``msgspec-inband`` (see the module docstring)."""

    def __init__(self, name: str, type_: type[M], *, out_of_band: bool) -> None:
        self.name = name
        self.type = type_
        self.out_of_band = out_of_band
        self._encoder = msgspec.msgpack.Encoder(enc_hook=self._enc_hook)
        self._decoder = msgspec.msgpack.Decoder(
            type_, dec_hook=self._dec_hook, ext_hook=self._ext_hook
        )
        self._aux: list[BytesLike] | None = None
        self._frames: Sequence[BytesLike] = ()
        self._used: set[int] = set()

    def encode(self, message: M, /) -> list[BytesLike]:
        frames: list[BytesLike] = [b""]
        self._aux = frames
        try:
            frames[0] = self._encoder.encode(message)
        except (TypeError, ValueError, OverflowError) as exc:
            raise HopProtocolError(
                f"{self.name}: cannot encode {type(message).__name__}: {exc}"
            ) from exc
        finally:
            self._aux = None
        return frames

    def _enc_hook(self, obj: Any) -> Any:
        if not isinstance(obj, np.ndarray):
            raise TypeError(f"{type(obj).__name__} is not a hop type")
        dtype = obj.dtype.str
        if dtype not in DTYPES:
            raise TypeError(f"an array of dtype {dtype!r}: not one of the hop's")
        if not obj.flags.c_contiguous:
            obj = np.ascontiguousarray(obj)
        data = obj.data.cast("B") if obj.ndim else memoryview(obj.tobytes())
        assert self._aux is not None
        if self.out_of_band and obj.nbytes >= ZERO_COPY_THRESHOLD:
            self._aux.append(data)  # its buffer: sent as a frame of its own, not copied
            return (dtype, obj.shape, len(self._aux) - 1)
        return (dtype, obj.shape, msgspec.msgpack.Ext(RAW_VIEW, data))

    def decode(self, frames: Sequence[BytesLike], /) -> M:
        head = _check_frames(frames)
        if not head.nbytes or head[0] not in _MSGPACK_ARRAY_FIRST:
            first = f"0x{head[0]:02x}" if head.nbytes else "none"
            raise HopProtocolError(
                f"{self.name}: frame 0 is not a MessagePack array (first byte {first})"
            )
        if not self.out_of_band and len(frames) != 1:
            raise HopProtocolError(f"{self.name}: a message of {len(frames)} frames, not 1")
        self._frames = frames
        self._used = set()
        try:
            message = self._decoder.decode(head)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise HopProtocolError(f"{self.name}: frame 0 does not decode: {exc}") from exc
        finally:
            self._frames = ()
        if len(self._used) != len(frames) - 1:
            raise HopProtocolError(
                f"{self.name}: {len(frames) - 1 - len(self._used)} of {len(frames) - 1} array "
                "frames are not referenced by the message"
            )
        return message

    def _ext_hook(self, code: int, data: memoryview) -> Any:
        if code != RAW_VIEW:
            raise HopProtocolError(f"{self.name}: a MessagePack extension of type {code}")
        return data

    def _dec_hook(self, type_: type, obj: Any) -> Any:
        if type_ is not np.ndarray and getattr(type_, "__origin__", None) is not np.ndarray:
            raise TypeError(f"{type_!r} is not a hop type")
        if not isinstance(obj, list) or len(obj) != 3:
            raise HopProtocolError("an array that is not (dtype, shape, data)")
        dtype, shape, data = obj
        if not isinstance(dtype, str) or not isinstance(shape, list):
            raise HopProtocolError("an array that is not (dtype, shape, data)")
        expected = _array_bytes(dtype, shape)
        if isinstance(data, int):
            if not 0 < data < len(self._frames) or data in self._used:
                raise HopProtocolError(
                    f"an array in frame {data}: the message has frames 1 to "
                    f"{len(self._frames) - 1}, each for one array"
                )
            self._used.add(data)
            buffer = memoryview(self._frames[data])
        elif isinstance(data, memoryview):
            buffer = data
        else:
            raise HopProtocolError(f"an array whose data is a {type(data).__name__}")
        if buffer.nbytes != expected:
            raise HopProtocolError(
                f"an array of {dtype} {shape} in {buffer.nbytes} bytes, not {expected}"
            )
        if not expected:
            return np.empty(shape, dtype=dtype)
        # zero copy: the array keeps the received frame alive, as vLLM's does
        return np.frombuffer(buffer, dtype=dtype).reshape(shape)


class PickleCodec(Generic[M]):
    """``pickle5-oob`` and ``pickle-inband`` (see the module docstring). Unsafe for untrusted
    peers: :func:`step_codec` gives it only with ``allow_pickle``."""

    def __init__(self, name: str, type_: type[M], *, out_of_band: bool) -> None:
        self.name = name
        self.type = type_
        self.out_of_band = out_of_band

    def encode(self, message: M, /) -> list[BytesLike]:
        frames: list[BytesLike] = [b""]
        try:
            if self.out_of_band:
                frames[0] = pickle.dumps(
                    message, protocol=5, buffer_callback=lambda b: frames.append(b.raw())
                )
            else:
                frames[0] = pickle.dumps(message, protocol=5)
        except (pickle.PicklingError, TypeError, AttributeError, BufferError) as exc:
            raise HopProtocolError(f"{self.name}: cannot encode: {exc}") from exc
        return frames

    def decode(self, frames: Sequence[BytesLike], /) -> M:
        head = _check_frames(frames)
        if bytes(head[:2]) != _PICKLE5_HEAD:
            raise HopProtocolError(f"{self.name}: frame 0 is not a protocol-5 pickle")
        if not self.out_of_band and len(frames) != 1:
            raise HopProtocolError(f"{self.name}: a message of {len(frames)} frames, not 1")
        try:
            message = pickle.loads(head, buffers=frames[1:])
        except Exception as exc:  # anything: unpickling runs the constructors it names
            raise HopProtocolError(f"{self.name}: {type(exc).__name__}: {exc}") from exc
        if not isinstance(message, self.type):
            raise HopProtocolError(
                f"{self.name}: a {type(message).__name__}, not a {self.type.__name__}"
            )
        arrays = _checked_arrays(message)
        if self.out_of_band and len(arrays) != len(frames) - 1:
            # numpy puts every contiguous array out of band: one frame each
            raise HopProtocolError(
                f"{self.name}: {len(frames) - 1} array frames for {len(arrays)} arrays"
            )
        return message


def _checked_arrays(message: object) -> list[Array]:
    """A pickle's message checked as msgspec checks its own on decode (the fields' types,
    for the two messages of the hop), and its arrays (their dtypes and ranks)."""
    if isinstance(message, EngineCoreOutputs):
        _check_outputs(message)
        arrays = arrays_of(message)
    elif isinstance(message, EngineCoreRequest):
        _check_request(message)
        arrays = [] if message.prompt_embeds is None else [message.prompt_embeds]
    else:
        arrays = []
    for array in arrays:
        if not isinstance(array, np.ndarray):
            raise HopProtocolError(f"a tensor that is a {type(array).__name__}")
        _array_bytes(array.dtype.str, array.shape)
    return arrays


def _check_outputs(message: EngineCoreOutputs) -> None:
    if type(message.outputs) is not list or not isinstance(message.timestamp, float):
        raise HopProtocolError("outputs of the wrong types")
    for output in message.outputs:
        if (
            type(output) is not EngineCoreOutput
            or type(output.request_id) is not str
            or type(output.new_token_ids) is not list
            or not all(type(t) is int for t in output.new_token_ids)
        ):
            raise HopProtocolError("an output of the wrong types")


def _check_request(message: EngineCoreRequest) -> None:
    tokens = message.prompt_token_ids
    if (
        type(message.request_id) is not str
        or (tokens is not None and (type(tokens) is not list))
        or (tokens is not None and not all(type(t) is int for t in tokens))
        or not isinstance(message.arrival_time, float)
    ):
        raise HopProtocolError("a request of the wrong types")
