"""The serving helpers' exceptions: one root, each carrying the HTTP status and OpenAI error
``type`` a framework helper answers it with (:func:`inferwire.serving.error_body`).

Codec errors are not wrapped: a corrupt or truncated stream read by a client helper raises
the codec's own :class:`~inferwire.codecs.DecodeError` (``IncompleteStreamError`` for a
stream cut short), as every other reader of the codecs does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar


class ServingError(Exception):
    """Root of every error raised by :mod:`inferwire.serving`."""

    status: ClassVar[int] = 500
    """The HTTP status a server answers this error with."""
    kind: ClassVar[str] = "internal_error"
    """OpenAI's error ``type``."""
    param: str | None = None
    """The request field at fault, if one is."""


class RequestError(ServingError, ValueError):
    """A request body that is not a valid OpenAI request: ``param`` names the field at fault
    (a dotted path, ``stream_options.include_usage``, ``messages[0]``), if one is."""

    status: ClassVar[int] = 400
    kind: ClassVar[str] = "invalid_request_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class NotAcceptableError(ServingError):
    """The client's ``Accept`` names none of the media types offered (RFC 9110, section
    15.5.7: 406 Not Acceptable); ``offered`` lists them, in the server's order."""

    status: ClassVar[int] = 406
    kind: ClassVar[str] = "invalid_request_error"

    def __init__(self, accept: str, offered: Sequence[str]) -> None:
        self.accept = accept
        self.offered: tuple[str, ...] = tuple(offered)
        super().__init__(
            f"Accept: {accept!r} takes none of the media types offered: {', '.join(self.offered)}"
        )


class ChunkBuilderError(ServingError, ValueError):
    """A chunk asked of a :class:`~inferwire.serving.ChunkBuilder` that OpenAI's stream could
    not hold: after the finishing chunk, or with a finish reason OpenAI does not define."""


class ResponseError(ServingError):
    """A client helper's answer that is not a stream it can read: an error status (``status``
    is the server's; ``message`` its OpenAI error message) or a content type of no codec."""

    def __init__(self, message: str, *, status: int, content_type: str = "") -> None:
        super().__init__(message)
        self.response_status = status
        self.content_type = content_type
