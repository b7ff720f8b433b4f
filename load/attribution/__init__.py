"""Where a request's time goes on a server inferwire did not write: the server's own reports of
each request (a per-request ``metrics`` object, its Prometheus histograms, its OpenTelemetry
spans), joined to what the client measured, and the split of the end-to-end latency into the
server's queue, the model, and what lies outside the engine (the server's frontend,
serialization and transport).

- :mod:`.reports`: :class:`ServerReport`, one request's stages as a server reported them, and
  the reader of vLLM's per-request ``metrics`` object;
- :mod:`.families`: the metric families of vLLM, SGLang, TGI and Triton, with their meaning and
  source, in one table;
- :mod:`.scrape`: scrapes of a ``/metrics`` endpoint, parsed;
- :mod:`.prometheus`: two scrapes' deltas over a point, per stage;
- :mod:`.otlp_receiver`: the embedded OTLP/HTTP receiver;
- :mod:`.otlp`: the join of a server's spans to requests, and the ``traceparent`` they carry;
- :mod:`.split`: the split, per request and per point.

Durations only: a server's timestamps are never compared with the client's clock.
"""
