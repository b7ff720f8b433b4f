"""The project README's short answer is generated: the block between its markers is exactly what
the report renders from the committed ``results/raw/`` (so a hand-edited or stale answer fails),
and writing the report rewrites it there and nowhere else."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Final

import pytest

from inferwire.bench.report import answer, readme
from inferwire.bench.report.results import CODECS_RAW

ROOT: Final = Path(__file__).resolve().parents[2]
RAW: Final = ROOT / "results" / "raw"


def test_the_committed_answer_is_what_the_committed_run_gives() -> None:
    committed = answer.block((ROOT / "README.md").read_text())
    assert committed == answer.render(RAW, "results/README.md"), (
        "README.md's answer is not the committed run's: run `inferwire report`"
    )


def test_the_committed_run_answers_every_line() -> None:
    # a line whose row advice.py no longer names would drop out silently
    rendered = answer.render(RAW, "results/README.md")
    assert sum(line.startswith("- **") for line in rendered.splitlines()) == len(answer.LINES)


def test_splice_replaces_only_the_block() -> None:
    text = f"head\n{answer.START}\nold\n{answer.END}\ntail\n"
    spliced = answer.splice(text, "new\nlines")
    assert spliced == f"head\n{answer.START}\nnew\nlines\n{answer.END}\ntail\n"
    assert answer.block(spliced) == "new\nlines"
    assert answer.splice(spliced, "new\nlines") == spliced


@pytest.mark.parametrize(
    "text",
    [
        "no markers",
        f"{answer.START} only the start",
        f"only the end {answer.END}",
        f"{answer.END} reversed {answer.START}",
        f"{answer.START} a {answer.END} twice {answer.START} b {answer.END}",
    ],
)
def test_markers_out_of_place_are_refused(text: str) -> None:
    with pytest.raises(answer.AnswerMarkersError):
        answer.splice(text, "block")
    with pytest.raises(answer.AnswerMarkersError):
        answer.block(text)


def test_a_run_without_codec_rounds_says_so(tmp_path: Path) -> None:
    rendered = answer.render(tmp_path, "results/README.md")
    assert rendered.startswith("No answer yet:")
    assert "(results/README.md#what-should-i-use)" in rendered


def test_update_leaves_other_files_alone(tmp_path: Path) -> None:
    results = tmp_path / "results"
    assert not answer.update(tmp_path / "README.md", RAW, results)  # none there
    assert not (tmp_path / "README.md").exists()
    own = tmp_path / "README.md"
    own.write_text("# a user's own project\n")
    assert not answer.update(own, RAW, results)
    assert own.read_text() == "# a user's own project\n"
    broken = tmp_path / "broken.md"
    broken.write_text(f"{answer.START} and no end\n")
    with pytest.raises(answer.AnswerMarkersError):
        answer.update(broken, RAW, results)


def test_writing_the_report_rewrites_the_answer_beside_it(tmp_path: Path) -> None:
    results = tmp_path / "results"
    shutil.copytree(RAW, results / "raw")
    project = tmp_path / "README.md"
    project.write_text(f"# project\n\n{answer.START}\na stale answer\n{answer.END}\n\nmore\n")

    written = readme.write(results / "raw" / CODECS_RAW, results)

    assert written == results / "README.md"
    text = project.read_text()
    assert answer.block(text) == answer.render(RAW, "results/README.md")
    assert text.startswith("# project\n\n")
    assert text.endswith("\n\nmore\n")
