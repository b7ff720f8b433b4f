"""One name per concept: no two public classes of ``codecs``, ``serving`` and ``transports``
share a name (two ``ChunkReader`` classes with different constructors were one too many), and
the three old ``stream_encoder`` functions are one codec method and two clearly named helpers.

Read from the source (every module, imported or not), so a module that needs an optional
library is checked too."""

from __future__ import annotations

import ast
import collections
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("codecs", "serving", "transports")


def _modules(package: str) -> list[Path]:
    # a private module (``_delta_accel``, ``_runtime``) is nobody's public surface
    return [
        path
        for path in sorted((ROOT / package).rglob("*.py"))
        if not any(part.startswith("_") and part != "__init__.py" for part in path.parts)
    ]


def public_classes() -> dict[str, list[str]]:
    """Each public top-level class name and the modules that define it."""
    where: dict[str, list[str]] = collections.defaultdict(list)
    for package in PACKAGES:
        for path in _modules(package):
            for node in ast.parse(path.read_text(), str(path)).body:
                if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                    where[node.name].append(str(path.relative_to(ROOT)))
    return where


def test_the_packages_are_where_the_test_looks() -> None:
    for package in PACKAGES:
        assert (ROOT / package / "__init__.py").is_file(), package
    assert len(public_classes()) > 50  # the walk finds the classes, not an empty tree


def test_no_two_public_classes_share_a_name() -> None:
    shared = {name: paths for name, paths in public_classes().items() if len(paths) > 1}
    assert shared == {}


def test_the_walk_would_see_a_shared_name(tmp_path: Path) -> None:
    """The check itself: two modules defining one class name are found."""
    for module in ("a.py", "b.py"):
        (tmp_path / module).write_text("class ChunkReader:\n    pass\n")
    names = collections.Counter(
        node.name
        for path in tmp_path.glob("*.py")
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.ClassDef)
    )
    assert names["ChunkReader"] == 2


def test_one_stream_encoder_the_codec_method() -> None:
    import inferwire.codecs as ic
    import inferwire.serving as iws
    from inferwire.codecs import framing

    assert callable(ic.get("orjson").stream_encoder)
    assert not hasattr(framing, "stream_encoder")
    assert not hasattr(framing, "stream_decoder")
    assert callable(framing.framed_encoder)
    assert callable(framing.framed_decoder)
    assert not hasattr(iws, "stream_encoder")
    assert callable(iws.response_encoder)


@pytest.mark.parametrize("name", ["ChunkReader"])
def test_the_old_shared_name_is_one_class(name: str) -> None:
    import inferwire.serving as iws
    from inferwire.transports import streams

    assert not hasattr(iws, name)
    assert hasattr(streams, name)
    assert iws.ResponseStreamReader is not getattr(streams, name)
