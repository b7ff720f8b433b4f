"""Bad bytes against every codec: what each decoder makes of input a peer should never send.

:func:`codec_inputs_report` feeds each codec the seeded bad inputs of
:mod:`inferwire.workloads.hostile`, for each workload it carries. Each row counts what came
back: a value (``decoded``), a ``DecodeError``, or anything else (``other``: a foreign
exception escaped the codec; expected 0), and the slowest single decode (of a cropped or
shortened payload where the inputs are made from one, so not always the full payload's).
tests/codecs/test_codec_fuzz.py is the exhaustive, hypothesis-driven counterpart.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import inferwire.codecs as ic
from inferwire.workloads import hostile
from inferwire.workloads.hostile import Input


@dataclasses.dataclass(slots=True)
class _Tally:
    tried: int = 0
    decoded: int = 0
    decode_error: int = 0
    other: int = 0
    max_s: float = 0.0


def _attempt(codec: ic.Codec, type_: type[Any], item: Input, tally: _Tally) -> None:
    start = time.perf_counter()
    try:
        if item.stream:
            decoder = codec.stream_decoder(type_)
            for chunk in decoder.feed(item.data):
                _read_through(chunk)
            decoder.close()
        else:
            _read_through(codec.decode(item.data, type_))
    except ic.DecodeError:
        tally.decode_error += 1
    except KeyboardInterrupt:
        raise
    except BaseException:  # what the report counts: a foreign exception escaped the codec
        tally.other += 1
    else:
        tally.decoded += 1
    tally.tried += 1
    tally.max_s = max(tally.max_s, time.perf_counter() - start)


def _read_through(value: Any) -> None:
    """A zero-copy view read whole, as a caller would (its faults surface on access)."""
    materialize: Callable[[], Any] | None = getattr(value, "materialize", None)
    if materialize is not None:
        materialize()


def codec_inputs_report(seed: int = 0, per_codec: int = 2000) -> list[dict[str, Any]]:
    """One row per codec x workload x kind: ``per_codec`` prefixes and corruptions per codec,
    and the fixed inputs of the other kinds (see :func:`inferwire.workloads.hostile.bad_inputs`)."""
    rows: list[dict[str, Any]] = []
    for name in ic.names():
        codec = ic.get(name, extensions=True)
        for batch in hostile.bad_inputs(name, codec, seed, per_codec):
            tally = _Tally()
            for item in batch.inputs:
                _attempt(codec, batch.type_, item, tally)
            rows.append(
                {
                    "codec": name,
                    "workload": batch.workload,
                    "kind": batch.kind,
                    "tried": tally.tried,
                    "decoded": tally.decoded,
                    "decode_error": tally.decode_error,
                    "other": tally.other,
                    "max_ms": round(tally.max_s * 1e3, 3),
                }
            )
    return rows
