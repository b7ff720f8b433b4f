"""What an HTTP route answers, for the HTTP/1.1 and HTTP/2 servers alike: a status, a content
type, and a body that is either bytes or an async iterator of frames (sans-IO: the servers
write it); errors are OpenAI's error object (:func:`~inferwire.serving.error_body`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from inferwire.serving import error_body

from .timing import ServerStamps

if TYPE_CHECKING:
    from .metrics import RequestMeter
    from .request_stamps import RequestStamps

JSON: Final = "application/json"


@dataclass(slots=True)
class Response:
    status: int
    content_type: str
    body: bytes = b""
    stream: AsyncGenerator[bytes, None] | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)
    """More response headers, names in lower case (HTTP/2 refuses others)."""
    stamps: ServerStamps | None = None
    """For a timed stream: the sender calls ``stamps.written()`` after each frame it wrote
    and sends ``stamps`` as the ``x-inferwire-timing`` trailer."""
    meter: RequestMeter | None = None
    """When the server records metrics: the sender calls ``meter.written(n)`` after each write
    and ``meter.answered(status)`` (or ``meter.failed(exc)``) at the end."""
    request_stamps: RequestStamps | None = None
    """An answer made of a token stream that is not streamed: its stamps, which its meter
    observes when it ends (a stream's meter has them from the stream)."""


def error(
    status: int, message: str, kind: str = "invalid_request_error", param: str | None = None
) -> Response:
    return Response(status, JSON, error_body(status, message, kind, param))


def media(value: str) -> str:
    """The media type of a Content-Type or Accept entry, without parameters."""
    return value.split(";", 1)[0].strip().lower()


def accepts(accept: str, media_type: str, *, wildcards: bool = True) -> bool:
    """Whether an Accept header takes ``media_type``, by name or (``wildcards``) by a range
    (RFC 9110, section 12.5.1; quality values are not weighed, and q=0 is not singled out)."""
    names = {media_type}
    if wildcards:
        names |= {media_type.split("/", 1)[0] + "/*", "*/*"}
    return any(media(part) in names for part in accept.split(","))
