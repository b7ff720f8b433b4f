"""What the tests of the codecs' C extensions share: code run in a child process with the
extensions on (a crash there fails one test, not the run), the same under Python's debug
allocator, and memory measured by tracemalloc (also what the hostile-input tests bound a
refusal's memory with).
"""

from __future__ import annotations

import dataclasses
import gc
import os
import subprocess
import sys
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import inferwire.codecs as ic

CHILD_TIMEOUT_S = 600.0
"""A child process's bound: generous, the machine is a busy 2-core one."""


def run_child(*args: str, dev_mode: bool = False, pure_python: str | None = None) -> str:
    """The standard output of ``python [-X dev -W error] ARGS``, which must exit 0 (else the
    test fails with its standard error). ``INFERWIRE_PURE_PYTHON`` is removed from its
    environment (the extensions on), or set to ``pure_python``."""
    env = {k: v for k, v in os.environ.items() if k != "INFERWIRE_PURE_PYTHON"}
    if pure_python is not None:
        env["INFERWIRE_PURE_PYTHON"] = pure_python
    flags = ["-X", "dev", "-W", "error"] if dev_mode else []
    done = subprocess.run(
        [sys.executable, *flags, *args],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def assert_same_under_dev_mode(script: str) -> None:
    """``script`` (which prints "same" when every check passed) under ``-X dev``: the debug
    allocator's hooks report a write past the end of a buffer an extension fills when it is
    freed (a crash), where it would otherwise corrupt memory silently."""
    assert run_child("-c", script, dev_mode=True).strip() == "same"


@contextmanager
def peak_memory(limit_bytes: int) -> Iterator[None]:
    """Fail if the block allocates more than ``limit_bytes`` at its peak (tracemalloc)."""
    tracemalloc.start()
    try:
        yield
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < limit_bytes, f"peak {peak} bytes"


def assert_nothing_kept(
    loop: Callable[[int], None],
    held: Sequence[object],
    *,
    warm: int,
    times: int,
    limit_bytes: int = 64 * 1024,
) -> None:
    """``loop(times)`` keeps no memory (tracemalloc sees PyMem and object allocations) and
    leaves the reference count of every object in ``held`` as it was; ``loop(warm)`` first,
    for caches and free lists."""
    refcounts = [sys.getrefcount(x) for x in held]
    loop(warm)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        loop(times)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < limit_bytes, f"{grown} bytes kept after loop({times})"
    assert [sys.getrefcount(x) for x in held] == refcounts


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WiderUsage:
    """Usage's fields and one more: an extension would leave that one unset."""

    prompt_tokens: int
    completion_tokens: int
    extra: int


CHUNK_CLASSES_IT_CANNOT_FILL: list[tuple[object, ...]] = [
    (ic.TokenChunk, ic.TokenLogprob, ic.TopLogprob, WiderUsage),  # a field it does not know
    (ic.TokenLogprob, ic.TokenChunk, ic.TopLogprob, ic.Usage),  # fields missing
    (ic.TokenChunk, ic.TokenLogprob, ic.TopLogprob, dict),  # not a slotted class
    (ic.TokenChunk, ic.TokenLogprob, ic.TopLogprob, None),
]
"""The four model classes as configure() takes them (codecs/_model_slots.h binds them for every
extension that builds or reads chunks), wrong in each way it must refuse."""
