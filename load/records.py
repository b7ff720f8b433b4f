"""Per-request records of a load run, one line a request, written while the run goes: a
Locust integration (or ``tail -f``) reads them live.

The format follows the file name: ``.csv`` (a header line of :data:`FIELDS`, then one row a
request), ``.jsonl`` or ``.ndjson`` (one JSON object a line, keys :data:`FIELDS`), and ``-`` for
JSONL on standard output. The fields are those of
:class:`~inferwire.load.metrics.RequestRecord`, by name, then ``point`` (the index of
the sweep point, as in the JSON report's ``points``) and ``rate_rps`` (its rate; ``"inf"`` for
all at once). In CSV a ``None`` is an empty cell.

Records are buffered and written in bulk: when :data:`FLUSH_EVERY_RECORDS` wait, and, inside an
event loop, at most :data:`FLUSH_EVERY_S` after the first of them arrived (a timer on the
loop; outside one, at the next record that comes after that time). A write that fails (a full
disk) stops the writing, not the run: :meth:`RecordWriter.close` raises it.

The cost to the generator: about 5 us a record as JSONL and 10 us as CSV (orjson's dataclass
serialization; the csv module), measured on a busy 2-core machine where the generator spends
some 500 us a request.
"""

from __future__ import annotations

import asyncio
import csv
import io
import operator
import sys
import time
from dataclasses import fields
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Final, Literal

import orjson

from .metrics import RecordSink, RequestRecord

RECORD_FIELDS: Final = tuple(f.name for f in fields(RequestRecord))
FIELDS: Final = (*RECORD_FIELDS, "point", "rate_rps")
FLUSH_EVERY_S: Final = 0.5
FLUSH_EVERY_RECORDS: Final = 1024
STDOUT: Final = "-"

Format = Literal["csv", "jsonl"]
_SUFFIXES: Final[dict[str, Format]] = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
_row = operator.attrgetter(*RECORD_FIELDS)


class RecordsError(ValueError):
    """A records file that cannot be written: an unknown suffix, or a failed write."""


def records_format(path: str | Path) -> Format:
    """``"csv"`` or ``"jsonl"``, from the file's suffix (``-``: JSONL on standard output)."""
    if str(path) == STDOUT:
        return "jsonl"
    suffix = Path(path).suffix.lower()
    if suffix not in _SUFFIXES:
        raise RecordsError(f"records file {str(path)!r}: name it .csv, .jsonl or .ndjson (or -)")
    return _SUFFIXES[suffix]


class RecordWriter:
    """Writes :class:`RequestRecord` s to ``stream`` (binary) as ``fmt``; :meth:`sink` gives
    the callable a point's :class:`~inferwire.load.metrics.Recorder` calls."""

    def __init__(
        self,
        stream: IO[bytes],
        fmt: Format,
        *,
        close_stream: bool = False,
        flush_every_s: float = FLUSH_EVERY_S,
        flush_every_records: int = FLUSH_EVERY_RECORDS,
    ) -> None:
        self._stream = stream
        self._format = fmt
        self._close_stream = close_stream
        self._every_s = flush_every_s
        self._every_records = flush_every_records
        # each record with what its point adds: JSON bytes, or CSV columns
        self._pending: list[tuple[RequestRecord, Any]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._oldest_s = 0.0
        self._error: OSError | None = None
        self.written = 0
        """Records written so far (flushed to the stream)."""
        if fmt == "csv":
            self._write(self._csv([FIELDS]))

    @classmethod
    def open(
        cls,
        path: str | Path,
        *,
        flush_every_s: float = FLUSH_EVERY_S,
        flush_every_records: int = FLUSH_EVERY_RECORDS,
    ) -> RecordWriter:
        """A writer to the file ``path`` (created, with its folders; replaced if it exists), or
        to standard output for ``-``."""
        fmt = records_format(path)
        if str(path) == STDOUT:
            sys.stdout.flush()  # what was printed before goes first
            stream: IO[bytes] = sys.stdout.buffer
            close_stream = False
        else:
            path = Path(path)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                stream = path.open("wb")
            except OSError as exc:
                raise RecordsError(f"cannot write the records to {path}: {exc}") from exc
            close_stream = True
        return cls(
            stream,
            fmt,
            close_stream=close_stream,
            flush_every_s=flush_every_s,
            flush_every_records=flush_every_records,
        )

    def sink(self, *, point: int, rate_rps: float | str) -> RecordSink:
        """The sink of sweep point ``point``, at ``rate_rps``."""
        if self._format == "jsonl":
            extra = b',"point":%d,"rate_rps":%s}\n' % (point, orjson.dumps(rate_rps))
            return lambda record: self._add(record, extra)
        columns = (point, rate_rps)
        return lambda record: self._add(record, columns)

    def _add(self, record: RequestRecord, extra: Any) -> None:
        pending = self._pending
        pending.append((record, extra))
        if len(pending) >= self._every_records:
            self.flush()
        elif len(pending) == 1:
            self._arm()
        elif self._timer is None and time.monotonic() - self._oldest_s >= self._every_s:
            self.flush()

    def _arm(self) -> None:
        self._oldest_s = time.monotonic()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop: the next record flushes, once the time has come
        self._timer = loop.call_later(self._every_s, self.flush)

    def flush(self) -> None:
        """Write what waits, and flush the stream."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending, self._pending = self._pending, []
        if not pending:
            return
        if self._format == "jsonl":
            # orjson writes the dataclass's fields in order: open its object for two more keys
            data = b"".join([orjson.dumps(r)[:-1] + extra for r, extra in pending])
        else:
            data = self._csv([_row(r) + extra for r, extra in pending])
        self._write(data)
        self.written += len(pending)

    def _write(self, data: bytes) -> None:
        if self._error is not None:
            return
        try:
            self._stream.write(data)
            self._stream.flush()
        except OSError as exc:
            self._error = exc

    @staticmethod
    def _csv(rows: list[tuple[object, ...]]) -> bytes:
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows(rows)
        return text.getvalue().encode()

    def close(self) -> None:
        """Flush, close the file (not standard output), and raise a write that failed."""
        self.flush()
        if self._close_stream:
            try:
                self._stream.close()
            except OSError as exc:
                self._error = self._error or exc
        if self._error is not None:
            raise RecordsError(f"writing the records failed: {self._error}") from self._error

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
