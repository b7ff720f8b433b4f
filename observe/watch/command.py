"""``inferwire watch``: writes the alert rules, the Prometheus configuration and the Grafana
dashboard (``observe/`` holds their defaults)::

    inferwire watch rules --threshold-ms 250 --window 30s --for 10s > alerts.yml
    inferwire watch prometheus-config --server 127.0.0.1:8000 --load 127.0.0.1:9465
    inferwire watch dashboard --out observe/grafana/inferwire.json
    inferwire watch all --out-dir observe   # every default file, as shipped
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Final

from inferwire._runtime.arguments import CommandError, Commands, connect_address, positive

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


def _settings(args: argparse.Namespace) -> rules.AlertSettings:
    try:
        return rules.AlertSettings(
            threshold_s=args.threshold_ms / 1000,
            window=args.window,
            hold=args.hold,
            quantile=args.quantile,
            evaluation_interval=args.evaluation_interval,
        )
    except ValueError as exc:
        raise CommandError(str(exc)) from None


def _rules(args: argparse.Namespace) -> int:
    _write(rules.rules(_settings(args)), args.out)
    return 0


def _config(args: argparse.Namespace) -> int:
    defaults = prometheus_config.ScrapeSettings()
    given = bool(args.server or args.load)
    try:
        settings = prometheus_config.ScrapeSettings(
            servers=(args.server or ()) if given else defaults.servers,
            loads=(args.load or ()) if given else defaults.loads,
            scrape_interval=args.scrape_interval,
            rule_files=args.rules or defaults.rule_files,
        )
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    _write(prometheus_config.config(settings), args.out)
    return 0


def _dashboard(args: argparse.Namespace) -> int:
    _write(dashboard.dump(args.threshold_ms / 1000), args.out)
    return 0


def _all(args: argparse.Namespace) -> int:
    """Every default file, as ``observe/`` ships them."""
    out_dir: Path = args.out_dir
    _write(rules.rules(), out_dir / RULES_FILE)
    _write(prometheus_config.config(), out_dir / CONFIG_FILE)
    _write(dashboard.dump(), out_dir / DASHBOARD_FILE)
    return 0


def _add_rule_settings(parser: argparse.ArgumentParser) -> None:
    defaults = rules.AlertSettings()
    parser.add_argument(
        "--threshold-ms",
        type=positive,
        default=defaults.threshold_s * 1000,
        help="alert when the quantile is above this, ms",
    )
    parser.add_argument(
        "--window", default=defaults.window, help="rate window of the quantile (1m, 30s, ...)"
    )
    parser.add_argument(
        "--for",
        dest="hold",
        default=defaults.hold,
        help="how long above the threshold before the alert fires (0s: at once)",
    )
    parser.add_argument(
        "--quantile", type=float, default=defaults.quantile, help="the quantile, in (0, 1)"
    )
    parser.add_argument(
        "--evaluation-interval",
        default=defaults.evaluation_interval,
        help="how often Prometheus evaluates the group",
    )


def add_commands(commands: Commands) -> None:
    watch = commands.add_parser(
        "watch",
        help="write the Prometheus rules and configuration, and the Grafana dashboard",
        description=__doc__.split("\n\n")[0].replace("\n", " ") if __doc__ else None,
    )
    kinds = watch.add_subparsers(dest="kind", required=True, metavar="WHAT")

    rule = kinds.add_parser(
        "rules",
        help="alert rules: P99 end-to-end latency and TTFT above a threshold",
        description=rules.__doc__,
    )
    _add_rule_settings(rule)
    rule.add_argument("--out", type=Path, help="file to write (default: stdout)")
    rule.set_defaults(run=_rules)

    cfg = kinds.add_parser(
        "prometheus-config",
        help="a Prometheus configuration scraping servers and load generators",
        description=prometheus_config.__doc__,
    )
    cfg.add_argument(
        "--server",
        action="append",
        type=connect_address,
        help="HOST:PORT of a server's metrics (repeat for more; default, with no --load "
        "either: 127.0.0.1:8000)",
    )
    cfg.add_argument(
        "--load",
        action="append",
        type=connect_address,
        help="HOST:PORT of a load generator's --metrics-port (repeat for more; default, with "
        "no --server either: 127.0.0.1:9465)",
    )
    cfg.add_argument("--scrape-interval", default="1s", help="how often to scrape")
    cfg.add_argument(
        "--rules",
        action="append",
        default=None,
        help="rule file path as Prometheus reads it (default: alerts.yml beside the config)",
    )
    cfg.add_argument("--out", type=Path, help="file to write (default: stdout)")
    cfg.set_defaults(run=_config)

    dash = kinds.add_parser(
        "dashboard",
        help="the Grafana dashboard (JSON, provisionable); needs the 'watch' extra",
        description=dashboard.__doc__,
    )
    dash.add_argument(
        "--threshold-ms",
        type=positive,
        default=500.0,
        help="the alert threshold drawn on the latency panels, ms",
    )
    dash.add_argument("--out", type=Path, help="file to write (default: stdout)")
    dash.set_defaults(run=_dashboard)

    every = kinds.add_parser(
        "all", help="every default file, as observe/ ships them", description=_all.__doc__
    )
    every.add_argument(
        "--out-dir", type=Path, default=Path("observe"), help="the folder to write them under"
    )
    every.set_defaults(run=_all)
