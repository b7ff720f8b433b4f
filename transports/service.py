"""The simulated inference service that every transport serves, so protocols compare on
identical work.

A request names a seeded token-stream workload; the service replays its chunks, paced like a
model: ``prefill_s`` before the first chunk (time to first token) and ``decode_s`` per token
after it, on an absolute schedule so that pacing does not drift with the time spent sending.
Both zero measures serialization and transport alone.

The service does not build workloads itself: the caller passes a ``source`` that turns a
request into its chunks (``inferwire serve`` passes the seeded workloads of
:mod:`inferwire.workloads`). Streams are cached per (workload, seed), so a server times what
it sends, not how the payload was made. ``models`` names the model(s) it serves (what the
OpenAI API's ``/v1/models`` lists); by default the one the seeded workloads name.

Each stream keeps the service's own stamps in its :class:`TokenStream`'s ``stamps``
(:class:`~inferwire.transports.request_stamps.RequestStamps`): the service has no queue, so a
request arrives and is scheduled when its playing starts; its first token is stamped when the
first chunk is due (after ``prefill_s``), its last when the last one is.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

import orjson

from inferwire.codecs import InferRequest, InferResponse, Tensor, TokenChunk
from inferwire.workloads import MODEL, cut_stream

from .errors import BadRequestError
from .request_stamps import RequestStamps

MAX_TOKENS_LIMIT: Final = 1 << 20
MAX_BATCH_CHUNKS: Final = 32
"""Most chunks :meth:`SimulatedService.batches` hands over at once (about 8 KiB of SSE)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerateRequest:
    """Ask for a token stream: the chunks of ``workload`` made with ``seed``, cut after
    ``max_tokens`` tokens (``None``: all of them)."""

    workload: str = "stream-256"
    seed: int = 0
    max_tokens: int | None = None
    prompt_tokens: int = 0
    model: str = ""
    timing: bool = False
    """Ask the server for per-chunk timestamps (see :mod:`inferwire.transports.timing`)."""

    def __post_init__(self) -> None:
        if not isinstance(self.workload, str) or not self.workload:
            raise BadRequestError("workload must be a non-empty string")
        for name in ("seed", "prompt_tokens"):
            value = getattr(self, name)
            if type(value) is not int or not 0 <= value < 1 << 63:
                raise BadRequestError(f"{name} must be a non-negative integer")
        if self.max_tokens is not None and (
            type(self.max_tokens) is not int or not 0 < self.max_tokens <= MAX_TOKENS_LIMIT
        ):
            raise BadRequestError(f"max_tokens must be an integer in 1..{MAX_TOKENS_LIMIT}")
        if not isinstance(self.model, str):
            raise BadRequestError("model must be a string")
        if not isinstance(self.timing, bool):
            raise BadRequestError("timing must be true or false")

    def to_json_obj(self) -> dict[str, Any]:
        obj: dict[str, Any] = {"workload": self.workload, "seed": self.seed}
        if self.max_tokens is not None:
            obj["max_tokens"] = self.max_tokens
        if self.prompt_tokens:
            obj["prompt_tokens"] = self.prompt_tokens
        if self.model:
            obj["model"] = self.model
        if self.timing:
            obj["timing"] = True
        return obj

    def to_json(self, *, timing: bool = False) -> bytes:
        """The JSON body that asks for this stream (with ``timing``, the server's per-chunk
        stamps too). The HTTP routes take an OpenAI request instead
        (:func:`~inferwire.transports.openai_api.chat_request_body`)."""
        obj = self.to_json_obj()
        if timing:
            obj["timing"] = True
        return orjson.dumps(obj)

    @classmethod
    def from_json_obj(cls, obj: object) -> GenerateRequest:
        """From our own request object, or an OpenAI chat completion request body (its
        ``model``, ``max_tokens`` or ``max_completion_tokens`` and ``seed``; ``workload`` is
        our extension, sent by the OpenAI SDK as ``extra_body``)."""
        if not isinstance(obj, Mapping):
            raise BadRequestError("the request body must be a JSON object")
        max_tokens = obj.get("max_tokens", obj.get("max_completion_tokens"))
        fields: dict[str, Any] = {
            "workload": obj.get("workload", "stream-256"),
            "seed": obj.get("seed", 0),
            "max_tokens": max_tokens,
            "prompt_tokens": obj.get("prompt_tokens", 0),
            "model": obj.get("model", ""),
            "timing": obj.get("timing", False),
        }
        if fields["seed"] is None:
            fields["seed"] = 0
        return cls(**fields)


@dataclass(frozen=True, slots=True)
class TokenStream:
    """A request the service has accepted, with the chunks it will stream: what
    :meth:`SimulatedService.open` returns and :meth:`SimulatedService.batches` plays, which
    fills its ``stamps`` (the service's, then the frontend's: :mod:`.request_stamps`)."""

    request: GenerateRequest
    chunks: Sequence[TokenChunk]
    stamps: RequestStamps = field(default_factory=RequestStamps, compare=False)


Source = Callable[[str, int], Sequence[TokenChunk]]
"""Makes the chunks of a named workload with a seed; raises ``KeyError`` for unknown names."""


class SimulatedService:
    """Token streams and unary inference with configurable pacing; see the module docstring."""

    def __init__(
        self,
        source: Source,
        *,
        prefill_s: float = 0.0,
        decode_s: float = 0.0,
        cache_size: int = 64,
        models: Sequence[str] = (MODEL,),
    ) -> None:
        if prefill_s < 0 or decode_s < 0:
            raise ValueError("prefill and decode times cannot be negative")
        if (
            isinstance(models, str)
            or not models
            or not all(isinstance(m, str) and m for m in models)
        ):
            raise ValueError("models must be one or more non-empty names")
        self.models: tuple[str, ...] = tuple(models)
        """The names of the models served, the default (a request that names none) first."""
        self.prefill_s = prefill_s
        self.decode_s = decode_s
        self._chunks = functools.lru_cache(maxsize=cache_size)(source)
        self.active_streams = 0
        """Streams being generated now: a client that goes away must bring this back down."""
        self.streams_started = 0

    def open(self, request: GenerateRequest) -> TokenStream:
        """Check ``request`` and compute its chunks, once: a server calls this before it
        answers, so a bad request is refused before a stream starts. Raises
        :class:`BadRequestError`."""
        chunks = self.chunks(request)
        return TokenStream(request, chunks, RequestStamps(chunks[0].model))

    def healthy(self) -> bool:
        """Whether a stream opened now can be served (a frontend's engine may be away)."""
        return True

    @property
    def instant(self) -> bool:
        """Whether a stream's chunks are all there at once (an unpaced local service), so an
        answer that is not streamed need not wait for them to be played."""
        return not (self.prefill_s or self.decode_s)

    def chunks(self, request: GenerateRequest) -> Sequence[TokenChunk]:
        """The chunks ``request`` asks for, in order. Raises :class:`BadRequestError`."""
        try:
            chunks = self._chunks(request.workload, request.seed)
        except KeyError:
            raise BadRequestError(f"unknown workload {request.workload!r}") from None
        if not chunks or not all(isinstance(c, TokenChunk) for c in chunks[:1]):
            raise BadRequestError(f"workload {request.workload!r} is not a token stream")
        if request.max_tokens is not None:
            chunks = cut_stream(chunks, request.max_tokens)
        if request.model and request.model != chunks[0].model:
            chunks = [replace(c, model=request.model) for c in chunks]
        return chunks

    async def generate(self, stream: TokenStream) -> AsyncGenerator[TokenChunk, None]:
        """The paced stream, one chunk at a time. Cancelling the consumer's task ends it (and
        its accounting)."""
        async with contextlib.aclosing(self.batches(stream, max_chunks=1)) as batches:
            async for batch in batches:
                for chunk in batch:
                    yield chunk

    async def batches(
        self, stream: TokenStream, *, max_chunks: int = MAX_BATCH_CHUNKS
    ) -> AsyncGenerator[list[TokenChunk], None]:
        """The paced stream as lists of the chunks that are due now, for servers that write
        a list at once: a chunk is handed over as soon as it is produced (paced, a list holds
        one), and a model that runs ahead of the wire does not cost one write per chunk (the
        batching an HTTP/2 server such as Hypercorn does by buffering its output)."""
        chunks = stream.chunks
        stamps = stream.stamps
        self.active_streams += 1
        self.streams_started += 1
        try:
            paced = bool(self.prefill_s or self.decode_s)
            started_ns = time.monotonic_ns()
            stamps.engine(started_ns, started_ns, 0, 0)
            due = time.monotonic() + self.prefill_s
            batch: list[TokenChunk] = []
            last = chunks[-1] if chunks else None
            for chunk in chunks:
                if paced:
                    delay = due - time.monotonic()
                    if delay > 0:
                        if batch:
                            yield batch
                            batch = []
                        await asyncio.sleep(delay)
                    due += self.decode_s * max(1, len(chunk.token_ids))
                if not batch and not stamps.first_token_ns:
                    stamps.first_token_ns = time.monotonic_ns()
                if chunk is last:
                    stamps.last_token_ns = time.monotonic_ns()
                batch.append(chunk)
                if len(batch) >= max_chunks:
                    yield batch
                    batch = []
            if batch:
                yield batch
        finally:
            self.active_streams -= 1

    def infer(self, request: InferRequest) -> InferResponse:
        """Echo: each input comes back as ``output_<i>``, the same array (no copy).

        ``request`` may be a codec's zero-copy view of one (FlatBuffers): anything with the
        model's ``model``, ``id`` and ``inputs``."""
        if not all(hasattr(request, name) for name in ("model", "id", "inputs")):
            raise BadRequestError("infer takes an InferRequest")
        outputs = tuple(
            Tensor(name=f"output_{i}", datatype=t.datatype, shape=t.shape, data=t.data)
            for i, t in enumerate(request.inputs)
        )
        return InferResponse(model=request.model, id=request.id, outputs=outputs)
