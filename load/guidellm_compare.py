"""``inferwire load`` beside guidellm on the same server and schedule (``make compare-guidellm``).

    python -m inferwire.load.guidellm_compare --guidellm .venv-guidellm/bin/guidellm \\
        --tokenizer .venv-guidellm/tokenizer

One ``inferwire serve --transport http1 --codec orjson`` paced at ``--prefill-ms`` to the first
token and ``--decode-ms`` a token after it (its streams are ``stream-256``: 256 tokens, one a
chunk) takes both tools in turn, ABAB for ``--rounds`` rounds, so that a drift of the machine
hits both: ``inferwire load --url ... --api openai-chat`` and ``guidellm run`` (openai_http
backend, chat completions), each with Poisson arrivals at ``--rate`` for ``--duration`` s,
synthetic prompts of ``--input-tokens`` tokens counted with the same local tokenizer
(:mod:`.local_tokenizer`) and ``--output-tokens`` tokens asked for. guidellm runs offline
(``HF_HUB_OFFLINE=1``) in its own environment: it brings torch and CUDA libraries (about
6 GB), which stay out of the project's.

Each tool's client CPU is the user + system time of its whole process tree (guidellm forks
worker processes), sampled every :data:`CPU_SAMPLE_S` with a wall-clock stamp so that the time
of its measured window can be read apart from its start-up (importing torch alone costs
seconds). One raw file comes out, ``results/raw/load-agreement.json``: the run's parameters,
inferwire's JSON report and per-request records of each round (compact rows), and of
guidellm's each round its own summary metrics
and a compact per-request table of its timings (targeted start, actual start, first and last
token, end; Unix seconds), from which the page (:mod:`inferwire.bench.report.load_agreement`)
computes what guidellm does not summarise. Nothing here imports guidellm.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import psutil  # type: ignore[import-untyped, unused-ignore]

from inferwire.transports import server_process

from . import metrics
from .stream_tap import StreamTap

CPU_SAMPLE_S: Final = 0.2
RUN_TIMEOUT_S: Final = 1800.0
"""One tool's run, start-up included: guidellm's start-up alone took over a minute here."""
REQUEST_COLUMNS: Final = (
    "status",
    "targeted_start",
    "request_start",
    "first_token_iteration",
    "last_token_iteration",
    "request_end",
    "output_tokens",
    "prompt_tokens",
    "time_to_first_token_ms",
    "inter_token_latency_ms",
    "time_per_output_token_ms",
    "request_latency",
)
"""One row per guidellm request, in this order (its ``timings`` and computed fields)."""
INFERWIRE_COLUMNS: Final = (
    "intended_s",
    "queue_wait_ms",
    "ok",
    "ttft_ms",
    "tpot_ms",
    "e2e_ms",
    "output_tokens",
)
"""One row per ``inferwire load`` request, in this order (of its ``--records``)."""
GUIDELLM_METRICS: Final = (
    "requests_per_second",
    "request_latency",
    "request_dispatch_delay",
    "time_to_first_token_ms",
    "inter_token_latency_ms",
    "time_per_output_token_ms",
    "output_token_count",
)


WIRE_COLUMNS: Final = ("request_in", "request_whole", "first_event_out", "done_out")
"""One row per request the relay saw (:class:`~.stream_tap.Exchange`), in this order."""


def server_process_cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


class CompareError(Exception):
    """A tool failed or wrote nothing: the comparison has nothing to compare."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CompareSpec:
    rate_rps: float = 10.0
    duration_s: float = 60.0
    rounds: int = 3
    prefill_ms: float = 20.0
    decode_ms: float = 10.0
    input_tokens: int = 128
    output_tokens: int = 256
    seed: int = 0


class TreeCpu:
    """CPU seconds of a process and its descendants, sampled in a thread with wall-clock stamps:
    each live process's own time plus the time of the children it has reaped."""

    def __init__(self, pid: int) -> None:
        self.root = psutil.Process(pid)
        self.samples: list[tuple[float, float]] = []
        self._known: dict[int, psutil.Process] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _total_s(self) -> float:
        try:
            processes = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            processes = []
        total = 0.0
        for process in processes:
            # keep the same Process object: psutil caches its identity against pid reuse
            process = self._known.setdefault(process.pid, process)
            try:
                t = process.cpu_times()
            except psutil.Error:
                continue  # ended between listing and reading: its parent reaps its time
            total += t.user + t.system + t.children_user + t.children_system
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            total = self._total_s()
            if total or not self.samples:
                self.samples.append((time.time(), total))
            self._stop.wait(CPU_SAMPLE_S)

    def __enter__(self) -> TreeCpu:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _run_tool(
    args: list[str], *, env: dict[str, str], log: Path
) -> tuple[list[tuple[float, float]], float]:
    """Run a tool to its end; returns its CPU samples and its whole tree's CPU seconds (from
    the kernel's accounting of reaped children, start-up and exit included)."""
    before = os.times()
    with log.open("w") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
        with TreeCpu(process.pid) as cpu:
            try:
                code = process.wait(RUN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                raise CompareError(f"{args[0]} ran past {RUN_TIMEOUT_S:g} s; see {log}") from None
    after = os.times()
    if code != 0:
        tail = log.read_text(errors="replace")[-2000:]
        raise CompareError(f"{' '.join(args[:3])} ... exited {code}:\n{tail}")
    whole_s = (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )
    return cpu.samples, whole_s


def run_inferwire(
    spec: CompareSpec, round_index: int, url: str, server_pid: int, tokenizer: Path, work: Path
) -> dict[str, Any]:
    out = work / f"inferwire-{round_index}.json"
    records = work / f"inferwire-{round_index}.jsonl"
    command = [
        str(Path(sys.executable).with_name("inferwire")),
        "load",
        "--url",
        url,
        "--api",
        "openai-chat",
        "--rate",
        f"{spec.rate_rps:g}",
        "--duration",
        f"{spec.duration_s:g}",
        "--seed",
        str(spec.seed + round_index),
        "--prompts",
        "synthetic",
        "--input-tokens",
        str(spec.input_tokens),
        "--output-tokens",
        str(spec.output_tokens),
        "--tokenizer",
        str(tokenizer),
        "--server-pid",
        str(server_pid),
        "--out",
        str(out),
        "--records",
        str(records),
        "--quiet",
    ]
    samples, whole_s = _run_tool(command, env=dict(os.environ), log=out.with_suffix(".log"))
    report = json.loads(out.read_text())
    rows = [json.loads(line) for line in records.read_text().splitlines() if line.strip()]
    return {
        "command": command,
        "report": report,
        "request_columns": list(INFERWIRE_COLUMNS),
        "requests": [[row[name] for name in INFERWIRE_COLUMNS] for row in rows],
        "cpu_samples": samples,
        "process_cpu_s": whole_s,
    }


def _request_row(request: dict[str, Any], status: str) -> list[Any]:
    timings = request["info"]["timings"]
    return [status] + [
        timings[name] if name in timings else request.get(name) for name in REQUEST_COLUMNS[1:]
    ]


def guidellm_digest(output: dict[str, Any]) -> dict[str, Any]:
    """What the page needs of guidellm's JSON output (its one benchmark): its own summary of
    the metrics of :data:`GUIDELLM_METRICS` (successful requests), its scheduler's figures,
    and every request's timings as rows of :data:`REQUEST_COLUMNS`."""
    (benchmark,) = output["benchmarks"]
    rows = [
        _request_row(request, status)
        for status in ("successful", "incomplete", "errored")
        for request in benchmark["requests"].get(status) or []
    ]
    return {
        "guidellm_version": output["metadata"]["guidellm_version"],
        "strategy": benchmark["config"]["strategy"],
        "start_time": benchmark["start_time"],
        "end_time": benchmark["end_time"],
        "duration_s": benchmark["duration"],
        "scheduler_metrics": {
            k: v for k, v in benchmark["scheduler_metrics"].items() if k != "generation_delay"
        },
        "metrics": {
            name: benchmark["metrics"][name].get("successful", benchmark["metrics"][name])
            for name in GUIDELLM_METRICS
        },
        "warnings": benchmark.get("warnings", []),
        "request_columns": list(REQUEST_COLUMNS),
        "requests": rows,
    }


def run_guidellm(
    spec: CompareSpec, round_index: int, url: str, guidellm: Path, tokenizer: Path, work: Path
) -> dict[str, Any]:
    out = work / f"guidellm-{round_index}.json"
    command = [
        str(guidellm),
        "run",
        # no /health route on inferwire's server (vLLM has one): skip guidellm's probe of it;
        # HTTP/1.1 as inferwire's client speaks it (httpx would not use h2 on http:// anyway)
        f"--backend=kind=openai_http,target={url},validate_backend=false,http2=false",
        f"--profile=kind=poisson,rate={spec.rate_rps:g}",
        f"--constraint=kind=max_duration,seconds={spec.duration_s:g}",
        f"--tokenizer=kind=huggingface_auto,model={tokenizer}",
        f"--data=kind=synthetic_text,prompt_tokens={spec.input_tokens},"
        f"output_tokens={spec.output_tokens}",
        f"--seed=kind=static,value={spec.seed + round_index}",
        # keep every request's timings, drop the texts
        "--metrics=kind=generative,sample_size=0",
        f"--output=kind=json,path={out}",
        "--disable-progress",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    samples, whole_s = _run_tool(command, env=env, log=out.with_suffix(".log"))
    digest = guidellm_digest(json.loads(out.read_text()))
    return {"command": command, "digest": digest, "cpu_samples": samples, "process_cpu_s": whole_s}


def compare(spec: CompareSpec, *, guidellm: Path, tokenizer: Path, work: Path) -> dict[str, Any]:
    """Both tools, ABAB, on one paced server; the raw record of :func:`main`."""
    pacing = ["--prefill-ms", f"{spec.prefill_ms:g}", "--decode-ms", f"{spec.decode_ms:g}"]
    runs: list[dict[str, Any]] = []
    started = datetime.now(UTC).isoformat(timespec="seconds")
    with (
        server_process.serve("http1", "orjson", *pacing) as server,
        StreamTap(server.host, server.port) as tap,
    ):
        assert server.process is not None
        url = f"http://{tap.address}"
        for round_index in range(spec.rounds):
            for tool in ("inferwire", "guidellm"):
                print(f"round {round_index + 1}/{spec.rounds}: {tool}", flush=True)
                load_before = os.getloadavg()
                server_before = server_process_cpu_s(server.process.pid)
                if tool == "inferwire":
                    run = run_inferwire(spec, round_index, url, server.process.pid, tokenizer, work)
                else:
                    run = run_guidellm(spec, round_index, url, guidellm, tokenizer, work)
                runs.append(
                    {
                        "tool": tool,
                        "round": round_index,
                        # the machine is shared: how busy it was (1, 5, 15 min averages)
                        "load_average_before": load_before,
                        "load_average_after": os.getloadavg(),
                        # the server's CPU over the whole run: is it starved, or busier?
                        "server_cpu_s": server_process_cpu_s(server.process.pid) - server_before,
                        # what the wire saw, one row a request
                        "wire_columns": list(WIRE_COLUMNS),
                        "wire": [[getattr(e, name) for name in WIRE_COLUMNS] for e in tap.take()],
                        **run,
                    }
                )
    return {
        "kind": "inferwire-load-agreement",
        "started": started,
        "spec": asdict(spec),
        "server": {"transport": "http1", "codec": "orjson", "workload": "stream-256"},
        "relay": "stream_tap: one timestamping TCP relay in front of the server, for both tools",
        "versions": metrics.versions(),
        "machine": metrics.machine(),
        "runs": runs,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m inferwire.load.guidellm_compare", description=__doc__
    )
    parser.add_argument("--guidellm", type=Path, required=True, help="guidellm's executable")
    parser.add_argument("--tokenizer", type=Path, required=True, help="the local tokenizer DIR")
    parser.add_argument("--raw", type=Path, default=Path("results/raw/load-agreement.json"))
    defaults = CompareSpec()
    parser.add_argument("--rate", type=float, default=defaults.rate_rps)
    parser.add_argument("--duration", type=float, default=defaults.duration_s)
    parser.add_argument("--rounds", type=int, default=defaults.rounds)
    parser.add_argument("--prefill-ms", type=float, default=defaults.prefill_ms)
    parser.add_argument("--decode-ms", type=float, default=defaults.decode_ms)
    parser.add_argument("--input-tokens", type=int, default=defaults.input_tokens)
    parser.add_argument("--output-tokens", type=int, default=defaults.output_tokens)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    args = parser.parse_args(argv)
    if not args.guidellm.is_file():
        parser.error(f"--guidellm {args.guidellm}: no such file (make compare-guidellm)")
    if not (args.tokenizer / "tokenizer.json").is_file():
        parser.error(f"--tokenizer {args.tokenizer}: no tokenizer.json in it")
    spec = CompareSpec(
        rate_rps=args.rate,
        duration_s=args.duration,
        rounds=args.rounds,
        prefill_ms=args.prefill_ms,
        decode_ms=args.decode_ms,
        input_tokens=args.input_tokens,
        output_tokens=args.output_tokens,
        seed=args.seed,
    )
    # kept after the run: each tool's own full output and log, for a look behind the page
    work = Path(tempfile.mkdtemp(prefix="inferwire-guidellm-"))
    print(f"each tool's output and log: {work}", flush=True)
    try:
        raw = compare(spec, guidellm=args.guidellm, tokenizer=args.tokenizer.resolve(), work=work)
    except CompareError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    args.raw.parent.mkdir(parents=True, exist_ok=True)
    args.raw.write_text(json.dumps(raw, indent=None, allow_nan=False) + "\n")
    # the page (results/load-agreement.md) is the bench report's, made from this file:
    # python -m inferwire.bench.report.load_agreement (make compare-guidellm runs it)
    print(f"wrote {args.raw}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
