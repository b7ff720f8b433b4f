"""The metric families the attribution reads from a server's Prometheus endpoint: one row per
family, for vLLM (V1 engine), SGLang, TGI (text-generation-inference) and Triton Inference
Server, each with the stage of :mod:`.reports` it maps to, its unit, what it times, and the page
its name and meaning were read from.

How a row is read (:func:`~inferwire.load.attribution.prometheus.delta`): the difference between
two scrapes, summed over the family's label sets (vLLM's ``model_name`` and ``engine``, SGLang's
``model_name`` and ranks, Triton's ``model`` and ``version``). A ``histogram`` gives a count, a
mean (its ``_sum`` over its ``_count``) and percentiles interpolated within its buckets; a
``summary`` gives a count and a mean (its quantiles are over the engine's own sliding window,
not over the point, so they are not read); a ``counter`` is a cumulative duration whose mean is
its delta over the delta of ``count_family``, the engine's request counter.

Where the engines' clocks start and stop (durations only, each on the server's own clock):

- vLLM's intervals are timed by the engine core's events (docs.vllm.ai, *Metrics* design page):
  queue is QUEUED to the most recent SCHEDULED, so a preempted request's first run counts as
  queue; prefill, decode and inference start at that most recent SCHEDULED. Its
  ``e2e_request_latency_seconds`` and ``time_to_first_token_seconds`` start earlier, at the
  frontend's ``arrival_time`` (when tokenization begins), so they include input processing and
  the queue, unlike the per-request ``metrics`` object's ``time_to_first_token_ms``, which starts
  at scheduling. The HTTP server's handling before arrival and after the last token is in none.
- SGLang publishes per-request histograms for the queue, its end to end and TTFT only: no
  prefill or decode. Its queue is the scheduler's waiting queue until the first forward batch;
  its end to end and TTFT start when the tokenizer manager receives the request. Its queue
  histogram's buckets are coarse (0, 0.1, 0.2, 0.5 s, ...): its percentiles under 100 ms are
  interpolations within one bucket, its mean is exact. Scheduler metrics come from attention-TP
  rank 0 (unless ``--enable-metrics-for-all-schedulers``, when a sum over ranks counts a request
  more than once). ``sglang:per_stage_req_latency_seconds{stage=...}`` is not read: its stage
  names change between versions.
- TGI's router times three consecutive spans of a request: validation (the handler's start to
  the request being queued: validation and tokenization; the ``frontend`` stage), queue, and
  inference (the first batch's start to the last token: prefill and decode together), and a
  total that spans the three (and the response's assembly after them); all four are recorded
  for successful requests only. No TTFT histogram.
- Triton's latencies are cumulative microsecond counters by default: a mean is the counter's
  delta over ``nv_inference_request_success``'s, which counts each request once, whatever its
  batch size, as the summaries' ``_count`` does (the docs say the two agree);
  ``nv_inference_count`` counts a batch of n as n and leaves out cached requests, so it is not
  the divisor. Queue and request durations include response-cache hits; compute input, infer
  and output do not, so their divisor leaves out ``nv_cache_num_hits_per_model``. The
  summaries (``--metrics-config summary_latencies=true``) are read when the counters are off.

A family of a stage not in :data:`~inferwire.load.attribution.reports.STAGES` (``ttft``) is
reported beside the stages, never in the split: TTFT overlaps the queue and the prefill.

The prefix cache (:data:`PREFIX_CACHE`, read beside the stages for :mod:`..prefix_cache`):
vLLM's V1 engine counts, per engine, the prompt tokens it looked up in its prefix cache
(``vllm:prefix_cache_queries``) and those it found (``vllm:prefix_cache_hits``), so the
deltas over a point give its hit rate over the point's tokens; SGLang publishes only a gauge,
``sglang:cache_hit_rate``, over its scheduler's recent batches, read as it is at the point's
end (several ranks: their mean).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

HISTOGRAM: Final = "histogram"
COUNTER: Final = "counter"
SUMMARY: Final = "summary"
KINDS: Final = (HISTOGRAM, COUNTER, SUMMARY)
TTFT: Final = "ttft"
EXTRA_MEASURES: Final = (TTFT,)
"""What a row may measure besides the stages: reported, not split."""

VLLM: Final = "vllm"
SGLANG: Final = "sglang"
TGI: Final = "tgi"
TRITON: Final = "triton"
ENGINES: Final = (VLLM, SGLANG, TGI, TRITON)

_SECONDS: Final = 1000.0
_MICROSECONDS: Final = 0.001

_VLLM_DOC: Final = "https://docs.vllm.ai/en/latest/usage/metrics/"
_VLLM_DESIGN: Final = "https://docs.vllm.ai/en/latest/design/metrics/"
_VLLM_CODE: Final = "https://github.com/vllm-project/vllm/blob/main/vllm/v1/metrics/loggers.py"
_SGLANG_DOC: Final = "https://docs.sglang.io/references/production_metrics.html"
_SGLANG_CODE: Final = (
    "https://github.com/sgl-project/sglang/blob/main/python/sglang/srt/metrics/collector.py"
)
_TGI_DOC: Final = "https://huggingface.co/docs/text-generation-inference/reference/metrics"
_TGI_CODE: Final = (
    "https://github.com/huggingface/text-generation-inference/blob/main/router/src/server.rs"
)
_TRITON_DOC: Final = (
    "https://docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/user_guide/"
    "metrics.html"
)
_TRITON_CODE: Final = (
    "https://github.com/triton-inference-server/server/blob/main/docs/user_guide/metrics.md"
)
_TRITON_REQUESTS: Final = "nv_inference_request_success"
_TRITON_CACHE_HITS: Final = "nv_cache_num_hits_per_model"


@dataclass(frozen=True, slots=True, kw_only=True)
class Family:
    """One metric family an engine publishes, and how the attribution reads it."""

    engine: str
    name: str
    """The family's name as the endpoint exposes it (a histogram's, without ``_bucket``)."""
    kind: str
    """One of :data:`KINDS`."""
    stage: str
    """A stage of :data:`~inferwire.load.attribution.reports.STAGES`, or one of
    :data:`EXTRA_MEASURES`."""
    to_ms: float
    """Multiplies the family's unit into milliseconds."""
    meaning: str
    url: str
    """The documentation page the name and meaning were read from."""
    source: str = ""
    """The code that records it, where the page leaves the clock's start or end unsaid."""
    count_family: str | None = None
    """For a ``counter`` of cumulative duration: the counter of the requests it is over."""
    count_excludes: str | None = None
    """Requests ``count_family`` counts that add nothing to this counter (cache hits)."""


def _vllm(name: str, stage: str, meaning: str) -> Family:
    return Family(
        engine=VLLM,
        name=name,
        kind=HISTOGRAM,
        stage=stage,
        to_ms=_SECONDS,
        meaning=meaning,
        url=_VLLM_DOC if stage in ("server_e2e", TTFT) else _VLLM_DESIGN,
        source=_VLLM_CODE,
    )


def _seconds(engine: str, name: str, stage: str, meaning: str, url: str, source: str) -> Family:
    return Family(
        engine=engine,
        name=name,
        kind=HISTOGRAM,
        stage=stage,
        to_ms=_SECONDS,
        meaning=meaning,
        url=url,
        source=source,
    )


def _triton(name: str, stage: str, meaning: str, *, compute: bool) -> Family:
    summary = name.endswith("_summary_us")
    return Family(
        engine=TRITON,
        name=name,
        kind=SUMMARY if summary else COUNTER,
        stage=stage,
        to_ms=_MICROSECONDS,
        meaning=meaning,
        url=_TRITON_DOC,
        source=_TRITON_CODE,
        count_family=None if summary else _TRITON_REQUESTS,
        count_excludes=_TRITON_CACHE_HITS if compute and not summary else None,
    )


FAMILIES: Final[tuple[Family, ...]] = (
    # vLLM, V1 engine: histograms in seconds, labels model_name and engine (the DP rank).
    _vllm(
        "vllm:request_queue_time_seconds",
        "queue",
        "waiting in the scheduler's queue: queued in the engine core until last scheduled",
    ),
    _vllm(
        "vllm:request_prefill_time_seconds",
        "prefill",
        "last scheduled until the first new token: the prompt's forward passes",
    ),
    _vllm(
        "vllm:request_decode_time_seconds",
        "decode",
        "the first new token after the last scheduling until the request's last token",
    ),
    _vllm(
        "vllm:request_inference_time_seconds",
        "inference",
        "last scheduled until the last token: prefill and decode together",
    ),
    _vllm(
        "vllm:e2e_request_latency_seconds",
        "server_e2e",
        "the frontend's arrival (tokenization starts) until it holds the last token",
    ),
    _vllm(
        "vllm:time_to_first_token_seconds",
        TTFT,
        "the frontend's arrival until the first token: input processing, queue and prefill",
    ),
    # SGLang: histograms in seconds, labels model_name and the ranks.
    _seconds(
        SGLANG,
        "sglang:queue_time_seconds",
        "queue",
        "in the scheduler's waiting queue until the request enters a forward batch",
        _SGLANG_DOC,
        _SGLANG_CODE,
    ),
    _seconds(
        SGLANG,
        "sglang:e2e_request_latency_seconds",
        "server_e2e",
        "the tokenizer manager's receipt of the request until the request finishes",
        _SGLANG_DOC,
        _SGLANG_CODE,
    ),
    _seconds(
        SGLANG,
        "sglang:time_to_first_token_seconds",
        TTFT,
        "the tokenizer manager's receipt of the request until its first output token",
        _SGLANG_DOC,
        _SGLANG_CODE,
    ),
    # TGI's router: histograms in seconds, no labels on these.
    _seconds(
        TGI,
        "tgi_request_validation_duration",
        "frontend",
        "the router's handler start until the request is queued: validation, tokenization",
        _TGI_DOC,
        _TGI_CODE,
    ),
    _seconds(
        TGI,
        "tgi_request_queue_duration",
        "queue",
        "queued in the router until the first batch that holds the request starts",
        _TGI_DOC,
        _TGI_CODE,
    ),
    _seconds(
        TGI,
        "tgi_request_inference_duration",
        "inference",
        "the first batch's start until the last token: prefill and decode together",
        _TGI_DOC,
        _TGI_CODE,
    ),
    _seconds(
        TGI,
        "tgi_request_duration",
        "server_e2e",
        "the router's handler start until the response is complete (successes only)",
        _TGI_DOC,
        _TGI_CODE,
    ),
    # Triton: cumulative microsecond counters per model and version (the default), then the
    # summaries that stand in for them when --metrics-config counter_latencies=false.
    _triton(
        "nv_inference_queue_duration_us",
        "queue",
        "total time requests waited in the model's scheduling queue (cache hits included)",
        compute=False,
    ),
    _triton(
        "nv_inference_compute_input_duration_us",
        "input",
        "total time the backend spent taking in requests' input tensors (no cache hits)",
        compute=True,
    ),
    _triton(
        "nv_inference_compute_infer_duration_us",
        "inference",
        "total time the backend spent running the model for requests (no cache hits)",
        compute=True,
    ),
    _triton(
        "nv_inference_compute_output_duration_us",
        "output",
        "total time the backend spent making requests' output tensors (no cache hits)",
        compute=True,
    ),
    _triton(
        "nv_inference_request_duration_us",
        "server_e2e",
        "total time the server core handled requests, end to end (cache hits included)",
        compute=False,
    ),
    _triton(
        "nv_inference_queue_summary_us",
        "queue",
        "summary of the time requests waited in the scheduling queue",
        compute=False,
    ),
    _triton(
        "nv_inference_compute_input_summary_us",
        "input",
        "summary of the backend's time taking in input tensors",
        compute=True,
    ),
    _triton(
        "nv_inference_compute_infer_summary_us",
        "inference",
        "summary of the backend's time running the model",
        compute=True,
    ),
    _triton(
        "nv_inference_compute_output_summary_us",
        "output",
        "summary of the backend's time making output tensors",
        compute=True,
    ),
    _triton(
        "nv_inference_request_summary_us",
        "server_e2e",
        "summary of the server core's end-to-end handling of requests",
        compute=False,
    ),
)
"""Every family read, per engine in order of preference: for a stage, the first row whose
family the endpoint exposes is used."""


def engine_families(engine: str, families: tuple[Family, ...] = FAMILIES) -> tuple[Family, ...]:
    return tuple(f for f in families if f.engine == engine)


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheFamilies:
    """How an engine publishes its prefix cache's hits: two counters of tokens, or a gauge."""

    engine: str
    hits: str | None = None
    """A counter of the prompt tokens found in the cache."""
    queries: str | None = None
    """A counter of the prompt tokens looked up."""
    rate_gauge: str | None = None
    """A gauge of the hit rate, 0 to 1, over the engine's own window."""
    meaning: str
    url: str


PREFIX_CACHE: Final[tuple[CacheFamilies, ...]] = (
    CacheFamilies(
        engine=VLLM,
        hits="vllm:prefix_cache_hits",
        queries="vllm:prefix_cache_queries",
        meaning="prompt tokens found in the prefix cache, over those looked up (V1 engine)",
        url=_VLLM_DOC,
    ),
    CacheFamilies(
        engine=SGLANG,
        rate_gauge="sglang:cache_hit_rate",
        meaning="the radix cache's hit rate over the scheduler's recent batches (a gauge)",
        url=_SGLANG_DOC,
    ),
)
"""The prefix cache's families, in order of preference: the first one the endpoint exposes is
read."""
