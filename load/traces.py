"""Replaying a timestamped trace (``--trace-file``): each request sent at its time in the
trace, with a prompt of the trace's length, asking for the trace's output length.

Formats (``--trace-format``; else guessed from the file name's suffix, then its first line):

``mooncake``
    JSONL, one request a line, as kvcache-ai/Mooncake publishes its traces
    (``FAST25-release/traces/*.jsonl``, ``mooncake_trace.jsonl``; the fields as its
    ``FAST25-release/README.md`` and NVIDIA Dynamo's ``benchmarks/data_generator/README.md``
    describe them): ``timestamp``, the request's arrival in milliseconds from the trace's
    start; ``input_length``, its prompt's tokens; ``output_length``, the tokens it generated;
    ``hash_ids``, its prompt's blocks of :data:`BLOCK_TOKENS` tokens, each a remapped hash of the
    block and what precedes it, so two requests whose lists begin with the same ids share that
    prefix (the last block may be partial). Other keys are ignored.
``azure``
    CSV with a header line, as Azure/AzurePublicDataset publishes its LLM inference traces
    (``data/AzureLLMInferenceTrace_{code,conv}.csv``, described in
    ``AzureLLMInferenceDataset2023.md``; the 2024 week-long ones have the same columns):
    ``TIMESTAMP``, the invocation time as a date and time (``2023-11-16 18:15:46.6805900``:
    seven fractional digits, no zone; an ISO ``T`` and a ``Z`` or ``+HH:MM`` zone are read
    too); ``ContextTokens``, the prompt's tokens; ``GeneratedTokens``, the tokens generated.
    Columns are found by name, others ignored. The trace has no prompts (they are private):
    every request gets one of its own, so nothing is shared.

Timestamps may not go backwards (both publishers sort them). The first request is the
schedule's zero and each one's offset is ``(t - t0) / speed`` (``--trace-speed``). Each request
asks for its output length as ``max_tokens``; a server may stop sooner at an end of sequence
(vLLM takes ``--extra-body '{"ignore_eos": true}'`` to go on). An output length of 0 asks for
1 token, and the trace's ``outputs_raised`` counts them.

Prompts are made of the project's vocabulary, about a token a word (with ``--tokenizer``, of
the tokenizer's tokens, and counted again whole), seeded: a Mooncake hash id is always the same
block of words for the same seed, so requests whose hash ids begin alike share that prefix, as
in the trace. Tokens past the blocks the hash ids cover are the request's own.

A malformed line (not JSON or not CSV, a field missing, negative or not a whole number, a
timestamp that is not a date and time, time going backwards) is a :class:`TraceFileError`
naming the file and line. Memory is bounded: a line may not pass :data:`MAX_LINE_CHARS`, and
the prompts made may not pass ``MAX_DRAW_TOKENS`` tokens in all (replay fewer requests with
``--requests N``, the trace's first N).
"""

from __future__ import annotations

import calendar
import contextlib
import csv
import json
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final, Literal

import numpy as np

from .prompt_sets import MAX_DRAW_TOKENS, WORDS, Prompt, drawable_ids
from .tokenizer import Tokenizer

TraceFormat = Literal["mooncake", "azure"]
FORMATS: Final[tuple[TraceFormat, ...]] = ("mooncake", "azure")
BLOCK_TOKENS: Final = 512
"""Tokens of a Mooncake hash id's block (its README and the FAST'25 paper's appendix)."""
MAX_LINE_CHARS: Final = 4 << 20
MAX_REQUESTS: Final = 10_000_000
AZURE_COLUMNS: Final = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_SUFFIXES: Final[dict[str, TraceFormat]] = {
    ".jsonl": "mooncake",
    ".ndjson": "mooncake",
    ".json": "mooncake",
    ".csv": "azure",
}
_DATETIME: Final = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
    r"(Z|[+-]\d{2}:?\d{2})?"
)


class TraceFileError(ValueError):
    """A trace that cannot be replayed; ``line`` is where (1-based), 0 for the whole file."""

    def __init__(self, path: Path, line: int, reason: str) -> None:
        super().__init__(f"{path}:{line}: {reason}" if line else f"{path}: {reason}")
        self.path = path
        self.line = line


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceRequest:
    """One request of a trace."""

    time_ns: int
    """Its arrival, nanoseconds on the trace's own clock (not yet from the first request)."""
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] | None
    """Mooncake's blocks; None for a trace without them."""
    line: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Trace:
    """A trace read whole (:func:`read_trace`)."""

    path: Path
    format: TraceFormat
    requests: tuple[TraceRequest, ...]
    outputs_raised: int = 0
    """Requests whose output length of 0 became 1."""

    def __post_init__(self) -> None:
        if not self.requests:
            raise TraceFileError(self.path, 0, "no requests")

    def first(self, count: int | None) -> Trace:
        """The trace's first ``count`` requests (None: all)."""
        if count is None or count >= len(self.requests):
            return self
        raised = sum(1 for r in self.requests[:count] if r.output_tokens == 0)
        return Trace(
            path=self.path,
            format=self.format,
            requests=self.requests[:count],
            outputs_raised=raised,
        )

    def offsets_ns(self, speed: float) -> np.ndarray:
        """Each request's intended send time after the first's, at ``speed`` times the trace's
        pace."""
        times = np.fromiter((r.time_ns for r in self.requests), np.int64, len(self.requests))
        offsets: np.ndarray = np.round((times - times[0]) / speed).astype(np.int64)
        return offsets

    def rate_rps(self, speed: float) -> float:
        """The trace's mean rate at ``speed``: requests after the first over its span (inf when
        every request has the one time)."""
        span_ns = (self.requests[-1].time_ns - self.requests[0].time_ns) / speed
        return (len(self.requests) - 1) / (span_ns / 1e9) if span_ns > 0 else math.inf

    def describe(self, speed: float) -> dict[str, Any]:
        """For the report."""
        return {
            "path": str(self.path),
            "format": self.format,
            "requests": len(self.requests),
            "speed": speed,
            "span_s": (self.requests[-1].time_ns - self.requests[0].time_ns) / 1e9,
            "input_tokens": sum(r.input_tokens for r in self.requests),
            "output_tokens": sum(max(r.output_tokens, 1) for r in self.requests),
            "outputs_raised": self.outputs_raised,
            "hash_ids": any(r.hash_ids for r in self.requests),
        }

    def prompts(self, *, seed: int, tokenizer: Tokenizer | None = None) -> list[Prompt]:
        """One prompt per request, in the trace's order (:func:`make_prompts`)."""
        return make_prompts(self.requests, seed=seed, tokenizer=tokenizer, path=self.path)


# -- reading ------------------------------------------------------------------------------------


def guess_format(path: Path) -> TraceFormat:
    """From the suffix, else from the first line: ``{`` is Mooncake, a header naming
    ``TIMESTAMP`` is Azure."""
    known = _SUFFIXES.get(path.suffix.lower())
    if known is not None:
        return known
    with _opened(path) as file, _read_errors(path):
        first = ""
        while not first and (line := file.readline(MAX_LINE_CHARS)):
            first = line.strip()
    if first.startswith("{"):
        return "mooncake"
    if "TIMESTAMP" in first.upper().split(","):
        return "azure"
    raise TraceFileError(
        path, 0, "neither a Mooncake JSONL nor an Azure CSV trace: give --trace-format"
    )


def read_trace(path: Path, fmt: TraceFormat | None = None, *, limit: int | None = None) -> Trace:
    """The trace at ``path`` (``fmt``: guessed when None), its first ``limit`` requests only
    when given (the rest of the file is not read)."""
    fmt = fmt or guess_format(path)
    if fmt not in FORMATS:
        raise TraceFileError(path, 0, f"unknown trace format {fmt!r} (one of {', '.join(FORMATS)})")
    wanted = MAX_REQUESTS if limit is None else min(limit, MAX_REQUESTS)
    requests: list[TraceRequest] = []
    with _opened(path) as file, _read_errors(path):
        rows = _mooncake(file, path) if fmt == "mooncake" else _azure(file, path)
        for request in rows:
            if requests and request.time_ns < requests[-1].time_ns:
                raise TraceFileError(path, request.line, "its time is before the line above's")
            requests.append(request)
            if len(requests) == wanted:
                break
    if not requests:
        raise TraceFileError(path, 0, "no requests")
    if limit is None and len(requests) == MAX_REQUESTS:
        raise TraceFileError(
            path, 0, f"more than {MAX_REQUESTS} requests: replay fewer (--requests)"
        )
    raised = sum(1 for r in requests if r.output_tokens == 0)
    return Trace(path=path, format=fmt, requests=tuple(requests), outputs_raised=raised)


def _opened(path: Path) -> IO[str]:
    try:
        return path.open(encoding="utf-8-sig", newline="")
    except OSError as exc:
        raise TraceFileError(path, 0, exc.strerror or str(exc)) from None


@contextlib.contextmanager
def _read_errors(path: Path) -> Iterator[None]:
    """A failed read, or text that is not UTF-8, as a :class:`TraceFileError`."""
    try:
        yield
    except UnicodeDecodeError as exc:
        raise TraceFileError(path, 0, f"not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise TraceFileError(path, 0, f"cannot be read: {exc}") from None


def _whole(value: object, name: str, path: Path, line: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TraceFileError(path, line, f"{name!r} is {value!r}, not a whole number of 0 or more")
    return value


def _mooncake(file: IO[str], path: Path) -> Iterator[TraceRequest]:
    for line, text in enumerate(iter(lambda: file.readline(MAX_LINE_CHARS + 1), ""), 1):
        if len(text) > MAX_LINE_CHARS:
            raise TraceFileError(path, line, f"a line longer than {MAX_LINE_CHARS} characters")
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceFileError(path, line, f"not JSON: {exc.msg}") from None
        if not isinstance(record, dict):
            raise TraceFileError(path, line, "a line that is not a JSON object")
        missing = [k for k in ("timestamp", "input_length", "output_length") if k not in record]
        if missing:
            raise TraceFileError(path, line, f"no {', '.join(repr(k) for k in missing)}")
        stamp = record["timestamp"]
        if isinstance(stamp, bool) or not isinstance(stamp, int | float):
            raise TraceFileError(path, line, f"'timestamp' is {stamp!r}, not milliseconds")
        if not (math.isfinite(stamp) and 0 <= stamp < 1e15):
            raise TraceFileError(path, line, f"'timestamp' {stamp!r} is not 0 or more milliseconds")
        inputs = _whole(record["input_length"], "input_length", path, line)
        if inputs < 1:
            raise TraceFileError(path, line, "'input_length' is 0: a prompt has a token or more")
        ids = record.get("hash_ids")
        if ids is not None:
            if not isinstance(ids, list):
                raise TraceFileError(path, line, "'hash_ids' is not a list")
            ids = tuple(_whole(h, "hash_ids", path, line) for h in ids)
        yield TraceRequest(
            time_ns=round(stamp * 1_000_000),
            input_tokens=inputs,
            output_tokens=_whole(record["output_length"], "output_length", path, line),
            hash_ids=ids or None,
            line=line,
        )


def _azure(file: IO[str], path: Path) -> Iterator[TraceRequest]:
    reader = csv.reader(file, strict=True)
    columns: tuple[int, int, int] | None = None
    try:
        for row in reader:
            line = reader.line_num
            if not row or not any(cell.strip() for cell in row):
                continue
            if columns is None:
                columns = _header(row, path, line)
                continue
            if len(row) <= max(columns):
                raise TraceFileError(path, line, f"{len(row)} columns, the header names more")
            stamp, context, generated = (row[i].strip() for i in columns)
            yield TraceRequest(
                time_ns=parse_datetime_ns(stamp, path, line),
                input_tokens=_cell(context, "ContextTokens", path, line, lowest=1),
                output_tokens=_cell(generated, "GeneratedTokens", path, line, lowest=0),
                hash_ids=None,
                line=line,
            )
    except csv.Error as exc:
        raise TraceFileError(path, reader.line_num, f"not CSV: {exc}") from None


def _header(row: Sequence[str], path: Path, line: int) -> tuple[int, int, int]:
    names = [cell.strip().lower() for cell in row]
    found = []
    for column in AZURE_COLUMNS:
        if column.lower() not in names:
            raise TraceFileError(
                path,
                line,
                f"the header has no {column} column (it needs {', '.join(AZURE_COLUMNS)})",
            )
        found.append(names.index(column.lower()))
    return found[0], found[1], found[2]


def _cell(text: str, name: str, path: Path, line: int, *, lowest: int) -> int:
    if not text.isascii() or not text.isdigit() or int(text) < lowest:
        raise TraceFileError(
            path, line, f"{name} is {text!r}, not a whole number of {lowest} or more"
        )
    return int(text)


def parse_datetime_ns(text: str, path: Path, line: int) -> int:
    """``YYYY-MM-DD HH:MM:SS[.fraction][zone]`` as nanoseconds since the UNIX epoch (no zone:
    as UTC, which only the differences matter for), to the nanosecond: the fraction has up to
    nine digits (Azure writes seven, .NET's ticks), more than ``datetime`` keeps."""
    match = _DATETIME.fullmatch(text)
    if match is None:
        raise TraceFileError(path, line, f"TIMESTAMP {text!r} is not a date and time")
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    fraction, zone = match.group(7) or "", match.group(8)
    if not (1 <= month <= 12 and 1 <= day <= calendar.monthrange(year, month)[1]) or not (
        hour < 24 and minute < 60 and second < 60
    ):
        raise TraceFileError(path, line, f"TIMESTAMP {text!r} is not a date and time")
    seconds = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    if zone and zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        seconds -= sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    return seconds * 1_000_000_000 + int(fraction.ljust(9, "0") or 0)


# -- prompts ------------------------------------------------------------------------------------


def make_prompts(
    requests: Sequence[TraceRequest],
    *,
    seed: int,
    tokenizer: Tokenizer | None = None,
    path: Path = Path("trace"),
) -> list[Prompt]:
    """A prompt per request: its hash ids' blocks (the same block for the same id), then tokens
    of its own up to its input length; asking for its output length (at least 1)."""
    total = sum(r.input_tokens for r in requests)
    if total > MAX_DRAW_TOKENS:
        raise TraceFileError(
            path,
            0,
            f"its {len(requests)} prompts make {total} tokens, more than the {MAX_DRAW_TOKENS}"
            " one run may hold: replay its first requests only (--requests N)",
        )
    pool = len(WORDS) if tokenizer is None else len(ids := drawable_ids(tokenizer))
    rng = np.random.default_rng([seed, 4])
    rows: dict[int, int] = {}
    for request in requests:  # each block's row, in order of first appearance
        for hash_id in request.hash_ids or ():
            rows.setdefault(hash_id, len(rows))
    blocks = rng.integers(0, pool, size=(len(rows), BLOCK_TOKENS), dtype=np.int32)
    sequences: list[np.ndarray] = []
    for request in requests:
        shared = [blocks[rows[h]] for h in request.hash_ids or ()]
        covered = len(shared) * BLOCK_TOKENS
        own = max(request.input_tokens - covered, 0)
        parts = [*shared, rng.integers(0, pool, size=own, dtype=np.int32)]
        sequences.append(np.concatenate(parts)[: request.input_tokens])
    outputs = [max(r.output_tokens, 1) for r in requests]
    if tokenizer is None:
        words = np.asarray(WORDS, dtype=object)
        return [
            Prompt(text=" ".join(words[s].tolist()), input_tokens=len(s), max_tokens=out)
            for s, out in zip(sequences, outputs, strict=True)
        ]
    texts = tokenizer.decode_batch([ids[s].tolist() for s in sequences])
    counts = tokenizer.count_batch(texts)
    return [
        Prompt(text=text, input_tokens=n, max_tokens=out, input_tokens_exact=True)
        for text, n, out in zip(texts, counts, outputs, strict=True)
    ]


def expected_block_hits(requests: Sequence[TraceRequest], seen: set[int]) -> tuple[int, int]:
    """(tokens a cache keeping every block would serve, input tokens) over ``requests`` in
    order: each request's leading hash ids that an earlier request had (``seen``, updated), a
    block each, up to its input length."""
    hits = inputs = 0
    for request in requests:
        inputs += request.input_tokens
        matched = 0
        for hash_id in request.hash_ids or ():
            if hash_id not in seen:
                break
            matched += 1
        hits += min(matched * BLOCK_TOKENS, request.input_tokens)
        seen.update(request.hash_ids or ())
    return hits, inputs
