"""The codec package's exceptions: one root, a class for each thing a caller can act on.

Foreign exceptions (``struct.error``, ``msgpack.ExtraData``, protobuf's ``DecodeError``, ...)
never escape a codec: each codec translates them at its boundary with ``raise ... from exc``.
"""

from __future__ import annotations


class CodecError(Exception):
    """Root of every error raised by :mod:`inferwire.codecs`."""


class UnknownCodecError(CodecError, KeyError):
    """No codec is registered under the requested name."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "unknown codec"


class EncodeError(CodecError, TypeError):
    """A value cannot be encoded: wrong model type, or a value the format cannot carry."""


class DecodeError(CodecError, ValueError):
    """Bytes that are not a valid encoding: truncated, corrupt, or of the wrong shape."""


class FrameTooLargeError(DecodeError):
    """A frame's header declares more bytes than the configured maximum.

    Raised from the header alone, before any buffer of that size is allocated.
    """

    def __init__(self, declared_bytes: int, max_frame_bytes: int) -> None:
        super().__init__(
            f"frame declares {declared_bytes} bytes, over the limit of {max_frame_bytes}"
        )
        self.declared_bytes = declared_bytes
        self.max_frame_bytes = max_frame_bytes


class DepthLimitError(DecodeError):
    """The input nests deeper than the codec's ``max_depth``: refused before it is built."""

    def __init__(self, max_depth: int) -> None:
        super().__init__(f"input nests deeper than the limit of {max_depth}")
        self.max_depth = max_depth


class ElementBudgetError(DecodeError):
    """The input holds more elements than the codec's ``max_elements`` budget.

    An element is any decoded value (a container, a scalar, a map key). Refused before the
    objects are built: a megabyte of empty maps would otherwise become 70 MB of dicts.
    """

    def __init__(self, max_elements: int) -> None:
        super().__init__(f"input holds more than the budget of {max_elements} elements")
        self.max_elements = max_elements


class IncompleteStreamError(DecodeError):
    """A stream ended mid-frame or without its end marker: it must not be taken as complete."""


class VerificationError(DecodeError):
    """A zero-copy buffer failed verification (an offset, length or string out of bounds)."""


class BadMagicError(DecodeError):
    """The stream does not start with the expected magic byte: not this format at all."""


class SequenceError(DecodeError):
    """A frame's sequence number is not the next one: the stream is not whole and in order."""

    def __init__(self, message: str, *, expected: int, received: int) -> None:
        super().__init__(message)
        self.expected = expected
        self.received = received


class SequenceGapError(SequenceError):
    """Frames are missing: a frame arrived with a sequence number past the next one."""


class DuplicateFrameError(SequenceError):
    """A frame arrived whose sequence number was already delivered."""


class ReorderedFrameError(SequenceError):
    """A frame arrived ahead of its turn, and the one it skipped came right after it."""


class AlteredStreamError(DecodeError):
    """A stream that is whole and in order but is not the stream that was sent: a chunk's
    tokens or text differ from the expected ones, or it has more or fewer chunks."""

    def __init__(self, message: str, *, seq: int) -> None:
        super().__init__(message)
        self.seq = seq


class SchemaError(CodecError):
    """Root of the schema registry's errors."""


class UnknownSchemaError(SchemaError, DecodeError):
    """No schema is registered under this id (a stream naming it cannot be read)."""

    def __init__(self, schema_id: int) -> None:
        super().__init__(f"unknown schema id {schema_id}")
        self.schema_id = schema_id


class IncompatibleSchemaError(SchemaError):
    """A schema breaks the subject's compatibility mode; ``violations`` names each rule broken."""

    def __init__(self, message: str, violations: tuple[object, ...] = ()) -> None:
        super().__init__(message)
        self.violations = violations


class SchemaRegistryUnavailableError(SchemaError):
    """The registry could not be reached. Retriable: a decoder keeps its unread bytes."""

    retriable = True


class CorruptRegistryError(SchemaError):
    """A saved registry file is not valid: nothing was loaded from it."""
