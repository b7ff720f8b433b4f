"""``json``: the standard library, as a server with no extra dependency would write it.

Floats are written with ``repr`` (the shortest text that reads back to the same double), so a
round trip is exact; NaN and infinities are refused (``allow_nan=False``): JSON has no text for
them. Text is UTF-8 without ``\\u`` escapes, as OpenAI-compatible servers send it.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from .base import BytesLike
from .dictcodec import DictCodec, Framing


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
# One decoder, built once: json.loads with keyword arguments builds a new one per call.
# parse_constant: the stdlib would otherwise accept NaN and Infinity.
_decoder = json.JSONDecoder(parse_constant=_reject_constant)


def dumps(obj: Any) -> bytes:
    return _encoder.encode(obj).encode()


def loads(data: BytesLike) -> Any:
    # RFC 8259 section 8.1: JSON exchanged between systems is UTF-8.
    return _decoder.decode(str(data, "utf-8"))


class JsonCodec(DictCodec):
    name: ClassVar[str] = "json"
    media_type: ClassVar[str] = "application/json"
    stream_media_type: ClassVar[str] = "text/event-stream"
    binary: ClassVar[bool] = False
    framing: Framing = "sse"
    framings: ClassVar[tuple[Framing, ...]] = ("sse", "ndjson", "length-prefixed")

    def dumps(self, obj: Any) -> bytes:
        return dumps(obj)

    def loads(self, data: BytesLike) -> Any:
        return loads(data)
