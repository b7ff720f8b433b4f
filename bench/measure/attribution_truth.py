"""``inferwire load``'s attribution of each request's latency, checked against inferwire's own
ground truth, through the real stack (load generator -> ``inferwire serve --engine`` ->
``inferwire engine``): the benchmark ``bench_engine_attribution`` and the integration test
``tests/integration/test_attribution_truth.py`` both run :func:`run_attributed` and
:func:`compare`.

The load generator drives the frontend's OpenAI chat API (``--api openai-chat``) with its
attribution on: each stream's per-request ``metrics`` object
(``--enable-per-request-metrics``) gives that request's split, and scrapes of the frontend's
``/metrics`` (its vLLM-named histograms) give the point's means. The truth is the frontend's
``--stamps-file``: one line per answer with the engine's and the frontend's raw stamps
(``time.monotonic_ns``, the clock of the generator's own stamps on this host).

**The join.** A stamps line names the answer's ``id``, which the generator's records do not
carry; it is joined to a record by causality on the one clock instead: the frontend received
the request (``frontend_received_ns``) after the client had a connection in hand to write it
(``acquired_ns``) and before the client read the response's head (``head_ns``), and the
answer's tokens are the record's. A line fitting exactly one record's window is that record's;
lines that fit several (two requests written within the same few hundred microseconds, with
as many tokens) are assigned in order and counted as ambiguous.

**The truth** of a joined request, in ms: queue = scheduled - arrived, model = last token -
scheduled, outside the engine = E2E - the generator's lag - its pool wait - (last token -
arrived), where E2E, lag and pool wait are the record's (the client's side of both accounts is
the same; what is checked is the server's side and the arithmetic on it).
"""

from __future__ import annotations

import bisect
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import orjson

from inferwire._runtime import loops
from inferwire.engine.launch import EngineProcess
from inferwire.load import endpoints, metrics, openloop, targets
from inferwire.load.api_streams import ApiChunk, ApiStreamCheck
from inferwire.load.attribution import session
from inferwire.load.attribution.reports import PROMETHEUS
from inferwire.transports import server_process
from inferwire.transports.timing import StreamTiming

STAGES: Final = ("queue", "model", "outside")
"""The split's parts, as the report names them: the engine's queue, its model (prefill and
decode), and all that is outside the engine."""
BOUND_SHARE: Final = 0.10
BOUND_MS: Final = 1.0
"""Attributed and true figures agree when within 10% of the truth, or 1 ms (issue 29)."""
PROMPT_TOKENS: Final = 256
"""Every request's prompt length (the API target's body is one per endpoint, and the server
reads prompt length from inferwire's own ``prompt_tokens`` field, not from the text)."""
PROMPT_TEXT: Final = "Generate."
WARM_REQUESTS: Final = 4
STAMPS_WAIT_S: Final = 10.0
"""How long to wait, after the point, for the frontend's lines of its last answers (written
when each answer ended, which can be just after the client read its end)."""
SCRAPE_INTERVAL_S: Final = 1.0


class TruthStack:
    """``inferwire engine`` and ``inferwire serve --transport http1 --codec orjson --engine``
    in front of it, with ``--enable-per-request-metrics``, its ``/metrics`` on and
    ``--stamps-file``; a context manager. ``engine_options`` go to the engine."""

    def __init__(self, hop_codec: str, *engine_options: str) -> None:
        self.hop_codec = hop_codec
        self._dir = tempfile.TemporaryDirectory(prefix="inferwire-truth-")
        root = Path(self._dir.name)
        self.stamps_path = root / "stamps.jsonl"
        self._pickle = ("--allow-pickle",) if hop_codec == "pickle" else ()
        self.engine = EngineProcess(
            "--endpoint",
            f"ipc://{root / 'engine.sock'}",
            "--codec",
            hop_codec,
            *self._pickle,
            *engine_options,
        )
        self.frontend: server_process.ServerProcess | None = None

    def start(self) -> TruthStack:
        try:
            self.engine.start()
            self.frontend = server_process.serve(
                "http1",
                "orjson",
                "--engine",
                self.engine.endpoint,
                "--engine-codec",
                self.hop_codec,
                *self._pickle,
                "--enable-per-request-metrics",
                "--stamps-file",
                str(self.stamps_path),
                metrics=True,
            ).start()
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def url(self) -> str:
        assert self.frontend is not None, "not started"
        return f"http://{self.frontend.address}"

    @property
    def metrics_url(self) -> str:
        return f"{self.url}/metrics"

    @property
    def frontend_pid(self) -> int:
        assert self.frontend is not None, "not started"
        return self.frontend.pid

    def stamp_lines(self, at_least: int = 0, wait_s: float = STAMPS_WAIT_S) -> list[dict[str, Any]]:
        """The stamps file's lines so far, waiting up to ``wait_s`` for ``at_least`` of them."""
        deadline = time.monotonic() + wait_s
        while True:
            text = self.stamps_path.read_bytes() if self.stamps_path.exists() else b""
            lines = [orjson.loads(line) for line in text.splitlines() if line.endswith(b"}")]
            if len(lines) >= at_least or time.monotonic() > deadline:
                return lines
            time.sleep(0.02)

    def stop(self) -> None:
        if self.frontend is not None:
            self.frontend.stop()
            self.frontend = None
        self.engine.stop()
        self._dir.cleanup()

    def __enter__(self) -> TruthStack:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


@dataclass(frozen=True, slots=True, kw_only=True)
class Prompt:
    """A request of the point (:class:`~inferwire.load.endpoints.PromptLike`), with the index
    of the schedule it is sent at."""

    index: int
    max_tokens: int
    text: str = PROMPT_TEXT


class TimedApiTarget:
    """An API target that keeps each request's client stamps by its prompt's index (the
    generator makes them; the join needs their times on the host's clock)."""

    def __init__(self, inner: endpoints.ApiTarget, timings: dict[int, StreamTiming]) -> None:
        self.inner = inner
        self.timings = timings

    def generate(
        self, prompt: Prompt, /, *, timing: StreamTiming | None = None
    ) -> AsyncIterator[ApiChunk]:
        if timing is not None:
            self.timings[prompt.index] = timing
        return self.inner.generate(prompt, timing=timing)

    async def close(self) -> None:
        await self.inner.close()


@dataclass(frozen=True, slots=True, kw_only=True)
class AttributedRun:
    point: dict[str, Any]
    records: list[metrics.RequestRecord]
    timings: Mapping[int, StreamTiming]


def api_checks(target: endpoints.ApiTarget) -> openloop.CheckFactory:
    """The checks ``inferwire load --api`` makes (``ApiSweep.check_factory`` of
    :mod:`inferwire.load.api_mode`), with no tokenizer: the server's usage counts the tokens."""
    needs_finish = target.needs_finish

    def make(parse: metrics.Histogram) -> Callable[[], openloop.StreamCheck]:
        return lambda: ApiStreamCheck(parse=parse, counter=None, needs_finish=needs_finish)

    return make


def run_attributed(
    stack: TruthStack,
    spec: openloop.LoadSpec,
    rate_rps: float,
    output_tokens: Sequence[int],
    *,
    loop: str = "auto",
) -> AttributedRun:
    """One open-loop point against ``stack``'s OpenAI chat API with attribution on (the
    per-request metrics object and ``/metrics``), request i asking for ``output_tokens[i]``
    tokens, after a few untimed requests."""
    prompts = [Prompt(index=i, max_tokens=n) for i, n in enumerate(output_tokens)]
    records: list[metrics.RequestRecord] = []
    endpoint = endpoints.Endpoint(
        url=stack.url, api="openai-chat", extra_body={"prompt_tokens": PROMPT_TOKENS}
    )
    options = session.Options(
        metrics_url=stack.metrics_url, metrics_url_given=True, scrape_interval_s=SCRAPE_INTERVAL_S
    )
    timings: dict[int, StreamTiming] = {}

    async def go() -> dict[str, Any]:
        # on the running loop, as ``inferwire load`` opens it (ApiSweep.open)
        target = TimedApiTarget(targets.open_api_target(endpoint), timings)
        attribution = session.Attribution(options)
        try:
            await target.inner.describe()  # the model: the first that /v1/models lists
            await openloop.warm_up(target, Prompt(index=-1, max_tokens=16), WARM_REQUESTS)
            await attribution.open()
            return await openloop.run_point(
                target,
                spec,
                rate_rps=rate_rps,
                server_pid=stack.frontend_pid,
                request_for=lambda i: prompts[i % len(prompts)],
                checks=api_checks(target.inner),
                on_record=records.append,
                attribution=attribution.point(),
            )
        finally:
            await attribution.close()
            await target.close()

    point = loops.run(go(), loop)
    return AttributedRun(point=point, records=records, timings=timings)


# -- the join -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Join:
    """Records and their stamps lines (:func:`join`)."""

    pairs: list[tuple[metrics.RequestRecord, Mapping[str, Any]]]
    ambiguous: int
    """Pairs assigned in order among several that fit (module docstring)."""
    records_unjoined: int
    """Completed records that no line fits."""
    lines_unjoined: int
    """Lines of the point's time that fit no record."""


def _window(timing: StreamTiming | None) -> tuple[int, int] | None:
    """When the frontend can have received the request: connection in hand to head read."""
    if timing is None or not (timing.acquired_ns and timing.head_ns):
        return None
    return timing.acquired_ns, timing.head_ns


def join(
    records: Iterable[metrics.RequestRecord],
    timings: Mapping[int, StreamTiming],
    lines: Iterable[Mapping[str, Any]],
) -> Join:
    """Each completed record's stamps line (module docstring). Lines received before the
    first record's window (the untimed warm-up's) are not the point's and are left out."""
    completed = [r for r in records if r.ok]
    wanted = sorted(
        (
            (record, window)
            for record in completed
            if (window := _window(timings.get(record.index))) is not None
        ),
        key=lambda item: item[1],
    )
    start_ns = wanted[0][1][0] if wanted else 0
    point_lines = sorted(
        (
            line
            for line in lines
            if line.get("outcome") == "ok" and (line.get("frontend_received_ns") or 0) >= start_ns
        ),
        key=lambda line: int(line["frontend_received_ns"]),
    )
    received = [int(line["frontend_received_ns"]) for line in point_lines]
    candidates = []
    for record, (low, high) in wanted:
        first, last = bisect.bisect_left(received, low), bisect.bisect_right(received, high)
        tokens = record.output_tokens
        candidates.append([i for i in range(first, last) if point_lines[i].get("tokens") == tokens])
    assigned = _assign(candidates)
    return Join(
        pairs=[(wanted[p][0], point_lines[i]) for p, (i, _) in sorted(assigned.items())],
        ambiguous=sum(ambiguous for _, ambiguous in assigned.values()),
        records_unjoined=len(completed) - len(assigned),
        lines_unjoined=len(point_lines) - len(assigned),
    )


def _assign(candidates: Sequence[Sequence[int]]) -> dict[int, tuple[int, bool]]:
    """Position -> (its line, whether it was chosen among several). A position with one line
    left takes it, which may leave one to another; positions still with several take the
    first left, in order."""
    assigned: dict[int, tuple[int, bool]] = {}
    taken: set[int] = set()
    settled = True
    while settled:
        settled = False
        for position, found in enumerate(candidates):
            left = [i for i in found if i not in taken]
            if position not in assigned and len(left) == 1:
                assigned[position] = (left[0], False)
                taken.add(left[0])
                settled = True
    for position, found in enumerate(candidates):
        left = [i for i in found if i not in taken]
        if position not in assigned and left:
            assigned[position] = (left[0], True)
            taken.add(left[0])
    return assigned


# -- the comparison -----------------------------------------------------------------------------


def truth_ms(record: metrics.RequestRecord, line: Mapping[str, Any]) -> dict[str, float]:
    """The request's stages from the frontend's stamps (module docstring), ms."""
    arrived = int(line["engine_arrived_ns"])
    scheduled = int(line["engine_scheduled_ns"])
    last = int(line["engine_last_token_ns"])
    own_ms = record.queue_wait_ms + (record.pool_wait_ms or 0.0)
    return {
        "queue": (scheduled - arrived) / 1e6,
        "model": (last - scheduled) / 1e6,
        "outside": record.e2e_ms - own_ms - (last - arrived) / 1e6,
    }


def attributed_ms(record: metrics.RequestRecord) -> dict[str, float | None]:
    """The request's stages as the generator attributed them from the server's report."""
    return {
        "queue": record.server_queue_ms,
        "model": record.server_model_ms,
        "outside": record.outside_engine_ms,
    }


def agrees(attributed: float | None, truth: float) -> bool:
    """Within :data:`BOUND_SHARE` of the truth, or :data:`BOUND_MS`."""
    if attributed is None:
        return False
    return abs(attributed - truth) <= max(BOUND_SHARE * abs(truth), BOUND_MS)


def _ratio(attributed: float | None, truth: float) -> float | None:
    return attributed / truth if attributed is not None and truth else None


def per_request(pairs: Sequence[tuple[metrics.RequestRecord, Mapping[str, Any]]]) -> dict[str, Any]:
    """Per stage: the median attributed and true figures, their ratio, the largest difference
    of one request, the share of requests within bounds, and whether the medians agree."""
    out: dict[str, Any] = {}
    for stage in STAGES:
        both = [(attributed_ms(r)[stage], truth_ms(r, line)[stage]) for r, line in pairs]
        truths = [t for _, t in both]
        given = [a for a, _ in both if a is not None]
        attributed = statistics.median(given) if given else None
        truth = statistics.median(truths) if truths else 0.0
        out[stage] = {
            "attributed_p50_ms": attributed,
            "truth_p50_ms": truth,
            "ratio": _ratio(attributed, truth),
            "max_abs_diff_ms": max((abs(a - t) for a, t in both if a is not None), default=None),
            "requests": len(both),
            "attributed_requests": len(given),
            "within_share": sum(agrees(a, t) for a, t in both) / len(both) if both else 0.0,
            "within": bool(both) and len(given) == len(both) and agrees(attributed, truth),
        }
    return out


def per_point(
    point: Mapping[str, Any], pairs: Sequence[tuple[metrics.RequestRecord, Mapping[str, Any]]]
) -> dict[str, Any]:
    """Per stage: the point's means from the server's histograms (scraped before and after the
    point; :func:`~inferwire.load.attribution.session.point_split`) against the true means
    over the same requests."""
    prometheus = point.get("attribution", {}).get("sources", {}).get(PROMETHEUS, {})
    split = prometheus.get("split") or {}
    counts = [s.get("count") for s in (prometheus.get("stages") or {}).values()]
    out: dict[str, Any] = {
        "state": prometheus.get("state"),
        "server_count": max((c for c in counts if c is not None), default=None),
        "requests": len(pairs),
        "e2e_mean_ms": split.get("e2e_mean_ms"),
    }
    for stage in STAGES:
        truths = [truth_ms(r, line)[stage] for r, line in pairs]
        truth = statistics.fmean(truths) if truths else 0.0
        attributed = split.get(f"{stage}_mean_ms")
        out[stage] = {
            "attributed_mean_ms": attributed,
            "truth_mean_ms": truth,
            "ratio": _ratio(attributed, truth),
            "abs_diff_ms": None if attributed is None else abs(attributed - truth),
            "within": bool(truths) and agrees(attributed, truth),
        }
    return out


def compare(run: AttributedRun, lines: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The figures of one run against its stamps (``extra_info`` of the benchmark), with
    ``correct``: every stream whole, every completed request joined to its line, and every
    stage within bounds, per request (medians) and per point (means)."""
    point = run.point
    joined = join(run.records, run.timings, lines)
    requests = per_request(joined.pairs)
    means = per_point(point, joined.pairs)
    whole = point["requests_failed"] == 0 and metrics.integrity_violations(point["integrity"]) == 0
    within = all(requests[s]["within"] and means[s]["within"] for s in STAGES)
    return {
        "requests_completed": point["requests_completed"],
        "requests_failed": point["requests_failed"],
        "errors": point["errors"],
        "e2e_p50_ms": point["e2e"]["p50_ms"],
        "join": {
            "pairs": len(joined.pairs),
            "ambiguous": joined.ambiguous,
            "records_unjoined": joined.records_unjoined,
            "lines_unjoined": joined.lines_unjoined,
        },
        "per_request": requests,
        "per_point": means,
        "attribution_text": point.get("attribution", {}).get("text"),
        "whole": whole,
        "within_bounds": within,
        "correct": whole and joined.records_unjoined == 0 and bool(joined.pairs) and within,
    }
