"""The codecs the hop can speak: any codec of the registry that carries token chunks, by name
(``msgspec-msgpack`` as vLLM's engine core speaks, ``protobuf``, ``delta``, ``orjson``, ...),
and ``pickle``, SGLang's choice between its tokenizer manager and its scheduler.

``pickle`` is **unsafe for untrusted peers**: ``pickle.loads`` runs whatever code the bytes
name, so whoever can write to the hop's socket can run code in the frontend. It is therefore
not in the codec registry (:func:`inferwire.codecs.get` does not know it, so no server can be
asked to speak it to a client), and :func:`hop_codec` refuses it unless the caller says so
(``allow_pickle``; ``--allow-pickle`` on both ``inferwire engine`` and ``inferwire serve``).
It frames a stream like the binary codecs: length-prefixed frames and a counting end frame.
"""

from __future__ import annotations

import pickle
from typing import Any, ClassVar, Final, TypeVar

import inferwire.codecs as ic
from inferwire.codecs.base import Codec
from inferwire.codecs.framing import BytesLike

from .hop import HopRefusedError

M = TypeVar("M")

PICKLE: Final = "pickle"
DEFAULT_HOP_CODEC: Final = "msgspec-msgpack"
"""vLLM's engine-core hop: msgspec's MessagePack."""


class PickleCodec(Codec):
    """Token chunks as pickles (protocol 5). Unsafe for untrusted peers: see the module
    docstring."""

    name: ClassVar[str] = PICKLE
    media_type: ClassVar[str] = "application/x-python-pickle"
    stream_media_type: ClassVar[str] = "application/x-python-pickle-stream"
    types: ClassVar[frozenset[type[Any]]] = frozenset({ic.TokenChunk})

    def encode(self, message: ic.Message, /) -> bytes:
        if not isinstance(message, ic.TokenChunk):
            raise ic.EncodeError(f"the pickle hop codec carries token chunks, not {message!r}")
        try:
            return pickle.dumps(message, protocol=5)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            raise ic.EncodeError(f"pickle: {exc}") from exc

    def decode(self, data: BytesLike, type_: type[M], /) -> M:
        try:
            message = pickle.loads(data)
        except Exception as exc:  # anything: unpickling runs arbitrary constructors
            raise ic.DecodeError(f"pickle: {type(exc).__name__}: {exc}") from exc
        if not isinstance(message, type_):
            raise ic.DecodeError(f"pickle: a {type(message).__name__}, not a {type_.__name__}")
        return message


def hop_names() -> list[str]:
    """The codecs the hop can speak: the registry's that carry token chunks, then pickle."""
    return [n for n in ic.names() if ic.TokenChunk in ic.get(n).types] + [PICKLE]


def hop_codec(name: str, *, allow_pickle: bool = False) -> Codec:
    """The hop codec ``name``. Raises :class:`HopRefusedError` for ``pickle`` without
    ``allow_pickle`` and for a codec that does not carry token chunks, and
    :class:`~inferwire.codecs.UnknownCodecError` for a name the registry does not know."""
    if name == PICKLE:
        if not allow_pickle:
            raise HopRefusedError(
                "the pickle hop codec runs code from the bytes it reads: it is refused unless "
                "allowed (--allow-pickle on both the engine and the frontend), and only for "
                "peers you trust"
            )
        return PickleCodec()
    # inferwire's fields (seq, token ids) cross the hop: the frontend's clients check them
    codec = ic.get(name, extensions=True)
    if ic.TokenChunk not in codec.types:
        raise HopRefusedError(f"codec {name!r} does not carry token chunks")
    return codec
