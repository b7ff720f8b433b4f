"""``results/`` is what ``inferwire report`` makes of its ``raw/``: the README text and every
plot's data file (``plots/NAME.json``, the series the picture shows) byte for byte, and every
picture drawn anew. A PNG's bytes move with matplotlib's version and the machine's fonts, so a
picture is checked to be a fresh, valid PNG (its data file carries what it shows), and to be the
same bytes when this machine draws it twice.

After changing the report or ``raw/``: ``inferwire report --out results``."""

from __future__ import annotations

import difflib
import re
import shutil
import struct
from pathlib import Path
from typing import Final

import pytest

from inferwire.bench.report import plots
from inferwire.cli.main import main as cli

ROOT: Final = Path(__file__).resolve().parents[2]
RESULTS: Final = ROOT / "results"
"""The committed results (a module constant, so a copy can be checked the same way)."""
PNG_SIGNATURE: Final = b"\x89PNG\r\n\x1a\n"
PICTURE: Final = re.compile(r"!\[[^\]]*\]\(plots/([^)\s]+)\)")


def rebuild(results: Path, into: Path) -> Path:
    """A copy of ``results`` under ``into`` with its plots removed, rebuilt by ``inferwire
    report``: every plot file in it was written by the rebuild."""
    copy = into / "results"
    shutil.copytree(results, copy)
    shutil.rmtree(copy / "plots", ignore_errors=True)
    assert cli(["report", "--out", str(copy)]) == 0
    return copy


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk; fails on anything that is not a PNG."""
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_SIGNATURE, f"{path.name} is not a PNG"
    assert head[12:16] == b"IHDR", f"{path.name} has no IHDR chunk first"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def plot_files(results: Path) -> dict[str, bytes]:
    directory = results / "plots"
    if not directory.is_dir():
        return {}
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return rebuild(RESULTS, tmp_path_factory.mktemp("rebuild"))


def test_the_committed_results_are_what_the_report_rebuilds(rebuilt: Path) -> None:
    committed = (RESULTS / "README.md").read_text()
    made = (rebuilt / "README.md").read_text()
    diff = "\n".join(
        list(
            difflib.unified_diff(
                committed.splitlines(),
                made.splitlines(),
                "results/README.md",
                "rebuilt",
                lineterm="",
                n=0,
            )
        )[:30]
    )
    assert made == committed, f"run `inferwire report --out results`:\n{diff}"
    committed_plots = plot_files(RESULTS)
    made_plots = plot_files(rebuilt)
    assert sorted(made_plots) == sorted(committed_plots), "run `inferwire report --out results`"
    for name, data in made_plots.items():
        if name.endswith(".png"):
            assert min(png_size(rebuilt / "plots" / name)) > 0, name
        else:
            assert data == committed_plots[name], f"plots/{name}: run `inferwire report`"


def test_every_picture_the_readme_names_was_drawn_by_the_rebuild_and_no_other(
    rebuilt: Path,
) -> None:
    named = PICTURE.findall((rebuilt / "README.md").read_text())
    assert named, "the README shows no picture"
    assert len(named) == len(set(named)), "a picture shown twice"
    assert all(name.endswith(".png") for name in named)
    made = plot_files(rebuilt)
    pictures = {name for name in made if name.endswith(".png")}
    assert set(named) == pictures
    data = {name.removesuffix(".png") + ".json" for name in pictures}
    assert set(made) == pictures | data, "a plot file that is neither a picture nor its data"
    for name in pictures:
        assert min(png_size(rebuilt / "plots" / name)) > 0, name


def test_a_second_rebuild_draws_the_same_bytes_and_removes_stale_plots(
    rebuilt: Path, tmp_path: Path
) -> None:
    again = tmp_path / "results"
    shutil.copytree(rebuilt, again)
    stale = [again / "plots" / "gone.png", again / "plots" / "gone.json"]
    for path in stale:
        path.write_bytes(b"from a run that had this plot")
    for path in (again / "plots").glob("*.png"):
        path.write_bytes(b"not redrawn")  # so a file left alone would differ

    assert cli(["report", "--out", str(again)]) == 0

    assert not any(path.exists() for path in stale)
    assert plot_files(again) == plot_files(rebuilt)  # PNGs too: one machine, one matplotlib
    assert (again / "README.md").read_text() == (rebuilt / "README.md").read_text()


def test_a_picture_the_run_did_not_draw_is_not_linked() -> None:
    text = "## A\n\n![drawn](plots/drawn.png)\n\nprose\n\n![missing](plots/missing.png)\n\n| t |\n"
    kept = plots.without_missing(text, [Path("out/plots/drawn.png")])
    assert kept == "## A\n\n![drawn](plots/drawn.png)\n\nprose\n\n| t |\n"
