"""``flatbuffers``: the model in ``schemas/inferwire.fbs``, read in place (zero copy).

Encoding builds an ``Envelope`` with the generated builder functions, size-prefixed so that a
truncated buffer is never taken for a whole one (identifier ``IWF1``; the byte layout is in
``schemas/inferwire.fbs``); tensor data and embedding vectors are written
in one bulk copy, 16-byte aligned, so a reader can view them in place.

Decoding verifies the whole buffer first (:mod:`inferwire.codecs.fbverify`: O(fields), not
O(bytes)), then returns a read-only view over it (:mod:`inferwire.codecs.fbviews`): arrays are
``numpy.frombuffer`` over the input, ``materialize()`` gives the plain model object, and a view
compares equal to the model object it stands for.

Two builders write the same bytes. The default is compiled, :mod:`inferwire.codecs.
_flatbuffers_accel` (codecs/_flatbuffers_accel.c): the official ``flatbuffers.Builder`` is pure
Python, a method call and a ``struct.pack`` per scalar, and that cost (20-30x protobuf's per
chunk), not the format's, was what the codec tables showed. The official builder stays the
reference (:func:`encode_reference`, ``FlatbuffersCodec(builder="reference")``) and the
fallback: the extension hands back every message it does not take (a subclass, a BYTES tensor,
a non-contiguous array, a value out of range, anything of another type), and the reference then
encodes it or raises its :class:`EncodeError`. ``INFERWIRE_PURE_PYTHON=1`` in the environment,
read at import, leaves the extension unused, as for the delta codec.

Absent and empty differ where the model says so: ``logprobs`` absent is ``None`` and present
but empty is ``()``; ``finish_reason`` absent is ``None``; ``usage`` absent is ``None``. Other
empty strings and vectors are not written at all (absent reads as empty). Streams are
length-prefixed frames (:class:`~inferwire.codecs.base.Codec`'s default), each decoded from a
copy of its frame.
"""

from __future__ import annotations

import struct
from typing import ClassVar, Final, Literal, Protocol, TypeVar, cast

import numpy as np

from . import extensions
from .base import BytesLike, Codec
from .errors import DecodeError
from .fbverify import DEFAULT_MAX_DEPTH, DEFAULT_MAX_ITEMS, Buffer, verify_envelope
from .fbviews import (
    VIEWS,
    EmbeddingBatchView,
    InferRequestView,
    InferResponseView,
    TensorView,
    TokenChunkView,
)
from .flatbuffers_reference import Envelope, encode_reference
from .model import (
    EmbeddingBatch,
    InferRequest,
    InferResponse,
    Message,
    Tensor,
    TokenChunk,
    TokenLogprob,
    TopLogprob,
    Usage,
)

__all__ = [
    "BUILDERS",
    "EmbeddingBatchView",
    "Envelope",
    "FlatbuffersBuilder",
    "FlatbuffersCodec",
    "InferRequestView",
    "InferResponseView",
    "TensorView",
    "TokenChunkView",
    "accelerated",
    "decode_message",
    "encode_message",
    "encode_reference",
]

M = TypeVar("M")

# What a bug in the verifier would let escape from reading; translated at the decode boundary.
_DECODE_ERRORS: Final = (
    struct.error,
    BufferError,
    IndexError,
    KeyError,
    TypeError,
    ValueError,
    RecursionError,
)


def _byte_buffer(data: BytesLike) -> Buffer:
    """``data`` as read-only bytes, without a copy: arrays over it are read-only too."""
    if type(data) is bytes:
        return data
    if not isinstance(data, bytes | bytearray | memoryview):
        raise DecodeError(f"expected bytes, bytearray or memoryview, not {type(data).__name__}")
    try:
        view = memoryview(data)
        if not (view.format == "B" and view.ndim == 1 and view.c_contiguous):
            view = view.cast("B")
        return view.toreadonly()
    except (TypeError, ValueError) as exc:  # not C-contiguous, or released
        raise DecodeError(f"cannot read this buffer in place: {exc}") from exc


# --- the compiled encoder ------------------------------------------------------------------


class _Accelerator(Protocol):
    """What the C extension provides (codecs/_flatbuffers_accel.c; its stub has the details)."""

    API_VERSION: int

    def encode(self, message: object, /) -> bytes | None: ...


_ACCEL_API_VERSION: Final = 1


def _load_accelerator() -> _Accelerator | None:
    """The C extension, bound to the model classes; None when absent, stale or turned off."""
    accel: _Accelerator | None = extensions.load(
        "_flatbuffers_accel",
        _ACCEL_API_VERSION,
        lambda module: module.configure(
            TokenChunk,
            TokenLogprob,
            TopLogprob,
            Usage,
            EmbeddingBatch,
            Tensor,
            InferRequest,
            InferResponse,
            np.ndarray,
        ),
        "using the official flatbuffers builder",
    )
    return accel


_accel = _load_accelerator()

FlatbuffersBuilder = Literal["compiled", "reference"]
BUILDERS: Final[tuple[FlatbuffersBuilder, ...]] = ("compiled", "reference")


def accelerated() -> bool:
    """Whether the compiled encoder is built and in use by default."""
    return _accel is not None


def encode_message(message: Message) -> bytes:
    """The size-prefixed ``Envelope`` of ``message``: compiled when the extension takes it, else
    :func:`encode_reference` (the same bytes). Raises :class:`EncodeError`."""
    if _accel is not None:
        data = _accel.encode(message)
        if data is not None:
            return data
    return encode_reference(message)


def decode_message(
    data: BytesLike,
    type_: type[M],
    *,
    max_items: int = DEFAULT_MAX_ITEMS,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> M:
    """A view of the verified ``type_`` message in ``data``. Raises :class:`DecodeError`."""
    entry = VIEWS.get(type_)
    if entry is None:
        raise DecodeError(f"flatbuffers cannot decode into {type_!r}")
    payload, view = entry
    buf = _byte_buffer(data)
    try:
        verified = verify_envelope(buf, payload, max_items=max_items, max_depth=max_depth)
        return cast("M", view(buf, verified, verified.payload))
    except DecodeError:
        raise
    except _DECODE_ERRORS as exc:
        raise DecodeError(f"flatbuffers: {type(exc).__name__}: {exc}") from exc


class FlatbuffersCodec(Codec):
    """FlatBuffers with verified, zero-copy reads: :meth:`decode` returns a view (see above)."""

    name: ClassVar[str] = "flatbuffers"
    media_type: ClassVar[str] = "application/vnd.inferwire.flatbuffers"
    stream_media_type: ClassVar[str] = "application/vnd.inferwire.frames+flatbuffers"

    def __init__(
        self,
        *,
        builder: FlatbuffersBuilder | None = None,
        max_items: int = DEFAULT_MAX_ITEMS,
        max_depth: int = DEFAULT_MAX_DEPTH,
        extensions: bool = True,
    ) -> None:
        """``builder``: ``"compiled"`` (the C extension, with the reference as its fallback),
        ``"reference"`` (the official ``flatbuffers.Builder`` only), or None: compiled when
        the extension is built. The bytes are the same either way."""
        self._use_extensions(extensions)
        if builder is None:
            builder = "compiled" if _accel is not None else "reference"
        if builder not in BUILDERS:
            raise ValueError(f"builder must be one of {', '.join(BUILDERS)}, not {builder!r}")
        if builder == "compiled" and _accel is None:
            raise ValueError(
                "the compiled FlatBuffers encoder is not built, or INFERWIRE_PURE_PYTHON is set"
            )
        self.builder: FlatbuffersBuilder = builder
        self._fast = _accel.encode if builder == "compiled" and _accel is not None else None
        self.max_items = max_items
        self.max_depth = max_depth

    def encode(self, message: Message, /) -> bytes:
        fast = self._fast
        if fast is not None:
            data = fast(message)
            if data is not None:
                return data
        return encode_reference(message)

    def decode(self, data: BytesLike, type_: type[M], /) -> M:
        # decode_message's body, inline: one call frame is measurable on a ~20 us decode
        entry = VIEWS.get(type_)
        if entry is None:
            raise DecodeError(f"flatbuffers cannot decode into {type_!r}")
        payload, view = entry
        buf = _byte_buffer(data)
        try:
            verified = verify_envelope(
                buf, payload, max_items=self.max_items, max_depth=self.max_depth
            )
            return cast("M", view(buf, verified, verified.payload))
        except DecodeError:
            raise
        except _DECODE_ERRORS as exc:
            raise DecodeError(f"flatbuffers: {type(exc).__name__}: {exc}") from exc
