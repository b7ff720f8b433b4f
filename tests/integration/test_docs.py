"""The README, ARCHITECTURE.md and docs/ point at what exists: every relative link resolves to a
file or folder of the checkout (and a ``#section`` of a markdown page to one of its headings),
every path they quote in backticks exists, and the README's codec quickstart runs."""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

ROOT: Final = Path(__file__).resolve().parents[2]
PAGES: Final = sorted([ROOT / "README.md", ROOT / "ARCHITECTURE.md", *(ROOT / "docs").glob("*.md")])
LINK: Final = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE: Final = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
# a path quoted in backticks, from a top-level folder of the checkout (no placeholder in it)
QUOTED_PATH: Final = re.compile(
    r"`((?:_runtime|schemas|codecs|workloads|serving|engine|transports|load|observe|bench|cli"
    r"|tests|examples|results|docs|requirements)/[\w./-]*)`"
)


def _prose(page: Path) -> str:
    """The page without its code blocks (a command's arguments are not links)."""
    return FENCE.sub("", page.read_text())


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    found: set[str] = set()
    for line in _prose(page).splitlines():
        if line.startswith("#"):
            slug = _slug(line.lstrip("#"))
            duplicate = 1
            unique = slug
            while unique in found:  # GitHub numbers a repeated heading's anchor
                unique = f"{slug}-{duplicate}"
                duplicate += 1
            found.add(unique)
    return found


def _links(page: Path) -> Iterator[str]:
    for target in LINK.findall(_prose(page)):
        if not re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: are not ours
            yield target


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in _links(page):
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target}: no such section in {resolved.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_quoted_paths_exist(page: Path) -> None:
    missing = [
        quoted
        for quoted in QUOTED_PATH.findall(_prose(page))
        if not (ROOT / quoted.rstrip("/")).exists()
    ]
    assert not missing, f"{page.relative_to(ROOT)} names paths that do not exist: {missing}"


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in _links(ROOT / "README.md")}
    assert set((ROOT / "docs").glob("*.md")) <= linked


def test_the_readme_codec_quickstart_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    quickstart = re.search(r"```python\n(.*?)```", readme, re.DOTALL)
    assert quickstart is not None
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(quickstart.group(1), "README.md quickstart", "exec"), {})
    assert printed.getvalue() == "Hello\n"
