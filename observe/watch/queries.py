"""The PromQL the alert rules and the dashboard share, over the metrics of
:mod:`inferwire.transports.metrics` (servers, ``inferwire_*``) and
:mod:`inferwire.load.live_metrics` (the load generator, ``inferwire_load_*``)."""

from __future__ import annotations

from typing import Final

SERVER: Final = "inferwire"
"""Prefix of the server's metrics."""
LOAD: Final = "inferwire_load"
"""Prefix of the load generator's metrics."""

TTFT: Final = "time_to_first_token_seconds"
ITL: Final = "inter_token_latency_seconds"
E2E: Final = "e2e_request_latency_seconds"


def quantile(q: float, histogram: str, window: str, by: tuple[str, ...] = ()) -> str:
    """The ``q`` quantile of ``histogram`` (a full name, without ``_bucket``) over ``window``,
    one series per job and instance (and per label of ``by``)."""
    labels = ", ".join(("job", "instance", *by, "le"))
    return f"histogram_quantile({q:g}, sum by ({labels}) (rate({histogram}_bucket[{window}])))"


def rate(counter: str, window: str, by: tuple[str, ...] = (), selector: str = "") -> str:
    """Per-second rate of ``counter`` (a full exposed name), summed per job, instance and
    ``by``."""
    labels = ", ".join(("job", "instance", *by))
    return f"sum by ({labels}) (rate({counter}{selector}[{window}]))"


def mean(histogram: str, window: str, by: tuple[str, ...] = ()) -> str:
    """Mean observation of ``histogram`` over ``window``."""
    labels = ", ".join(("job", "instance", *by))
    return (
        f"sum by ({labels}) (rate({histogram}_sum[{window}]))"
        f" / sum by ({labels}) (rate({histogram}_count[{window}]))"
    )
