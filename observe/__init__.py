"""Watching inferwire, and the servers it measures, while they run: the Prometheus alert rules,
scrape configuration and Grafana dashboard (:mod:`.watch`, ``inferwire watch``; the shipped
defaults are ``grafana/`` and ``prometheus/`` beside this file), and the OpenTelemetry spans of
a request's stages, collected and read back as tables (:mod:`.traces`, ``inferwire trace``).
"""
