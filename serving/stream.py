"""A token stream's bytes for any codec, both ends, framework-free (sans-IO): what the
Starlette, aiohttp and httpx helpers wrap.

Server side, :func:`response_encoder` chooses the writer from the codec:

- a JSON codec (``json``, ``orjson``, ``msgspec-json``) writes OpenAI's stream, the bytes
  vLLM sends: ``chat.completion.chunk`` events (``data: {...}``, no field of inferwire's own),
  the chunk with ``finish_reason`` without usage, then, if the last chunk carries usage
  (:class:`~inferwire.serving.ChunkBuilder` with ``include_usage``), a chunk of its own with
  ``"choices": []`` and the usage, and ``data: [DONE]``. With ``extensions=True``, inferwire's
  own JSON instead (``seq``, ``token_ids``, usage on the last chunk: what
  :class:`~inferwire.codecs.integrity.StreamVerifier` checks), whatever the codec's own
  ``extensions`` option;
- a binary codec writes its own stream: length-prefixed frames (or ``delta``'s), ending with
  its end marker, every field carried.

Client side, :class:`ResponseStreamReader` reads either, chosen by the response's content
type: bytes in any split in, chunks out, and :meth:`ResponseStreamReader.close` raises the
codec's
:class:`~inferwire.codecs.IncompleteStreamError` for a stream cut short. OpenAI's usage-only
chunk becomes a chunk with no text and no tokens that carries the usage, as the OpenAI SDK
yields a chunk with no choices.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable, Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any, Final

import orjson

import inferwire.codecs as ic
from inferwire.codecs import openai as oa
from inferwire.codecs.framing import (
    DEFAULT_MAX_FRAME_BYTES,
    BytesLike,
    Framing,
    StreamDecoder,
    StreamEncoder,
    framed_decoder,
    framed_encoder,
)

from .coalesce import Ready
from .errors import ResponseError, ServingError
from .negotiation import DEFAULT_OFFERS, JSON, is_json
from .openai_events import templated

__all__ = [
    "ResponseStreamReader",
    "UsageAsOpenAI",
    "error_body",
    "error_of",
    "reader_for",
    "response_encoder",
    "stream_body",
]

USAGE_CHUNK_CHOICES: Final = b'"choices":[]'


def _openai_codec(name: str, framing: Framing) -> ic.Codec:
    """The JSON codec ``name`` that writes (and reads) OpenAI's chunks, without extensions."""
    return ic.get(name, framing=framing, extensions=False)


UsageExtra = Callable[[ic.Usage], Mapping[str, Any]]
"""Fields a server adds to the usage-only chunk after ``usage``, given the usage (vLLM's
per-request ``metrics`` object, which inferwire's own server adds)."""


def usage_chunk(
    chunk: ic.TokenChunk,
    usage: ic.Usage,
    *,
    object_: str = oa.CHUNK_OBJECT,
    id_: str | None = None,
    extra: UsageExtra | None = None,
) -> dict[str, Any]:
    """OpenAI's last chunk of ``stream_options.include_usage``: no choices, the usage of the
    whole request; a chat chunk unless ``object_`` (and ``id_``) say otherwise (a legacy
    ``text_completion``); ``extra``'s fields after the usage."""
    obj = {
        "id": chunk.id if id_ is None else id_,
        "object": object_,
        "created": chunk.created,
        "model": chunk.model,
        "choices": [],
        "usage": oa.usage_obj(usage),
    }
    if extra is not None:
        obj.update(extra(usage))
    return obj


class UsageAsOpenAI:
    """A JSON chunk stream with usage where OpenAI puts it: a chunk that carries usage is
    written without it, followed by a usage-only chunk (see the module docstring), or by
    nothing when ``include_usage`` is false (the request did not ask for it).

    ``chunks``: the codec's encoder (without extensions); ``objects``: an encoder of plain
    objects in the same framing, for the usage-only chunk; ``usage_extra``: fields to add to
    the usage-only chunk (:data:`UsageExtra`)."""

    __slots__ = ("_encode", "_end", "_objects", "include_usage", "usage_extra")

    def __init__(
        self,
        chunks: StreamEncoder,
        objects: StreamEncoder,
        *,
        include_usage: bool = True,
        usage_extra: UsageExtra | None = None,
    ) -> None:
        self._encode = chunks.encode
        self._end = chunks.end
        self._objects = objects
        self.include_usage = include_usage
        self.usage_extra = usage_extra

    def encode(self, chunk: ic.TokenChunk, /) -> bytes:
        usage = chunk.usage
        if usage is None:
            return self._encode(chunk)
        frame = self._encode(replace(chunk, usage=None))
        if self.include_usage:
            frame += self._objects.encode(usage_chunk(chunk, usage, extra=self.usage_extra))
        return frame

    def end(self) -> bytes:
        return self._end()


def response_encoder(codec: ic.Codec, *, extensions: bool = False) -> StreamEncoder:
    """A fresh encoder of one response's token stream in ``codec`` (see the module
    docstring): a binary codec's own stream; for a JSON codec, OpenAI's events with usage
    where OpenAI puts it, or with ``extensions`` inferwire's (the codec's own ``extensions``
    option aside: a response says which it is)."""
    if ic.TokenChunk not in codec.types:
        raise ValueError(f"codec {codec.name!r} does not carry token streams")
    if not is_json(codec):
        return codec.stream_encoder()
    if extensions:
        return ic.get(codec.name, framing=codec.framing, extensions=True).stream_encoder()
    openai_codec = _openai_codec(codec.name, codec.framing)
    chunks = framed_encoder(codec.framing, templated(openai_codec))
    return UsageAsOpenAI(chunks, framed_encoder(codec.framing, orjson.dumps))


COALESCE: Final = 32
"""Most chunks :func:`stream_body` puts in one piece (about 8 KiB of OpenAI events), as
inferwire's servers batch (``SimulatedService.batches``)."""


async def stream_body(
    chunks: AsyncIterable[ic.TokenChunk] | Iterable[ic.TokenChunk],
    codec: ic.Codec,
    *,
    extensions: bool = False,
    coalesce: int = COALESCE,
) -> AsyncGenerator[bytes, None]:
    """The bytes of a response, then the end marker: the body of a streaming response in any
    ASGI or aiohttp framework. Each piece holds the chunks the source had ready when the
    previous piece was taken, up to ``coalesce`` (:class:`~inferwire.serving.coalesce.Ready`:
    none is ever held back waiting for the next); ``coalesce=1``: one piece per chunk. The
    bytes are the same either way; a piece is one write of the framework."""
    if type(coalesce) is not int or coalesce < 1:
        raise ValueError("coalesce must be a positive integer")
    encoder = response_encoder(codec, extensions=extensions)
    encode = encoder.encode
    if not isinstance(chunks, AsyncIterable):
        pending: list[bytes] = []
        for chunk in chunks:  # all ready: pieces of ``coalesce`` chunks
            pending.append(encode(chunk))
            if len(pending) >= coalesce:
                yield b"".join(pending)
                pending.clear()
        if pending:
            yield b"".join(pending)
        yield encoder.end()
        return
    if coalesce == 1:
        async for chunk in chunks:
            yield encode(chunk)
        yield encoder.end()
        return
    ready = Ready(aiter(chunks), coalesce)
    try:
        while batch := await ready.next_batch():
            yield (
                b"".join([encode(chunk) for chunk in batch]) if len(batch) > 1 else encode(batch[0])
            )
    finally:
        ready.close()
    yield encoder.end()


def error_body(
    status: int, message: str, kind: str = "invalid_request_error", param: str | None = None
) -> bytes:
    """An error answer in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``,
    with the HTTP status as ``code``, as vLLM writes it."""
    return orjson.dumps(
        {"error": {"message": message, "type": kind, "param": param, "code": status}}
    )


def error_of(exc: ServingError) -> tuple[int, bytes]:
    """The status and OpenAI error body that answer ``exc``."""
    return exc.status, error_body(exc.status, str(exc), exc.kind, exc.param)


def _media(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


class ResponseStreamReader:
    """Sans-IO reader of one HTTP response's token stream, from any server (see the module
    docstring): the codec's stream decoder, and OpenAI's usage-only chunk read as well."""

    __slots__ = ("_decoder", "codec")

    def __init__(self, codec: ic.Codec, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES):
        if ic.TokenChunk not in codec.types:
            raise ValueError(f"codec {codec.name!r} does not carry token streams")
        self.codec = codec
        self._decoder: StreamDecoder[ic.TokenChunk]
        if is_json(codec):
            # read tolerantly (a chunk as any OpenAI-compatible server writes it, seq its
            # place in the stream), through the codec's own limits
            tolerant = _openai_codec(codec.name, codec.framing)
            decode = _usage_tolerant(tolerant.decode_function(ic.TokenChunk))
            self._decoder = framed_decoder(codec.framing, decode, max_frame_bytes)
        else:
            self._decoder = codec.stream_decoder(max_frame_bytes=max_frame_bytes)

    @property
    def finished(self) -> bool:
        """Whether the stream's end marker has been read."""
        return self._decoder.finished

    def feed(self, data: BytesLike) -> list[ic.TokenChunk]:
        """The chunks completed by ``data``. Raises :class:`~inferwire.codecs.DecodeError`."""
        return self._decoder.feed(data)

    def close(self) -> None:
        """Raises :class:`~inferwire.codecs.IncompleteStreamError` if the stream ended
        mid-frame or before its end marker."""
        self._decoder.close()


def _usage_tolerant(
    decode: Callable[[BytesLike], ic.TokenChunk],
) -> Callable[[bytes], ic.TokenChunk]:
    """``decode``, and OpenAI's usage-only chunk as a chunk with no text and no tokens."""
    previous: list[ic.TokenChunk] = []

    def decode_chunk(data: bytes) -> ic.TokenChunk:
        try:
            chunk = decode(data)
        except ic.DecodeError:
            if USAGE_CHUNK_CHOICES not in data.replace(b" ", b""):
                raise
            chunk = _usage_only(data, previous[-1].seq + 1 if previous else 0)
        previous[:] = [chunk]
        return chunk

    return decode_chunk


def _usage_only(data: bytes, seq: int) -> ic.TokenChunk:
    """The usage-only chunk in ``data``, already refused as a chunk with a choice."""
    try:
        obj = orjson.loads(data)
        usage = obj["usage"]
        fields = (obj["id"], obj["model"], obj["created"])
        counts = (usage["prompt_tokens"], usage["completion_tokens"])
        if not (
            type(fields[0]) is str
            and type(fields[1]) is str
            and type(fields[2]) is int
            and all(type(n) is int and n >= 0 for n in counts)
        ):
            raise TypeError("a field of the wrong type")
        return ic.TokenChunk(
            id=fields[0],
            model=fields[1],
            created=fields[2],
            index=0,
            seq=seq,
            token_ids=(),
            text="",
            usage=ic.Usage(prompt_tokens=counts[0], completion_tokens=counts[1]),
        )
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise ic.DecodeError(f"a chunk without choices and without usage: {exc}") from exc


def reader_for(
    content_type: str,
    codec: str | ic.Codec | None = None,
    *,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
) -> ResponseStreamReader:
    """The reader of a response whose ``Content-Type`` is ``content_type``: ``codec`` if its
    stream is of that type, else the codec registered for it (for JSON events, ``orjson``).
    Raises :class:`ResponseError` for a type no codec streams (a non-streamed
    ``application/json`` answer included)."""
    media = _media(content_type)
    chosen = ic.get(codec) if isinstance(codec, str) else codec
    if chosen is None or chosen.stream_media_type != media:
        names = [n for n in ic.names_for(media) if ic.get(n).stream_media_type == media]
        names = [n for n in DEFAULT_OFFERS if n in names] + names
        if not names:
            what = "a whole JSON answer, not a stream" if media == JSON else "no codec's stream"
            raise ResponseError(
                f"the response is {content_type or 'untyped'}: {what}",
                status=200,
                content_type=content_type,
            )
        chosen = ic.get(names[0])
    return ResponseStreamReader(chosen, max_frame_bytes=max_frame_bytes)
