"""The surface every codec keeps, and the helpers codecs share to keep it.

A codec turns model values (:mod:`inferwire.codecs.model`) into bytes and back. Streams are
sans-IO: a :class:`StreamEncoder` returns the bytes of one frame per chunk and the end marker
from :meth:`StreamEncoder.end`; a :class:`StreamDecoder` takes bytes in any split and returns
the chunks completed so far. No codec touches a socket.

A codec is immutable once built (options are read by the constructor and never change), so
:func:`inferwire.codecs.get` hands out one instance per name and options and any number of
threads and streams share it; what holds a stream's state (a stream encoder or decoder, a
:meth:`Codec.decode_function`) is made fresh for each stream and never shared.

The codec API::

    codec.name, codec.media_type, codec.stream_media_type, codec.types
    codec.encode(message) -> bytes                  # one message
    codec.decode(data, type_) -> message
    codec.stream_encoder() -> StreamEncoder         # one stream: .encode(chunk), .end()
    codec.stream_decoder(type_=None) -> StreamDecoder  # one stream: .feed(data), .close()
    codec.message_encoder(), codec.message_decoder()   # a stream as whole messages (gRPC)
    codec.decode_function(type_=None)               # one stream's one-message decode
    codec.extensions                                # whether chunks carry seq, token_ids
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar, Final, Literal, TypeVar

from . import scan
from .framing import (
    DEFAULT_MAX_FRAME_BYTES,
    BytesLike,
    Framing,
    MessageDecoder,
    MessageEncoder,
    StreamDecoder,
    StreamEncoder,
    framed_decoder,
    framed_encoder,
)
from .model import EmbeddingBatch, InferRequest, InferResponse, Message, TokenChunk

__all__ = [
    "ALL_TYPES",
    "DEFAULT_MAX_DEPTH",
    "DEFAULT_MAX_ELEMENTS",
    "DEFAULT_MAX_FRAME_BYTES",
    "BytesLike",
    "Codec",
    "Framing",
    "StreamDecoder",
    "StreamEncoder",
    "StreamShape",
]

M = TypeVar("M")

DEFAULT_MAX_DEPTH: Final = 512
"""Deepest nesting a JSON or MessagePack codec parses (``max_depth``): every message inferwire
writes nests 9 deep at most, and 512 stays clear of the interpreter's recursion limit (1,000),
which bounds the stdlib json and msgspec parsers, whatever stack the caller already holds."""
DEFAULT_MAX_ELEMENTS: Final = 1 << 18
"""Most decoded elements (containers, scalars and map keys) one message may hold
(``max_elements``): 262,144, above the 150,528 numbers of a 224x224 RGB image as a JSON array.
A megabyte of MessagePack empty maps would otherwise become 70 MB of dicts."""


def nbytes(data: BytesLike) -> int:
    """The size of ``data`` in bytes: ``len`` of a memoryview counts its items, which are wider
    than a byte in any format but ``B``."""
    return data.nbytes if type(data) is memoryview else len(data)


def check_limits(max_depth: int, max_elements: int) -> None:
    """Refuse decode limits that cannot be met (``ValueError``)."""
    if type(max_depth) is not int or max_depth < 1:
        raise ValueError("max_depth must be a positive integer")
    if type(max_elements) is not int or max_elements < 1:
        raise ValueError("max_elements must be a positive integer")


def limit_scan(
    binary: bool, max_depth: int, max_elements: int
) -> tuple[Callable[[BytesLike, int, int], None], int]:
    """The scan that holds a JSON (or, ``binary``, MessagePack) parser's input to the limits,
    and the size in bytes above which input must be scanned: every element takes a byte or
    more, and every level of nesting two in JSON (one in MessagePack), so shorter input cannot
    break either limit and is not scanned."""
    check_limits(max_depth, max_elements)
    check = scan.check_msgpack if binary else scan.check_json
    return check, min(max_elements, max_depth if binary else 2 * max_depth)


StreamShape = Literal["independent", "stateful"]
"""How the chunks of a codec's stream relate (:attr:`Codec.stream_shape`)."""

ALL_TYPES: Final[frozenset[type[Any]]] = frozenset(
    {TokenChunk, EmbeddingBatch, InferRequest, InferResponse}
)


class Codec(ABC):
    """One wire format. Subclasses set ``name``, ``media_type`` and ``types``."""

    name: ClassVar[str]
    media_type: ClassVar[str]
    """Media type of one encoded message (a unary body)."""
    stream_media_type: ClassVar[str]
    """Media type of an encoded stream."""
    types: ClassVar[frozenset[type[Any]]] = ALL_TYPES
    """The model types this codec carries."""

    @abstractmethod
    def encode(self, message: Message, /) -> bytes:
        """The bytes of one message. Raises :class:`EncodeError`."""

    @abstractmethod
    def decode(self, data: BytesLike, type_: type[M], /) -> M:
        """The message of type ``type_`` in ``data``. Raises :class:`DecodeError`."""

    framing: Framing = "length-prefixed"
    """How :meth:`stream_encoder` frames messages."""
    framings: ClassVar[tuple[Framing, ...]] = ("length-prefixed",)
    """The framings this codec can use (text framings need a text format)."""
    default_stream_type: ClassVar[type[Any]] = TokenChunk
    stream_shape: ClassVar[StreamShape] = "independent"
    """``"independent"``: each chunk of a stream is one whole message that :meth:`decode` reads
    alone. ``"stateful"``: a frame depends on the frames before it (a header, a string table),
    so only the stream decoder reads it. A transport that carries messages rather than bytes
    asks for :meth:`message_encoder` and :meth:`message_decoder`, which follow the shape."""

    def _use_framing(self, framing: Framing | None) -> None:
        if framing is None:
            return
        if framing not in self.framings:
            raise ValueError(
                f"codec {self.name!r} frames streams as {' or '.join(self.framings)}, "
                f"not {framing!r}"
            )
        self.framing = framing

    extensions: bool = True
    """Whether a token chunk carries inferwire's fields (``seq``, ``token_ids``), which a
    stream needs to prove itself whole (:mod:`inferwire.codecs.integrity`). Every binary codec
    carries them; a JSON codec writes OpenAI's chunk unless built with ``extensions=True``.
    Every codec takes the option: ``get(name, extensions=True)`` is inferwire's own stream for
    any ``name``."""

    def _use_extensions(self, extensions: bool) -> None:
        """The ``extensions`` option of a codec that always carries inferwire's fields."""
        if type(extensions) is not bool:
            raise ValueError("extensions must be True or False")
        if not extensions:
            raise ValueError(f"codec {self.name!r} always carries inferwire's fields (extensions)")

    def stream_encoder(self) -> StreamEncoder:
        """A fresh encoder for one stream."""
        return framed_encoder(self.framing, self.encode)

    def stream_decoder(
        self,
        type_: type[Any] | None = None,
        /,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> StreamDecoder[Any]:
        """A fresh decoder for one stream of ``type_`` messages (token chunks by default)."""
        return framed_decoder(self.framing, self.decode_function(type_), max_frame_bytes)

    def decode_function(self, type_: type[Any] | None = None, /) -> Callable[[BytesLike], Any]:
        """A fresh function that decodes one message of ``type_`` (the stream type by default)
        from its bytes, for the frames of one stream: what :meth:`stream_decoder` calls once a
        frame, to wrap in a framing of one's own (:func:`~inferwire.codecs.framing.framed_decoder`).
        Make one per stream: a JSON codec without extensions numbers the chunks it reads by
        their place in the stream."""
        message_type = self.default_stream_type if type_ is None else type_
        decode = self.decode

        def decode_one(data: BytesLike) -> Any:
            return decode(data, message_type)

        return decode_one

    def message_encoder(self) -> StreamEncoder:
        """A fresh encoder of one stream for a transport that carries whole messages (gRPC):
        each call returns the bytes of one message, and :meth:`~StreamEncoder.end` the last
        one's (empty when the shape needs no end message: the transport's end of call is the
        stream's end). Independent chunks travel unframed, one a message; a stateful codec's
        frames travel one a message, its end marker included."""
        if self.stream_shape == "stateful":
            return self.stream_encoder()
        return MessageEncoder(self.encode)

    def message_decoder(
        self,
        type_: type[Any] | None = None,
        /,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> StreamDecoder[Any]:
        """A fresh decoder of what :meth:`message_encoder` wrote: feed it one message at a
        time. Every limit of the codec holds, as for :meth:`decode`."""
        if self.stream_shape == "stateful":
            return self.stream_decoder(type_, max_frame_bytes=max_frame_bytes)
        return MessageDecoder(self.decode_function(type_), max_frame_bytes)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"
