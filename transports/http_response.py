"""The answer an HTTP route gives, sans-IO: what the HTTP/1.1 and HTTP/2 servers send."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from .timing import ServerStamps


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
