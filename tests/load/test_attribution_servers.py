"""``inferwire load --url`` against servers it did not write (tests/helpers/fake_engines.py: vLLM,
SGLang, TGI and Triton, each a child process on 127.0.0.1 with KNOWN delays), end to end through
the command: the report must recover each stage the server reports, within the bounds stated
beside each assertion, from every source (vLLM's per-request metrics object, each engine's
Prometheus families, vLLM's spans), and a bad source must be a note and no figure, the run going
on.

The bounds (:class:`Known`): the fake sleeps each stage between ``time.monotonic_ns()`` stamps,
and a sleep never ends early, so every reported stage is at least its delay, for every request;
each sleep ends late by the scheduler's wake-up, so the upper bounds are on the P50 (or a mean),
with room for each of the stage's sleeps on a busy 2-core machine. HDR histograms keep 3
significant digits: a percentile may sit up to 0.1 % below the value recorded, hence :data:`HDR`.
No other wall-clock assertion; the runs are 1 s each, the span waits capped generously.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson
import pytest

from inferwire.cli import main as cli
from tests.helpers.fake_engines import OTHER_BUCKETS_S, Running, running

FRONTEND_MS: Final = 5.0
QUEUE_MS: Final = 10.0
PREFILL_MS: Final = 20.0
DECODE_MS: Final = 3.0
TOKENS: Final = 8
DELAYS: Final = (
    f"--frontend-ms={FRONTEND_MS}",
    f"--queue-ms={QUEUE_MS}",
    f"--prefill-ms={PREFILL_MS}",
    f"--decode-ms={DECODE_MS}",
    f"--tokens={TOKENS}",
)
DECODE_FLOOR_MS: Final = (TOKENS - 1) * DECODE_MS
"""The first token ends the prefill; each further token sleeps ``DECODE_MS``."""
MODEL_FLOOR_MS: Final = PREFILL_MS + DECODE_FLOOR_MS
MODEL: Final = "fake-model"
CLIENT_STAGES: Final = ("lag", "pool_wait", "connect", "write", "wait_head", "first_event", "parse")
HDR: Final = 0.999
"""A percentile of an HDR histogram (3 significant digits) is within 0.1 % of a value in it."""

# The run: 1 s of Poisson arrivals at 20/s (seed 0: 15 requests), one untimed warm-up request
# (so that the fake's --reset-after 3 falls inside the point).
RUN: Final = ("--rate", "20", "--duration", "1", "--warmup", "1", "--quiet")
SPAN_WAIT: Final = ("--span-wait-s", "15")
"""Generous: a point waits only until its spans are in (the fake exports every 100 ms)."""

# -- the bounds, each with its reason -------------------------------------------------------

LATE_P50_MS: Final = 5.0
"""How late one sleep may end, at the median: the scheduler's wake-up, well under 5 ms even with
both cores of the machine saturated (about 4 ms a sleep, measured with two busy loops beside the
run; a fraction of a millisecond on an idle machine)."""
LATE_MEAN_MS: Final = 8.0
"""The same for a mean (Prometheus gives means): one request late by 30 ms moves the mean of 15
by 2 ms, so the allowance is wider than the median's."""
OUTSIDE_ROOM_MS: Final = 15.0
"""Outside the engine is the frontend's sleep plus HTTP both ways, JSON and the client's socket
reads: at most 15 ms of those at the median, or in the mean."""


@dataclass(frozen=True, slots=True)
class Known:
    """A stage the fake sleeps through: at least ``floor_ms`` (a sleep never ends early), at most
    that plus each of its ``sleeps`` ending late, plus ``room_ms`` of work that is not a sleep."""

    floor_ms: float
    sleeps: int
    room_ms: float = 0.0

    def bounds(self, late_ms: float) -> tuple[float, float]:
        return self.floor_ms * HDR, self.floor_ms + self.sleeps * late_ms + self.room_ms

    def p50(self) -> tuple[float, float]:
        return self.bounds(LATE_P50_MS)

    def mean(self) -> tuple[float, float]:
        return self.bounds(LATE_MEAN_MS)


QUEUE: Final = Known(QUEUE_MS, 1)
PREFILL: Final = Known(PREFILL_MS, 1)
DECODE: Final = Known(DECODE_FLOOR_MS, TOKENS - 1)
MODEL_TIME: Final = Known(MODEL_FLOOR_MS, TOKENS)
"""Prefill and decode: inference (vLLM, TGI), compute infer (Triton)."""
FRONTEND: Final = Known(FRONTEND_MS, 1)
OUTSIDE: Final = Known(FRONTEND_MS, 1, OUTSIDE_ROOM_MS)
"""Outside the engine, where the server reports no frontend (vLLM, Triton) or reports it
beside the engine (TGI's validation): at least the frontend's sleep."""
ENGINE_E2E: Final = Known(QUEUE_MS + MODEL_FLOOR_MS, TOKENS + 1)
"""From the engine's arrival, after the frontend (vLLM's e2e, Triton's request duration)."""
RECEIPT_E2E: Final = Known(FRONTEND_MS + QUEUE_MS + MODEL_FLOOR_MS, TOKENS + 2)
"""From the request's receipt, the frontend inside (SGLang's e2e)."""


def within(value: float | None, bounds: tuple[float, float], what: str) -> None:
    low, high = bounds
    assert value is not None, f"{what}: no figure"
    assert low <= value <= high, f"{what}: {value:.3f} ms, not within [{low:.3f}, {high:.3f}]"


# -- servers and runs -------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def otlp_address() -> str:
    """Where each run's --otlp-listen receives the vLLM fake's spans."""
    return f"127.0.0.1:{_free_port()}"


@pytest.fixture(scope="module")
def vllm(otlp_address: str) -> Iterator[Running]:
    """The vLLM fake with every source on: metrics object, /metrics, spans (every 100 ms to
    ``otlp_address``, dropped while no run listens there)."""
    endpoint = f"--otlp-endpoint=http://{otlp_address}/v1/traces"
    with running("vllm", *DELAYS, "--per-request-metrics", endpoint, "--span-batch-ms=100") as e:
        yield e


@dataclass(frozen=True, slots=True)
class Run:
    point: dict[str, Any]
    records: list[dict[str, Any]]
    output: str
    """What the command printed (stdout and stderr)."""

    @property
    def attribution(self) -> dict[str, Any]:
        found: dict[str, Any] = self.point["attribution"]
        return found

    @property
    def per_request(self) -> dict[str, Any]:
        found: dict[str, Any] = self.attribution["per_request"]
        return found

    def source(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.attribution["sources"][name]
        return found

    def notes(self) -> list[str]:
        """Every note of the point: the split's and each source's."""
        sources = self.attribution["sources"].values()
        return [*self.attribution["notes"], *(n for s in sources for n in s.get("notes", ()))]

    def p50(self, stage: str) -> float | None:
        value: float | None = (self.per_request.get(stage) or {}).get("p50_ms")
        return value


def load(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    engine: Running,
    *args: str,
    api: str = "openai-chat",
) -> Run:
    """``inferwire load --url`` against ``engine``: it exits 0 and every request completes."""
    out, records = tmp_path / "load.json", tmp_path / "records.jsonl"
    capsys.readouterr()
    argv = ["load", "--url", engine.url, "--api", api, *RUN, *args]
    code = cli.main([*argv, "--out", str(out), "--records", str(records)])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    (point,) = orjson.loads(out.read_bytes())["points"]
    scheduled = point["requests_scheduled"]
    assert scheduled >= 10, point  # 15 with seed 0: enough for a P50
    assert point["requests_completed"] == scheduled, point["error_examples"]
    assert point["requests_failed"] == 0
    lines = records.read_bytes().splitlines()
    rows = [orjson.loads(line) for line in lines if line.strip()]
    assert len(rows) == scheduled
    assert all(r["ok"] and r["output_tokens"] == TOKENS for r in rows)  # the decode's N
    return Run(point, rows, printed.out + printed.err)


def split_line(run: Run) -> str:
    """The summary's second line: ``  split (...)`` or ``  split: ...``."""
    lines = [line for line in run.output.splitlines() if line.startswith("  split")]
    assert len(lines) == 1, run.output
    assert lines[0].strip() == run.attribution["text"]
    return lines[0]


def assert_per_request(run: Run, source: str) -> None:
    """Every request split from ``source``; each stage at least its delay for every request,
    its P50 within its bound."""
    requests = run.point["requests_scheduled"]
    assert run.per_request["requests"] == requests
    assert run.per_request["sources"] == {source: requests}
    within(run.p50("queue"), QUEUE.p50(), "queue P50")
    within(run.p50("prefill"), PREFILL.p50(), "prefill P50")
    within(run.p50("decode"), DECODE.p50(), "decode P50")
    within(run.p50("inference"), MODEL_TIME.p50(), "inference P50")
    # vLLM reports no frontend: the split leaves it outside the engine
    within(run.p50("outside"), OUTSIDE.p50(), "outside the engine P50")
    share = run.per_request["outside_share_of_e2e"]
    assert 0 < share < 1
    assert set(CLIENT_STAGES) <= run.attribution["client"].keys()
    for record in run.records:
        # the client's own stamps: the fake starts its frontend when it has read the request
        # and writes the head after it, the first token after the queue and the prefill. The
        # write stage ends when the client gets the CPU back, which on a busy host can be after
        # the server has read the request, and a client slow to read the head moves time from
        # first_event into wait_head: only the sums from the write's start have whole floors
        sent = record["write_ms"] + record["wait_head_ms"]
        assert sent >= FRONTEND_MS * HDR
        assert sent + record["first_event_ms"] >= (FRONTEND_MS + QUEUE_MS + PREFILL_MS) * HDR
        assert record["server_source"] == source
        assert record["trace_id"] is not None
        # a sleep never ends early: the floors hold for every request, not just the median
        assert record["server_queue_ms"] >= QUEUE_MS * HDR
        assert record["server_prefill_ms"] >= PREFILL_MS * HDR
        assert record["server_decode_ms"] >= DECODE_FLOOR_MS * HDR
        model = record["server_prefill_ms"] + record["server_decode_ms"]
        assert record["server_model_ms"] == pytest.approx(model, abs=1e-3)
        assert record["outside_engine_ms"] >= FRONTEND_MS * HDR
        engine = record["server_queue_ms"] + model + record["outside_engine_ms"]
        assert engine <= record["e2e_ms"] + 1e-3  # the split never spends more than the E2E
    assert f"split ({source}, {requests} requests, P50 ms)" in split_line(run)


def prometheus_stages(run: Run, engine: str) -> dict[str, Any]:
    """The point's Prometheus figures, each over exactly the point's requests (the warm-up is
    before the first scrape, and the fakes record a request before its last chunk)."""
    prom = run.source("prometheus")
    assert prom["state"] == "used", prom
    assert prom["engine"] == engine
    stages: dict[str, Any] = prom["stages"]
    for figures in stages.values():
        assert figures["count"] == run.point["requests_scheduled"]
    return stages


def mean(stages: dict[str, Any], stage: str) -> float | None:
    value: float | None = stages[stage]["mean_ms"]
    return value


# -- vLLM: all three sources -------------------------------------------------------------------


def test_vllm_metrics_object_per_request_and_prometheus_per_point(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], vllm: Running, otlp_address: str
) -> None:
    run = load(tmp_path, capsys, vllm, "--otlp-listen", otlp_address, *SPAN_WAIT)
    assert_per_request(run, "metrics-object")
    assert run.notes() == []
    assert run.source("metrics-object")["state"] == "used"

    stages = prometheus_stages(run, "vllm")
    within(mean(stages, "queue"), QUEUE.mean(), "queue mean (/metrics)")
    within(mean(stages, "prefill"), PREFILL.mean(), "prefill mean (/metrics)")
    within(mean(stages, "decode"), DECODE.mean(), "decode mean (/metrics)")
    within(mean(stages, "inference"), MODEL_TIME.mean(), "inference mean (/metrics)")
    # vLLM's e2e starts at the engine's arrival, after the frontend: queue and model time only
    within(mean(stages, "server_e2e"), ENGINE_E2E.mean(), "server e2e mean")
    # the two sources read the same stamps: their means agree to the rounding
    for stage in ("queue", "prefill", "decode"):
        assert mean(stages, stage) == pytest.approx(run.per_request[stage]["mean_ms"], abs=0.01)
    split = run.source("prometheus")["split"]
    within(split["queue_mean_ms"], QUEUE.mean(), "split queue mean")
    within(split["model_mean_ms"], MODEL_TIME.mean(), "split model mean")
    within(split["outside_mean_ms"], OUTSIDE.mean(), "split outside mean")

    # the spans came for every request and agree with the metrics object they check
    spans = run.source("otlp")
    assert spans["state"] == "cross-check"
    assert spans["requests_without_spans"] == 0
    assert spans["cross_checked"] == run.point["requests_scheduled"]
    assert spans["cross_check_median_abs_ms"] < 0.01


def test_vllm_spans_per_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], vllm: Running, otlp_address: str
) -> None:
    argv = ("--request-metrics", "off", "--server-metrics", "off")
    run = load(tmp_path, capsys, vllm, *argv, "--otlp-listen", otlp_address, *SPAN_WAIT)
    assert_per_request(run, "otlp")
    assert run.notes() == []
    spans = run.source("otlp")
    assert spans["state"] == "used"
    assert spans["requests_joined"] == run.point["requests_scheduled"]
    assert spans["requests_without_spans"] == 0
    assert spans["spans_received"] >= spans["requests_joined"]
    assert run.source("metrics-object") == {"state": "off"}
    assert run.source("prometheus") == {"state": "off"}


def test_no_attribution(tmp_path: Path, capsys: pytest.CaptureFixture[str], vllm: Running) -> None:
    run = load(tmp_path, capsys, vllm, "--no-attribution")
    assert "attribution" not in run.point
    assert "split" not in run.output
    assert all(r.get("server_source") is None for r in run.records)


# -- SGLang, TGI, Triton: Prometheus only -------------------------------------------------------


def test_sglang_queue_and_its_end_to_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with running("sglang", *DELAYS) as engine:
        run = load(tmp_path, capsys, engine)
    stages = prometheus_stages(run, "sglang")
    within(mean(stages, "queue"), QUEUE.mean(), "queue mean")
    # SGLang's e2e starts at the tokenizer manager's receipt: the frontend is inside it
    within(mean(stages, "server_e2e"), RECEIPT_E2E.mean(), "server e2e mean")
    # no model time published: no split is made up from the end to end
    assert {"prefill", "decode", "inference"}.isdisjoint(stages)
    assert run.source("prometheus")["split"] is None
    assert any("no per-request time of the model" in n for n in run.notes())
    assert run.per_request["requests"] == 0
    assert "split: no server report" in split_line(run)


def test_tgi_validation_is_its_frontend(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with running("tgi", *DELAYS) as engine:
        run = load(tmp_path, capsys, engine)
    stages = prometheus_stages(run, "tgi")
    assert stages["frontend"]["family"] == "tgi_request_validation_duration"
    within(mean(stages, "frontend"), FRONTEND.mean(), "validation mean")
    within(mean(stages, "queue"), QUEUE.mean(), "queue mean")
    within(mean(stages, "inference"), MODEL_TIME.mean(), "inference mean")
    split = run.source("prometheus")["split"]
    assert split["prefill_mean_ms"] is None  # TGI times prefill and decode as one
    within(split["model_mean_ms"], MODEL_TIME.mean(), "split model mean")
    # the validation is the router's, not the engine's: it stays outside the engine
    within(split["outside_mean_ms"], OUTSIDE.mean(), "split outside mean")
    assert "split (prometheus tgi, means ms)" in split_line(run)


def test_triton_from_its_counters_on_its_metrics_port(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with running("triton", *DELAYS) as engine:
        metrics = ("--server-metrics", engine.metrics_url, "--model", MODEL)
        run = load(tmp_path, capsys, engine, *metrics, api="kserve-v2-http")
    stages = prometheus_stages(run, "triton")
    assert stages["queue"]["family"] == "nv_inference_queue_duration_us"
    within(mean(stages, "queue"), QUEUE.mean(), "queue mean")
    # compute infer: from the inputs taken (at scheduling, in the fake) to the last token
    within(mean(stages, "inference"), MODEL_TIME.mean(), "compute infer mean")
    within(mean(stages, "server_e2e"), ENGINE_E2E.mean(), "request duration mean")
    split = run.source("prometheus")["split"]
    within(split["outside_mean_ms"], OUTSIDE.mean(), "split outside mean")
    assert "split (prometheus triton, means ms)" in split_line(run)


def test_other_buckets_are_still_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Buckets none of the engines uses are valid: the means are as tight as ever; a P50 can
    only be placed within the bucket that holds it (as histogram_quantile does)."""
    with running("vllm", *DELAYS, "--metrics-mode=other-buckets") as engine:
        run = load(tmp_path, capsys, engine)
    stages = prometheus_stages(run, "vllm")
    edges_ms = (0.0, *(b * 1000 for b in OTHER_BUCKETS_S))

    def bucket_of(bounds: tuple[float, float]) -> tuple[float, float]:
        low, high = bounds
        return max(e for e in edges_ms if e <= low), min(e for e in edges_ms if e >= high)

    for stage, bounds in (
        ("queue", QUEUE.mean()),
        ("prefill", PREFILL.mean()),
        ("decode", DECODE.mean()),
        ("inference", MODEL_TIME.mean()),
    ):
        within(mean(stages, stage), bounds, f"{stage} mean")
        within(stages[stage]["p50_ms"], bucket_of(bounds), f"{stage} P50 (in its bucket)")
    assert run.source("prometheus")["split"] is not None


# -- bad sources: a note, no figure, the run goes on --------------------------------------------


PROM: Final = "prometheus"
OBJ: Final = "metrics-object"
OTLP: Final = "otlp"


@dataclass(frozen=True, slots=True)
class Bad:
    server: tuple[str, ...]
    """The vLLM fake's switches (none: the shared ``vllm`` fixture)."""
    load: tuple[str, ...]
    source: str
    state: str
    note: str
    """Words of one of the point's notes."""


OBJECT: Final = ("--per-request-metrics",)
NO_SCRAPE: Final = ("--server-metrics", "off")
SPANS_ONLY: Final = ("--request-metrics", "off", *NO_SCRAPE, "--span-wait-s", "1")
UNREACHABLE: Final = ("--server-metrics", "http://127.0.0.1:1/metrics")

BAD: Final = {
    # id: (the vLLM fake's switches, the run's, the source, its state, words of its note)
    "metrics-404": Bad(("--metrics-mode=404",), (), PROM, "failed", "404 Not Found"),
    "metrics-unreachable": Bad((), UNREACHABLE, PROM, "failed", "unreachable"),
    "metrics-garbage": Bad(("--metrics-mode=garbage",), (), PROM, "failed", "not Prometheus"),
    # every family back to zero when the 4th request arrives: the warm-up's 1, then the point's 3
    "metrics-reset": Bad(("--metrics-mode=reset", "--reset-after=3"), (), PROM, "no stages",
                         "was reset during the point"),
    "object-nulls": Bad((*OBJECT, "--metrics-object-mode=nulls"), NO_SCRAPE, OBJ, "refused",
                        "refused (every stage null)"),
    "object-negative": Bad((*OBJECT, "--metrics-object-mode=negative"), NO_SCRAPE, OBJ,
                           "refused", "refused (negative)"),
    "object-too-large": Bad((*OBJECT, "--metrics-object-mode=too-large"), NO_SCRAPE, OBJ,
                            "refused", "refused (longer than the request)"),
    "spans-never": Bad(("--spans-mode=never",), SPANS_ONLY, OTLP, "no spans joined",
                       "got no server span"),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD.values(), ids=BAD.keys())
def test_a_bad_source_is_a_note_and_no_figure(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
    otlp_address: str,
    case: Bad,
) -> None:
    load_args = [*case.load]
    if case.source == OTLP:
        load_args += ["--otlp-listen", otlp_address]
    if case.server:
        with running("vllm", *DELAYS, *case.server) as engine:
            run = load(tmp_path, capsys, engine, *load_args)
    else:
        run = load(tmp_path, capsys, request.getfixturevalue("vllm"), *load_args)
    requests = run.point["requests_scheduled"]
    found = run.source(case.source)
    assert found["state"] == case.state, found
    assert any(case.note in note for note in run.notes()), run.notes()
    # no figure from it, anywhere: not per point, not per request, not in the summary line
    assert case.source not in run.per_request["sources"]
    assert all(r["server_source"] != case.source for r in run.records)
    assert case.source not in split_line(run)
    if case.source == PROM:
        assert not found.get("stages")
        assert not found.get("split")
    if "--metrics-mode=reset" in case.server:
        assert "vllm:request_queue_time_seconds" in found["dropped"]
    if case.source == OBJ:
        assert found["refused"] == requests
        assert run.per_request["requests"] == 0
        assert all(r["server_queue_ms"] is None for r in run.records)
    if case.source == OTLP:
        assert found["requests_without_spans"] == requests
        assert found["requests_joined"] == 0
    if not case.server:  # the shared server's other sources go on
        assert run.per_request["sources"] == {OBJ: requests}
