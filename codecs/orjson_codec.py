"""``orjson``: the fast JSON most Python servers reach for; same wire bytes as ``json``.

orjson writes NaN and infinities as ``null``, which would silently change a value, so the dict
layer refuses non-finite floats before they get here. Embedding matrices and tensors are
written as JSON arrays of numbers.
"""

from __future__ import annotations

from typing import ClassVar

import orjson

from .dict_codec import DictCodec, Framing


class OrjsonCodec(DictCodec):
    name: ClassVar[str] = "orjson"
    media_type: ClassVar[str] = "application/json"
    stream_media_type: ClassVar[str] = "text/event-stream"
    binary: ClassVar[bool] = False
    framing: Framing = "sse"
    framings: ClassVar[tuple[Framing, ...]] = ("sse", "ndjson", "length-prefixed")
    decode_errors: ClassVar[tuple[type[BaseException], ...]] = (orjson.JSONDecodeError,)

    # The library's functions themselves, not methods that call them: the dict layer calls
    # these once a message, and a Python frame around each costs more than orjson's own
    # work on a small chunk's dict.
    dumps = staticmethod(orjson.dumps)  # type: ignore[assignment]
    loads = staticmethod(orjson.loads)  # type: ignore[assignment]
