"""codecs/extensions.py: every C extension of the codecs is loaded the same way, so its
fallbacks are tested here once for each: absent (a pure-Python install), stale (an older build:
its API version differs) and turned off (``INFERWIRE_PURE_PYTHON=1``), the reference does all
the work. What each extension computes is tested beside its codec (tests/test_*_accel.py,
tests/test_flatbuffers_fast.py, tests/test_scan.py)."""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

import pytest

import inferwire.codecs
from inferwire.codecs import extensions

LOADERS = {
    "_delta_accel": "inferwire.codecs.delta_codec",
    "_scan": "inferwire.codecs.scan",
    "_flatbuffers_accel": "inferwire.codecs.flatbuffers_codec",
    "_protobuf_accel": "inferwire.codecs.protobuf_codec",
    "_openai_accel": "inferwire.codecs.openai",
}


def _loader(extension: str) -> Any:
    return importlib.import_module(LOADERS[extension])._load_accelerator


@pytest.fixture(autouse=True)
def _not_pure_python(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INFERWIRE_PURE_PYTHON", raising=False)


@pytest.mark.parametrize("extension", LOADERS)
def test_the_built_extension_is_loaded(extension: str) -> None:
    assert _loader(extension)() is getattr(inferwire.codecs, extension)


@pytest.mark.parametrize("extension", LOADERS)
def test_an_absent_extension_falls_back(monkeypatch: pytest.MonkeyPatch, extension: str) -> None:
    monkeypatch.delattr(inferwire.codecs, extension)
    monkeypatch.setitem(sys.modules, f"inferwire.codecs.{extension}", None)  # import fails
    assert _loader(extension)() is None


@pytest.mark.parametrize("extension", LOADERS)
def test_a_stale_extension_is_not_used(monkeypatch: pytest.MonkeyPatch, extension: str) -> None:
    stale = types.ModuleType(f"inferwire.codecs.{extension}")
    stale.API_VERSION = 0  # type: ignore[attr-defined]
    monkeypatch.setattr(inferwire.codecs, extension, stale)
    with pytest.warns(RuntimeWarning, match="stale"):
        assert _loader(extension)() is None


@pytest.mark.parametrize("extension", LOADERS)
def test_a_newer_api_version_is_stale_too(monkeypatch: pytest.MonkeyPatch, extension: str) -> None:
    module = getattr(inferwire.codecs, extension)
    monkeypatch.setattr(module, "API_VERSION", module.API_VERSION + 1)
    with pytest.warns(RuntimeWarning, match="stale"):
        assert _loader(extension)() is None


@pytest.mark.parametrize("extension", LOADERS)
def test_pure_python_in_the_environment_leaves_it_unused(
    monkeypatch: pytest.MonkeyPatch, extension: str
) -> None:
    monkeypatch.setenv("INFERWIRE_PURE_PYTHON", "1")
    assert _loader(extension)() is None


def test_a_configure_that_refuses_is_stale() -> None:
    def refuse(module: object) -> None:
        raise TypeError("not these classes")

    version = getattr(inferwire.codecs, "_scan").API_VERSION  # noqa: B009 (a built module)
    with pytest.warns(RuntimeWarning, match="not these classes"):
        assert extensions.load("_scan", version, refuse, "x") is None
