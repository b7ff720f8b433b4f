"""A server's Prometheus endpoint, scraped: the text exposition parsed into a :class:`Snapshot`
(per family, per label set), and the :class:`Scraper` that GETs one endpoint.
:mod:`.prometheus` reads two snapshots into what they say about a load point.

- :func:`parse_exposition`: Prometheus text (``prometheus_client``'s parser) into a
  :class:`Snapshot`; anything else is a :class:`ScrapeError`, and so is a body over
  :data:`MAX_BODY_BYTES`.
- :class:`Scraper`: one endpoint, scraped over the project's HTTP/1.1 pool; every failure
  (unreachable, a timeout, a status other than 2xx, a body that is not Prometheus text) is a
  :class:`ScrapeError` whose message says which.
"""

from __future__ import annotations

import asyncio
import math
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final
from urllib.parse import urljoin, urlsplit

from prometheus_client.parser import text_string_to_metric_families

from inferwire.transports.errors import (
    ConnectError,
    MessageTooLargeError,
    TransportError,
)
from inferwire.transports.http1.pool import HttpPool, Origin
from inferwire.transports.timing import now_ns

from .families import HISTOGRAM, SUMMARY, Family

MAX_BODY_BYTES: Final = 16 << 20
"""A body over this is refused: vLLM's /metrics is tens of kilobytes, one with thousands of
label sets a few megabytes."""
DEFAULT_TIMEOUT_S: Final = 10.0
"""Prometheus' own default ``scrape_timeout``."""
_ACCEPT: Final = "text/plain; version=0.0.4"
"""The classic text format (not OpenMetrics), which every engine's exporter serves."""
_REDIRECTS: Final = frozenset({301, 302, 303, 307, 308})

LabelSet = tuple[tuple[str, str], ...]
"""A series' labels, sorted (a histogram's ``le`` and a summary's ``quantile`` left out)."""


class ScrapeError(ValueError):
    """The endpoint gave no Prometheus text: the message says why."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HistogramSeries:
    buckets: tuple[tuple[float, float], ...]
    """(upper bound ``le``, cumulative count), by bound; the last bound is ``math.inf``."""
    sum: float
    count: float


@dataclass(frozen=True, slots=True, kw_only=True)
class SummarySeries:
    sum: float
    count: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """One scrape: per family name, per label set."""

    taken_ns: int
    """Monotonic clock (``time.monotonic_ns``) when the body had been read."""
    source_url: str | None = None
    histograms: Mapping[str, Mapping[LabelSet, HistogramSeries]]
    summaries: Mapping[str, Mapping[LabelSet, SummarySeries]]
    counters: Mapping[str, Mapping[LabelSet, float]]
    """By the family's name without ``_total`` (as ``prometheus_client`` names it)."""
    gauges: Mapping[str, Mapping[LabelSet, float]]
    untyped: Mapping[str, Mapping[LabelSet, float]]

    def counter(self, name: str) -> Mapping[LabelSet, float] | None:
        """A counter by the name it is exposed under (with or without ``_total``); a sample
        without a ``# TYPE`` line counts too."""
        found = self.counters.get(name.removesuffix("_total"))
        return found if found is not None else self.untyped.get(name)

    def has(self, family: Family) -> bool:
        if family.kind == HISTOGRAM:
            return family.name in self.histograms
        if family.kind == SUMMARY:
            return family.name in self.summaries
        return self.counter(family.name) is not None


def _labels(labels: Mapping[str, str], *drop: str) -> LabelSet:
    return tuple(sorted((k, v) for k, v in labels.items() if k not in drop))


def _histogram(parts: dict[str, Any]) -> HistogramSeries | None:
    buckets = sorted(parts["buckets"].items())
    count = parts.get("count")
    if buckets and math.isinf(buckets[-1][0]):
        count = buckets[-1][1] if count is None else count
    elif count is not None:
        buckets.append((math.inf, count))  # the format requires +Inf; _count is its value
    if count is None:
        return None
    return HistogramSeries(buckets=tuple(buckets), sum=parts.get("sum", math.nan), count=count)


def parse_exposition(
    text: str | bytes, *, taken_ns: int | None = None, source_url: str | None = None
) -> Snapshot:
    """Prometheus text exposition into a :class:`Snapshot` (``taken_ns``: now, if not given).
    Raises :class:`ScrapeError` for text that is not Prometheus, names no family, or is over
    :data:`MAX_BODY_BYTES`."""
    if len(text) > MAX_BODY_BYTES:
        raise ScrapeError(f"a metrics body of {len(text)} bytes, over {MAX_BODY_BYTES}")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ScrapeError(f"not Prometheus text (not UTF-8: {exc.reason})") from None
    hist: dict[str, dict[LabelSet, dict[str, Any]]] = {}
    summ: dict[str, dict[LabelSet, dict[str, float]]] = {}
    scalars: dict[str, dict[str, dict[LabelSet, float]]] = {"counter": {}, "gauge": {}, "": {}}
    families = 0
    try:
        for family in text_string_to_metric_families(text):
            families += 1
            for sample in family.samples:
                name, value = sample.name, float(sample.value)
                suffix = name[len(family.name) :]
                if family.type == "histogram":
                    parts = hist.setdefault(family.name, {}).setdefault(
                        _labels(sample.labels, "le"), {"buckets": {}}
                    )
                    if suffix == "_bucket":
                        parts["buckets"][float(sample.labels["le"])] = value
                    elif suffix in ("_sum", "_count"):
                        parts[suffix[1:]] = value
                elif family.type == "summary" and suffix in ("_sum", "_count"):
                    key = _labels(sample.labels, "quantile")
                    summ.setdefault(family.name, {}).setdefault(key, {})[suffix[1:]] = value
                elif family.type in ("counter", "gauge") and suffix != "_created":
                    by_name = scalars[family.type].setdefault(family.name, {})
                    by_name[_labels(sample.labels)] = value
                elif family.type in ("unknown", "untyped"):
                    scalars[""].setdefault(name, {})[_labels(sample.labels)] = value
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        raise ScrapeError(f"not Prometheus text ({str(exc)[:120]})") from exc
    if not families:  # an exporter with nothing observed yet still prints # TYPE lines
        raise ScrapeError("not Prometheus text (no metric family in the body)")
    histograms: dict[str, dict[LabelSet, HistogramSeries]] = {}
    for family_name, by_labels in hist.items():
        for key, parts in by_labels.items():
            series = _histogram(parts)
            if series is not None:
                histograms.setdefault(family_name, {})[key] = series
    return Snapshot(
        taken_ns=now_ns() if taken_ns is None else taken_ns,
        source_url=source_url,
        histograms=histograms,
        summaries={
            name: {
                k: SummarySeries(sum=p.get("sum", math.nan), count=p["count"])
                for k, p in s.items()
                if "count" in p
            }
            for name, s in summ.items()
        },
        counters=scalars["counter"],
        gauges=scalars["gauge"],
        untyped=scalars[""],
    )


class Scraper:
    """GETs one metrics endpoint (a URL without a path: ``/metrics``); one redirect to the same
    origin is followed (and kept for later scrapes). A connection per scrape: scrapes are
    seconds apart, and a kept one would race the server's idle timeout (uvicorn's is 5 s, the
    scrape interval's default too) and fail as closed before the answer."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        ssl_context: ssl.SSLContext | None = None,
        headers: Sequence[tuple[str, str]] = (),
        max_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        try:
            origin = Origin.parse(url)
        except ValueError as exc:
            raise ScrapeError(str(exc)) from None
        self.url = url
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self._origin = replace(origin, base_path="")
        self._target = _target(url, default="/metrics")
        self._pool = HttpPool(
            self._origin,
            headers=headers,
            ssl_context=ssl_context,
            max_connections=1,
            new_connection_per_request=True,
            timeout_s=timeout_s,
        )

    async def scrape(self) -> Snapshot:
        """One scrape; raises :class:`ScrapeError` with what went wrong."""
        try:
            async with asyncio.timeout(self.timeout_s):
                body = await self._get()
        except TimeoutError:  # the transports' TransportTimeoutError included
            raise ScrapeError(f"no answer within {self.timeout_s:g} s") from None
        except ConnectError as exc:
            raise ScrapeError(f"unreachable: {exc}") from exc
        except MessageTooLargeError:
            raise ScrapeError(f"a metrics body over {self.max_bytes} bytes: refused") from None
        except TransportError as exc:
            raise ScrapeError(f"the scrape failed: {exc}") from exc
        return parse_exposition(body, taken_ns=now_ns(), source_url=self.url)

    async def _get(self) -> bytes:
        for _ in range(2):
            response = await self._pool.request("GET", self._target, accept=_ACCEPT)
            if 200 <= response.status < 300:
                return await response.read(self.max_bytes)
            location = response.headers.get("location", "")
            error = await response.fail()
            if response.status in _REDIRECTS and self._follow(location):
                continue
            raise ScrapeError(_status_message(response.status, self._target, error.detail))
        raise ScrapeError(f"redirected again from {self._target}")

    def _follow(self, location: str) -> bool:
        """Take a redirect to the same origin; False for one elsewhere (or none)."""
        if not location:
            return False
        here = f"{self._origin.scheme}://{self._origin.authority}{self._target}"
        there = urlsplit(urljoin(here, location))
        try:
            same = Origin.parse(there.geturl())
        except ValueError:
            return False
        if replace(same, base_path="") != self._origin:
            return False
        self._target = _target(there.geturl(), default="/")
        return True

    async def close(self) -> None:
        await self._pool.close()


def _target(url: str, *, default: str) -> str:
    parts = urlsplit(url)
    return (parts.path or default) + (f"?{parts.query}" if parts.query else "")


def _status_message(status: int, target: str, detail: str) -> str:
    if status == 404:
        return (
            f"404 Not Found at {target}: no metrics there (vLLM and TGI serve /metrics on"
            " their API port, SGLang only with --enable-metrics, Triton on port 8002)"
        )
    return f"HTTP {status} from {target}: {detail[:200]}"
