"""What both ends of the ``grpclib`` transport share: the service's paths, the request's
protobuf form, a grpclib codec that passes the transport's bytes through, and a bounded read of
one gRPC message.

grpclib reads a whole message whatever length its 5-byte prefix declares (up to 4 GiB) before
its codec sees it. :func:`read_message` reads the prefix itself and refuses a message over the
limit before reading its body, which reaches into grpclib's call for its h2 stream: the
``_stream`` (and, on the client, ``_wrapper``) of grpclib 0.4's ``Stream``, the objects its own
``recv_message`` uses. The transport's tests fail if a grpclib release moves them.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from inferwire._runtime.extras import needs_extras
from inferwire.schemas import inferwire_pb2 as pb

from .errors import MessageTooLargeError, ProtocolError
from .service import GenerateRequest
from .timing import TRAILER

with needs_extras("the grpclib transport"):
    import grpclib.encoding.base
    import grpclib.protocol

TRAILER_BIN: Final = TRAILER + "-bin"
SERVICE: Final = pb.DESCRIPTOR.services_by_name["Inference"].full_name
PREFIX_BYTES: Final = 5
"""A gRPC message's prefix: a compressed flag and a big-endian 4-byte length (gRPC's
PROTOCOL-HTTP2.md, Length-Prefixed-Message)."""


def path(method: str) -> str:
    return f"/{SERVICE}/{method}"


def request_from_pb(message: pb.GenerateRequest) -> GenerateRequest:
    return GenerateRequest(
        workload=message.workload,
        seed=message.seed,
        max_tokens=message.max_tokens or None,
        prompt_tokens=message.prompt_tokens,
        model=message.model,
        timing=message.timing,
    )


def request_to_pb(request: GenerateRequest) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        workload=request.workload,
        seed=request.seed,
        max_tokens=request.max_tokens or 0,
        prompt_tokens=request.prompt_tokens,
        model=request.model,
        timing=request.timing,
    )


class RawCodec(grpclib.encoding.base.CodecBase):
    """Messages as bytes, both ways: the transport's codec made them. Its content subtype is
    ``proto``, so requests go as ``application/grpc`` and answers as
    ``application/grpc+proto``, what grpcio and every gRPC client of the proto expect."""

    __content_subtype__ = "proto"

    def encode(self, message: Any, message_type: Any) -> bytes:
        if not isinstance(message, bytes):
            raise TypeError(f"a message is bytes, not {type(message).__name__}")
        return message

    def decode(self, data: bytes, message_type: Any) -> bytes:
        return data


class CutShortError(Exception):
    """The h2 stream ended inside a message (grpclib's buffer asserts it has the bytes)."""


async def read_message(
    h2_stream: grpclib.protocol.Stream, max_bytes: int, what: str
) -> bytes | None:
    """The next message of a gRPC stream, None at its end. The prefix is read first, so a
    message over ``max_bytes`` is refused before its body is read (grpclib's own
    ``recv_message`` buffers whatever length the prefix declares); a compressed one is a
    protocol error, as neither end here offers compression."""
    try:
        prefix = await h2_stream.recv_data(PREFIX_BYTES)
        if not prefix:
            return None
        if prefix[0]:
            raise ProtocolError(f"{what}: a compressed message, and no compression was offered")
        size = int.from_bytes(prefix[1:], "big")
        if size > max_bytes:
            raise MessageTooLargeError(
                f"{what}: a message of {size} bytes, over the limit of {max_bytes}"
            )
        return await h2_stream.recv_data(size)
    except AssertionError as exc:  # grpclib.protocol.Buffer.read: fewer bytes than asked at EOF
        raise CutShortError(f"{what}: the stream ended inside a message") from exc


def uncancel() -> None:
    """grpclib wakes a call's task with ``task.cancel()`` and raises its own error in place
    of the CancelledError (its ``Wrapper``): take back the cancellation it consumed, so the
    task's ``cancelling()`` count (``asyncio.timeout`` reads it) stays true."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        task.uncancel()
