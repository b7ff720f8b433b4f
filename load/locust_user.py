"""``inferwire load`` scaled out on Locust: one seeded open-loop schedule split across Locust
workers, live statistics in Locust's web UI and CSV, and the same JSON report at the end.

Run (one master, N workers; on one machine or several, whose clocks agree, e.g. NTP)::

    LOCUSTFILE=$(python -m inferwire.load.locust_user)   # this file's path
    locust -f $LOCUSTFILE --master --headless --expect-workers 2 --users 2 --spawn-rate 2 \\
        --inferwire-load "--transport http2 --address 10.0.0.5:8000 --rate 400 --duration 60" \\
        --inferwire-out load.json
    locust -f $LOCUSTFILE --worker --master-host MASTER_HOST    # once per worker

Leave out ``--headless`` (and ``--users``) for the web UI, where the ``inferwire load``
arguments can be edited before each run; the test stops when every part has reported.
``--users`` must be at least the number of workers: each worker's part is driven by its first
user (more users on a worker idle). Headless, the master quits when every part has reported;
a ``--run-time``, if given, must outlast the schedule (a run stopped early writes no report).
``locust_local.run_local`` starts a master and N workers on this machine.

Options (beside Locust's own): ``--inferwire-load ARGS`` (the ``inferwire load`` arguments every
part shares: one point, a server by ``--address``; ``--part``, ``--start-at``, ``--out``,
``--records`` and ``--spawn`` are the split's own), ``--inferwire-out FILE`` (the merged
report), ``--inferwire-lead-s S`` (from the test's start to the schedule's, default 5: time for
each part to start its process and warm up; a late part shows as send lag), and, on a worker,
``--inferwire-parts-dir DIR`` (keep each part's report, records and log). The master exits 2
when a part failed or the parts do not merge (the part's error is in its log), else as Locust
does (1 when a request failed).

How it works. At the test's start the master draws nothing: it sends each worker its part
``I/N`` and one start instant (now + ``--inferwire-lead-s``). Each worker's user runs
``inferwire load ARGS --part I/N --start-at T`` as a child process: Locust runs on gevent,
the generator on asyncio with its own precise timers, and the two do not share a thread. The
schedule is drawn whole from the seed in every part and each keeps requests I, I+N, ..., so the
parts together send exactly the one schedule from the one start. While the part runs, the user
reads its per-request records (``--records``, JSONL) and fires them as Locust requests:
"E2E" for every request (a failure with its error's name) and, for a completed one, "TTFT",
"TPOT" and "ITL max" (the longest gap between two chunks), in milliseconds, TTFT and E2E from
the intended send time as every latency of ``inferwire load``; the name is the API, else
transport/codec. When its part ends, the worker sends the part's JSON report, HDR histograms
included, to the master, which merges them (:mod:`inferwire.load.hdr_merge`) into the
report one ``inferwire load --out`` would have written for the whole schedule, its parameters
saying how it was split (``split``: Locust, the number of workers, each part's counts).

Locust loads this file by path (not as ``inferwire.load.locust_user``), so its
imports are absolute. It is the only module that imports Locust, which monkey-patches the
standard library for gevent when imported.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

import gevent  # type: ignore[import-untyped, unused-ignore]
import gevent.event  # type: ignore[import-untyped, unused-ignore]
import locust
from locust import User, constant, events, task
from locust.env import Environment
from locust.runners import MasterRunner, WorkerRunner

from inferwire.load import hdr_merge, load_command
from inferwire.load.split_run import (
    LoadArguments,
    PartPlan,
    RecordTail,
    SplitRunError,
    check_load_arguments,
    stat_entries,
)

PLAN_MESSAGE: Final = "inferwire_plan"
PART_MESSAGE: Final = "inferwire_part"
POLL_S: Final = 0.25
"""How often a worker reads its part's new records (they are flushed every 0.5 s at most)."""
DEFAULT_LEAD_S: Final = 5.0
STOP_TIMEOUT_S: Final = 10.0
logger = logging.getLogger("inferwire.locust")


class InferwireRequestError(Exception):
    """A request of the schedule that failed: its message is the error's name."""


def _options(parser: Any) -> None:
    # on the parser itself: Locust's include_in_web_ui is not known to argument groups
    group = parser
    group.add_argument(
        "--inferwire-load",
        default="",
        help="the `inferwire load` arguments every part shares: the server, one --rate, the "
        'schedule (e.g. "--transport http2 --address HOST:PORT --rate 200 --duration 30")',
    )
    group.add_argument(
        "--inferwire-out", default="", help="master: write the merged JSON report to this file"
    )
    group.add_argument(
        "--inferwire-lead-s",
        type=float,
        default=DEFAULT_LEAD_S,
        help="seconds from the test's start to the schedule's, for the parts to start",
    )
    group.add_argument(
        "--inferwire-parts-dir",
        default="",
        include_in_web_ui=False,
        help="worker: keep each part's report, records and log here (default: removed)",
    )


class _Master:
    """The master's side: plans the parts, collects their reports, writes the merged one."""

    def __init__(self) -> None:
        self.parts = 0
        self.results: dict[int, dict[str, Any]] = {}

    def test_start(self, environment: Environment) -> None:
        runner = environment.runner
        options = environment.parsed_options
        assert runner is not None
        assert options is not None
        self.results = {}
        try:
            load = check_load_arguments(options.inferwire_load)
        except SplitRunError as exc:
            self._fail(environment, f"--inferwire-load: {exc}")
            return
        if isinstance(runner, MasterRunner):
            workers = runner.clients.ready + runner.clients.running + runner.clients.spawning
            index = runner.get_worker_index  # the order in which they first connected
            workers.sort(key=lambda worker: int(index(worker.id)))  # type: ignore[no-untyped-call]
            destinations: list[str | None] = [worker.id for worker in workers]
        else:  # one process: a LocalRunner runs the whole schedule as part 0/1
            destinations = [None]
        self.parts = len(destinations)
        if runner.target_user_count < self.parts:
            self._fail(environment, f"--users {runner.target_user_count}: need one per worker")
            return
        start_at = time.time() + float(options.inferwire_lead_s)
        logger.info(
            "inferwire: %d part(s) of %s, starting at %.3f", self.parts, load.name, start_at
        )
        for part, destination in enumerate(destinations):
            plan = _plan(load, part, self.parts, start_at)
            runner.send_message(PLAN_MESSAGE, plan.to_message(), client_id=destination)

    def part_done(self, environment: Environment, msg: Any) -> None:
        data = msg.data
        self.results[int(data["part"])] = data
        logger.info("inferwire: part %s/%s reported", data["part"], self.parts)
        if len(self.results) == self.parts:
            gevent.spawn(self._finish, environment)

    def test_stop(self, environment: Environment) -> None:
        if self.parts and len(self.results) < self.parts:
            logger.error(
                "inferwire: stopped with %d of %d parts reported: no report",
                len(self.results),
                self.parts,
            )

    def _finish(self, environment: Environment) -> None:
        options = environment.parsed_options
        runner = environment.runner
        assert options is not None
        assert runner is not None
        try:
            self._report(environment, options)
        except Exception:  # the run must still end, and say it failed
            logger.exception("inferwire: the report failed")
            environment.process_exit_code = 2
        finally:
            self.parts = 0
            if options.headless:
                runner.quit()
            else:
                runner.stop()

    def _report(self, environment: Environment, options: Any) -> None:
        failed = {part: r["error"] for part, r in self.results.items() if r.get("error")}
        for part, error in sorted(failed.items()):
            logger.error("inferwire: part %d/%d failed: %s", part, self.parts, error)
        if failed:
            environment.process_exit_code = 2
            return
        try:
            report = hdr_merge.merge_reports(
                [r["report"] for r in self.results.values()],
                runner={"kind": "locust", "workers": self.parts, "locust": locust.__version__},
            )
        except hdr_merge.MergeError as exc:
            logger.error("inferwire: the parts do not merge: %s", exc)
            environment.process_exit_code = 2
            return
        if options.inferwire_out:
            out = Path(options.inferwire_out)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(report, indent=1, allow_nan=False) + "\n")
            logger.info("inferwire: wrote %s", out)
        for point in report["points"]:
            logger.info("inferwire: %s", load_command.summary_line(point))

    @staticmethod
    def _fail(environment: Environment, message: str) -> None:
        logger.error("inferwire: %s", message)
        environment.process_exit_code = 2
        assert environment.runner is not None
        gevent.spawn(environment.runner.quit)


def _plan(load: LoadArguments, part: int, parts: int, start_at: float) -> PartPlan:
    return PartPlan(
        load_args=load.args, part=part, parts=parts, start_at_unix_s=start_at, name=load.name
    )


class _Worker:
    """A worker's side: its plan, and whether one of its users has taken it."""

    def __init__(self) -> None:
        self.plan: PartPlan | None = None
        self.taken = False
        self.parts_dir = ""
        self.reported = gevent.event.Event()

    def plan_received(self, environment: Environment, msg: Any) -> None:
        self.plan = PartPlan.from_message(msg.data)
        self.taken = False


MASTER: Final = _Master()
WORKER: Final = _Worker()


def _init(environment: Environment, **_: Any) -> None:
    runner = environment.runner
    options = environment.parsed_options
    if runner is None or options is None:
        return
    if not isinstance(runner, WorkerRunner):
        if options.inferwire_load:  # fail now, not at the start (the web UI can set it later)
            try:
                check_load_arguments(options.inferwire_load)
            except SplitRunError as exc:
                sys.exit(f"--inferwire-load: {exc}")
        runner.register_message(PART_MESSAGE, MASTER.part_done)
        on = environment.events
        on.test_start.add_listener(MASTER.test_start)  # type: ignore[no-untyped-call]
        on.test_stop.add_listener(MASTER.test_stop)  # type: ignore[no-untyped-call]
    if not isinstance(runner, MasterRunner):
        # the master's options overwrite a worker's own at the start: keep this one now
        WORKER.parts_dir = options.inferwire_parts_dir
        runner.register_message(PLAN_MESSAGE, WORKER.plan_received)
        on_report = environment.events.report_to_master
        on_report.add_listener(lambda **_: WORKER.reported.set())  # type: ignore[no-untyped-call]


events.init_command_line_parser.add_listener(_options)  # type: ignore[no-untyped-call]
events.init.add_listener(_init)  # type: ignore[no-untyped-call]


class InferwireLoad(User):  # type: ignore[misc, unused-ignore]
    """Drives this worker's part of the schedule (see the module docstring); a second user on
    the same worker finds the part taken and idles."""

    wait_time = constant(1)

    @task
    def drive(self) -> None:
        plan = WORKER.plan
        if plan is None or WORKER.taken:
            return
        WORKER.taken = True
        folder = Path(WORKER.parts_dir or tempfile.mkdtemp(prefix="inferwire-part-"))
        try:
            self._send(plan, self._run(plan, folder))
        finally:
            if not WORKER.parts_dir:
                shutil.rmtree(folder, ignore_errors=True)

    def _run(self, plan: PartPlan, folder: Path) -> dict[str, Any]:
        """Runs the part, firing its records as they come; returns what to send the master."""
        stem = f"part-{plan.part}-of-{plan.parts}"
        out, records, log = (folder / f"{stem}{suffix}" for suffix in (".json", ".jsonl", ".log"))
        folder.mkdir(parents=True, exist_ok=True)
        tail = RecordTail(records)
        with log.open("wb") as log_file:
            process = subprocess.Popen(
                plan.command(out=out, records=records),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
            try:
                while process.poll() is None:
                    self._fire(tail.read(), plan.name)
                    gevent.sleep(POLL_S)
                self._fire(tail.read(), plan.name)
            finally:
                tail.close()
                _stop(process)
        if process.returncode != 0 or not out.exists():
            last = log.read_text(errors="replace").strip().splitlines()[-3:]
            return {"part": plan.part, "error": f"exit {process.returncode}: {' | '.join(last)}"}
        return {"part": plan.part, "report": json.loads(out.read_text())}

    def _fire(self, records: list[dict[str, Any]], name: str) -> None:
        fire = self.environment.events.request.fire
        for record in records:
            for request_type, time_ms, error in stat_entries(record):
                fire(
                    request_type=request_type,
                    name=name,
                    response_time=time_ms,
                    response_length=int(record.get("output_tokens") or 0),
                    exception=InferwireRequestError(error) if error else None,
                    context={"index": record.get("index")},
                )

    def _send(self, plan: PartPlan, result: dict[str, Any]) -> None:
        runner = self.environment.runner
        assert runner is not None
        if isinstance(runner, WorkerRunner):
            # the master's statistics get every request fired above before the report: wait
            # for the next statistics message (sent every few seconds) to go first
            WORKER.reported.clear()
            WORKER.reported.wait(timeout=3 * locust.runners.WORKER_REPORT_INTERVAL)
            gevent.sleep(0.1)
        runner.send_message(PART_MESSAGE, result)
        logger.info("inferwire: part %d/%d sent", plan.part, plan.parts)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Ends the part's process if it still runs (the test was stopped)."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(STOP_TIMEOUT_S)


if __name__ == "__main__":  # `python -m inferwire.load.locust_user`: the path for -f
    print(__file__)
