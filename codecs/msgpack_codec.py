"""``msgpack``: the same objects as the JSON codecs, in MessagePack; tensor data as ``bin``.

Floats are written as float64 (exact); ``strict_map_key`` and ``raw=False`` keep keys and text
as ``str``. Streams are length-prefixed frames.
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgpack

from .base import BytesLike
from .dict_codec import DictCodec


class MsgpackCodec(DictCodec):
    name: ClassVar[str] = "msgpack"
    media_type: ClassVar[str] = "application/vnd.msgpack"
    stream_media_type: ClassVar[str] = "application/vnd.inferwire.frames+msgpack"
    binary: ClassVar[bool] = True
    decode_errors: ClassVar[tuple[type[BaseException], ...]] = (
        msgpack.ExtraData,
        msgpack.FormatError,
        msgpack.StackError,
        msgpack.OutOfData,
    )

    def dumps(self, obj: Any) -> bytes:
        # packb, not a shared Packer: a codec instance may be used from several threads.
        return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]

    def loads(self, data: BytesLike) -> Any:
        return msgpack.unpackb(data, raw=False, strict_map_key=True)
