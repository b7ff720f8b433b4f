"""The HTTP/2 small-call path: HPACK blocks remembered while the dynamic table holds
(:mod:`inferwire.transports.http2.hpack_cache`) and h2's inbound field checks run with a memory
(:mod:`inferwire.transports.http2.fields`).

Properties: what is remembered is exactly what hpack would produce (differential against a
plain hpack encoder and decoder over random field lists, table size changes included); a
malformed or hostile block fails as it did (hpack's own errors, never another exception); a
field list h2 would refuse is refused, on the server (GOAWAY(PROTOCOL_ERROR), and it goes on
serving) and on the client (the transport's ``ProtocolError``).
"""

from __future__ import annotations

import asyncio
import contextlib

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import hpack
import pytest
from hyperframe.frame import DataFrame, Frame, RstStreamFrame, SettingsFrame, WindowUpdateFrame
from hypothesis import given, settings
from hypothesis import strategies as st

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire.transports.errors import ProtocolError, RemoteError
from inferwire.transports.http2 import fields as h2fields
from inferwire.transports.http2 import flow, hpack_cache
from tests.helpers.faults import assert_serves, serving
from tests.transports.test_http2_hostile import (
    PREFACE,
    Codes,
    frames_in,
    goaway_codes,
    headers_frame,
    hpack_int,
    hpack_literal,
    raw_peer,
    request_block,
    serialize,
)

# -- table_neutral: RFC 7541's own examples (Appendix C.2, C.3) ------------------------------

NEUTRAL = [
    bytes.fromhex("82"),  # C.2.4 indexed :method GET
    bytes.fromhex("040c2f73616d706c652f70617468"),  # C.2.2 without indexing
    bytes.fromhex("100870617373776f726406736563726574"),  # C.2.3 never indexed
    bytes.fromhex("828684"),  # indexed only
    hpack_int(300, 7, 0x80),  # an index past one byte
    b"",
]
NOT_NEUTRAL = [
    bytes.fromhex("400a637573746f6d2d6b65790d637573746f6d2d686561646572"),  # C.2.1 indexing
    bytes.fromhex("828684410f7777772e6578616d706c652e636f6d"),  # C.3.1: :authority indexed
    bytes.fromhex("3fe11f82"),  # a dynamic table size update (6.3), then a field
    bytes.fromhex("20"),  # size update to 0
]
TRUNCATED = [
    bytes.fromhex("ff"),  # an index whose continuation never comes
    bytes.fromhex("040c2f73616d"),  # a value shorter than its length
    bytes.fromhex("00"),  # a literal name missing
    bytes.fromhex("0003616263"),  # a name, no value
    hpack_int(1 << 40, 7, 0x80),  # longer than any kept block needs
]


@pytest.mark.parametrize("block", NEUTRAL)
def test_blocks_that_leave_the_table_are_neutral(block: bytes) -> None:
    assert hpack_cache.table_neutral(block)


@pytest.mark.parametrize("block", NOT_NEUTRAL + TRUNCATED)
def test_blocks_that_change_the_table_or_do_not_parse_are_not(block: bytes) -> None:
    assert not hpack_cache.table_neutral(block)


@given(st.binary(max_size=64))
@settings(max_examples=400, deadline=None)
def test_a_neutral_block_leaves_the_decoders_table_as_it_was(block: bytes) -> None:
    """Any bytes: the scan never raises, and a block it calls neutral changes no table."""
    decoder = hpack.Decoder()
    decoder.decode(b"\x40\x01a\x01b")  # one entry in the dynamic table
    before = list(decoder.header_table.dynamic_entries)
    neutral = hpack_cache.table_neutral(block)
    with contextlib.suppress(hpack.HPACKError, IndexError, TypeError, UnicodeDecodeError):
        decoder.decode(block, raw=True)
    if neutral:
        assert list(decoder.header_table.dynamic_entries) == before


# -- differential: the caching encoder and decoder against hpack's ---------------------------

_names = st.sampled_from([b":status", b"content-type", b"content-length", b"x-a", b"x-b"])
_values = st.sampled_from([b"200", b"404", b"application/json", b"12", b"13", b"v" * 40])
_lists = st.lists(st.tuples(_names, _values), min_size=1, max_size=5)
_steps = st.lists(
    st.one_of(_lists, st.sampled_from([0, 64, 256, 4096])),  # a list, or a table size change
    min_size=1,
    max_size=30,
)


@given(_steps)
@settings(max_examples=200, deadline=None)
def test_caching_hpack_is_byte_for_byte_hpack(steps: list[list[tuple[bytes, bytes]] | int]) -> None:
    """Field lists (repeated, so remembered) and table size changes (SETTINGS) in any order:
    the caching encoder writes hpack's bytes, and the caching decoder reads hpack's lists."""
    plain, caching = hpack.Encoder(), hpack_cache.CachingEncoder()
    plain_reader, caching_reader = hpack.Decoder(), hpack_cache.CachingDecoder()
    for step in [*steps, *steps]:  # twice: the second pass finds what the first remembered
        if isinstance(step, int):
            plain.header_table_size = caching.header_table_size = step
            continue
        block = caching.encode(list(step))
        assert block == plain.encode(list(step))
        got, expected = _outcome(caching_reader, block), _outcome(plain_reader, block)
        assert got == expected
        if expected[0] == "error":
            return  # hpack refused its own block (it drops a size update set twice): so do we
        assert (
            caching_reader.header_table.dynamic_entries == plain_reader.header_table.dynamic_entries
        )


def _outcome(decoder: hpack.Decoder, block: bytes) -> tuple[str, object]:
    try:
        return "ok", list(decoder.decode(block, raw=True))
    except hpack.HPACKError as exc:
        return "error", type(exc)


def test_the_encoder_remembers_only_neutral_blocks_of_plain_tuples() -> None:
    encoder, plain = hpack_cache.CachingEncoder(), hpack.Encoder()
    fields = [(b":status", b"200"), (b"x-a", b"1")]
    first = encoder.encode(list(fields))  # x-a enters the table: not neutral, not remembered
    assert first == plain.encode(list(fields))
    assert not hpack_cache.table_neutral(first)
    second = encoder.encode(list(fields))
    assert second == plain.encode(list(fields))
    assert hpack_cache.table_neutral(second)
    assert encoder.encode(list(fields)) is second  # from memory
    # a never-indexed field compares equal to a plain tuple: it goes to hpack, not to memory
    secret = [(b":status", b"200"), hpack.NeverIndexedHeaderTuple(b"x-b", b"2")]
    block = encoder.encode(secret)
    assert block == plain.encode(secret)
    assert block[1:2] == b"\x10"
    encoder.header_table_size = plain.header_table_size = 0  # SETTINGS_HEADER_TABLE_SIZE 0
    block = encoder.encode(list(fields))
    assert block == plain.encode(list(fields))
    assert block[:1] == b"\x20"


def test_a_decoder_limit_change_forgets_what_it_remembered() -> None:
    """A block decoded within the list size limit is not answered from memory after the limit
    shrinks: hpack judges it again (and refuses it)."""
    block = hpack.Encoder().encode([(b"x-a", b"v" * 100)])
    decoder = hpack_cache.CachingDecoder()
    neutral = b"\x00\x03x-a\x64" + b"v" * 100  # the same field, without indexing
    assert hpack_cache.table_neutral(neutral)
    assert decoder.decode(neutral, raw=True) == [(b"x-a", b"v" * 100)]
    decoder.max_header_list_size = 64
    with pytest.raises(hpack.OversizedHeaderListError):
        decoder.decode(neutral, raw=True)
    with pytest.raises(hpack.OversizedHeaderListError):
        decoder.decode(block, raw=True)


@pytest.mark.parametrize(
    "block",
    [
        bytes.fromhex("ff"),  # truncated integer
        bytes([0x80 | 0x7F]) + hpack_int(5000, 7, 0)[1:],  # index past both tables
        bytes.fromhex("be"),  # dynamic index 62 with an empty table
        bytes.fromhex("82") + bytes.fromhex("3f e1 1f".replace(" ", "")),  # size update late
        bytes.fromhex("040c2f73616d"),  # truncated literal
    ],
)
def test_a_malformed_block_fails_in_hpack_as_before(block: bytes) -> None:
    decoder = hpack_cache.CachingDecoder()
    for _ in range(2):  # and is never remembered
        with pytest.raises(hpack.HPACKError):
            decoder.decode(block, raw=True)


def test_memory_is_bounded_against_ever_new_blocks() -> None:
    decoder = hpack_cache.CachingDecoder()
    for i in range(10 * hpack_cache.CACHED_BLOCKS):
        decoder.decode(hpack_literal(b"x-a", str(i).encode(), index=False), raw=True)
    assert len(decoder._lists) <= hpack_cache.CACHED_BLOCKS
    checker = h2fields.InboundFields(client_side=False)
    for i in range(10 * h2fields.REMEMBERED_LISTS):
        checker.check(_request_fields((b"x-a", str(i).encode())), trailer=False)
    assert len(checker._passed) <= h2fields.REMEMBERED_LISTS


# -- inbound field checks ----------------------------------------------------------------------


def _request_fields(*extra: tuple[bytes, bytes]) -> list[tuple[bytes, bytes]]:
    return [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":authority", b"x"),
        (b":path", b"/v2/models/sim/infer"),
        *extra,
    ]


BAD_REQUESTS = {
    "uppercase name": _request_fields((b"X-Upper", b"1")),
    "connection-specific": _request_fields((b"connection", b"close")),
    "te other than trailers": _request_fields((b"te", b"gzip")),
    "pseudo after regular": [(b"accept", b"*/*"), *_request_fields()],
    "missing :path": [f for f in _request_fields() if f[0] != b":path"],
    "response pseudo in a request": _request_fields((b":status", b"200")),
    "illegal character": _request_fields((b"x-a", b"a\nb")),
}


@pytest.mark.parametrize("fields", BAD_REQUESTS.values(), ids=BAD_REQUESTS.keys())
def test_a_field_list_h2_refuses_is_refused_every_time(fields: list[tuple[bytes, bytes]]) -> None:
    checker = h2fields.InboundFields(client_side=False)
    for _ in range(2):
        with pytest.raises(h2.exceptions.ProtocolError):
            checker.check(fields, trailer=False)


def test_a_good_list_passes_as_h2_hands_it_over() -> None:
    checker = h2fields.InboundFields(client_side=False)
    fields = _request_fields((b"cookie", b"a=1"), (b"cookie", b"b=2"))
    first = checker.check(fields, trailer=False)
    assert checker.check(list(fields), trailer=False) is first  # from memory
    assert (b"cookie", b"a=1; b=2") in first  # h2's normalization: cookies joined (8.2.3)
    with pytest.raises(h2.exceptions.ProtocolError):  # pseudo-headers are not trailers
        checker.check(fields, trailer=True)


@pytest.mark.parametrize("fields", BAD_REQUESTS.values(), ids=BAD_REQUESTS.keys())
def test_the_server_ends_a_connection_that_sends_a_malformed_request(
    fields: list[tuple[bytes, bytes]],
) -> None:
    block = b"".join(hpack_literal(k, v, index=False) for k, v in fields)

    async def run() -> None:
        async with serving("http2") as srv:
            async with raw_peer(srv) as peer:
                # a good request first: the connection's memory holds a list that passed
                good = request_block("POST", "/v2/models/sim/infer")
                await peer.send(serialize(headers_frame(1, good, ["END_HEADERS", "END_STREAM"])))
                await peer.send(serialize(headers_frame(3, block, ["END_HEADERS", "END_STREAM"])))
                data = await peer.read_until_closed()
                assert goaway_codes(data) == [Codes.PROTOCOL_ERROR]
            await assert_serves("http2", srv.address, stream=False)

    asyncio.run(run())


# -- the client against a server that sends malformed fields ----------------------------------


_INFER = ic.InferRequest(model="sim", id="x", inputs=())


async def _lying_server(
    answer: list[tuple[bytes, bytes]], handlers: list[asyncio.Task[None]]
) -> tuple[asyncio.Server, int]:
    """A raw h2 server answering every request with ``answer`` as its header fields (h2's own
    outbound checks off, so it sends them as given), then an empty body."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.append(task)
        conn = h2.connection.H2Connection(
            h2.config.H2Configuration(
                client_side=False, validate_outbound_headers=False, normalize_outbound_headers=False
            )
        )
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        with contextlib.suppress(ConnectionError, h2.exceptions.H2Error):
            while data := await reader.read(1 << 16):
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.StreamEnded):
                        conn.send_headers(event.stream_id, answer, end_stream=True)
                writer.write(conn.data_to_send())
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.mark.parametrize(
    "answer",
    [
        [(b":status", b"200"), (b"Content-Type", b"application/json")],
        [(b":status", b"200"), (b"connection", b"close")],
        [(b"content-type", b"application/json"), (b":status", b"200")],
        [(b":status", b"200"), (b":path", b"/")],
    ],
    ids=["uppercase", "connection-specific", "pseudo-last", "request-pseudo"],
)
def test_the_client_refuses_a_malformed_response_with_its_typed_error(
    answer: list[tuple[bytes, bytes]],
) -> None:
    async def run() -> None:
        handlers: list[asyncio.Task[None]] = []
        server, port = await _lying_server(answer, handlers)
        client = it.connect("http2", f"127.0.0.1:{port}", codec="orjson")
        try:
            with pytest.raises(ProtocolError):
                await client.infer(_INFER)
        finally:
            await client.close()
            server.close()
            await server.wait_closed()
            async with asyncio.timeout(20.0):
                await asyncio.gather(*handlers)

    asyncio.run(run())


def test_the_client_takes_a_well_formed_answer_from_the_same_server() -> None:
    """The control: the same raw server with well-formed fields is no protocol error (the
    empty 500 answer is the server's error, as the client reports it)."""

    async def run() -> None:
        handlers: list[asyncio.Task[None]] = []
        answer = [(b":status", b"500"), (b"content-type", b"application/json")]
        server, port = await _lying_server(answer, handlers)
        client = it.connect("http2", f"127.0.0.1:{port}", codec="orjson")
        try:
            for _ in range(3):  # the second and third from memory
                with pytest.raises(RemoteError):
                    await client.infer(_INFER)
        finally:
            await client.close()
            server.close()
            await server.wait_closed()
            async with asyncio.timeout(20.0):
                await asyncio.gather(*handlers)

    asyncio.run(run())


def test_repeated_small_calls_stay_correct_on_one_connection() -> None:
    """The remembered path, exercised: many calls on one connection, each answer the service's
    own, with the same and with changing fields (an echo whose size varies)."""

    async def run() -> None:
        async with serving("http2", "protobuf") as srv:
            client = it.connect("http2", srv.address, codec="protobuf")
            try:
                for i in range(50):
                    request = ic.InferRequest(model="sim", id=f"r{i % 3}", inputs=())
                    assert await client.infer(request) == srv.service.infer(request)
            finally:
                await client.close()

    asyncio.run(run())


# -- Connection: h2's _receive_frame without formatting each frame for its trace log ---------


def _server_pair() -> list[h2.connection.H2Connection]:
    """A stock h2 server connection and ours, configured alike, each past the preface."""
    pair = []
    for conn in (
        h2.connection.H2Connection(h2.config.H2Configuration(client_side=False)),
        flow.h2_connection(client_side=False),
    ):
        if isinstance(conn, flow.Connection):
            conn.config.validate_inbound_headers = True  # as stock, for the same verdicts
            conn.config.normalize_inbound_headers = True
        conn.initiate_connection()
        conn.receive_data(PREFACE + serialize(SettingsFrame(0)))
        conn.data_to_send()
        pair.append(conn)
    return pair


def _received(conn: h2.connection.H2Connection, data: bytes) -> tuple[str, bytes]:
    """What a connection makes of ``data``: its events (or the error it raised), then the
    bytes it would send."""
    try:
        said = repr(conn.receive_data(data))
    except h2.exceptions.ProtocolError as exc:
        said = f"{type(exc).__name__}: {exc}"
    return said, conn.data_to_send()


_BLOCK = request_block("POST", "/v2/models/sim/infer")
_FRAME_KINDS = (
    "headers",
    "headers-end",
    "data",
    "data-end",
    "rst",
    "window",
    "server-reset",
    "server-end",
)


def _step(conn: h2.connection.H2Connection, kind: str, stream_id: int) -> bytes:
    """The bytes a peer sends for ``kind`` on ``stream_id``; ``server-reset`` and
    ``server-end`` are the server resetting the stream or answering it whole (no bytes)."""
    if kind.startswith("server"):
        with contextlib.suppress(h2.exceptions.H2Error):
            if kind == "server-reset":
                conn.reset_stream(stream_id)
            else:
                conn.send_headers(stream_id, [(b":status", b"200")], end_stream=True)
        return b""
    if kind.startswith("headers"):
        flags = ["END_HEADERS", "END_STREAM"] if kind == "headers-end" else ["END_HEADERS"]
        return serialize(headers_frame(stream_id, _BLOCK, flags))
    if kind.startswith("data"):
        return serialize(
            DataFrame(stream_id, b"x", flags=["END_STREAM"] if kind == "data-end" else [])
        )
    if kind == "rst":
        return serialize(RstStreamFrame(stream_id))
    return serialize(WindowUpdateFrame(stream_id, window_increment=1))


BRANCHES = {
    # HEADERS on a stream the server reset: RST_STREAM(STREAM_CLOSED) answers it (h2 takes
    # DATA on a closed stream before this method, so HEADERS is what reaches its branches)
    "closed-by-reset": [("headers", 1), ("server-reset", 1), ("headers", 1)],
    # the same once a newer stream made h2 forget the reset one (StreamIDTooLowError)
    "forgotten-after-reset": [("headers", 1), ("server-reset", 1), ("headers", 3), ("headers", 1)],
    # a stream both ends ended, then HEADERS on it: a connection error (STREAM_CLOSED)
    "closed-by-end": [("headers-end", 1), ("server-end", 1), ("headers", 1)],
    "forgotten-after-end": [
        ("headers-end", 1),
        ("server-end", 1),
        ("headers", 3),
        ("headers", 1),
    ],
    # a stream never opened, below one that was: closed implicitly, PROTOCOL_ERROR
    "closed-implicitly": [("headers", 3), ("headers", 1)],
    # HEADERS again on a stream the peer half-closed: h2 resets it, and the error carries
    # that StreamReset event, which the method hands on
    "half-closed-headers": [("headers-end", 1), ("headers", 1)],
    # DATA on a reset stream: h2's DATA handler answers RST_STREAM itself, as frames this
    # method sends on (its else branch)
    "data-on-reset": [("headers", 1), ("server-reset", 1), ("data", 1)],
    "ordinary": [("headers", 1), ("data-end", 1), ("window", 1), ("rst", 1)],
}


def test_both_ends_use_the_connection_that_does_not_format_frames(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The override is what h2_connection makes, on either side, and it receives frames
    without their repr (stock h2 calls it for every frame)."""
    assert type(flow.h2_connection(client_side=True)) is flow.Connection
    stock, ours = _server_pair()
    assert type(ours) is flow.Connection
    assert type(stock) is not flow.Connection

    def no_repr(frame: object) -> str:
        raise AssertionError(f"a received {type(frame).__name__} was formatted")

    monkeypatch.setattr(Frame, "__repr__", no_repr)
    data = _step(ours, "headers-end", 1)
    assert [type(e) for e in ours.receive_data(data)] == [
        h2.events.RequestReceived,
        h2.events.StreamEnded,
    ]
    with pytest.raises(AssertionError, match="was formatted"):
        stock.receive_data(data)


@pytest.mark.parametrize("steps", BRANCHES.values(), ids=BRANCHES)
def test_the_connection_receives_frames_as_stock_h2_does(steps: list[tuple[str, int]]) -> None:
    stock, ours = _server_pair()
    for kind, stream_id in steps:
        assert _received(ours, _step(ours, kind, stream_id)) == _received(
            stock, _step(stock, kind, stream_id)
        ), (kind, stream_id)


def test_the_connection_answers_a_frame_on_a_reset_stream_with_rst_stream() -> None:
    """The branch that answers rather than raises, checked on its own: not only equal."""
    _, ours = _server_pair()
    for kind, stream_id in BRANCHES["closed-by-reset"][:-1]:
        _received(ours, _step(ours, kind, stream_id))
    said, sent = _received(ours, _step(ours, "headers", 1))
    assert "Error" not in said
    assert (RstStreamFrame.type, 1) in [(kind, sid) for kind, sid, _ in frames_in(sent)]


def test_the_connection_hands_on_the_events_of_a_stream_error() -> None:
    _, ours = _server_pair()
    _received(ours, _step(ours, "headers-end", 1))
    said, sent = _received(ours, _step(ours, "headers", 1))
    assert said.startswith("[<StreamReset stream_id:1")
    assert (RstStreamFrame.type, 1) in [(kind, sid) for kind, sid, _ in frames_in(sent)]


@given(st.lists(st.tuples(st.sampled_from(_FRAME_KINDS), st.sampled_from([1, 3, 5])), max_size=12))
@settings(max_examples=300, deadline=None)
def test_any_frame_sequence_is_received_as_stock_h2_does(steps: list[tuple[str, int]]) -> None:
    stock, ours = _server_pair()
    for kind, stream_id in steps:
        theirs = _received(stock, _step(stock, kind, stream_id))
        assert _received(ours, _step(ours, kind, stream_id)) == theirs, (kind, stream_id)
