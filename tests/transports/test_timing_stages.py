"""The per-stage split of a timed stream (StreamTiming.request_stages_ns and stages_ns) on
synthetic stamps: every network stage from the sender's stamp before its write call to the
receiver's after its read returned, so none is below zero even when a write call returns after
the peer has read its bytes, and the stages add up to the whole."""

from __future__ import annotations

import numpy as np

from inferwire.transports.timing import REQUEST_STAGES, StreamTiming

US = 1_000


def _timing(*, write_us: int | None = 112) -> StreamTiming:
    """One request of two chunks (us): the client's write call returns at 160, after the server
    read the request (130); the server's returns at 200 and 1260, after the client read each
    chunk (170, 1230)."""
    timing = StreamTiming(
        request_start_ns=100 * US,
        request_encoded_ns=110 * US,
        request_write_ns=0 if write_us is None else write_us * US,
        request_sent_ns=160 * US,
    )
    rows = [(130, 140, 0), (150, 155, 200), (1200, 1203, 1260)]  # the request's, then chunks'
    timing.set_server(np.asarray(rows, dtype=np.uint64) * US)
    timing.received_ns = [170 * US, 1230 * US]
    timing.decoded_ns = [175 * US, 1232 * US]
    return timing


def test_a_request_stages_are_stamps_in_causal_order() -> None:
    stages = {name: ns / US for name, ns in _timing().request_stages_ns().items()}
    assert stages == {
        "client serialize": 10,
        "client dispatch": 2,
        "network to server": 18,  # before the write call (112) -> the server read it (130)
        "server parse": 10,
        "service": 10,
        "server serialize": 5,
        "network back": 15,  # before the server's write call (155) -> the client read it (170)
        "client parse": 5,
    }
    assert list(stages) == list(REQUEST_STAGES)
    assert sum(stages.values()) == 175 - 100


def test_a_client_without_a_write_stamp_starts_the_network_at_its_encode() -> None:
    stages = _timing(write_us=None).request_stages_ns()
    assert stages["client dispatch"] == 0
    assert stages["network to server"] == (130 - 110) * US


def test_a_chunk_network_holds_the_write_call() -> None:
    stages = {name: list(ns // US) for name, ns in _timing().stages_ns().items()}
    assert stages == {
        "serialize": [5, 3],
        "network": [15, 27],  # encoded -> received
        "parse": [5, 2],
        "end_to_end": [25, 32],
        "write": [45, 57],  # the write call alone, inside network (and longer than it here)
    }
    parts = np.add.reduce([stages[name] for name in ("serialize", "network", "parse")])
    assert list(parts) == stages["end_to_end"]
