"""``inferwire load --trace``: each request of the run as an OpenTelemetry trace.

:class:`TracedTarget` wraps the run's client: every ``generate`` opens a client span
(:meth:`inferwire.transports.tracing.Tracer.client_request`), hands the transport its
``StreamTiming`` (which carries the ``traceparent`` and asks the server for no stamps), and
ends the span with the request: ``ok``, ``error`` (an exception, the stream check's included)
or ``cancelled`` (the run stopped reading it). The spans and their attributes are described in
:mod:`inferwire.transports.tracing`. The server's own spans come from ``inferwire serve
--trace`` (``--spawn --trace`` starts it so); a run against any other server (``--url``) is
not traced.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire.transports.tracing import Tracer


class TimedTarget(Protocol):
    """A client of inferwire's transports (or a pool of them): ``generate`` takes timing."""

    def generate(
        self, request: it.GenerateRequest, /, *, timing: it.StreamTiming | None = None
    ) -> AsyncIterator[ic.TokenChunk]: ...

    async def close(self) -> None: ...


class TracedTarget:
    def __init__(self, target: TimedTarget, tracer: Tracer) -> None:
        self.target = target
        self.tracer = tracer

    async def generate(
        self, request: it.GenerateRequest, /, *, timing: it.StreamTiming | None = None
    ) -> AsyncIterator[ic.TokenChunk]:
        """The request, in its span; ``timing`` (the run's attribution) is handed the span's
        own stamps and trace context, so the client's stages are the traced ones."""
        trace = self.tracer.client_request(request.workload)
        if timing is not None:
            timing.traceparent = trace.timing.traceparent
        outcome = "cancelled"
        try:
            async for chunk in self.target.generate(request, timing=trace.timing):
                if timing is not None and not timing.request_sent_ns:
                    _copy_stamps(trace.timing, timing)
                yield chunk
            outcome = "ok"
        except Exception:
            outcome = "error"
            raise
        finally:
            trace.finish(outcome)

    async def close(self) -> None:
        await self.target.close()


def _copy_stamps(source: it.StreamTiming, into: it.StreamTiming) -> None:
    into.request_start_ns = source.request_start_ns
    into.acquired_ns = source.acquired_ns
    into.connect_ns = source.connect_ns
    into.request_sent_ns = source.request_sent_ns
    into.head_ns = source.head_ns
