"""The event loop choice (:mod:`inferwire._runtime.loops`): what each name resolves to, the
loop that then runs, and the message when uvloop is asked for but not installed.

uvloop comes with the dev install (through the bench extra); its absence is simulated by
hiding the module (``sys.modules["uvloop"] = None`` makes its import fail and ``find_spec``
answer None, as for a library that is not installed).
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import pytest

from inferwire._runtime import loops
from inferwire._runtime.arguments import add_loop_argument
from inferwire._runtime.extras import MissingExtraError

uvloop = pytest.importorskip("uvloop")


@pytest.fixture
def without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)


async def _running() -> str:
    return loops.running()


def test_concrete_names_resolve_to_themselves() -> None:
    assert [loops.resolve(name) for name in loops.CONCRETE] == ["asyncio", "uvloop"]


def test_auto_is_uvloop_when_installed() -> None:
    assert loops.uvloop_installed()
    assert loops.resolve() == loops.resolve("auto") == "uvloop"


def test_auto_is_asyncio_without_uvloop(without_uvloop: None) -> None:
    assert not loops.uvloop_installed()
    assert loops.resolve("auto") == "asyncio"
    assert loops.run(_running(), "auto") == "asyncio"


def test_uvloop_without_it_names_the_extra(without_uvloop: None) -> None:
    with pytest.raises(MissingExtraError) as raised:
        loops.resolve("uvloop")
    assert raised.value.extra == "uvloop"
    assert "--loop uvloop" in str(raised.value)
    assert "pip install 'inferwire[uvloop]'" in str(raised.value)
    with pytest.raises(MissingExtraError):
        loops.new_event_loop("uvloop")


def test_an_unknown_name_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown event loop 'trio'"):
        loops.resolve("trio")


@pytest.mark.parametrize(
    ("name", "kind"), [("asyncio", "asyncio"), ("uvloop", "uvloop"), ("auto", "uvloop")]
)
def test_run_runs_on_the_loop_named(name: str, kind: str) -> None:
    assert loops.run(_running(), name) == kind


@pytest.mark.parametrize("name", loops.CONCRETE)
def test_new_event_loop_is_of_the_kind_named(name: str) -> None:
    loop = loops.new_event_loop(name)
    try:
        assert loops.kind(loop) == name
        assert isinstance(loop, uvloop.Loop) == (name == "uvloop")
        assert loop.run_until_complete(_running()) == name
    finally:
        loop.close()


def test_running_outside_a_loop_is_an_error() -> None:
    with pytest.raises(RuntimeError):
        loops.running()


def test_the_loop_argument() -> None:
    parser = argparse.ArgumentParser()
    add_loop_argument(parser)
    assert parser.parse_args([]).loop == "auto"
    assert parser.parse_args(["--loop", "uvloop"]).loop == "uvloop"
    with pytest.raises(SystemExit):
        parser.parse_args(["--loop", "trio"])


def test_asyncio_run_is_unaffected() -> None:
    """Choosing a loop for one run sets no policy: a plain ``asyncio.run`` stays asyncio's."""
    loops.run(_running(), "uvloop")
    assert asyncio.run(_running()) == "asyncio"
