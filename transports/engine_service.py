"""The simulated service behind a frontend: every transport's server serves it unchanged, and
its token streams come from the engine process over the hop (:mod:`inferwire.engine`).

:class:`EngineService` keeps what a frontend does itself: ``open`` checks a request and
computes its chunks before a server answers (as a real frontend tokenizes and validates
before it hands a request to its engine), ``chunks`` is what a stream must equal (the tests
and benchmarks compare with it), ``infer`` and ``models`` are local. Only ``batches`` (and
``generate``, which reads it) go through the engine: ADD on the hop, then lists of the chunks
decoded so far, ABORT when the consumer goes away.

A stream the engine cannot finish raises :class:`~inferwire.transports.errors.
ServiceUnavailableError` from ``batches``, its ``__cause__`` the hop's error (every server then
fails the stream: tcp and http1 close the connection before the end marker, http2 resets the
stream, grpc ends the call with status ``UNAVAILABLE``, so a client sees an error, never a
short complete stream; the server logs it in one line, the engine's failure not its own):

- :class:`~inferwire.engine.hop.EngineGoneError`: the engine died, stopped answering or
  restarted mid-stream;
- :class:`~inferwire.engine.hop.EngineOverloadedError`: the engine's waiting queue was full.
  The servers have no overload answer of their own (no 503 / ``RESOURCE_EXHAUSTED`` path, as
  a stream's status is sent before the engine answers), so it fails the stream like any
  server-side error, the closest they have; the error's type says why in the server's log;
- :class:`~inferwire.engine.hop.StreamFailedError`: the hop bytes did not decode or the
  codec's end marker did not come.

With ``want_stamps``, each request asks the engine for its stamps (``want_stamps``), which arrive
with its last output and go into its :class:`TokenStream`'s ``stamps`` before its last chunk is
handed over (:mod:`~inferwire.transports.request_stamps`). :meth:`EngineService.healthy` is
whether an engine is there now (a frontend's ``/health``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Sequence

from inferwire.codecs import TokenChunk
from inferwire.engine import hop
from inferwire.engine.client import EngineClient, EngineStream
from inferwire.workloads import MODEL

from .errors import ServiceUnavailableError
from .service import MAX_BATCH_CHUNKS, SimulatedService, Source, TokenStream


class EngineService(SimulatedService):
    """:class:`SimulatedService` whose streams the engine behind ``client`` plays (the
    client started by the caller). With ``stage_times``, each request asks the engine for its
    stage times, kept in :attr:`last_stage_times` (benchmarks read them) with the frontend's
    own ``hop_decode_s``, the time its frames spent in the hop codec's decoder."""

    def __init__(
        self,
        source: Source,
        client: EngineClient,
        *,
        cache_size: int = 64,
        models: Sequence[str] = (MODEL,),
        stage_times: bool = False,
        want_stamps: bool = False,
    ) -> None:
        super().__init__(source, cache_size=cache_size, models=models)
        self.client = client
        self.stage_times = stage_times
        self.want_stamps = want_stamps
        self.last_stage_times: dict[str, float] | None = None
        """The stage times of the stream that ended last (with ``stage_times``)."""

    def hop_stats(self) -> dict[str, int]:
        """The frontend's side of the hop (:meth:`EngineClient.stats`): ``decode_ns``, the time
        spent decoding the engine's frames, ``chunks_decoded``, PAUSE and RESUME sent, ..."""
        return self.client.stats()

    def healthy(self) -> bool:
        """Whether an engine has welcomed the client and is not known to be gone."""
        return self.client.ready

    @property
    def instant(self) -> bool:
        """Never: the engine plays every stream, the ones answered whole too."""
        return False

    async def batches(
        self, stream: TokenStream, *, max_chunks: int = MAX_BATCH_CHUNKS
    ) -> AsyncGenerator[list[TokenChunk], None]:
        """The engine's stream as lists of the chunks decoded so far (at most
        ``max_chunks``). Raises :class:`ServiceUnavailableError` (from the hop's error) when
        the stream cannot finish; closing the generator aborts the request on the engine."""
        self.active_streams += 1
        self.streams_started += 1
        engine_stream: EngineStream | None = None
        stamps = stream.stamps
        stamps.engine(0, 0, 0, 0)
        try:
            request = stream.request
            try:
                engine_stream = await self.client.open_stream(
                    hop.Add(
                        rid="-",
                        workload=request.workload,
                        seed=request.seed,
                        max_tokens=request.max_tokens,
                        prompt_tokens=request.prompt_tokens,
                        model=request.model,
                        want_stage_times=self.stage_times,
                        want_stamps=self.want_stamps,
                    )
                )
                while batch := await engine_stream.next_batch(max_chunks):
                    engine = engine_stream.stamps
                    if engine is not None and not stamps.last_token_ns:  # with the last chunk
                        stamps.engine(
                            engine.arrived_ns,
                            engine.scheduled_ns,
                            engine.first_token_ns,
                            engine.last_token_ns,
                        )
                    yield batch
            except hop.HopError as exc:
                raise ServiceUnavailableError(f"{type(exc).__name__}: {exc}") from exc
            if engine_stream.stage_times is not None:
                times = dict(engine_stream.stage_times)
                times["hop_decode_s"] = engine_stream.decode_ns / 1e9
                self.last_stage_times = times
        finally:
            self.active_streams -= 1
            if engine_stream is not None and not engine_stream.done:
                with contextlib.suppress(Exception):
                    engine_stream.abort()
