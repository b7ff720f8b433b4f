"""The stages ``inferwire trace report`` derives from spans (inferwire.observe.traces.stages),
on synthetic spans of one request: every network stage from the sender's stamp before its write
call to the receiver's after its read returned. The stamps are those of the case that read
below zero before: the client's write call and the server's return only after the peer has
already read the bytes."""

from __future__ import annotations

from typing import Any, Final

import pytest

from inferwire.observe.traces import stages
from inferwire.observe.traces.otlp_json import SPAN_KIND_CLIENT, SPAN_KIND_SERVER, Span
from inferwire.transports.tracing import MONOTONIC_START

US: Final = 1_000
CLIENT_EPOCH_NS: Final = 1_700_000_000 * 10**9
"""The client process's UNIX offset (``time.time_ns() - time.monotonic_ns()`` at its start)."""
SPAN_KIND_INTERNAL: Final = 1

# one request on the host's monotonic clock (us); in causal order across the processes:
# the client writes, the server reads, the server writes, the client reads
CLIENT = {"start": 100, "encoded": 110, "write": 112, "sent": 160, "received": 170, "decoded": 175}
SERVER = {"received": 130, "parsed": 140, "started": 145, "produced": 150, "encoded": 155}
SERVER_WRITTEN: Final = 200
"""The server's write call returned after the client had read the chunk (at 170)."""
# the second chunk (one token): produced, encoded, written; received, decoded
TOKEN = {"produced": 1200, "encoded": 1203, "written": 1260, "received": 1230, "decoded": 1232}


def _span(name: str, kind: int, start_us: int, end_us: int, epoch_ns: int, **kw: Any) -> Span:
    return Span(
        trace_id="t" * 32,
        start_ns=start_us * US + epoch_ns,
        end_ns=end_us * US + epoch_ns,
        name=name,
        kind=kind,
        **kw,
    )


def _trace(server_epoch_ns: int, *, monotonic: bool = True) -> list[Span]:
    """The request's spans; the server's UNIX offset is ``server_epoch_ns`` (its own, taken at
    another instant than the client's); ``monotonic``: the roots carry their monotonic start."""
    c, s = CLIENT, SERVER
    received = ",".join(str((v - c["start"]) * US) for v in (c["received"], TOKEN["received"]))
    client_attributes: dict[str, Any] = {
        "inferwire.chunk.received_ns": received,
        "inferwire.chunk.parse_ns": f"{(c['decoded'] - c['received']) * US},{2 * US}",
    }
    server_attributes: dict[str, Any] = {
        "inferwire.chunk.produced_ns": ",".join(
            str((v - s["received"]) * US) for v in (s["produced"], TOKEN["produced"])
        ),
        "inferwire.chunk.serialize_ns": f"{(s['encoded'] - s['produced']) * US},{3 * US}",
        "inferwire.chunk.write_ns": ",".join(
            str((w - e) * US)
            for e, w in ((s["encoded"], SERVER_WRITTEN), (TOKEN["encoded"], TOKEN["written"]))
        ),
    }
    if monotonic:
        client_attributes[MONOTONIC_START] = c["start"] * US
        server_attributes[MONOTONIC_START] = s["received"] * US
    client_ids = {"service": "inferwire-load", "parent_span_id": "c" * 16}
    server_ids = {"service": "inferwire-server", "parent_span_id": "s" * 16}

    def client(name: str, start: int, end: int) -> Span:
        return _span(
            name, SPAN_KIND_INTERNAL, start, end, CLIENT_EPOCH_NS, span_id="x" * 16, **client_ids
        )

    def server(name: str, start: int, end: int) -> Span:
        return _span(
            name, SPAN_KIND_INTERNAL, start, end, server_epoch_ns, span_id="y" * 16, **server_ids
        )

    return [
        _span(
            "generate",
            SPAN_KIND_CLIENT,
            c["start"],
            1300,
            CLIENT_EPOCH_NS,
            span_id="c" * 16,
            parent_span_id="",
            service="inferwire-load",
            attributes=client_attributes,
        ),
        client("client serialize", c["start"], c["encoded"]),
        client("send", c["write"], c["sent"]),
        client("client parse", c["received"], c["decoded"]),
        _span(
            "generate",
            SPAN_KIND_SERVER,
            s["received"],
            1290,
            server_epoch_ns,
            span_id="s" * 16,
            parent_span_id="c" * 16,
            service="inferwire-server",
            attributes=server_attributes,
        ),
        server("server parse", s["received"], s["parsed"]),
        server("queue", s["parsed"], s["started"]),
        server("compute", s["started"], s["produced"]),
        server("server serialize", s["produced"], s["encoded"]),
        server("write", s["encoded"], SERVER_WRITTEN),
    ]


def _medians_us(rows: list[stages.StageRow]) -> dict[str, float]:
    return {row.stage: row.median_ns / US for row in rows}


def test_the_request_stages_are_stamps_in_causal_order_and_add_up() -> None:
    result = stages.breakdown(_trace(CLIENT_EPOCH_NS - 5 * US))
    assert result.joined == result.parented == 1
    request = _medians_us(result.request)
    assert request == {
        "client serialize": 10,
        "client dispatch": 2,  # encoded -> just before the write call
        "network to server": 18,  # before the client's write call -> the server read it (130)
        "server parse": 10,
        "queue": 5,
        "compute": 5,
        "server serialize": 5,
        "network back": 15,  # before the server's write call (155) -> the client read it
        "client parse": 5,
    }
    assert list(request) == list(stages.REQUEST_STAGES)
    # the client's start to its first chunk decoded, exactly
    assert sum(request.values()) == CLIENT["decoded"] - CLIENT["start"]
    # what the old stages read on these stamps: from the write calls' returns
    assert SERVER["received"] - CLIENT["sent"] < 0
    assert CLIENT["received"] - SERVER_WRITTEN < 0


def test_a_token_network_starts_before_the_server_write_call() -> None:
    token = _medians_us(stages.breakdown(_trace(CLIENT_EPOCH_NS)).token)
    assert token == {
        "compute": TOKEN["produced"] - SERVER_WRITTEN,  # the previous chunk written -> produced
        "server serialize": 3,
        "network": TOKEN["received"] - TOKEN["encoded"],
        "client parse": 2,
    }
    assert list(token) == list(stages.TOKEN_STAGES)
    assert TOKEN["received"] - TOKEN["written"] < 0  # written -> received, the old stage


@pytest.mark.parametrize("offset_us", [-40, -5, 0, 5, 40])
def test_the_monotonic_starts_take_the_processes_offsets_out(offset_us: int) -> None:
    """Each process converts to UNIX time by its own offset; with the roots' monotonic starts
    the network stages do not depend on it, without them they are off by the difference."""
    server_epoch = CLIENT_EPOCH_NS + offset_us * US
    exact = _medians_us(stages.breakdown(_trace(server_epoch)).request)
    assert exact["network to server"] == 18
    assert exact["network back"] == 15
    unix = _medians_us(stages.breakdown(_trace(server_epoch, monotonic=False)).request)
    assert unix["network to server"] == 18 + offset_us
    assert unix["network back"] == 15 - offset_us


def test_the_table_marks_a_median_below_zero() -> None:
    # two processes whose UNIX offsets are 40 us apart and no monotonic starts: not one clock
    below = stages.text(stages.breakdown(_trace(CLIENT_EPOCH_NS - 40 * US, monotonic=False)))
    network = next(line for line in below.splitlines() if "network to server" in line)
    assert network.endswith("< 0: not a duration")
    assert stages.NEGATIVE_NOTE in below
    fine = stages.text(stages.breakdown(_trace(CLIENT_EPOCH_NS - 40 * US)))
    assert "not a duration" not in fine
