"""The fault scenarios and their parameters: what :mod:`inferwire.load.faults` runs
and the report describes.

Each scenario lasts a few seconds at a modest rate, ``stream-16`` paced at 5 ms a token, so a
few streams are in flight at any time:

- ``kill-restart``: SIGKILL the server mid-run, start a new one on the same port a moment
  later. Requests in flight and those sent while it is down fail; the clients reconnect to
  the new server and later requests succeed.
- ``drop``: the generator reaches the server through a :class:`~inferwire.transports.proxy.
  DelayProxy` (no delay) that aborts every open connection, twice a second apart, as a
  middlebox or a network failure would. The streams cut are errors; the clients reconnect.
- ``stall``: SIGSTOP the server for longer than the client's timeout, then SIGCONT. Requests
  waiting on it time out (errors); the run finishes; later requests succeed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import inferwire.transports as it

SCENARIOS: Final = ("kill-restart", "drop", "stall")
WORKLOAD: Final = "stream-16"
DECODE_MS: Final = 5.0
RATE_RPS: Final = 40.0
DURATION_S: Final = 5.0
FAULT_AT_S: Final = 1.0
"""When the fault starts, after the run's first request."""
DROPS: Final = 2
DROP_EVERY_S: Final = 1.0
DOWN_S: Final = 0.3
"""kill-restart: how long the port stays closed before the new server starts."""
TIMEOUT_S: Final = 1.0
"""The clients' timeout (connect, each wait for the server; gRPC: each call's deadline)."""
STALL_S: Final = 2.0
"""stall: how long the server stays stopped, well past the clients' timeout."""
GRACE_S: Final = 1.5
"""After the fault ends: time for the clients to reconnect before every request must succeed
(gRPC's channel retries a lost connection after a backoff of up to a second)."""
AFTER_RECOVERY_S: Final = 1.0
"""kill-restart: the least time a run goes on after the replacement is up and the grace is
over, so that some requests show the recovery."""
DRAIN_TIMEOUT_S: Final = 30.0


def plan(transports: Sequence[str] = it.TRANSPORTS) -> list[tuple[str, str]]:
    """Every scenario on every transport."""
    return [(scenario, transport) for scenario in SCENARIOS for transport in transports]
