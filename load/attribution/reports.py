"""One request's stages as its server reported them, and the reader of vLLM's per-request
``metrics`` object.

The stages every source is mapped to (milliseconds, durations on the server's own clock):

==============  ==========================================================================
stage           meaning
==============  ==========================================================================
``queue``       waiting in the engine's queue until first scheduled
``prefill``     first scheduled to the first output token (the prompt's forward passes)
``decode``      the first output token to the last
``inference``   first scheduled to the last token (``prefill`` + ``decode`` where both exist)
``server_e2e``  the server's own end to end: its frontend's arrival to the last token
``frontend``    a stage the server names in its frontend (TGI's validation)
``input``       tensors into the model's inputs (Triton's compute input: deserialization)
``output``      the model's outputs into response tensors (Triton's compute output)
==============  ==========================================================================

The split subtracts only ``queue`` and the model (``prefill`` + ``decode``, else
``inference``) from the client's E2E: ``frontend``, ``input`` and ``output`` are the server's
own frontend and (de)serialization, so they are reported beside the split and stay in *outside
the engine*, which is what the question asks about.

vLLM's ``metrics`` object (``vllm serve --enable-per-request-metrics``, on the response, or on
the last chunk of a stream that asks for ``stream_options.include_usage``), as its page
*Per-Request Metrics* (docs.vllm.ai/en/latest/features/per_request_metrics) defines it:

- ``queue_time_ms``: in the queue, until scheduled -> ``queue``;
- ``time_to_first_token_ms``: *from when the request was scheduled* until the first output
  token -> ``prefill`` (not the client's TTFT, which starts at the send);
- ``generation_time_ms``: the first output token to the last -> ``decode``;
- ``mean_itl_ms``, ``tokens_per_second``: kept for the records, not part of the split.
"""

from __future__ import annotations

import math
from typing import Any, Final, NamedTuple

STAGES: Final = (
    "queue",
    "prefill",
    "decode",
    "inference",
    "server_e2e",
    "frontend",
    "input",
    "output",
)
METRICS_OBJECT: Final = "metrics-object"
PROMETHEUS: Final = "prometheus"
OTLP: Final = "otlp"
SOURCES: Final = (METRICS_OBJECT, PROMETHEUS, OTLP)


class ServerReport(NamedTuple):
    """One request's stages as its server reported them (ms; ``None``: not reported). A named
    tuple rather than a frozen dataclass: one is made per request, and a frozen dataclass's
    ``__init__`` costs several times as much."""

    source: str
    """Where the figures came from: one of :data:`SOURCES`."""
    queue_ms: float | None = None
    prefill_ms: float | None = None
    decode_ms: float | None = None
    inference_ms: float | None = None
    server_e2e_ms: float | None = None

    def engine_ms(self) -> float | None:
        """Queue and model time together (None if the model's time is not reported)."""
        model = self.model_ms()
        if model is None:
            return None
        return model + (self.queue_ms or 0.0)

    def model_ms(self) -> float | None:
        """Prefill and decode, or the inference time when only that is reported."""
        if self.prefill_ms is not None and self.decode_ms is not None:
            return self.prefill_ms + self.decode_ms
        return self.inference_ms


class BadReport(ValueError):
    """A server report that cannot be right (a note in the report, never a figure); ``kind``
    names the fault without its figures, so that the report counts faults of one kind."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def _duration_ms(obj: dict[str, Any], field: str) -> float | None:
    value = obj.get(field)
    if value is None:
        return None
    kind = type(value)
    if kind is float and 0.0 <= value < math.inf:  # the common case first: read per request
        return value  # type: ignore[no-any-return]
    if kind is bool or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadReport(f"{field} is {value!r}, not a number of milliseconds", "not a number")
    if value < 0:
        raise BadReport(f"{field} is negative ({value})", "negative")
    return float(value)


def from_metrics_object(obj: object, *, e2e_ms: float | None = None) -> ServerReport | None:
    """vLLM's ``metrics`` object as a :class:`ServerReport`; ``None`` when it reports none of the
    stages (all null). Raises :class:`BadReport` for one that is not an object, a stage that is
    not a non-negative number, or stages that add up to more than the client's ``e2e_ms`` (the
    server cannot have spent longer on the request than the client waited for it)."""
    if not isinstance(obj, dict):
        raise BadReport(f"a metrics object that is not an object: {str(obj)[:80]}", "not an object")
    queue = _duration_ms(obj, "queue_time_ms")
    prefill = _duration_ms(obj, "time_to_first_token_ms")
    decode = _duration_ms(obj, "generation_time_ms")
    if queue is None and prefill is None and decode is None:
        return None
    total = (queue or 0.0) + (prefill or 0.0) + (decode or 0.0)
    if e2e_ms is not None and total > e2e_ms * 1.001 + 0.01:
        raise BadReport(
            f"the server's stages add up to {total:.3f} ms, more than the {e2e_ms:.3f} ms the"
            " client waited",
            "longer than the request",
        )
    return ServerReport(source=METRICS_OBJECT, queue_ms=queue, prefill_ms=prefill, decode_ms=decode)
