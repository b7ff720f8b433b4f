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


class IncompleteStreamError(DecodeError):
    """A stream ended mid-frame or without its end marker: it must not be taken as complete."""


class VerificationError(DecodeError):
    """A zero-copy buffer failed verification (an offset, length or string out of bounds)."""
