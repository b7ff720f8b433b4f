"""grpcio: the (de)serializer callables a gRPC method takes, for any codec, so a service can
stream token chunks (or carry tensors) in the codec of its choice.

    from inferwire.serving import grpc as iws_grpc

    serialize, deserialize = iws_grpc.serializers("protobuf")
    handler = grpc.unary_stream_rpc_method_handler(
        generate, request_deserializer=iws_grpc.request_deserializer,
        response_serializer=serialize)
    call = channel.unary_stream(
        "/my.Service/Generate", request_serializer=iws_grpc.request_serializer,
        response_deserializer=deserialize)

Each message is one whole message of the codec (:meth:`~inferwire.codecs.Codec.encode`), read
alone, with every decode limit of the codec (a codec named here carries inferwire's
extensions, ``seq`` and ``token_ids``: a JSON chunk read alone has no other way to say its
place in the stream; pass ``ic.get(name)`` for OpenAI's chunk); a bad message raises its
:class:`~inferwire.codecs.DecodeError`, which grpcio reports as the call's failure. ``delta``
works too, each message with its own header: its savings come from a stream's frames, which a
transport that keeps state per call carries instead (``codec.message_encoder()``, as
inferwire's gRPC transport does). Nothing here imports grpcio: these are plain callables.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import inferwire.codecs as ic

from .request import ChatCompletionRequest

__all__ = [
    "deserializer",
    "request_deserializer",
    "request_serializer",
    "serializer",
    "serializers",
]


def _codec(codec: str | ic.Codec) -> ic.Codec:
    # each message is read alone: a JSON chunk without inferwire's seq could not say its place
    return ic.get(codec, extensions=True) if isinstance(codec, str) else codec


def serializer(codec: str | ic.Codec) -> Callable[[ic.Message], bytes]:
    """A message to its bytes in ``codec``. Raises :class:`~inferwire.codecs.EncodeError`."""
    return _codec(codec).encode


def deserializer(codec: str | ic.Codec, type_: type[Any] = ic.TokenChunk) -> Callable[[bytes], Any]:
    """The bytes of one message of ``type_`` in ``codec`` to the message. Raises
    :class:`~inferwire.codecs.DecodeError`."""
    chosen = _codec(codec)
    if type_ not in chosen.types:
        raise ValueError(f"codec {chosen.name!r} does not carry {type_.__name__}")
    decode = chosen.decode

    def deserialize(data: bytes) -> Any:
        return decode(data, type_)

    return deserialize


def serializers(
    codec: str | ic.Codec, type_: type[Any] = ic.TokenChunk
) -> tuple[Callable[[ic.Message], bytes], Callable[[bytes], Any]]:
    """``(serializer(codec), deserializer(codec, type_))``: the pair one end of a method
    needs (a server's response serializer is its client's response deserializer's twin)."""
    return serializer(codec), deserializer(codec, type_)


def request_serializer(request: ChatCompletionRequest) -> bytes:
    """An OpenAI chat request as its JSON body (the unset fields left out)."""
    return request.to_json()


def request_deserializer(data: bytes) -> ChatCompletionRequest:
    """:meth:`ChatCompletionRequest.parse <inferwire.serving.ChatCompletionRequest.parse>`.
    Raises :class:`~inferwire.serving.RequestError`."""
    return ChatCompletionRequest.parse(data)
