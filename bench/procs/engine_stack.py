"""The real stack of the engine benchmarks: an engine process (``inferwire engine``) and a
frontend (``inferwire serve --engine``) that reports what the benchmarks read.

The frontend is ``inferwire serve`` itself (:func:`inferwire.transports.serve.serve`), started
through this module (``python -m inferwire.bench.procs.engine_stack [--stage-log PATH]
[--counters PATH] OPTIONS``, OPTIONS the JSON of its
:class:`~inferwire.transports.serve.ServeOptions`), which swaps in :class:`LoggedEngineService`
before ``serve`` builds its service:

- ``--stage-log PATH``: every request asks the engine for its stage times (END_STATS), and
  the frontend appends one JSON line per finished stream to PATH: the request's ``seed``,
  ``max_tokens``, ``prompt_tokens``, its ``chunks`` and the engine's stage times (seconds). A
  write per request is frontend CPU the benchmark adds, so only the stage benchmark asks.
- ``--counters PATH``: on SIGUSR1 the frontend writes its engine client's counters
  (``decode_ns``, the hop decode time, ``chunks_decoded``, ...) and its own CPU time to PATH,
  with a sequence number that each write increments (:meth:`EngineStack.counters` waits for it).

Both processes run on the run's event loop and announce their addresses on stdout, as every
process the benchmarks start does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import AsyncGenerator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from inferwire._runtime.loops import requested_loop
from inferwire.codecs import TokenChunk
from inferwire.engine.launch import EngineProcess
from inferwire.transports import engine_service, server_process
from inferwire.transports.serve import ServeOptions
from inferwire.transports.service import MAX_BATCH_CHUNKS, TokenStream

COUNTERS_TIMEOUT_S: Final = 10.0


class _Logs:
    """Where this frontend process writes (set by :func:`main`)."""

    stage_log: Any = None
    counters_path: Path | None = None
    counters_written = 0
    services: list[engine_service.EngineService] = []  # noqa: RUF012 - one per process


class LoggedEngineService(engine_service.EngineService):
    """:class:`~inferwire.transports.engine_service.EngineService` that asks for stage times
    when a stage log is open, and logs each finished stream's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["stage_times"] = _Logs.stage_log is not None
        super().__init__(*args, **kwargs)
        _Logs.services.append(self)

    async def batches(
        self, stream: TokenStream, *, max_chunks: int = MAX_BATCH_CHUNKS
    ) -> AsyncGenerator[list[TokenChunk], None]:
        chunks = 0
        async with contextlib.aclosing(super().batches(stream, max_chunks=max_chunks)) as inner:
            async for batch in inner:
                chunks += len(batch)
                yield batch
            # set by the stream that just ended, with no await since: this stream's times
            times = self.last_stage_times
        log = _Logs.stage_log
        if log is not None and times is not None:
            request = stream.request
            line = {
                "seed": request.seed,
                "max_tokens": request.max_tokens,
                "prompt_tokens": request.prompt_tokens,
                "chunks": chunks,
                "ended_ns": time.monotonic_ns(),
                **times,
            }
            log.write(json.dumps(line) + "\n")


def _write_counters(signum: int, frame: object) -> None:
    path = _Logs.counters_path
    if path is None:
        return
    _Logs.counters_written += 1
    client: dict[str, int] = {}
    for service in _Logs.services:
        for name, value in service.client.stats().items():
            client[name] = client.get(name, 0) + value
    times = os.times()
    document = {
        "seq": _Logs.counters_written,
        "client": client,
        "cpu_s": times.user + times.system,
    }
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(document))
    partial.replace(path)


def main(argv: Sequence[str] | None = None) -> int:
    """``[--stage-log PATH] [--counters PATH]`` then the JSON of ``inferwire serve``'s
    options."""
    from inferwire.transports import serve

    args = list(sys.argv[1:] if argv is None else argv)
    while args and args[0] in ("--stage-log", "--counters"):
        flag, path = args[0], Path(args[1])
        del args[:2]
        if flag == "--stage-log":
            _Logs.stage_log = path.open("a", buffering=1)  # a line at a time
        else:
            _Logs.counters_path = path
            signal.signal(signal.SIGUSR1, _write_counters)
    # serve imports the service class from this module when --engine asks for it
    engine_service.EngineService = LoggedEngineService  # type: ignore[misc]
    (options,) = args
    try:
        return serve.serve(serve.ServeOptions(**json.loads(options)))
    finally:
        if _Logs.stage_log is not None:
            _Logs.stage_log.close()


class EngineStack:
    """An engine process and a frontend in front of it; a context manager.

    ``engine_options`` go to ``inferwire engine`` (``--policy``, ``--step-scale``, ...);
    the frontend serves ``transport`` with ``codec`` to its clients and speaks ``hop_codec``
    to the engine over an IPC socket in a temporary directory."""

    def __init__(
        self,
        hop_codec: str,
        *engine_options: str,
        transport: str = "http1",
        codec: str = "orjson",
        stage_log: bool = False,
    ) -> None:
        self.hop_codec = hop_codec
        self.transport = transport
        self.codec = codec
        self._dir = tempfile.TemporaryDirectory(prefix="inferwire-engine-")
        root = Path(self._dir.name)
        pickle = ("--allow-pickle",) if hop_codec == "pickle" else ()
        self.engine = EngineProcess(
            "--endpoint",
            f"ipc://{root / 'engine.sock'}",
            "--codec",
            hop_codec,
            *pickle,
            *engine_options,
        )
        self.stage_log_path = root / "stages.jsonl" if stage_log else None
        self.counters_path = root / "counters.json"
        self.frontend: server_process.ServerProcess | None = None
        self._pickle = pickle
        self._seq = 0

    def start(self) -> EngineStack:
        try:
            self.engine.start()
            options = ServeOptions(
                transport=self.transport,
                codec=self.codec,
                engine=self.engine.endpoint,
                engine_codec=self.hop_codec,
                allow_pickle=bool(self._pickle),
                no_metrics=True,  # as server_process.serve's servers
                loop=requested_loop(),
            )
            logs = ["--counters", str(self.counters_path)]
            if self.stage_log_path is not None:
                logs += ["--stage-log", str(self.stage_log_path)]
            frontend = server_process.ServerProcess()
            options_json = json.dumps(dataclasses.asdict(options))
            frontend.args = [sys.executable, "-m", __name__, *logs, options_json]
            self.frontend = frontend.start()
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def address(self) -> str:
        assert self.frontend is not None, "not started"
        return self.frontend.address

    @property
    def frontend_pid(self) -> int:
        process = self.frontend.process if self.frontend is not None else None
        if process is None:
            raise RuntimeError("the stack is not started")
        return process.pid

    def counters(self) -> dict[str, Any]:
        """The frontend's counters now (its engine client's, and its CPU seconds)."""
        self._seq += 1
        os.kill(self.frontend_pid, signal.SIGUSR1)
        deadline = time.monotonic() + COUNTERS_TIMEOUT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                document: dict[str, Any] = json.loads(self.counters_path.read_text())
                if document["seq"] >= self._seq:
                    self._seq = int(document["seq"])
                    return document
            time.sleep(0.005)
        raise RuntimeError("the frontend did not write its counters")

    def stage_lines(self) -> list[dict[str, Any]]:
        """Every stream's line of the stage log so far."""
        if self.stage_log_path is None or not self.stage_log_path.exists():
            return []
        text = self.stage_log_path.read_text()
        return [json.loads(line) for line in text.splitlines() if line.endswith("}")]

    def stop(self) -> None:
        if self.frontend is not None:
            self.frontend.stop()
            self.frontend = None
        self.engine.stop()
        self._dir.cleanup()

    def __enter__(self) -> EngineStack:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


if __name__ == "__main__":
    sys.exit(main())
