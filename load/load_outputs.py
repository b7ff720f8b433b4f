"""What ``inferwire load`` writes besides its summary lines: per-request records as the run
goes (:mod:`.records`), the HTML page (:mod:`.html_report`), and ``inferwire load-report``,
which redraws the page from a saved JSON report."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from typing import Any, TextIO

from inferwire._runtime.arguments import CommandError

from .records import STDOUT, RecordsError, RecordWriter


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
