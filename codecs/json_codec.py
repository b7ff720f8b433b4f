"""``json``: the standard library, as a server with no extra dependency would write it.

Floats are written with ``repr`` (the shortest text that reads back to the same double), so a
round trip is exact; NaN and infinities are refused (``allow_nan=False``): JSON has no text for
them. Text is UTF-8 without ``\\u`` escapes, as OpenAI-compatible servers send it.

Reading, the standard library is laxer than orjson and msgspec in two ways that this codec
closes, so that every JSON codec takes the same input: a number past the range of a double
(``1e400``) becomes an infinity (refused, see :func:`~inferwire.codecs.openai.finite_float`;
tensors and embeddings are checked as arrays), and a ``\\u`` escape of a lone surrogate
becomes a ``str`` that no UTF-8 writer can send on (refused here).
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from .base import BytesLike
from .dict_codec import DictCodec, Framing


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
# One decoder, built once: json.loads with keyword arguments builds a new one per call.
# parse_constant: the stdlib would otherwise accept NaN and Infinity.
_decoder = json.JSONDecoder(parse_constant=_reject_constant)


def dumps(obj: Any) -> bytes:
    return _encoder.encode(obj).encode()


# An escaped surrogate, paired or not: rare in text that was written as UTF-8.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def loads(data: BytesLike) -> Any:
    # RFC 8259 section 8.1: JSON exchanged between systems is UTF-8.
    text = str(data, "utf-8")
    obj = _decoder.decode(text)
    if "\\u" in text and _SURROGATE_ESCAPE.search(text):
        # A pair decodes to one code point; a lone half stays a surrogate, which writing the
        # object back as UTF-8 finds (UnicodeEncodeError, a ValueError).
        _encoder.encode(obj).encode()
    return obj


class JsonCodec(DictCodec):
    name: ClassVar[str] = "json"
    media_type: ClassVar[str] = "application/json"
    stream_media_type: ClassVar[str] = "text/event-stream"
    binary: ClassVar[bool] = False
    framing: Framing = "sse"
    framings: ClassVar[tuple[Framing, ...]] = ("sse", "ndjson", "length-prefixed")

    reads_infinity: ClassVar[bool] = True

    def dumps(self, obj: Any) -> bytes:
        return dumps(obj)

    def loads(self, data: BytesLike) -> Any:
        return loads(data)
