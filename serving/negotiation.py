"""Content negotiation: which codec answers a request, from its ``Accept`` header.

RFC 9110, section 12.5.1: ``Accept`` is a list of media ranges (``type/subtype``, ``type/*``
or ``*/*``), each with an optional weight ``q`` from 0 to 1 (default 1). The weight of a media
type is the one of the most specific range that matches it (``type/subtype`` over ``type/*``
over ``*/*``; a range with parameters is more specific still, and matches only a type with
those parameters), and ``q=0`` means "not acceptable". The server then sends the acceptable
representation of highest weight; among equal weights, its own preference (the order of
``offers``). The streams offered here have no parameters, so a range such as
``text/event-stream;charset=utf-8`` does not match them.

A request without ``Accept`` (or with an empty one) takes any type, so it gets the first
offer: by default the JSON server-sent events OpenAI-compatible servers send. OpenAI's SDKs
send ``Accept: application/json`` on streamed requests too, so a JSON codec's event stream is
also acceptable under ``application/json``. A malformed element (no ``/``, a weight outside
the grammar) is ignored, as if absent; nothing acceptable is a :class:`NotAcceptableError`
listing what is offered.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Final

import inferwire.codecs as ic

from .errors import NotAcceptableError

JSON: Final = "application/json"
EVENT_STREAM: Final = "text/event-stream"
DEFAULT_OFFERS: Final = ("orjson", "msgspec-msgpack", "protobuf", "flatbuffers", "delta")
"""The token-stream codecs offered when a caller names none, the default first: OpenAI's
JSON events (written by orjson), then one codec per binary stream media type."""

# qvalue = ( "0" [ "." 0*3DIGIT ] ) / ( "1" [ "." 0*3("0") ] )  (RFC 9110, section 12.4.2)
_QVALUE: Final = re.compile(r"0(?:\.\d{0,3})?|1(?:\.0{0,3})?")
_TOKEN: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")

MediaRange = tuple[str, str, frozenset[tuple[str, str]], float]
"""(type, subtype, parameters, weight), lower case; ``*`` for a wildcard."""


@functools.lru_cache(maxsize=256)
def parse_accept(accept: str) -> tuple[MediaRange, ...]:
    """The media ranges of an ``Accept`` value, malformed elements left out."""
    ranges = []
    for element in accept.split(","):
        media, *params = element.split(";")
        type_, slash, subtype = media.strip().lower().partition("/")
        if not slash or not _TOKEN.fullmatch(type_) or not _TOKEN.fullmatch(subtype):
            continue
        if type_ == "*" and subtype != "*":
            continue  # "*/json" is not a media range
        weight = 1.0
        parameters = []
        for param in params:
            name, _, value = param.strip().partition("=")
            name, value = name.strip().lower(), value.strip()
            if name == "q":
                weight = float(value) if _QVALUE.fullmatch(value) else -1.0
                break  # what follows q are accept-ext parameters
            parameters.append((name, value.strip('"').lower()))
        if weight >= 0:
            ranges.append((type_, subtype, frozenset(parameters), weight))
    return tuple(ranges)


def _parameters(media_type: str) -> tuple[str, str, frozenset[tuple[str, str]]]:
    media, *params = media_type.lower().split(";")
    type_, _, subtype = media.strip().partition("/")
    pairs = (p.strip().partition("=") for p in params)
    return type_, subtype, frozenset((n.strip(), v.strip().strip('"')) for n, _, v in pairs)


def quality(accept: str | None, media_type: str) -> float:
    """The weight ``accept`` gives ``media_type`` (0.0: not acceptable; 1.0 without a
    header): the weight of the most specific matching range."""
    if accept is None or not accept.strip():
        return 1.0
    type_, subtype, parameters = _parameters(media_type)
    best_specificity, weight = -1, 0.0
    for range_type, range_subtype, range_parameters, range_weight in parse_accept(accept):
        if not range_parameters <= parameters:
            continue
        if range_type == "*":
            specificity = 0
        elif range_type != type_:
            continue
        elif range_subtype == "*":
            specificity = 1
        elif range_subtype == subtype:
            specificity = 2 + len(range_parameters)
        else:
            continue
        # the most specific range decides; among equally specific ones, the highest weight
        if specificity > best_specificity or (
            specificity == best_specificity and range_weight > weight
        ):
            best_specificity, weight = specificity, range_weight
    return weight


def _codec(offer: str | ic.Codec) -> ic.Codec:
    codec = ic.get(offer) if isinstance(offer, str) else offer
    if ic.TokenChunk not in codec.types:
        raise ValueError(f"codec {codec.name!r} does not carry token streams")
    return codec


def is_json(codec: ic.Codec) -> bool:
    """Whether ``codec`` writes OpenAI's JSON (its stream: server-sent events or NDJSON)."""
    return codec.media_type == JSON


def stream_quality(accept: str | None, codec: ic.Codec) -> float:
    """The weight ``accept`` gives ``codec``'s token stream (see the module docstring)."""
    weight = quality(accept, codec.stream_media_type)
    if is_json(codec):
        weight = max(weight, quality(accept, JSON))
    return weight


def offered(offers: Sequence[str | ic.Codec] = DEFAULT_OFFERS) -> tuple[str, ...]:
    """The stream media types of ``offers``, each once, in order: what a 406 lists."""
    return tuple(dict.fromkeys(_codec(o).stream_media_type for o in offers))


def negotiate(accept: str | None, offers: Sequence[str | ic.Codec] = DEFAULT_OFFERS) -> ic.Codec:
    """The codec of ``offers`` (names or codecs, the server's preference first) whose token
    stream ``accept`` weighs highest; the first offer when ``accept`` is absent, empty or
    ``*/*``. Raises :class:`NotAcceptableError` (406, with the media types offered) when
    ``accept`` takes none, and ``ValueError`` for no offers or a codec that carries no token
    streams."""
    if not offers:
        raise ValueError("negotiate needs at least one codec to offer")
    codecs = [_codec(o) for o in offers]
    best, best_weight = codecs[0], 0.0
    for codec in codecs:
        weight = stream_quality(accept, codec)
        if weight > best_weight:
            best, best_weight = codec, weight
    if best_weight <= 0:
        raise NotAcceptableError(accept or "", offered(codecs))
    return best
