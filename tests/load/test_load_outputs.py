"""The outputs of ``inferwire load`` beside its JSON: the per-request records (CSV, JSONL), the
timeline of ITL and throughput, the histograms' CDFs, and the one-page HTML report; checked
against real runs on a real server, and against values computed here another way."""

from __future__ import annotations

import asyncio
import csv
import json
import socket
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferwire.cli import main as cli
from inferwire.load import html_report, load_command, metrics, openloop, records
from inferwire.load.metrics import Histogram, Recorder, RequestRecord
from inferwire.load.timeline import MAX_BUCKETS, Timeline, bucket_width_s
from inferwire.transports import server_process

RATES = (40.0, 80.0)


@pytest.fixture(scope="module")
def server() -> Iterator[server_process.ServerProcess]:
    with server_process.serve("http1", "orjson", "--prefill-ms", "5", "--decode-ms", "1") as s:
        yield s


def _argv(server: server_process.ServerProcess, *more: str) -> list[str]:
    assert server.process is not None
    argv = ["load", "--transport", "http1", "--address", server.address]
    argv += ["--server-pid", str(server.process.pid), "--workload", "stream-256"]
    argv += ["--max-tokens", "24", "--duration", "1.5", "--warmup", "2", "--quiet"]
    return [*argv, *more]


@pytest.fixture(scope="module")
def jsonl_run(
    server: server_process.ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """Two points, with records as JSONL, the JSON report and the page."""
    folder = tmp_path_factory.mktemp("jsonl-run")
    paths = {"records": folder / "records.jsonl", "out": folder / "load.json"}
    paths["html"] = folder / "page" / "load.html"  # a folder that does not exist yet
    rates = ",".join(f"{r:g}" for r in RATES)
    argv = _argv(server, "--rate", rates, "--slo-ttft-ms", "500")
    argv += ["--records", str(paths["records"]), "--out", str(paths["out"])]
    assert cli.main([*argv, "--html", str(paths["html"])]) == 0
    return paths


def _points(path: Path) -> list[dict[str, Any]]:
    report = json.loads(path.read_text())
    assert len(report["points"]) >= 1
    return list(report["points"])


def _check_records(rows: list[dict[str, Any]], points: list[dict[str, Any]]) -> None:
    """One record per scheduled request, each point's complete, consistent with the JSON."""
    assert len(rows) == sum(p["requests_scheduled"] for p in points)
    for index, point in enumerate(points):
        mine = [r for r in rows if r["point"] == index]
        assert sorted(r["index"] for r in mine) == list(range(point["requests_scheduled"]))
        assert {r["rate_rps"] for r in mine} == {point["rate_rps"]}
        ok = [r for r in mine if r["ok"]]
        assert len(ok) == point["requests_completed"] > 0
        assert sum(r["output_tokens"] for r in ok) == point["output_tokens"]
        for r in ok:
            assert r["error"] is None
            assert 0 < r["ttft_ms"] <= r["e2e_ms"]
            assert r["output_tokens"] == 24
            assert r["chunks"] >= 1
            assert r["queue_wait_ms"] >= 0
            assert r["intended_s"] >= 0
            # a stream of output alone: its first token is its first output
            assert r["ttfot_ms"] == r["ttft_ms"]
            assert (r["reasoning_tokens"], r["tool_calls"]) == (0, 0)
            assert 1 <= r["max_tokens_per_chunk"] <= r["output_tokens"]
        assert sum(point["tokens_per_chunk"].values()) == sum(r["chunks"] for r in ok)
        assert point["ttfot"]["count"] == point["ttft"]["count"] == len(ok)
        assert max(r["e2e_ms"] for r in ok) == pytest.approx(point["e2e"]["max_ms"], rel=1e-3)


def test_jsonl_records_one_per_request(jsonl_run: dict[str, Path]) -> None:
    lines = jsonl_run["records"].read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    for row in rows:
        assert tuple(row) == records.FIELDS
    _check_records(rows, _points(jsonl_run["out"]))


def test_csv_records_one_per_request(server: server_process.ServerProcess, tmp_path: Path) -> None:
    path, out = tmp_path / "records.csv", tmp_path / "load.json"
    argv = _argv(server, "--rate", "50", "--records", str(path), "--out", str(out))
    assert cli.main(argv) == 0
    with path.open(newline="") as file:
        reader = csv.reader(file)
        assert tuple(next(reader)) == records.FIELDS
        rows = [_typed(dict(zip(records.FIELDS, row, strict=True))) for row in reader]
    _check_records(rows, _points(out))


def _typed(row: dict[str, str]) -> dict[str, Any]:
    """A CSV row back to the values of the JSONL (an empty cell is None)."""
    kinds: dict[str, Callable[[str], Any]] = {
        "index": int, "output_tokens": int, "chunks": int, "input_tokens": int, "point": int,
        "ok": lambda s: {"True": True, "False": False}[s],
        "measured": lambda s: {"True": True, "False": False}[s],
        "error": str, "trace_id": str, "server_source": str,
    }  # fmt: skip
    return {k: None if v == "" else kinds.get(k, float)(v) for k, v in row.items()}


def test_records_to_stdout(
    server: server_process.ServerProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(_argv(server, "--rate", "30", "--records", "-")) == 0
    captured = capsys.readouterr()
    rows = [json.loads(line) for line in captured.out.splitlines()]  # nothing but records
    assert rows
    assert sum(r["ok"] for r in rows) == len(rows)
    assert "rate 30/s" in captured.err  # the summary line moved aside


def test_bad_records_name_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["load", "--transport", "tcp", "--address", "127.0.0.1:9", "--records", "r.txt"]
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    assert ".csv, .jsonl" in capsys.readouterr().err
    with pytest.raises(records.RecordsError):
        records.RecordWriter.open("records.parquet")


def test_timeline_sums_to_the_point(jsonl_run: dict[str, Path]) -> None:
    for point in _points(jsonl_run["out"]):
        timeline = point["timeline"]
        buckets = timeline["buckets"]
        assert 1 <= buckets <= MAX_BUCKETS
        assert buckets * timeline["bucket_s"] >= point["duration_s"] - timeline["bucket_s"]
        for key in ("itl_p50_ms", "itl_p99_ms", "itl_tokens", "tokens", "completed", "failed"):
            assert len(timeline[key]) == buckets, key
        assert sum(timeline["tokens"]) == point["output_tokens"]
        assert sum(timeline["completed"]) == point["requests_completed"]
        assert sum(timeline["failed"]) == point["requests_failed"]
        assert sum(timeline["itl_tokens"]) == point["itl_per_token"]["count"]
        # some bucket's P99 is at least the whole point's, and none above its maximum; some
        # bucket's P50 is at most the point's (HDR's values are within 0.1%, at a microsecond)
        itl = point["itl_per_token"]
        p99s = [v for v in timeline["itl_p99_ms"] if v is not None]
        assert max(p99s) >= itl["p99_ms"] / 1.002 - 1e-3
        assert max(p99s) <= itl["max_ms"] + 1e-4  # the timeline's ms have 4 decimals
        assert min(v for v in timeline["itl_p50_ms"] if v is not None) <= itl["p50_ms"] + 1e-3


def test_cdfs_in_the_report(jsonl_run: dict[str, Path]) -> None:
    for point in _points(jsonl_run["out"]):
        for name in ("ttft", "tpot", "itl_per_token", "itl_per_chunk", "e2e", "send_lag"):
            cdf = point[name]["cdf"]
            assert 2 <= len(cdf) <= 200
            values = [v for v, _ in cdf]
            fractions = [f for _, f in cdf]
            assert values == sorted(values)
            assert len(set(values)) == len(values)
            assert fractions == sorted(fractions)
            assert fractions[-1] == 1.0
            at_half = next(v for v, f in cdf if f >= 0.5)
            assert at_half == pytest.approx(point[name]["p50_ms"], rel=1e-9)


# -- the page -----------------------------------------------------------------------------


class _Page(HTMLParser):
    """The table's cells by (metric, point), the figures by kind, and what must not be there."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: dict[tuple[str, int], str] = {}
        self.figures: list[tuple[str, int]] = []
        self.svgs = 0
        self.external: list[str] = []
        self._cell: tuple[str, int] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "td" and "data-metric" in found:
            self._cell = (str(found["data-metric"]), int(str(found["data-point"])))
            self.cells[self._cell] = ""
        elif tag == "figure":
            self.figures.append((str(found["class"]), int(str(found["data-point"]))))
        elif tag == "svg":
            self.svgs += 1
        if tag in ("script", "link", "img", "iframe") or "src" in found:
            self.external.append(tag)
        for name, value in attrs:
            if name.endswith("href") and value and not value.startswith("#"):
                self.external.append(f"{tag} {name}={value}")

    def handle_endtag(self, tag: str) -> None:
        if tag == "td":
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self.cells[self._cell] += data


def _parsed(page: str) -> _Page:
    parser = _Page()
    parser.feed(page)
    parser.close()
    return parser


def _value(point: dict[str, Any], metric: str) -> Any:
    if metric == "integrity.violations":
        return metrics.integrity_violations(point["integrity"])
    value: Any = point
    for key in metric.split("."):
        value = value[key]
    return value


def _check_table(page: _Page, points: list[dict[str, Any]]) -> int:
    """Every numeric cell equals the JSON's value (to its printed digits); returns how many."""
    checked = 0
    for (metric, index), text in page.cells.items():
        if metric in (
            "errors",
            "concurrency",
            "token_count",
            "chunk_token_count",
            "reasoning_token_count",
        ):
            continue
        value = _value(points[index], metric)
        if value is None:
            assert text == "-", (metric, index)
        elif isinstance(value, int):
            assert text == str(value), (metric, index)
        else:
            decimals = len(text.partition(".")[2])
            assert abs(float(text) - value) <= 0.5 * 10**-decimals + 1e-12, (metric, text, value)
            assert decimals >= 3 or abs(value) >= 10  # printed to 4 significant digits or more
        checked += 1
    return checked


def test_the_page_shows_the_json(jsonl_run: dict[str, Path]) -> None:
    page_text = jsonl_run["html"].read_text()
    points = _points(jsonl_run["out"])
    page = _parsed(page_text)
    assert page.external == []  # self-contained
    assert [f for f in page.figures if f[0] == "cdf"] == [("cdf", i) for i in range(len(points))]
    timelines = [f for f in page.figures if f[0] == "timeline"]
    assert timelines == [("timeline", i) for i in range(len(points))]
    assert page.svgs == 2 * len(points)
    assert _check_table(page, points) >= 25 * len(points)
    for index in range(len(points)):
        assert page.cells[("errors", index)] == "none"
        assert page.cells[("ttft.p99_ms", index)] != "-"
        assert page.cells[("goodput_rps", index)] != "-"


def test_load_report_rebuilds_the_same_page(jsonl_run: dict[str, Path], tmp_path: Path) -> None:
    """The page comes from the JSON alone: rebuilt from the saved file, it is the same."""
    rebuilt = tmp_path / "again.html"
    assert cli.main(["load-report", str(jsonl_run["out"]), "--html", str(rebuilt)]) == 0
    assert rebuilt.read_text() == jsonl_run["html"].read_text()


def test_load_report_refuses_other_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "other.json"
    other.write_text('{"benchmarks": []}')
    assert cli.main(["load-report", str(other), "--html", str(tmp_path / "x.html")]) != 0
    assert "not a report of `inferwire load`" in capsys.readouterr().err


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_a_failed_point_renders(tmp_path: Path) -> None:
    """Every request refused: the point has no latency, and the page says so, inventing none."""
    out, page_path = tmp_path / "failed.json", tmp_path / "failed.html"
    argv = ["load", "--transport", "http1", "--address", f"127.0.0.1:{_closed_port()}"]
    argv += ["--warmup", "0", "--requests", "5", "--rate", "50", "--quiet"]
    argv += ["--out", str(out), "--html", str(page_path)]
    assert cli.main(argv) == 1  # all failed
    (point,) = _points(out)
    assert point["requests_failed"] == 5
    assert point["ttft"]["cdf"] == []
    assert sum(point["timeline"]["failed"]) == 5
    assert sum(point["timeline"]["tokens"]) == 0
    page = _parsed(page_path.read_text())
    assert ("cdf", 0) in page.figures
    assert page.cells[("ttft.p50_ms", 0)] == "-"
    assert page.cells[("requests_failed", 0)] == "5"
    assert "ConnectError" in page.cells[("errors", 0)]
    _check_table(page, [point])


def test_a_report_without_the_new_keys_renders() -> None:
    """A report of before the timeline and the CDFs (or cut short): dashes, no error."""
    recorder = Recorder()
    recorder.completed_stream(
        intended_ns=0, first_token_ns=10**7, done_ns=3 * 10**7, output_tokens=3,
        gaps_ns=[10**7, 10**7], chunk_tokens=[1, 1],
    )  # fmt: skip
    point = recorder.summary(start_ns=0, scheduled=1)
    del point["timeline"], point["ttft"]["cdf"], point["goodput_rps"], point["integrity"]
    page = _parsed(html_report.render({"kind": "inferwire-load", "points": [point]}))
    assert page.cells[("goodput_rps", 0)] == "-"
    assert page.cells[("integrity.verified", 0)] == "-"
    assert page.cells[("rate_rps", 0)] == "-"
    assert float(page.cells[("tpot.p50_ms", 0)]) == pytest.approx(10, rel=1e-3)
    assert [kind for kind, _ in page.figures] == ["cdf", "timeline"]
    assert _parsed(html_report.render({})).figures == []


# -- the parts, against values computed another way ----------------------------------------


def test_timeline_against_brute_force() -> None:
    rng = np.random.default_rng(11)
    start_ns = 5 * 10**12
    timeline = Timeline()
    arrivals: list[tuple[int, int, int]] = []  # (time after start, gap per token, tokens)
    ttfts: list[tuple[int, int]] = []
    total_tokens = 0
    for _ in range(400):
        intended_ns = start_ns + int(rng.uniform(0, 30e9))
        first_ns = intended_ns + int(rng.uniform(1e6, 80e6))
        gaps = rng.integers(10**5, 6 * 10**7, int(rng.integers(0, 40))).tolist()
        counts = rng.integers(1, 4, len(gaps)).tolist()
        tokens = int(rng.integers(1, 3)) + sum(counts)
        at_ns = first_ns
        for gap, count in zip(gaps, counts, strict=True):
            at_ns += gap
            arrivals.append((at_ns - start_ns, gap // count, count))
        timeline.completed(
            intended_ns=intended_ns, first_token_ns=first_ns, done_ns=at_ns + 1000,
            output_tokens=tokens, gaps_ns=gaps, chunk_tokens=counts,
        )  # fmt: skip
        ttfts.append((intended_ns - start_ns, first_ns - intended_ns))
        total_tokens += tokens
    timeline.failed(start_ns + 7 * 10**9)
    summary = timeline.summary(start_ns)
    width_ns = summary["bucket_s"] * 1e9
    assert summary["bucket_s"] == 1.0  # about 31 s: 1 s buckets
    assert sum(summary["tokens"]) == total_tokens
    assert summary["failed"][7] == 1
    for bucket in range(summary["buckets"]):
        gaps_here = [
            g for t, g, c in arrivals if min(t // width_ns, 30) == bucket for _ in range(c)
        ]
        ttft_here = [v for t, v in ttfts if min(t // width_ns, 30) == bucket]
        for key, values, q in (
            ("itl_p50_ms", gaps_here, 50), ("itl_p99_ms", gaps_here, 99),
            ("ttft_p50_ms", ttft_here, 50),
        ):  # fmt: skip
            if not values:
                assert summary[key][bucket] is None
                continue
            expected = np.percentile(values, q, method="inverted_cdf") / 1e6
            assert summary[key][bucket] == pytest.approx(expected, abs=1e-4), (key, bucket)
        assert summary["itl_tokens"][bucket] == len(gaps_here)


@pytest.mark.parametrize(
    ("span_s", "width_s"),
    [(0.3, 0.01), (4.0, 0.2), (10.0, 0.5), (20.0, 1.0), (199.0, 1.0), (600.0, 5.0), (1e6, 3600.0)],
)
def test_bucket_width(span_s: float, width_s: float) -> None:
    assert bucket_width_s(span_s) == width_s


def test_cdf_against_numpy() -> None:
    values_ns = np.random.default_rng(2).lognormal(14, 1.2, size=50_000).astype(np.int64)
    histogram = Histogram()
    histogram.record_many_ns(values_ns.tolist(), [1] * len(values_ns))
    cdf = histogram.cdf_ms()
    assert 100 <= len(cdf) <= 200
    ordered_ms = np.sort(values_ns) / 1e6
    for value_ms, fraction in cdf:
        # the HDR bucket's top (within 0.1%) holds at least that fraction of the values
        # to 0.1% (3 significant digits) and the microsecond the values are rounded to
        above_ms, below_ms = value_ms * 1.001 + 0.0005, value_ms / 1.001 - 0.0005
        empirical = np.searchsorted(ordered_ms, above_ms, side="right") / len(ordered_ms)
        one = 1 / len(ordered_ms)  # HDR rounds a percentile's count to a whole value
        assert empirical >= fraction - one
        below = np.searchsorted(ordered_ms, below_ms, side="left") / len(ordered_ms)
        assert below <= fraction + one
    assert cdf[-1][1] == 1.0
    assert Histogram().cdf_ms() == []


# -- the writer -----------------------------------------------------------------------------


def _record(index: int) -> RequestRecord:
    return RequestRecord(
        index=index, intended_s=index / 10, queue_wait_ms=0.1, ok=index % 2 == 0,
        error=None if index % 2 == 0 else "ConnectError", ttft_ms=1.5, e2e_ms=2.5,
        output_tokens=3, chunks=3, tpot_ms=0.5, itl_max_ms=0.6, input_tokens=None,
    )  # fmt: skip


def test_records_are_flushed_while_the_run_goes(tmp_path: Path) -> None:
    """A reader tailing the file sees a record within the flush interval, not at the end."""
    path = tmp_path / "live.jsonl"

    async def run() -> list[str]:
        writer = records.RecordWriter.open(path, flush_every_s=0.2, flush_every_records=10**6)
        sink = writer.sink(point=3, rate_rps="inf")
        sink(_record(0))
        seen: list[str] = []
        for _ in range(200):  # up to 20 s on a busy machine
            await asyncio.sleep(0.1)
            seen = path.read_text().splitlines()
            if seen:
                break
        writer.close()
        return seen

    seen = asyncio.run(run())
    assert len(seen) == 1
    assert json.loads(seen[0]) == {
        **{f: getattr(_record(0), f) for f in records.RECORD_FIELDS},
        "point": 3,
        "rate_rps": "inf",
    }


def test_records_are_flushed_every_n(tmp_path: Path) -> None:
    path = tmp_path / "n.csv"
    writer = records.RecordWriter.open(path, flush_every_s=3600, flush_every_records=4)
    sink = writer.sink(point=0, rate_rps=2.5)
    for index in range(9):
        sink(_record(index))
    assert len(path.read_text().splitlines()) == 1 + 8  # header, two batches of 4
    writer.close()
    with path.open(newline="") as file:
        rows = list(csv.DictReader(file))
    assert [int(r["index"]) for r in rows] == list(range(9))
    assert rows[1]["error"] == "ConnectError"
    assert rows[0]["error"] == ""
    assert writer.written == 9


def test_summary_line_ignores_the_new_keys(jsonl_run: dict[str, Path]) -> None:
    for point in _points(jsonl_run["out"]):
        assert "verified" in load_command.summary_line(point)


def test_every_scheduled_request_has_a_record_even_when_the_drain_times_out() -> None:
    """Two in flight, cancelled at the drain timeout, and four never sent (queued for the cap's
    two slots): each still has its record, as unfinished."""
    spec = openloop.LoadSpec(workload="stream-16", requests=6, drain_timeout_s=0.3)
    seen: list[RequestRecord] = []
    with server_process.serve("tcp", "orjson", "--decode-ms", "100") as server:

        async def run() -> dict[str, Any]:
            target = openloop.open_target("tcp", server.address, "orjson")
            try:
                return await openloop.run_point(
                    target, spec, rate_rps=100.0, concurrency=2, on_record=seen.append
                )
            finally:
                await target.close()

        point = asyncio.run(run())
    assert point["errors"] == {metrics.UNFINISHED: 6}
    assert sorted(record.index for record in seen) == list(range(6))
    assert all(not record.ok and record.error == metrics.UNFINISHED for record in seen)
