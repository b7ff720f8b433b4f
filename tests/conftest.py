"""Settings shared by the test suite.

Hypothesis: no per-example deadline (the first example of a test pays for imports and numpy
warm-up, and a deadline would make that flaky on a loaded 2-core CI machine). The ``ci``
profile (``HYPOTHESIS_PROFILE=ci``) derandomizes, so a CI failure reproduces exactly.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("default", deadline=None)
settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
