"""What a split run's Locust glue (:mod:`inferwire.load.locust_user`) does that needs
no Locust: check the ``inferwire load`` arguments once on the master, build each part's
command line, and read the per-request records a part writes while it runs.

Kept apart from the Locust module because importing Locust monkey-patches the standard
library for gevent: this module is safe to import anywhere, and is what the tests import.
"""

from __future__ import annotations

import json
import math
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final

from inferwire._runtime import arguments
from inferwire._runtime.arguments import CommandError, Parser

from . import load_arguments

SET_BY_THE_SPLIT: Final = ("--part", "--start-at", "--out", "--records", "--spawn")
"""Options of ``inferwire load`` that the split run sets itself (or that cannot be split: a
server spawned per part would be N servers, not one)."""


class SplitRunError(CommandError):
    """``inferwire load`` arguments that cannot be split, or a plan that is not one."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadArguments:
    """The ``inferwire load`` arguments every part shares, checked."""

    args: tuple[str, ...]
    name: str
    """What Locust's statistics call the requests: the API, else transport/codec."""


def check_load_arguments(text: str) -> LoadArguments:
    """Parses ``text`` as ``inferwire load`` would: one point (one rate, one cap), a server
    given by address, and none of :data:`SET_BY_THE_SPLIT`. Raises :class:`SplitRunError`."""
    try:
        args = tuple(shlex.split(text))
    except ValueError as exc:
        raise SplitRunError(f"the inferwire load arguments {text!r}: {exc}") from None
    for option in SET_BY_THE_SPLIT:
        if any(a == option or a.startswith(option + "=") for a in args):
            raise SplitRunError(f"{option} is set by the split run, or cannot be split")
    try:
        parsed, unknown = _load_parser().parse_known_args(args)
    except SystemExit:  # argparse printed the reason
        raise SplitRunError(f"the inferwire load arguments are not valid: {text!r}") from None
    if unknown:
        raise SplitRunError(f"inferwire load does not know: {' '.join(unknown)}")
    caps = parsed.concurrency or [None]
    if len(parsed.rate) * len(caps) != 1:
        raise SplitRunError("a split run is one point: give one --rate and one --concurrency")
    api = getattr(parsed, "api", None)
    name = str(api) if api else f"{parsed.transport}/{parsed.codec}"
    return LoadArguments(args=args, name=name)


def _load_parser() -> Parser:
    """The options of ``inferwire load`` (:mod:`inferwire.cli.load` adds the same), to check
    with: the Locust glue runs without the CLI, which sits above this layer."""
    parser = Parser(prog="inferwire load")
    load_arguments.add_load_arguments(parser)
    arguments.add_trace_arguments(parser, "each request's stages")
    load_arguments.add_output_arguments(parser)
    load_arguments.add_metrics_arguments(parser)
    load_arguments.add_attribution_arguments(parser)
    return parser


@dataclass(frozen=True, slots=True, kw_only=True)
class PartPlan:
    """What the master tells one worker: its share of the schedule and when it starts."""

    load_args: tuple[str, ...]
    part: int
    parts: int
    start_at_unix_s: float
    name: str

    def __post_init__(self) -> None:
        if not 0 <= self.part < self.parts:
            raise SplitRunError(f"part {self.part}/{self.parts}: needs 0 <= I < N")
        if not math.isfinite(self.start_at_unix_s):
            raise SplitRunError("the start must be a finite UNIX time")

    def command(self, *, out: Path, records: Path) -> list[str]:
        """The ``inferwire load`` command line of this part, in this Python."""
        return [
            sys.executable,
            "-m",
            "inferwire.cli",
            "load",
            *self.load_args,
            "--part",
            f"{self.part}/{self.parts}",
            "--start-at",
            repr(self.start_at_unix_s),
            "--out",
            str(out),
            "--records",
            str(records),
            "--quiet",
        ]

    def to_message(self) -> dict[str, Any]:
        return {
            "load_args": list(self.load_args),
            "part": self.part,
            "parts": self.parts,
            "start_at_unix_s": self.start_at_unix_s,
            "name": self.name,
        }

    @classmethod
    def from_message(cls, data: Any) -> PartPlan:
        try:
            return cls(
                load_args=tuple(str(a) for a in data["load_args"]),
                part=int(data["part"]),
                parts=int(data["parts"]),
                start_at_unix_s=float(data["start_at_unix_s"]),
                name=str(data["name"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SplitRunError(f"not a part plan: {exc}") from None


class RecordTail:
    """The records a running ``inferwire load --records FILE.jsonl`` has written so far: each
    :meth:`read` returns the lines completed since the last (a line still being written waits
    for the next), and never blocks. The file may not exist yet."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[bytes] | None = None
        self._rest = b""

    def read(self) -> list[dict[str, Any]]:
        if self._file is None:
            try:
                self._file = self.path.open("rb")
            except FileNotFoundError:
                return []
        data = self._rest + self._file.read()
        *lines, self._rest = data.split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


STAT_TYPES: Final = (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("ITL max", "itl_max_ms"))
"""Locust request types of a completed request, besides "E2E", and the record field of each."""


def stat_entries(record: dict[str, Any]) -> list[tuple[str, float, str | None]]:
    """What Locust's statistics get of one record: ``(request type, milliseconds, error)``.
    A failed request is one failed "E2E"; a completed one an "E2E" and each of
    :data:`STAT_TYPES` it has a value of. A record kept out of the statistics (warm-up or
    cool-down) gives nothing."""
    if not record.get("measured", True):
        return []
    e2e_ms = float(record["e2e_ms"])
    if not record["ok"]:
        return [("E2E", e2e_ms, str(record.get("error") or "failed"))]
    entries: list[tuple[str, float, str | None]] = [("E2E", e2e_ms, None)]
    for request_type, key in STAT_TYPES:
        value = record.get(key)
        if value is not None:
            entries.append((request_type, float(value), None))
    return entries
