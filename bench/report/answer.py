"""The project README's short answer: five lines of the "What should I use?" table of
``results/README.md`` (:mod:`.advice`'s rows, the same rules and figures), written into the
README between two marker comments each time the report is.

The README is the first page a newcomer reads, so its answer is generated like every other
figure: a hand-edited or stale block differs from :func:`render` of the committed ``raw/``,
which a test checks.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from . import advice
from .results import CODECS_RAW, RUN_KEY

START: Final = "<!-- answer:start -->"
END: Final = "<!-- answer:end -->"
LINES: Final = (
    # (payload, the start of the situation, as advice.rows() names them; the line's lead)
    ("token stream", "browser or OpenAI SDK", "Token streams a browser or the OpenAI SDK reads"),
    ("token stream", "in your Python server", "Token streams from your Python server"),
    ("token stream", "service to service", "Token streams between your own services"),
    ("embeddings", "service to service", "Embeddings between your own services"),
    ("token stream", "long round trip", "Token streams over a long round trip"),
)
"""The situations a newcomer meets first; the results page has every payload and situation."""


class AnswerMarkersError(ValueError):
    """The README has not exactly one start marker followed by one end marker."""


def _run_facts(raw_dir: Path) -> str:
    """How the run was made (repeats, minutes, date, and whether it was steady) from the run
    record of its codec file."""
    path = raw_dir / CODECS_RAW
    run: dict[str, Any] = json.loads(path.read_text()).get(RUN_KEY, {}) if path.is_file() else {}
    facts = []
    try:
        started = datetime.fromisoformat(run["started"])
        finished = datetime.fromisoformat(run["finished"])
    except (KeyError, TypeError, ValueError):
        pass  # a file from before the run record: nothing to say of it
    else:
        repeats = run.get("repeats", 1)
        minutes = round((finished - started).total_seconds() / 60)
        facts.append(
            f"{repeats} repeat{'s' if repeats != 1 else ''}, {minutes} min, "
            f"{finished.date().isoformat()}"
        )
    if run.get("stable") is False:
        facts.append("marked unstable: see its Machine and Reproducibility sections")
    return "the latest run" + (f" ({'; '.join(facts)})" if facts else "")


def render(raw_dir: Path, results_readme: str) -> str:
    """The block between the markers (markers excluded), from the run in ``raw_dir``;
    ``results_readme`` is the link to the results page, relative to the project README."""
    rows = advice.rows(raw_dir)
    lines = []
    for payload, situation, lead in LINES:
        row = next((r for r in rows if r[0] == payload and r[1].startswith(situation)), None)
        if row is not None:
            margin = row[3]
            lines.append(f"- **{lead}**: {row[2]}. {margin[:1].upper()}{margin[1:]}.")
    table = f"[What should I use?]({results_readme}#what-should-i-use)"
    if not lines:
        return f"No answer yet: {_run_facts(raw_dir)} timed no codec rounds; see {table}."
    intro = (
        f"From {_run_facts(raw_dir)}, by the fixed rules of {table} (every payload there, and "
        "when each answer changes):"
    )
    return "\n".join([intro, "", *lines])


def _check(text: str) -> None:
    if text.count(START) != 1 or text.count(END) != 1 or text.index(END) < text.index(START):
        raise AnswerMarkersError(f"expected one {START} followed by one {END}")


def splice(text: str, block: str) -> str:
    """``text`` with what lies between its markers replaced by ``block``."""
    _check(text)
    head, rest = text.split(START)
    tail = rest.split(END)[1]
    return f"{head}{START}\n{block}\n{END}{tail}"


def block(text: str) -> str:
    """What lies between the markers of ``text``, as :func:`splice` wrote it."""
    _check(text)
    return text.split(START)[1].split(END)[0].strip("\n")


def update(readme: Path, raw_dir: Path, results_dir: Path) -> bool:
    """Rewrite the answer in ``readme`` from ``raw_dir`` when it has the markers (a project
    README: any other file, or none, is left alone); whether it has them, and so now the
    answer of ``raw_dir``."""
    try:
        text = readme.read_text()
    except FileNotFoundError:
        return False
    if START not in text and END not in text:
        return False
    link = Path(os.path.relpath(results_dir / "README.md", readme.parent)).as_posix()
    try:
        updated = splice(text, render(raw_dir, link))
    except AnswerMarkersError as exc:
        raise AnswerMarkersError(f"{readme}: {exc}") from None
    if updated != text:
        readme.write_text(updated)
    return True
