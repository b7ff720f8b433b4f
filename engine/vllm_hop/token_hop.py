"""The tokens-only step over inferwire's own hop, as it is (:mod:`inferwire.engine.hop`): the
same B requests' new tokens as one OUTPUTS message of ``(rid, frame)`` pairs, each frame one
:class:`~inferwire.codecs.TokenChunk` in the request's hop-codec stream (the codec's end
marker after a request's last chunk), decoded by a stream decoder per request, as
:class:`~inferwire.engine.client.EngineClient` does. So the vLLM-shaped hop's rows stand beside
``msgspec-msgpack``, ``protobuf``, ``delta`` and ``orjson`` on the same step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import inferwire.codecs as ic
from inferwire.codecs.framing import StreamDecoder, StreamEncoder

from .. import hop
from ..hop_codecs import hop_codec
from .steps import TOKENS, rid, token_of

TOKEN_HOP_PREFIX: Final = "hop:"
"""A run's codec ``hop:NAME`` is hop codec NAME over this path."""
TOKEN_HOP_CODECS: Final = ("msgspec-msgpack", "protobuf", "delta", "orjson")
MODEL: Final = "vllm-hop"


def is_token_hop(codec: str) -> bool:
    return codec.startswith(TOKEN_HOP_PREFIX)


def _chunk(seed: int, step: int, index: int, *, last: bool) -> ic.TokenChunk:
    return ic.TokenChunk(
        id=rid(index),
        model=MODEL,
        created=0,
        index=0,
        seq=step,
        token_ids=(token_of(seed, step, index),),
        text="",
        finish_reason="length" if last else None,
    )


class TokenHopEncoder:
    """The engine's side of one run: a stream encoder per request."""

    def __init__(self, codec: str, case: str, batch: int, seed: int) -> None:
        if case != TOKENS:
            raise ValueError(f"the hop codecs carry token chunks only, not the {case} case")
        self.codec = hop_codec(codec.removeprefix(TOKEN_HOP_PREFIX))
        self.batch = batch
        self.seed = seed
        self._rids = [rid(i).encode("ascii") for i in range(batch)]
        self._encoders: list[StreamEncoder] = [self.codec.stream_encoder() for _ in range(batch)]

    def chunks(self, step: int, *, last: bool) -> list[ic.TokenChunk]:
        """The step's chunks (made outside the encode time, as the engine's model makes them)."""
        return [_chunk(self.seed, step, i, last=last) for i in range(self.batch)]

    def encode(self, chunks: Sequence[ic.TokenChunk], *, last: bool) -> list[bytes]:
        """One OUTPUTS message of the step's chunks."""
        pairs = []
        for rid_bytes, encoder, chunk in zip(self._rids, self._encoders, chunks, strict=True):
            frame = encoder.encode(chunk)
            if last:
                frame += encoder.end()
            pairs.append((rid_bytes, frame))
        return hop.outputs(pairs)


class TokenHopDecoder:
    """The frontend's side of one run: :func:`~inferwire.engine.hop.parse_from_engine`, then
    each request's stream decoder. Raises :class:`~inferwire.engine.hop.HopProtocolError` for
    a message or a frame that does not decode."""

    def __init__(self, codec: str, batch: int) -> None:
        self.codec = hop_codec(codec.removeprefix(TOKEN_HOP_PREFIX))
        self.batch = batch
        self._decoders: dict[str, StreamDecoder[ic.TokenChunk]] = {
            rid(i): self.codec.stream_decoder(ic.TokenChunk, max_frame_bytes=hop.MAX_PART_BYTES)
            for i in range(batch)
        }

    def decode(self, frames: Sequence[bytes]) -> list[tuple[str, list[ic.TokenChunk], bool]]:
        """Each request's chunks of the step, and whether its stream ended."""
        message = hop.parse_from_engine(frames)
        if not isinstance(message, hop.Outputs):
            raise hop.HopProtocolError(f"a {type(message).__name__}, not OUTPUTS")
        found = []
        for request_id, frame in message.items:
            decoder = self._decoders.get(request_id)
            if decoder is None:
                raise hop.HopProtocolError(f"outputs of an unknown request {request_id!r}")
            try:
                chunks = decoder.feed(frame)
                finished = decoder.finished
                if finished:
                    decoder.close()
            except ic.CodecError as exc:
                raise hop.HopProtocolError(f"stream {request_id}: {exc}") from exc
            found.append((request_id, chunks, finished))
        return found


def check_token_step(
    found: Sequence[tuple[str, list[ic.TokenChunk], bool]],
    batch: int,
    seed: int,
    step: int,
    *,
    last: bool,
) -> str | None:
    """What is wrong with a decoded tokens-only step, or None (as :func:`.steps.check_step`)."""
    if len(found) != batch:
        return f"step {step}: {len(found)} outputs, not {batch}"
    for index, (request_id, chunks, finished) in enumerate(found):
        expected = _chunk(seed, step, index, last=last)
        if request_id != rid(index) or finished != last or len(chunks) != 1:
            return f"step {step}: output {index} is {request_id!r} ({len(chunks)} chunks)"
        chunk = chunks[0]
        if (
            chunk.id != expected.id
            or chunk.seq != step
            or tuple(chunk.token_ids) != expected.token_ids
            or chunk.finish_reason != expected.finish_reason
        ):
            return f"step {step}: {request_id} has {chunk!r}"
    return None
