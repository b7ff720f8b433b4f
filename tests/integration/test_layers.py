"""The layers' one-way dependencies, read from the source: every ``import`` of an ``inferwire``
module (function-level and TYPE_CHECKING imports included) points at the importer's own layer or
one to its left, no module imports itself round a circle, and the tests of a lower layer import no
higher one (a codec test needs no load generator and no bench).

    _runtime <- schemas <- codecs <- workloads <- serving <- engine <- transports <- load
             <- observe <- bench <- cli
"""

from __future__ import annotations

import ast
from collections.abc import Container, Iterator
from pathlib import Path
from typing import Final

import pytest

ROOT: Final = Path(__file__).resolve().parents[2]
LAYERS: Final = (
    "_runtime",
    "schemas",
    "codecs",
    "workloads",
    "serving",
    "engine",
    "transports",
    "load",
    "observe",
    "bench",
    "cli",
)
RANK: Final = {layer: rank for rank, layer in enumerate(LAYERS)}
GENERATED: Final = ("_pb2", "schemas/fb/")


def _module_name(path: Path) -> str:
    relative = path.relative_to(ROOT).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["inferwire", *parts])


def _sources() -> Iterator[Path]:
    for layer in LAYERS:
        for path in sorted((ROOT / layer).rglob("*.py")):
            if not any(mark in path.as_posix() for mark in GENERATED):
                yield path


def _imports(path: Path, module: str, modules: Container[str]) -> set[str]:
    """Every inferwire module ``path`` imports. ``from X import y`` is X.y when that is a module
    of the tree (a package is imported before any of its modules in any case), else X."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("inferwire."))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if not target.startswith("inferwire"):
                continue
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                found.add(submodule if submodule in modules else target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in _sources()}
    return {
        name: {i for i in _imports(path, name, modules) if i in modules and i != name}
        for name, path in modules.items()
    }


def _layer(module: str) -> str:
    return module.split(".")[1]


def test_the_source_is_read() -> None:
    graph = _graph()
    assert len(graph) > 200
    assert {_layer(m) for m in graph} == set(LAYERS)


def test_every_import_points_left() -> None:
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in _graph().items()
        for target in targets
        if RANK[_layer(target)] > RANK[_layer(module)]
    )
    assert wrong == []


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each circle a depth-first walk meets, as the modules round it."""
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done
    circles: list[list[str]] = []

    def walk(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                circles.append([*path[path.index(target) :], target])
            elif target not in state:
                walk(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            walk(module, [module])
    return circles


def test_no_import_circle() -> None:
    assert _circles(_graph()) == []


def test_a_circle_is_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [["a", "b", "c", "a"]]


@pytest.mark.parametrize(
    "folder", ["codecs", "workloads", "runtime", "transports", "serving", "engine"]
)
def test_tests_of_a_lower_layer_import_no_higher_one(folder: str) -> None:
    higher = ("inferwire.load", "inferwire.observe", "inferwire.bench", "inferwire.cli")
    found = sorted(
        f"{path.relative_to(ROOT)}: {name}"
        for path in (ROOT / "tests" / folder).rglob("*.py")
        for name in _imports(path, "tests." + folder, ())
        if name.startswith(higher)
    )
    assert found == []
