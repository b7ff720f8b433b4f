"""What ``inferwire load`` writes besides the core of its summary lines: per-request records as
the run goes (:mod:`.records`), the HTML page (:mod:`.html_report`), ``inferwire load-report``,
which redraws the page from a saved JSON report, and the summary line's account of what the
streams carried (:func:`stream_parts`)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from typing import Any, Final, TextIO

from inferwire._runtime.arguments import CommandError

from .records import STDOUT, RecordsError, RecordWriter

MISSING: Final = "-"


def notes(args: argparse.Namespace) -> TextIO:
    """Where a line for the user goes: stderr when the records take stdout."""
    return sys.stderr if getattr(args, "records", None) == STDOUT else sys.stdout


@contextlib.contextmanager
def records(args: argparse.Namespace) -> Iterator[RecordWriter | None]:
    """The --records writer for the run (the summary lines go to stderr when it takes stdout)."""
    if args.records is None:
        yield None
        return
    try:
        writer = RecordWriter.open(args.records)
    except RecordsError as exc:
        raise CommandError(str(exc)) from exc
    with contextlib.ExitStack() as stack:
        if args.records == STDOUT:
            stack.enter_context(contextlib.redirect_stdout(sys.stderr))
        try:
            yield writer
        finally:
            try:
                writer.close()
            except RecordsError as exc:
                raise CommandError(str(exc)) from exc
    if args.records != STDOUT:
        print(f"wrote {writer.written} records to {args.records}")


def write_html(args: argparse.Namespace, report: dict[str, Any]) -> None:
    if args.html is None:
        return
    from . import html_report  # matplotlib: only when a page is asked for

    args.html.parent.mkdir(parents=True, exist_ok=True)
    args.html.write_text(html_report.render(report))
    print(f"wrote {args.html}", file=notes(args))


def load_report(args: argparse.Namespace) -> int:
    try:
        report = json.loads(args.report.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CommandError(f"cannot read the report {args.report}: {exc}") from exc
    if not isinstance(report, dict) or report.get("kind") != "inferwire-load":
        raise CommandError(f"{args.report} is not a report of `inferwire load` (its --out)")
    write_html(args, report)
    return 0


def stream_parts(point: dict[str, Any]) -> list[str]:
    """The summary line's parts on what the streams carried: ITL per chunk and per token
    (always, labelled), then, where a stream had any, tokens per chunk, TTFOT, reasoning tokens,
    tool calls, and input throughput."""
    parts = [
        f"ITL/chunk p50 {_ms(point, 'itl_per_chunk', 'p50')} p99"
        f" {_ms(point, 'itl_per_chunk', 'p99')} ms,"
        f" ITL/token p50 {_ms(point, 'itl_per_token', 'p50')} p99"
        f" {_ms(point, 'itl_per_token', 'p99')} ms;"
    ]
    per_chunk = point.get("tokens_per_chunk")
    if isinstance(per_chunk, dict) and any(n for name, n in per_chunk.items() if name != "1"):
        shown = ", ".join(f"{name}: {n}" for name, n in per_chunk.items() if n)
        counted = "/".join(sorted(point.get("chunk_token_count") or {})) or MISSING
        parts.append(f"chunks by tokens carried {shown} (counted by {counted});")
    reasoning = point.get("reasoning_tokens")
    if reasoning or _ms(point, "ttfot", "p99") != _ms(point, "ttft", "p99"):
        parts.append(f"TTFOT p50 {_ms(point, 'ttfot', 'p50')} p99 {_ms(point, 'ttfot', 'p99')} ms;")
    if reasoning:
        parts.append(f"{reasoning} reasoning tokens;")
    if point.get("tool_calls"):
        parts.append(f"{point['tool_calls']} tool calls;")
    if point.get("input_token_throughput_tps") is not None:
        parts.append(f"input {point['input_token_throughput_tps']:.0f} tok/s;")
    inputs = point.get("inputs_completed")
    if inputs is not None and inputs != point.get("requests_completed"):
        parts.append(f"{point['input_throughput_ips']:.1f} inputs/s;")
    return parts


def _ms(point: dict[str, Any], metric: str, percentile: str) -> str:
    value = (point.get(metric) or {}).get(f"{percentile}_ms")
    return MISSING if value is None else f"{value:.2f}"
