"""OTLP's JSON encoding of trace exports, both ways: the file format of ``inferwire trace``.

A trace file holds one ``ExportTraceServiceRequest`` per line, in OTLP JSON as the
OpenTelemetry Collector's ``file`` exporter writes it (and OTLP/HTTP JSON carries it): field
names in lowerCamelCase, enums as integers, 64-bit integers (``startTimeUnixNano``,
``intValue``) as decimal strings, and, unlike protobuf's default JSON mapping of ``bytes``
(base64), ``traceId``, ``spanId`` and ``parentSpanId`` as lower-case hex (the OTLP
specification, "JSON Protobuf Encoding"). So a file a real collector wrote reads the same as
one ``inferwire trace collect`` wrote.

:func:`to_json` turns a protobuf export into that object; :func:`read_spans` reads the spans
of such a file into :class:`Span` values, tolerant of what the encoding allows (numbers as
strings or numbers, absent fields at their defaults) and exact about what it does not.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

_ID_FIELDS: Final = ("traceId", "spanId", "parentSpanId")
SPAN_KIND_SERVER: Final = 2
SPAN_KIND_CLIENT: Final = 3


class TraceFileError(ValueError):
    """A trace file (or a line of it) that is not OTLP JSON; the message says where."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Span:
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int
    service: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


def to_json(request: Any) -> dict[str, Any]:
    """An ``ExportTraceServiceRequest`` (protobuf) as its OTLP JSON object."""
    from google.protobuf import json_format

    obj: dict[str, Any] = json_format.MessageToDict(request, use_integers_for_enums=True)
    for resource in obj.get("resourceSpans", ()):
        for scope in resource.get("scopeSpans", ()):
            for span in scope.get("spans", ()):
                _hex_ids(span)
                for link in span.get("links", ()):
                    _hex_ids(link)
    return obj


def _hex_ids(obj: dict[str, Any]) -> None:
    for name in _ID_FIELDS:
        if name in obj:
            obj[name] = base64.b64decode(obj[name]).hex()


def read_spans(path: Path) -> list[Span]:
    """Every span of a trace file. Raises :class:`TraceFileError` naming the line at fault,
    ``OSError`` if the file cannot be read."""
    spans: list[Span] = []
    with path.open("rb") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                obj = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise TraceFileError(f"{where}: not JSON: {exc}") from None
            try:
                spans += _spans(obj)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise TraceFileError(
                    f"{where}: not an OTLP JSON ExportTraceServiceRequest: {exc!r}"
                ) from None
    return spans


def _spans(obj: Any) -> Iterator[Span]:
    if not isinstance(obj, dict) or "resourceSpans" not in obj:
        raise ValueError("no resourceSpans")
    for resource in obj["resourceSpans"]:
        attributes = _attributes(resource.get("resource", {}).get("attributes", ()))
        service = str(attributes.get("service.name", ""))
        for scope in resource.get("scopeSpans", ()):
            for span in scope.get("spans", ()):
                yield Span(
                    trace_id=_id(span["traceId"], 32),
                    span_id=_id(span["spanId"], 16),
                    parent_span_id=_id(span.get("parentSpanId", ""), 16, empty=True),
                    name=str(span["name"]),
                    kind=int(span.get("kind", 0)),
                    service=service,
                    start_ns=int(span["startTimeUnixNano"]),
                    end_ns=int(span["endTimeUnixNano"]),
                    attributes=_attributes(span.get("attributes", ())),
                )


def _id(value: Any, digits: int, *, empty: bool = False) -> str:
    if empty and value == "":
        return ""
    if not isinstance(value, str) or len(value) != digits:
        raise ValueError(f"id {value!r} is not {digits} hex digits")
    int(value, 16)  # raises ValueError for a non-hex one (e.g. base64: protobuf's mapping)
    return value.lower()


def _attributes(items: Any) -> dict[str, Any]:
    return {item["key"]: _value(item.get("value", {})) for item in items}


def _value(value: dict[str, Any]) -> Any:
    """An ``AnyValue``: its one field, int64 read from its string."""
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "arrayValue" in value:
        return [_value(v) for v in value["arrayValue"].get("values", ())]
    if "kvlistValue" in value:
        return _attributes(value["kvlistValue"].get("values", ()))
    return None
