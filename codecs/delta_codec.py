"""``delta``: a token stream sent once in full, then only what changes, with a schema id.

The codec is four modules, one concern each: :mod:`~inferwire.codecs.delta_wire` (the bytes,
and what both directions share), :mod:`~inferwire.codecs.delta_encoder`,
:mod:`~inferwire.codecs.delta_decoder` with its frame parser
:mod:`~inferwire.codecs.delta_parser`, and this one: the codec, which checks schemas and picks
the encoder's and decoder's accelerator.

The steady state of a stream (each frame the next, with the shapes the encoder writes) runs in
a small C extension, :mod:`inferwire.codecs._delta_accel`, when it is built. The Python encoder
and decoder stay the reference and the fallback: the extension hands back, untouched, every
chunk or frame it does not take, and the Python path then writes or reads it (and raises its
errors). The bytes and the chunks are the same either way. ``INFERWIRE_PURE_PYTHON=1`` in the
environment, read at import, leaves the extension unused; so does
``DeltaCodec(pure_python=True)``.
"""

from __future__ import annotations

from typing import Any, ClassVar, Final, Protocol, TypeVar, cast

from . import compat, extensions
from .base import (
    DEFAULT_MAX_DEPTH,
    DEFAULT_MAX_ELEMENTS,
    BytesLike,
    Codec,
    StreamShape,
    check_limits,
)
from .delta_decoder import DeltaStreamDecoder, FrameDecoder
from .delta_encoder import DeltaStreamEncoder, FrameEncoder
from .delta_wire import (
    DELTA_V1,
    DELTA_V2,
    DELTA_V3,
    MAGIC,
    MAGIC_FLOAT32,
    MAX_INTERNED_CHARS,
    MAX_TABLE_ENTRIES,
    SUBJECT,
    default_registry,
)
from .errors import DecodeError, IncompatibleSchemaError
from .framing import DEFAULT_MAX_FRAME_BYTES, StreamDecoder, StreamEncoder
from .model import TokenChunk, TokenLogprob, TopLogprob, Usage
from .schema_registry import CachingResolver, Schema, SchemaRegistry, SchemaResolver

__all__ = [
    "DELTA_V1",
    "DELTA_V2",
    "DELTA_V3",
    "MAGIC",
    "MAGIC_FLOAT32",
    "MAX_INTERNED_CHARS",
    "MAX_TABLE_ENTRIES",
    "SUBJECT",
    "DeltaCodec",
    "DeltaStreamDecoder",
    "DeltaStreamEncoder",
    "accelerated",
    "default_registry",
]

M = TypeVar("M")


class _Accelerator(FrameEncoder, FrameDecoder, Protocol):
    """What the C extension provides (codecs/_delta_accel.c; its stub has the details)."""

    API_VERSION: int


_ACCEL_API_VERSION: Final = 2


def _load_accelerator() -> _Accelerator | None:
    """The C extension, bound to the model classes; None when absent, stale or turned off."""
    accel: _Accelerator | None = extensions.load(
        "_delta_accel",
        _ACCEL_API_VERSION,
        lambda module: module.configure(
            TokenChunk, TokenLogprob, TopLogprob, Usage, MAX_TABLE_ENTRIES, MAX_INTERNED_CHARS
        ),
        "using the pure-Python delta codec",
    )
    return accel


_accel = _load_accelerator()


def accelerated() -> bool:
    """Whether new delta encoders and decoders use the C extension."""
    return _accel is not None


def _carries_usage(schema: Schema) -> bool:
    frame = compat.messages(schema.parsed()).get("inferwire.delta.Frame")
    return frame is not None and any(f.number == 8 and f.name == "usage" for f in frame.field)


def _carries_float32(schema: Schema) -> bool:
    """Whether ``schema`` has the float32 logprob fields of version 3 (wire format 1)."""
    logprob = compat.messages(schema.parsed()).get("inferwire.delta.Logprob")
    fields = {(f.number, f.name) for f in logprob.field} if logprob is not None else set()
    return {(12, "logprob_f32"), (13, "top_f32")} <= fields


class DeltaCodec(Codec):
    """The delta codec, writing with ``schema`` and resolving writers' ids via ``resolver``.

    ``registry`` (by default one holding every delta version) gives the id the encoder writes;
    a decoder reads with ``schema`` (its reader schema) after checking that the writer's
    schema, found by id through ``resolver`` (by default a cache in front of ``registry``), is
    compatible with it.

    ``pure_python=True`` keeps its encoders and decoders off the C extension (see the module
    docstring): the reference path, for tests and benchmarks.

    Version 3 (the default) writes wire format 1: logprobs may travel as float32, and readers
    before it refuse the stream at its first byte. ``schema=DELTA_V2`` writes what they read.
    """

    name: ClassVar[str] = "delta"
    media_type: ClassVar[str] = "application/vnd.inferwire.delta"
    stream_media_type: ClassVar[str] = "application/vnd.inferwire.delta"
    types: ClassVar[frozenset[type[Any]]] = frozenset({TokenChunk})
    stream_shape: ClassVar[StreamShape] = "stateful"

    def __init__(
        self,
        *,
        schema: Schema = DELTA_V3,
        registry: SchemaRegistry | None = None,
        resolver: SchemaResolver | None = None,
        subject: str = SUBJECT,
        pure_python: bool = False,
        max_elements: int = DEFAULT_MAX_ELEMENTS,
        extensions: bool = True,
    ) -> None:
        check_limits(DEFAULT_MAX_DEPTH, max_elements)
        self._use_extensions(extensions)
        self.max_elements = max_elements
        self.pure_python = pure_python
        self.registry = default_registry() if registry is None else registry
        self.schema = schema
        self.schema_id = self.registry.register(subject, schema)
        self.resolver = CachingResolver(self.registry) if resolver is None else resolver
        self._carries_usage = _carries_usage(schema)
        self.reads_float32 = _carries_float32(schema)
        self._reader = compat.messages(schema.parsed())
        self._compatible: dict[int, bool] = {}

    def reader_for(self, schema_id: int) -> bool:
        """Check the writer's schema against ours; whether frames may carry usage."""
        if schema_id not in self._compatible:
            writer = self.resolver.resolve(schema_id)  # Unknown/Unavailable propagate
            messages = compat.messages(writer.parsed())
            if not {"inferwire.delta.Header", "inferwire.delta.Frame"} <= messages.keys():
                # compat.check compares shared messages only: an unrelated schema shares none
                raise IncompatibleSchemaError(
                    f"schema {schema_id} is not a delta schema (no inferwire.delta.Frame)"
                )
            violations = compat.check(messages, self._reader, reader_is_newer=False)
            if violations:
                raise IncompatibleSchemaError(
                    f"writer schema {schema_id} cannot be read with this reader schema: "
                    + "; ".join(map(str, violations)),
                    tuple(violations),
                )
            self._compatible[schema_id] = True
        return self._carries_usage

    def _accelerator(self) -> _Accelerator | None:
        # read as each encoder or decoder is made: a test may swap the module-level _accel
        return None if self.pure_python else _accel

    def _encoder(self) -> DeltaStreamEncoder:
        return DeltaStreamEncoder(
            self.schema_id,
            carries_usage=self._carries_usage,
            float32=self.reads_float32,
            accelerator=self._accelerator(),
        )

    def stream_encoder(self) -> StreamEncoder:
        return self._encoder()

    def stream_decoder(
        self, type_: type[Any] | None = None, /, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    ) -> StreamDecoder[Any]:
        if type_ not in (None, TokenChunk):
            raise DecodeError(f"codec 'delta' cannot decode into {type_!r}")
        return DeltaStreamDecoder(self, max_frame_bytes, accelerator=self._accelerator())

    def encode(self, message: Any, /) -> bytes:
        return self._encoder().encode(message)

    def decode(self, data: BytesLike, type_: type[M], /) -> M:
        if type_ is not TokenChunk:
            raise DecodeError(f"codec 'delta' cannot decode into {type_!r}")
        decoder = DeltaStreamDecoder(self, accelerator=self._accelerator())
        chunks = decoder.feed(data)
        if len(chunks) != 1 or decoder.waiting:
            raise DecodeError("a unary delta message is a header and exactly one frame")
        return cast("M", chunks[0])
