"""What OpenTelemetry tracing (``--trace``) costs, per transport, as paired ratios.

Two comparisons, each of two server processes on loopback measured back to back in pairs
(alternating order, the median of the pairs' ratios; :mod:`inferwire.bench.measure.paired`):

* **hooks, off**: the transports' servers as they are, tracing off, over the same servers
  built without the tracing hooks (``transports/`` of the commit before they came, from
  ``git archive``; the codecs and the rest are this tree's) on one unpaced ``stream-256``
  (prefill and decode 0: the most streams a second, so the most hook checks, one per stream).
  ``hooks_off_vs_absent`` is the wall-clock ratio, ``hooks_off_vs_absent_cpu`` the same in
  client + server CPU time; ``control_same_build`` pairs two server processes of this build
  the same way, the spread any two processes show. The client is this tree's on both sides
  (its own hooks, off, are the same few ``is None`` checks either way). Skipped, with a note
  in ``extra_info``, where git or the history is not at hand.
* **on at 1 ms a token**: a server with ``--decode-ms 1 --trace`` and a client that traces
  every request (:meth:`~inferwire.transports.tracing.Tracer.client_request`), both exporting
  to ``inferwire trace collect`` in a third process, over the same pair untraced, on
  ``TOKENS`` tokens of ``stream-256``: ``e2e_ratio`` (request start to the end marker),
  ``ttft_ratio`` (to the first chunk), ``cpu_ratio`` (client + server CPU time),
  and per token and per request: ``overhead_us_per_token`` and ``overhead_us_per_request``
  (the median traced - untraced wall time of the pairs, over the tokens or whole), and
  ``cpu_us_per_token`` and ``cpu_us_per_request`` in CPU time: ``cpu_sync_us_per_request``,
  the median traced - untraced CPU of the pairs (this thread + the server process: what a
  request costs as it runs, ``cpu_ratio`` the median ratio), plus the export of its spans,
  which the batch span processors do seconds later on a thread of their own:
  ``export_us_per_span``, measured on this process's exporter thread over the pairs' client
  spans, and on this thread for the flush after them (which exports the rest), times the
  spans of a request on both sides (the server's exporter is the same SDK code; its thread's
  CPU cannot be singled out from here, and a window of its whole process over the seconds an
  export takes was all noise on this shared machine: one block each way gave -0.7 to +7 ms
  a request). A paced stream's
  end is set by its schedule, so wall-clock overhead shows only where tracing makes a token
  late; the CPU figures are what it takes from a machine either way. The collector's own CPU
  is not in them (a real one runs elsewhere); on this 2-core machine its work does compete
  for the cores.

``correct``: every stream equal to what the service sends, and (tracing on) every traced
request's spans of both processes received by the collector, joined, the server's parented
by the client's.
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, Final

import pytest

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire._runtime import loops
from inferwire.bench.measure.paired import paired_ratio
from inferwire.bench.procs import placement
from inferwire.observe.traces import otlp_json
from inferwire.transports import server_process
from inferwire.transports.tracing import CLIENT_SERVICE, CLIENT_STAGES, SERVER_STAGES, Tracer
from inferwire.workloads import token_stream_source

PAIRS: Final = 21
TOKENS: Final = 64
"""Tokens per traced stream: 64 ms a stream at 1 ms a token."""
WORKLOAD: Final = "stream-256"
HOOKS_SAMPLE_S: Final = 0.02
CLIENT_SPANS: Final = 1 + len(CLIENT_STAGES)
SERVER_SPANS: Final = 1 + len(SERVER_STAGES)
ROOT: Final = Path(__file__).resolve().parents[1]
TRANSPORTS: Final = it.TRANSPORTS
COLLECT: Final = (sys.executable, "-m", "inferwire.cli.main", "trace", "collect")


def _git(*args: str) -> bytes:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, check=True, timeout=60
    ).stdout


_OLD_CODECS: Final = '''"""inferwire.codecs as the tree before the hooks knew it: today's
package (its modules and compiled extensions are found in {real}), with the names it has since
moved into submodules or renamed put back where that tree looks for them."""
# ruff: noqa
__path__ = ["{real}"]
__file__ = "{real}/__init__.py"
with open(__file__) as _source:
    exec(compile(_source.read(), __file__, "exec"))
from .base import DEFAULT_MAX_DEPTH, DEFAULT_MAX_ELEMENTS
from .errors import *
from .framing import DEFAULT_MAX_FRAME_BYTES, BytesLike, StreamDecoder, StreamEncoder
from .integrity import StreamVerifier
from .model import DATATYPES
from .schema_registry import *
from . import framing as _framing

_framing.stream_encoder = _framing.framed_encoder
_framing.stream_decoder = _framing.framed_decoder
'''
"""The tree's ``inferwire.codecs``: the codecs are today's, so both servers run the same codec
code, and only the transports differ."""
_OLD_LOOKUP: Final = re.compile(r"ic\.get\(((?:(?!extensions)[^()])+)\)")
"""A codec lookup by name without the extensions option, in the tree before the hooks."""


def _unhooked_tree(into: Path) -> Path | str:
    """An import root whose ``inferwire.transports`` is the one before the tracing hooks (and
    every other layer this tree's); or why there is none."""
    try:
        added = _git("log", "--diff-filter=A", "--format=%H", "--", "transports/tracing.py")
        first = added.decode().split()[-1]
        archive = _git("archive", "--format=tar", f"{first}^", "transports")
    except (OSError, subprocess.SubprocessError, IndexError) as exc:
        return f"no history to build the server without hooks from: {exc}"
    source = into / "source"
    source.mkdir()
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(source, filter="data")
    # that tree runs on today's codecs, whose JSON codecs now leave inferwire's fields out unless
    # asked; in its day a codec by name carried them, so its lookups ask, and it sends the bytes
    # it sent then
    for module in (source / "transports").rglob("*.py"):
        text = module.read_text()
        asked = _OLD_LOOKUP.sub(r"ic.get(\1, extensions=True)", text)
        if asked != text:
            module.write_text(asked)
    package = into / "tree" / "inferwire"
    package.mkdir(parents=True)
    for layer in ("schemas", "workloads", "bench"):
        (package / layer).symlink_to(ROOT / layer)
    (package / "codecs").mkdir()
    (package / "codecs" / "__init__.py").write_text(_OLD_CODECS.format(real=ROOT / "codecs"))
    (package / "transports").symlink_to(source / "transports")
    return package.parent


@contextlib.contextmanager
def _pythonpath(path: Path) -> Iterator[None]:
    """Child processes started inside import ``inferwire`` from ``path`` first."""
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(path) + (os.pathsep + before if before else "")
    try:
        yield
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before


class _Collector:
    """``inferwire trace collect`` in its own process."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.process = subprocess.Popen(
            [*COLLECT, "--listen", "127.0.0.1:0", "--out", str(out)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        self.endpoint = line.rpartition("endpoint=")[2].strip()
        if not self.endpoint:
            self.close()
            raise RuntimeError(f"inferwire trace collect did not start: {line!r}")

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(10)
        if self.process.stdout is not None:
            self.process.stdout.close()


class _Env:
    def __init__(self, tmp: Path) -> None:
        self.own_affinity = os.sched_getaffinity(0)
        self.cores = placement.split_cores()
        if self.cores is not None:
            os.sched_setaffinity(0, {self.cores[1]})
        self.loop_kind = loops.requested_loop()
        self.loop = loops.new_event_loop(self.loop_kind)
        self.tmp = tmp
        self.collector = _Collector(tmp / "spans.jsonl")
        self.tracer = Tracer.open(CLIENT_SERVICE, self.collector.endpoint)
        self.unhooked = _unhooked_tree(tmp)
        self.servers: dict[tuple[str, str], server_process.ServerProcess] = {}
        self.clients: dict[tuple[str, str], it.Client] = {}
        self.service = it.SimulatedService(token_stream_source)

    def server(self, transport: str, kind: str) -> server_process.ServerProcess:
        """``kind``: ``plain`` (unpaced), ``twin`` (another of them), ``unhooked`` (unpaced,
        the tree without hooks), ``paced`` (1 ms a token) or ``traced`` (paced, --trace)."""
        key = (transport, kind)
        if key not in self.servers:
            options = ["--loop", self.loop_kind]
            if kind in ("paced", "traced"):
                options += ["--decode-ms", "1"]
            if kind == "traced":
                options += ["--trace", "--trace-endpoint", self.collector.endpoint]
            # the tree without hooks predates the metrics too (they were written beside the
            # tracing hooks), so it takes no --no-metrics: off against absent, both hooks
            process = server_process.serve(
                transport, "orjson", *options, metrics=kind == "unhooked"
            )
            if kind == "unhooked":
                assert isinstance(self.unhooked, Path)
                # that tree predates inferwire.cli: its server is its own module's command
                process.args[process.args.index("inferwire.cli")] = "inferwire.transports.serve"
                with _pythonpath(self.unhooked):
                    process.start()
            else:
                process.start()
            if self.cores is not None and process.process is not None:
                placement.pin_threads(process.process.pid, self.cores[0])
            self.servers[key] = process
        return self.servers[key]

    def client(self, transport: str, kind: str) -> it.Client:
        key = (transport, kind)
        if key not in self.clients:
            address = self.server(transport, kind).address

            async def make() -> it.Client:
                return it.connect(transport, address, codec="orjson")

            self.clients[key] = self.loop.run_until_complete(make())
        return self.clients[key]

    def run(self, coro: Callable[[], Coroutine[Any, Any, Any]]) -> Callable[[], Any]:
        return lambda: self.loop.run_until_complete(coro())

    def close(self) -> None:
        for client in self.clients.values():
            self.loop.run_until_complete(client.close())
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()
        self.tracer.close()
        for server in self.servers.values():
            server.stop()
        self.collector.close()
        os.sched_setaffinity(0, self.own_affinity)


@pytest.fixture(scope="module")
def tracing_env() -> Iterator[_Env]:
    tmp = Path(tempfile.mkdtemp(prefix="inferwire-bench-tracing-"))
    env = _Env(tmp)
    try:
        yield env
    finally:
        env.close()
        shutil.rmtree(tmp, ignore_errors=True)


class _Timed:
    """One stream, its chunks and when the first one came (for TTFT)."""

    def __init__(
        self, client: it.Client, request: it.GenerateRequest, tracer: Tracer | None
    ) -> None:
        self.client = client
        self.request = request
        self.tracer = tracer
        self.ttft_ns: list[int] = []
        self.e2e_ns: list[int] = []
        self.cpu_ns: list[int] = []
        self.traceparents: list[str] = []
        self.correct = True
        self.expected: list[ic.TokenChunk] | None = None

    async def __call__(self) -> list[ic.TokenChunk]:
        trace = None if self.tracer is None else self.tracer.client_request(WORKLOAD)
        start = time.monotonic_ns()
        first = 0
        chunks = []
        async for chunk in self.client.generate(
            self.request, timing=None if trace is None else trace.timing
        ):
            if not first:
                first = time.monotonic_ns()
            chunks.append(chunk)
        end = time.monotonic_ns()
        if trace is not None:
            trace.finish()
            self.traceparents.append(trace.traceparent)
        self.ttft_ns.append(first - start)
        self.e2e_ns.append(end - start)
        if self.expected is not None and chunks != self.expected:
            self.correct = False
        return chunks


def _cpu_pairs(
    subject: Callable[[], Any],
    subject_pid: int,
    baseline: Callable[[], Any],
    base_pid: int,
    count: int,
) -> list[tuple[int, int]]:
    """``count`` back-to-back (subject, baseline) CPU times: this thread's + the server's."""

    def cpu_ns(work: Callable[[], Any], pid: int) -> int:
        clock = placement.cpu_clock(pid)
        client, server = time.thread_time_ns(), time.clock_gettime_ns(clock)
        work()
        return time.thread_time_ns() - client + time.clock_gettime_ns(clock) - server

    pairs = []
    gc.collect()
    gc.disable()  # as the paired ratios: no collection billed to one side
    try:
        for i in range(count):
            if i % 2:
                a = cpu_ns(subject, subject_pid)
                b = cpu_ns(baseline, base_pid)
            else:
                b = cpu_ns(baseline, base_pid)
                a = cpu_ns(subject, subject_pid)
            pairs.append((a, b))
    finally:
        gc.enable()
    return pairs


def _exporter_ns() -> int:
    """CPU time of this process's span exporter threads (the batch span processors')."""
    return sum(
        time.clock_gettime_ns(time.pthread_getcpuclockid(thread.ident))
        for thread in threading.enumerate()
        if thread.name.startswith("OtelBatch") and thread.ident is not None
    )


def _pid(env: _Env, transport: str, kind: str) -> int:
    process = env.server(transport, kind).process
    assert process is not None
    return process.pid


@pytest.mark.parametrize("transport", TRANSPORTS)
def bench_tracing_hooks_off(benchmark: Any, tracing_env: _Env, transport: str) -> None:
    """One unpaced ``stream-256``, hooks present and off, paired with the build without."""
    env = tracing_env
    benchmark.group = "tracing hooks off"
    request = it.GenerateRequest(workload=WORKLOAD)
    expected = list(env.service.chunks(request))
    hooked = _Timed(env.client(transport, "plain"), request, None)
    hooked.expected = expected
    subject = env.run(hooked)
    subject()
    chunks = benchmark(subject)
    info: dict[str, Any] = {
        "transport": transport,
        "workload": WORKLOAD,
        "chunks": len(expected),
        "loop": loops.kind(env.loop),
    }
    if isinstance(env.unhooked, str):
        info["hooks_off_vs_absent"] = None
        info["note"] = env.unhooked
        correct = chunks == expected and hooked.correct
    else:
        plain = _Timed(env.client(transport, "unhooked"), request, None)
        plain.expected = expected
        baseline = env.run(plain)
        baseline()
        disabled = benchmark.disabled
        pairs = 1 if disabled else PAIRS
        info["hooks_off_vs_absent"] = paired_ratio(
            subject, baseline, pairs, min_sample_s=0.0 if disabled else HOOKS_SAMPLE_S
        )
        cpu = _cpu_pairs(
            subject,
            _pid(env, transport, "plain"),
            baseline,
            _pid(env, transport, "unhooked"),
            pairs,
        )
        info["hooks_off_vs_absent_cpu"] = statistics.median(a / max(b, 1) for a, b in cpu)
        # the control: the same servers, two processes of one build, paired the same way
        twin = _Timed(env.client(transport, "twin"), request, None)
        twin.expected = expected
        control = env.run(twin)
        control()
        info["control_same_build"] = paired_ratio(
            subject, control, pairs, min_sample_s=0.0 if disabled else HOOKS_SAMPLE_S
        )
        info["pairs"] = pairs
        correct = chunks == expected and hooked.correct and plain.correct and twin.correct
    benchmark.extra_info.update(info, correct=correct)
    assert correct, f"{transport}: a stream differs from the service's"


@pytest.mark.parametrize("transport", TRANSPORTS)
def bench_tracing_on(benchmark: Any, tracing_env: _Env, transport: str) -> None:
    """``TOKENS`` tokens at 1 ms a token, traced end to end, paired with the same untraced."""
    env = tracing_env
    benchmark.group = "tracing on, 1 ms a token"
    request = it.GenerateRequest(workload=WORKLOAD, max_tokens=TOKENS)
    expected = list(env.service.chunks(request))
    tokens = sum(len(c.token_ids) for c in expected)
    traced = _Timed(env.client(transport, "traced"), request, env.tracer)
    untraced = _Timed(env.client(transport, "paced"), request, None)
    traced.expected = untraced.expected = expected
    subject, baseline = env.run(traced), env.run(untraced)
    subject()
    baseline()
    chunks = benchmark.pedantic(subject, rounds=3 if not benchmark.disabled else 1)
    pairs = 1 if benchmark.disabled else PAIRS
    for series in (traced, untraced):
        series.ttft_ns.clear()
        series.e2e_ns.clear()
    e2e_ratio = paired_ratio(subject, baseline, pairs)
    # the pairs' own stamps, in the same alternating order
    e2e = list(zip(traced.e2e_ns, untraced.e2e_ns, strict=True))
    ttft = list(zip(traced.ttft_ns, untraced.ttft_ns, strict=True))
    # CPU: what each request costs as it runs, paired (client thread + server process), and
    # what exporting its spans costs later, on the client's exporter thread: the client's
    # spans of the pairs are all exported by the flush after them
    env.tracer.flush()
    exported_before = _exporter_ns()
    cpu = _cpu_pairs(
        subject, _pid(env, transport, "traced"), baseline, _pid(env, transport, "paced"), pairs
    )
    flushing = time.thread_time_ns()
    env.tracer.flush()  # the SDK exports what is left on the calling thread
    flush_ns = time.thread_time_ns() - flushing
    export_ns = _exporter_ns() - exported_before + flush_ns
    export_ns_per_span = export_ns / (pairs * CLIENT_SPANS)
    cpu_sync_ns = statistics.median(a - b for a, b in cpu)
    cpu_overhead_ns = cpu_sync_ns + export_ns_per_span * (CLIENT_SPANS + SERVER_SPANS)
    overhead_ns = statistics.median(a - b for a, b in e2e)
    spans_ok = _spans_joined(env, traced.traceparents)
    benchmark.extra_info.update(
        transport=transport,
        workload=WORKLOAD,
        tokens=tokens,
        chunks=len(expected),
        decode_ms=1.0,
        pairs=pairs,
        e2e_ratio=e2e_ratio,
        ttft_ratio=statistics.median(a / max(b, 1) for a, b in ttft),
        cpu_ratio=statistics.median(a / max(b, 1) for a, b in cpu),
        cpu_sync_us_per_request=cpu_sync_ns / 1e3,
        export_us_per_span=export_ns_per_span / 1e3,
        overhead_us_per_request=overhead_ns / 1e3,
        overhead_us_per_token=overhead_ns / 1e3 / tokens,
        cpu_us_per_request=cpu_overhead_ns / 1e3,
        cpu_us_per_token=cpu_overhead_ns / 1e3 / tokens,
        traced_requests=len(traced.traceparents),
        spans_joined=spans_ok,
        loop=loops.kind(env.loop),
        correct=chunks == expected and traced.correct and untraced.correct and spans_ok,
    )
    assert chunks == expected, f"{transport}: a traced stream differs from the service's"
    assert spans_ok, f"{transport}: the collector did not get every traced request's spans"


def _spans_joined(env: _Env, traceparents: list[str], timeout_s: float = 30.0) -> bool:
    """Whether every one of these requests' client and server spans reached the collector,
    the server's parented by the client's. Flushes the client; the server's batch processor
    exports within its schedule delay (5 s)."""
    env.tracer.flush()
    wanted = {tp.split("-")[1]: tp.split("-")[2] for tp in traceparents}
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            spans = otlp_json.read_spans(env.collector.out)
        except (OSError, otlp_json.TraceFileError):
            spans = []
        servers = {
            s.trace_id: s.parent_span_id
            for s in spans
            if s.kind == otlp_json.SPAN_KIND_SERVER and s.trace_id in wanted
        }
        if servers == wanted:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.25)
