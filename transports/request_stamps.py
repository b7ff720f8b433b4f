"""One request's times from its arrival to its last chunk written, as the server itself saw
them, and what is made of them: vLLM's per-request ``metrics`` object, the intervals of vLLM's
request histograms and spans, and the ``--stamps-file`` line.

Every stamp is ``time.monotonic_ns()`` (CLOCK_MONOTONIC: one clock for every process of a
host, so a frontend's stamps and its engine process's compare directly); 0 where not reached:

========================  =================================================================
``received_ns``           the frontend had the whole request (the transport's stamp)
``arrived_ns``            the engine read the request (``--engine``), or the simulated
                          service started it (no queue: it plays every request at once)
``scheduled_ns``          the engine first scheduled it (the start of the step that first
                          prefilled it); the simulated service: its start
``first_token_ns``        its first output left the engine (the end of its step); the
                          simulated service: the first chunk was due (after ``prefill_ms``)
``last_token_ns``         its last output, likewise
``first_chunk_ns``        the frontend had its first chunk in hand, to encode
``last_chunk_ns``         the frontend had its last chunk in hand
``last_chunk_written_ns`` the write that carried the last chunk returned
========================  =================================================================

The intervals are vLLM's (``vllm/v1/metrics/stats.py``): queue ``scheduled - arrived``,
prefill ``first_token - scheduled``, decode ``last_token - first_token``, inference
``last_token - scheduled``; time to first token and end to end start at the frontend's
``received_ns``, as vLLM's start at its frontend's arrival, and end when the frontend holds the
first and the last token (``first_chunk_ns``, ``last_chunk_ns``), as vLLM's end when its
output processor has them. The per-request ``metrics`` object is vLLM's
(``--enable-per-request-metrics``, docs.vllm.ai/en/latest/features/per_request_metrics):
``time_to_first_token_ms`` is the prefill (from scheduling, not from arrival),
``generation_time_ms`` the decode, ``mean_itl_ms`` the decode over the tokens after the first
(null for a single token), ``tokens_per_second`` the tokens over the inference time.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

__all__ = ["RequestStamps", "StampsFile", "metrics_object"]

_NS_PER_MS: Final = 1e6
_NS_PER_S: Final = 1e9
VLLM_INTERVALS: Final = ("queue", "prefill", "decode", "inference", "ttft", "e2e")
"""The intervals of :meth:`RequestStamps.intervals_s`, in the order a request meets them."""


@dataclass(slots=True, eq=False)
class RequestStamps:
    """The stamps of the module docstring (ns, 0: not reached), and the ``model`` that
    served the request (the vLLM histograms' ``model_name``)."""

    model: str = ""
    received_ns: int = 0
    arrived_ns: int = 0
    scheduled_ns: int = 0
    first_token_ns: int = 0
    last_token_ns: int = 0
    first_chunk_ns: int = 0
    last_chunk_ns: int = 0
    last_chunk_written_ns: int = 0

    def engine(self, arrived_ns: int, scheduled_ns: int, first_ns: int, last_ns: int) -> None:
        """The engine's four stamps at once."""
        self.arrived_ns = arrived_ns
        self.scheduled_ns = scheduled_ns
        self.first_token_ns = first_ns
        self.last_token_ns = last_ns

    def intervals_s(self, received_ns: int = 0) -> dict[str, float]:
        """vLLM's intervals (module docstring), seconds, those whose stamps were reached;
        ``received_ns`` stands in for an unset :attr:`received_ns`."""
        received = self.received_ns or received_ns
        pairs = (
            ("queue", self.arrived_ns, self.scheduled_ns),
            ("prefill", self.scheduled_ns, self.first_token_ns),
            ("decode", self.first_token_ns, self.last_token_ns),
            ("inference", self.scheduled_ns, self.last_token_ns),
            ("ttft", received, self.first_chunk_ns),
            ("e2e", received, self.last_chunk_ns),
        )
        return {
            name: max(0, end - start) / _NS_PER_S for name, start, end in pairs if start and end
        }

    def line(self, request_id: str, outcome: str, tokens: int, *, stream: bool) -> bytes:
        """The ``--stamps-file`` line of this request (:class:`StampsFile`)."""

        def ns(value: int) -> int | None:
            return value or None

        return orjson.dumps(
            {
                "request_id": request_id,
                "model": self.model,
                "stream": stream,
                "outcome": outcome,
                "tokens": tokens,
                "frontend_received_ns": ns(self.received_ns),
                "engine_arrived_ns": ns(self.arrived_ns),
                "engine_scheduled_ns": ns(self.scheduled_ns),
                "engine_first_token_ns": ns(self.first_token_ns),
                "engine_last_token_ns": ns(self.last_token_ns),
                "frontend_first_chunk_ns": ns(self.first_chunk_ns),
                "frontend_last_chunk_ns": ns(self.last_chunk_ns),
                "frontend_last_chunk_written_ns": ns(self.last_chunk_written_ns),
            },
            option=orjson.OPT_APPEND_NEWLINE,
        )


def metrics_object(stamps: RequestStamps, tokens: int) -> dict[str, float | None]:
    """vLLM's per-request ``metrics`` object for ``tokens`` generated tokens, its fields in
    vLLM's order; a field is null when a stamp it needs was not reached (vLLM's
    ``build_per_request_timing_metrics``)."""
    scheduled, first, last = stamps.scheduled_ns, stamps.first_token_ns, stamps.last_token_ns
    ttft = generation = queue = itl = rate = None
    if scheduled and first:
        ttft = (first - scheduled) / _NS_PER_MS
    if first and last:
        generation = (last - first) / _NS_PER_MS
        if tokens > 1:
            itl = generation / (tokens - 1)
    if stamps.arrived_ns and scheduled:
        queue = (scheduled - stamps.arrived_ns) / _NS_PER_MS
    if scheduled and last and last > scheduled:
        rate = tokens / ((last - scheduled) / _NS_PER_S)
    return {
        "time_to_first_token_ms": ttft,
        "generation_time_ms": generation,
        "queue_time_ms": queue,
        "mean_itl_ms": itl,
        "tokens_per_second": rate,
    }


class StampsFile:
    """``--stamps-file PATH``: one JSON line per OpenAI API request the server answered
    (:meth:`RequestStamps.line`), written when the answer ended (a line at a time, so a reader
    sees whole lines while the server runs). The file is created, or emptied if it exists."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file: io.BufferedWriter | None = self.path.open("wb")
        self.lines = 0

    def write(self, line: bytes) -> None:
        if self._file is not None:
            self._file.write(line)
            self._file.flush()
            self.lines += 1

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> StampsFile:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
