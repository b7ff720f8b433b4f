"""``inferwire watch``: writes the alert rules, the Prometheus configuration and the Grafana
dashboard (``observe/`` holds their defaults; :mod:`inferwire.cli.watch` parses the options)::

    inferwire watch rules --threshold-ms 250 --window 30s --for 10s > alerts.yml
    inferwire watch prometheus-config --server 127.0.0.1:8000 --load 127.0.0.1:9465
    inferwire watch dashboard --out observe/grafana/inferwire.json
    inferwire watch all --out-dir observe   # every default file, as shipped
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from inferwire._runtime.arguments import CommandError

from . import dashboard, prometheus_config, rules

RULES_FILE: Final = Path("prometheus/alerts.yml")
CONFIG_FILE: Final = Path("prometheus/prometheus.yml")
DASHBOARD_FILE: Final = Path("grafana/inferwire.json")


def _write(text: str, out: Path | None) -> None:
    if out is None:
        sys.stdout.write(text)
        return
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    except OSError as exc:
        raise CommandError(f"cannot write {out}: {exc}") from None


def alert_settings(
    *, threshold_ms: float, window: str, hold: str, quantile: float, evaluation_interval: str
) -> rules.AlertSettings:
    """The alert's settings, a value :class:`~.rules.AlertSettings` refuses as a
    CommandError."""
    try:
        return rules.AlertSettings(
            threshold_s=threshold_ms / 1000,
            window=window,
            hold=hold,
            quantile=quantile,
            evaluation_interval=evaluation_interval,
        )
    except ValueError as exc:
        raise CommandError(str(exc)) from None


def write_rules(settings: rules.AlertSettings, out: Path | None) -> int:
    """The alert rules, to ``out`` (None: stdout)."""
    _write(rules.rules(settings), out)
    return 0


def write_config(
    *,
    servers: Sequence[str] | None,
    loads: Sequence[str] | None,
    scrape_interval: str,
    rule_files: Sequence[str] | None,
    out: Path | None,
) -> int:
    """The Prometheus configuration; with neither ``servers`` nor ``loads``, the defaults'
    targets."""
    defaults = prometheus_config.ScrapeSettings()
    given = bool(servers or loads)
    try:
        settings = prometheus_config.ScrapeSettings(
            servers=tuple(servers or ()) if given else defaults.servers,
            loads=tuple(loads or ()) if given else defaults.loads,
            scrape_interval=scrape_interval,
            rule_files=tuple(rule_files) if rule_files else defaults.rule_files,
        )
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    _write(prometheus_config.config(settings), out)
    return 0


def write_dashboard(threshold_ms: float, out: Path | None) -> int:
    """The Grafana dashboard, its latency panels drawing ``threshold_ms``."""
    _write(dashboard.dump(threshold_ms / 1000), out)
    return 0


def write_all(out_dir: Path) -> int:
    """Every default file, as ``observe/`` ships them."""
    _write(rules.rules(), out_dir / RULES_FILE)
    _write(prometheus_config.config(), out_dir / CONFIG_FILE)
    _write(dashboard.dump(), out_dir / DASHBOARD_FILE)
    return 0
