"""The surface every codec keeps, and the helpers codecs share to keep it.

A codec turns model values (:mod:`inferwire.codecs.model`) into bytes and back. Streams are
sans-IO: a :class:`StreamEncoder` returns the bytes of one frame per chunk and the end marker
from :meth:`StreamEncoder.end`; a :class:`StreamDecoder` takes bytes in any split and returns
the chunks completed so far. No codec touches a socket.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar, Final, Protocol, TypeVar, cast

from .errors import DecodeError, EncodeError
from .model import EmbeddingBatch, InferRequest, InferResponse, Message, TokenChunk

BytesLike = bytes | bytearray | memoryview
"""What a decoder accepts."""

M = TypeVar("M")

DEFAULT_MAX_FRAME_BYTES: Final = 64 * 1024 * 1024
"""Largest frame a stream decoder accepts unless told otherwise (64 MiB)."""

ALL_TYPES: Final[frozenset[type[Any]]] = frozenset(
    {TokenChunk, EmbeddingBatch, InferRequest, InferResponse}
)


class StreamEncoder(Protocol):
    """Sans-IO encoder of one stream: one call per chunk, then :meth:`end` once."""

    def encode(self, message: Any, /) -> bytes: ...

    def end(self) -> bytes: ...


class StreamDecoder(Protocol[M]):
    """Sans-IO decoder of one stream.

    :meth:`feed` takes bytes in any split and returns the messages they completed;
    :meth:`close` raises :class:`~inferwire.codecs.IncompleteStreamError` if the stream ended
    mid-frame or before its end marker. ``finished`` is true once the end marker was read.
    """

    finished: bool

    def feed(self, data: BytesLike, /) -> list[M]: ...

    def close(self) -> None: ...


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

    @abstractmethod
    def stream_encoder(self) -> StreamEncoder:
        """A fresh encoder for one stream."""

    @abstractmethod
    def stream_decoder(
        self, type_: type[M] = cast("type[M]", TokenChunk), /, *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> StreamDecoder[M]:
        """A fresh decoder for one stream of ``type_`` messages (token chunks by default)."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


def not_carried(codec: str, type_: type[Any]) -> EncodeError:
    return EncodeError(f"codec {codec!r} does not carry {type_.__name__}")


def checked_type(codec: str, table: dict[type[Any], Callable[..., Any]], type_: type[Any]) -> Any:
    """``table[type_]``, or the error a caller asking for an unsupported type deserves."""
    try:
        return table[type_]
    except (KeyError, TypeError):
        raise DecodeError(f"codec {codec!r} cannot decode into {type_!r}") from None
