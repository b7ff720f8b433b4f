"""Where a request's time goes on a server inferwire did not write: the server's own reports of
each request (a per-request ``metrics`` object, its Prometheus histograms, its OpenTelemetry
spans), joined to what the client measured, and the split of the end-to-end latency into the
server's queue, the model, and what lies outside the engine (the server's frontend,
serialization and transport).

- :mod:`.reports`: :class:`ServerReport`, one request's stages as a server reported them, and
  the reader of vLLM's per-request ``metrics`` object;
- :mod:`.families`: the metric families of vLLM, SGLang, TGI and Triton, with their meaning and
  source, in one table;
- :mod:`.prometheus`: scrapes of a ``/metrics`` endpoint and their deltas over a point;
- :mod:`.otlp`: the embedded OTLP/HTTP receiver and the join of spans to requests;
- :mod:`.split`: the split, per request and per point.

Durations only: a server's timestamps are never compared with the client's clock.
"""
