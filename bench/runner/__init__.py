"""The ``inferwire`` command: run the suites, rebuild the report, serve, proxy, load."""
