"""codecs/extensions.py: every C extension of the codecs is loaded the same way, so its
fallbacks are tested here once for each: absent (a pure-Python install), stale (an older build:
its API version differs) and turned off (``INFERWIRE_PURE_PYTHON=1``), the reference does all
the work. What each extension computes is tested beside its codec (tests/test_*_accel.py,
tests/codecs/test_flatbuffers_fast.py, tests/codecs/test_scan.py)."""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

import pytest

import inferwire.codecs
from inferwire.codecs import extensions
from tests.codecs.accel_helpers import run_child

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


# What each codec module says about its extension in a fresh process, as the environment
# variable is read at import: (code printing it, its output when the extension is on, off).
IN_A_FRESH_PROCESS = {
    "_delta_accel": (
        "from inferwire.codecs import delta_codec; print(delta_codec.accelerated())",
        "True",
        "False",
    ),
    "_scan": (
        "from inferwire.codecs import scan; print(scan.ACCELERATED, scan.check_json.__module__)",
        "True inferwire.codecs._scan",
        "False inferwire.codecs.scan",
    ),
    "_flatbuffers_accel": (
        "from inferwire.codecs import flatbuffers_codec as f; "
        "print(f.accelerated(), f.FlatbuffersCodec().builder)",
        "True compiled",
        "False reference",
    ),
    "_protobuf_accel": (
        "from inferwire.codecs import protobuf_codec as pc; "
        "print(pc.accelerated(), pc.ProtobufCodec().marshal)",
        "True compiled",
        "False upb",
    ),
    "_openai_accel": (
        "from inferwire.codecs import openai as oa; "
        "print(oa.accelerated(), oa.chunk_to_obj is oa.chunk_to_obj_reference, "
        "oa.chunk_from_obj is oa.chunk_from_obj_reference)",
        "True False False",
        "False True True",
    ),
}


@pytest.mark.parametrize("extension", LOADERS)
@pytest.mark.parametrize(("value", "on"), [("", True), ("0", True), ("1", False)])
def test_the_environment_variable_at_import(extension: str, value: str, on: bool) -> None:
    """End to end: a new process with INFERWIRE_PURE_PYTHON set to ``value`` imports the codec
    module and uses its extension (unset, empty or 0) or the reference (1)."""
    code, when_on, when_off = IN_A_FRESH_PROCESS[extension]
    assert run_child("-c", code, pure_python=value).strip() == (when_on if on else when_off)
