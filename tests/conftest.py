"""Settings shared by the test suite.

Hypothesis: no per-example deadline (the first example of a test pays for imports and numpy
warm-up, and a deadline would make that flaky on a loaded 2-core CI machine). The ``ci``
profile (``HYPOTHESIS_PROFILE=ci``) derandomizes, so a CI failure reproduces exactly.

Event loops: a test that takes the ``event_loop_kind`` fixture runs once on asyncio's own loop
and once on uvloop (what users deploy; :mod:`inferwire._runtime.loops`), its servers and
clients on a loop of that kind (``loops.run(coro, event_loop_kind)``, ``serve --loop``). The
fixture is session-scoped, so pytest runs every test of one loop before the other's and a
session fixture that depends on it (a fleet of server processes) exists for one loop at a time.
Without uvloop installed its cases skip and say so.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

from inferwire._runtime import loops

settings.register_profile("default", deadline=None)
settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

LOOP_KINDS = [
    pytest.param("asyncio", id="asyncio"),
    pytest.param(
        "uvloop",
        id="uvloop",
        marks=pytest.mark.skipif(
            not loops.uvloop_installed(), reason="uvloop is not installed: pip install '.[uvloop]'"
        ),
    ),
]


@pytest.fixture(scope="session", params=LOOP_KINDS)
def event_loop_kind(request: pytest.FixtureRequest) -> str:
    """``"asyncio"`` or ``"uvloop"``: the kind of loop this case's servers and clients run."""
    kind: str = request.param
    return kind
