"""pytest-benchmark settings shared by the suites under bench/.

GC: objects built before the timing (workloads, prepared messages) are frozen out of the
collector, and pytest-benchmark's ``--benchmark-disable-gc`` is on by default here, so a
collection pass is never billed to one unlucky round. Each result's ``extra_info`` names the
codec, the workload, the wire size and whether the round trip was correct.

Event loop: the run's (``$INFERWIRE_LOOP``, ``inferwire bench --loop``; uvloop when
installed) is recorded in ``machine_info["event_loop"]`` beside uvloop's version; each result
records the loops its client and servers actually ran on.

Calibration: a timed run measures two fixed workloads at its start, middle and end and reads
the machine's CPU counters (:mod:`inferwire.bench.measure.calibration`); the JSON of the run
records them under ``calibration``, with the run's stability verdict.
"""

from __future__ import annotations

import gc
import os
import platform
from collections.abc import Generator, Iterator
from typing import Any

import pytest

from inferwire._runtime.loops import LOOP_ENV, requested_loop
from inferwire._runtime.versions import CORE_LIBRARIES, library_versions
from inferwire.bench.measure.calibration import Calibration

LIBRARIES = (*CORE_LIBRARIES, "pytest-benchmark", "uvloop")


def pytest_benchmark_update_machine_info(config: Any, machine_info: dict[str, Any]) -> None:
    from inferwire.codecs.protobuf_codec import BACKEND

    machine_info["libraries"] = library_versions(LIBRARIES)
    machine_info["protobuf_backend"] = BACKEND
    machine_info["python_implementation"] = platform.python_implementation()
    machine_info["event_loop"] = requested_loop()
    machine_info["event_loop_requested"] = os.environ.get(LOOP_ENV) or "auto"


def pytest_configure(config: pytest.Config) -> None:
    option = config.option
    if hasattr(option, "benchmark_disable_gc"):
        option.benchmark_disable_gc = True
    # every timed run is saved under ./.benchmarks/ (of the working directory), so
    # `pytest bench/ --benchmark-compare` compares with the previous run out of the box. The
    # value is the run's name: the flag --benchmark-autosave stores get_tag() (commit id, date,
    # "uncommitted-changes" if dirty), so the same here; True would name the file 0001_True.json
    if getattr(option, "benchmark_autosave", False) is None and not option.benchmark_disable:
        from pytest_benchmark.utils import get_tag

        option.benchmark_autosave = get_tag()  # type: ignore[no-untyped-call]


_CALIBRATION = pytest.StashKey[Calibration]()
_MIDDLE = pytest.StashKey[int]()
_STARTED = pytest.StashKey[int]()


def _calibration(config: pytest.Config) -> Calibration | None:
    return config.stash.get(_CALIBRATION, None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtestloop(session: pytest.Session) -> Generator[None, None, None]:
    config = session.config
    # pytest-benchmark's own verdict (it is off under --benchmark-disable unless
    # --benchmark-enable, and in an xdist worker), when it exposes one: a run it does not time
    # writes no JSON to record a calibration in
    benchmarks = getattr(config, "_benchmarksession", None)
    if benchmarks is not None:
        timed = not benchmarks.disabled
    else:
        timed = not getattr(config.option, "benchmark_disable", True)
    if timed and session.items and not config.option.collectonly:
        calibration = Calibration()
        calibration.point("start")
        config.stash[_CALIBRATION] = calibration
        config.stash[_MIDDLE] = len(session.items) // 2
        config.stash[_STARTED] = 0
    yield
    ended = _calibration(config)
    if ended is not None:
        ended.point("end")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    config = item.config
    calibration = _calibration(config)
    if calibration is None:
        return
    started = config.stash[_STARTED]
    config.stash[_STARTED] = started + 1
    # once half the items have run (a single item has no middle: its start is the run's)
    if started and started == config.stash[_MIDDLE]:
        calibration.point("middle")


def pytest_benchmark_update_json(
    config: pytest.Config, benchmarks: Any, output_json: dict[str, Any]
) -> None:
    calibration = _calibration(config)
    if calibration is not None:
        output_json["calibration"] = calibration.summary()


@pytest.fixture(autouse=True, scope="session")
def _frozen_heap() -> Iterator[None]:
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()
