"""How a run is watched live: the Prometheus alert rules and scrape configuration, and the
Grafana dashboard, generated from one place so the shipped files (``observe/``) and the metric
names the servers and the load generator export cannot drift apart (a test regenerates them).
``inferwire watch`` writes them with other thresholds, windows or targets."""
