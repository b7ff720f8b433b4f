"""Content codings of HTTP bodies and streams (RFC 9110, section 8.4): ``gzip``, ``br`` and
``zstd`` chosen by the request's ``Accept-Encoding`` (section 12.5.3), a stream compressed with
a flush after every write, and every decoder bounded. Sans-IO: the servers and clients move
the bytes; this module only turns them into other bytes.

Negotiation (:func:`negotiate`): the client's highest ``q`` wins; among equal ones our order,
``zstd`` > ``gzip`` > ``br``, from what ``bench/bench_compression.py`` measures on token
streams flushed per event: zstd costs the server the least CPU per token (about half of gzip's,
a fifth of brotli's), which is what an inference frontend runs out of, for bytes within 15% of
the fewest; gzip makes the fewest bytes per token there; brotli, the best of the three on large
static text, pays a metablock per flush and comes out larger than gzip at twice its CPU.
``x-gzip`` is ``gzip`` (section 8.4.1.3); ``*`` stands for every coding the field does not
name. When nothing offered is acceptable, even with ``identity;q=0``, the answer goes out
without a coding, as section 12.5.3 advises (not 406). No field at all: no coding (a client
that says nothing may not decode; nginx's gzip sends identity then too).

Streams: each write is compressed and flushed at once (zlib's ``Z_SYNC_FLUSH``, brotli's
``flush``, zstd's ``FLUSH_BLOCK``), so an event is decodable when it arrives and the first token
is not held back; the window still spans the stream, so each event after the first costs little
more than what differs from the last. The compressors of a stream keep small windows: a server
holds one per open stream.

Decoders (:class:`Decoder`) never produce more than a limit: ``max_piece_bytes`` per
:meth:`Decoder.feed`, ``max_total_bytes`` over a body, and a ratio of output to input
(``max_ratio``, past ``ratio_floor_bytes``), checked in bounded steps: zlib's ``max_length``,
brotli's ``output_buffer_limit`` (256 KiB a step, at most 352 KiB out), and for zstd, whose
decompressobj has no output bound, input slices small enough that one step cannot produce more
than what is left (a zstd block, at most 128 KiB, takes at least 4 bytes of input). A zip bomb
is refused with :class:`DecompressionLimitError` having produced no more than the limit and one
step (gzip: nothing more; br: at most 352 KiB; zstd: 2.2 MiB); corrupt or unknown codings are
:class:`ContentEncodingError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import zlib
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

from inferwire._runtime.extras import needs_extras

from .errors import MessageTooLargeError, ProtocolError

if TYPE_CHECKING:
    from .http_response import Response

CODINGS: Final = ("zstd", "gzip", "br")
"""What the servers offer, best first (the module docstring says why this order)."""
DECODABLE: Final = ("zstd", "gzip", "br", "deflate")
"""What the clients decode: the offered codings and ``deflate`` (the zlib format, RFC 9110
8.4.1.2), which some servers still send."""
ALIASES: Final = {"x-gzip": "gzip"}
"""RFC 9110, 8.4.1.3: a recipient should treat ``x-gzip`` as ``gzip``."""
COMPRESSIBLE: Final = frozenset(
    {
        "application/json",
        "text/event-stream",
        "application/x-ndjson",
        "application/jsonl",
        "text/plain",
        "application/openmetrics-text",
        "application/vnd.inferwire.frames+protobuf",
        "application/vnd.inferwire.frames+msgpack",
        "application/vnd.inferwire.frames+flatbuffers",
    }
)
"""Media types compressed: text, and the token streams of the binary codecs whose frames repeat
each chunk's fields (protobuf's, MessagePack's and FlatBuffers' come out 5 to 10 times smaller,
flushed per event). Not ``delta``'s stream, whose frames carry only what changed and come out
larger compressed, nor binary unary bodies: tensors of floats, little to win for the CPU."""
MIN_BODY_BYTES: Final = 256
"""A body below this goes as it is: the coding's framing (gzip's 18 bytes) and the CPU are
rarely won back on less (OpenAI's error objects and /v1/models stay plain; nginx's
gzip_min_length is 20 bytes, which wins a few bytes for a syscall's worth of CPU)."""
OFF_LOOP_BYTES: Final = 1 << 20
"""A body at least this large is compressed in a worker thread: at gzip's speed (tens of MB/s)
a megabyte would hold the event loop, and every other stream on it, for tens of ms."""
GZIP_LEVEL: Final = 6
BROTLI_QUALITY: Final = 5
ZSTD_LEVEL: Final = 3
"""Each library's default speed, but brotli's: its default, 11, is for files compressed once;
dynamic content is served at 4 to 6 (nginx's brotli module and Cloudflare's default)."""
ZSTD_STREAM_LEVEL: Final = 1
"""A stream's zstd level: on events flushed one by one, level 3 makes no fewer bytes than 1,
and its tables make a stream's compressor 800 KiB where level 1's is 115 KiB (the memory a
server holds per open stream; gzip's is about 90 KiB, brotli's 180 KiB)."""
STREAM_WINDOW_BITS: Final = 16
"""A stream's compressor window for br and zstd, 64 KiB (zlib's is 32 KiB): an event repeats
the one before it, not what came a megabyte earlier, and a server holds one compressor per
open stream (brotli's default window would be 4 MiB each, and cost it 3 times the CPU)."""
ZSTD_MAX_WINDOW_BYTES: Final = 8 << 20
"""RFC 9659: a ``zstd`` content coding's window is at most 8 MB, and a decoder may refuse more;
ours does (libzstd's own default limit is 128 MiB per decoder)."""
DEFAULT_MAX_RATIO: Final = 1000.0
DEFAULT_RATIO_FLOOR_BYTES: Final = 1 << 20
"""A decoder refuses output over ``DEFAULT_MAX_RATIO`` times its input once it has produced
more than the floor: gzip cannot pass 1032:1, and what is served compressed here comes to 2:1
(a short JSON body) to 40:1 (an unpaced token stream); a bomb is 1000:1 to millions to one.
A legitimate body over a megabyte of nearly one repeated byte would be refused too."""
_ZSTD_BLOCK_BYTES: Final = 128 << 10
_ZSTD_MIN_BLOCK_INPUT: Final = 4
"""RFC 8878: a block decodes to at most 128 KiB, and takes at least 4 bytes (an RLE block)."""
_ZSTD_MIN_SLICE: Final = 64
_SLICE_BYTES: Final = 4096
"""brotli's input per step."""
_BROTLI_STEP_BYTES: Final = 256 << 10
"""brotli's output per step: it grows its buffer by blocks (32, 64, 256 KiB, 1, 4 MiB...) until
it has reached the limit, so a step of 256 KiB is at most 352 KiB."""


class ContentEncodingError(ProtocolError):
    """A body in a content coding we do not decode, or compressed bytes that do not decode
    (corrupt, truncated, or data after the end)."""


class DecompressionLimitError(MessageTooLargeError):
    """Compressed bytes that decode past a limit (size or ratio): a zip bomb, or a body too
    large for the limits. Refused before the output passed the limit by more than one step."""


def _coding_name(name: str) -> str:
    name = name.strip().lower()
    return ALIASES.get(name, name)


def parse_accept_encoding(value: str) -> dict[str, float]:
    """The codings of an ``Accept-Encoding`` field and their ``q`` (RFC 9110, 12.5.3 and 12.4.2),
    names lower-cased, ``x-gzip`` as ``gzip``. A member with a malformed weight is left out (a
    client whose q does not parse has said nothing sure about that coding); a name listed twice
    keeps its highest weight."""
    weights: dict[str, float] = {}
    for member in value.split(","):
        name, *params = member.split(";")
        coding = _coding_name(name)
        if not coding:
            continue
        q = 1.0
        for param in params:
            key, _, raw = param.partition("=")
            if key.strip().lower() != "q":
                continue
            q = _qvalue(raw.strip())
        if q < 0:
            continue
        weights[coding] = max(q, weights.get(coding, 0.0))
    return weights


def _qvalue(text: str) -> float:
    """RFC 9110 12.4.2: ``0`` or ``1`` with up to three decimals; -1 for anything else."""
    if not text or len(text) > 5 or text[0] not in "01":
        return -1.0
    try:
        q = float(text)
    except ValueError:
        return -1.0
    return q if 0.0 <= q <= 1.0 and (len(text) == 1 or text[1] == ".") else -1.0


def check_accept_encoding(value: str) -> None:
    """Raises ValueError unless ``value`` is an ``Accept-Encoding`` a client of ours may send:
    one line, each member a coding it decodes (or ``identity``, ``*``) with a valid weight."""
    if "\r" in value or "\n" in value:
        raise ValueError("--accept-encoding must be one line")
    weights = parse_accept_encoding(value)
    members = [m for m in value.split(",") if m.strip()]
    if not members:
        raise ValueError("--accept-encoding: name at least one coding")
    if len(weights) < len({_coding_name(m.split(";")[0]) for m in members}):
        raise ValueError(f"--accept-encoding {value!r}: a weight is not q=0 to q=1")
    unknown = sorted(set(weights) - {*DECODABLE, "identity", "*"})
    if unknown:
        raise ValueError(
            f"--accept-encoding: {', '.join(unknown)} cannot be decoded here; "
            f"ask for some of {', '.join(DECODABLE)}"
        )


def negotiate(accept_encoding: str | None, offered: Sequence[str] = CODINGS) -> str | None:
    """The coding to answer with, None for none (identity): of ``offered`` (best first), the
    one the client weighs highest, ties going to the earlier. A coding the field names with
    q=0 is refused, and so is any it does not name unless ``*`` is there with a non-zero q. An
    ``identity`` entry weighed above every acceptable coding keeps the answer uncompressed."""
    if accept_encoding is None:
        return None
    weights = parse_accept_encoding(accept_encoding)
    star = weights.get("*", 0.0)
    best: str | None = None
    best_q = 0.0
    for coding in offered:
        q = weights.get(coding, star)
        if q > best_q:
            best, best_q = coding, q
    if best is not None and weights.get("identity", 0.0) > best_q:
        return None
    return best


# -- compressors ------------------------------------------------------------------------


def _brotli() -> Any:
    """The brotli module (untyped), or MissingExtraError naming the extra."""
    with needs_extras("Content-Encoding br"):
        import brotli  # type: ignore[import-untyped]
    return brotli


class StreamCompressor(Protocol):
    """One stream's compressor: :meth:`compress` returns bytes that decode, with what came
    before, to every byte given so far; :meth:`finish` the coding's end."""

    def compress(self, data: bytes) -> bytes: ...

    def finish(self) -> bytes: ...


class _Zlib:
    __slots__ = ("_flush", "_obj")

    def __init__(self, wbits: int, level: int) -> None:
        self._obj = zlib.compressobj(level, zlib.DEFLATED, wbits)
        self._flush = zlib.Z_SYNC_FLUSH

    def compress(self, data: bytes) -> bytes:
        obj = self._obj
        return obj.compress(data) + obj.flush(self._flush)

    def finish(self) -> bytes:
        return self._obj.flush(zlib.Z_FINISH)


class _Brotli:
    __slots__ = ("_obj",)

    def __init__(self, quality: int, lgwin: int) -> None:
        brotli = _brotli()
        self._obj = brotli.Compressor(mode=brotli.MODE_TEXT, quality=quality, lgwin=lgwin)

    def compress(self, data: bytes) -> bytes:
        obj = self._obj
        out: bytes = obj.process(data) + obj.flush()
        return out

    def finish(self) -> bytes:
        out: bytes = self._obj.finish()
        return out


class _Zstd:
    __slots__ = ("_block", "_obj")

    def __init__(self, level: int, window_log: int) -> None:
        with needs_extras("Content-Encoding zstd"):
            import zstandard
        # the frame's checksum (4 bytes at its end): brotli has none, gzip its CRC-32
        params = zstandard.ZstdCompressionParameters.from_level(
            level, window_log=window_log, write_checksum=1
        )
        compressor = zstandard.ZstdCompressor(compression_params=params)
        self._obj = compressor.compressobj()
        self._block = zstandard.COMPRESSOBJ_FLUSH_BLOCK

    def compress(self, data: bytes) -> bytes:
        obj = self._obj
        return obj.compress(data) + obj.flush(self._block)

    def finish(self) -> bytes:
        return self._obj.flush()


@dataclass(frozen=True, slots=True, kw_only=True)
class Compression:
    """A server's content codings: what it offers (best first), which answers it compresses
    (``media_types``, bodies from ``min_body_bytes``), and each library's level."""

    codings: tuple[str, ...] = CODINGS
    media_types: frozenset[str] = COMPRESSIBLE
    min_body_bytes: int = MIN_BODY_BYTES
    gzip_level: int = GZIP_LEVEL
    brotli_quality: int = BROTLI_QUALITY
    zstd_level: int = ZSTD_LEVEL
    zstd_stream_level: int = ZSTD_STREAM_LEVEL
    max_request_bytes: int = 64 << 20
    """The largest request body decoded (the server's ``Limits.max_message_bytes``)."""

    def __post_init__(self) -> None:
        unknown = [c for c in self.codings if c not in CODINGS]
        if unknown or not self.codings:
            raise ValueError(f"codings must be some of {', '.join(CODINGS)}, not {unknown}")
        for coding in self.codings:  # a missing library: said when the server is made
            self.stream_compressor(coding)

    def stream_compressor(self, coding: str) -> StreamCompressor:
        """A compressor for one stream, flushed per write, with a stream's small window."""
        if coding == "gzip":
            return _Zlib(16 + zlib.MAX_WBITS, self.gzip_level)
        if coding == "br":
            return _Brotli(self.brotli_quality, STREAM_WINDOW_BITS)
        if coding == "zstd":
            return _Zstd(self.zstd_stream_level, STREAM_WINDOW_BITS)
        raise ValueError(f"no compressor for {coding!r}")

    def compress_body(self, coding: str, body: bytes) -> bytes:
        """``body`` whole in ``coding``."""
        if coding == "gzip":
            return zlib.compress(body, self.gzip_level, wbits=16 + zlib.MAX_WBITS)
        if coding == "br":
            brotli = _brotli()
            out: bytes = brotli.compress(body, mode=brotli.MODE_TEXT, quality=self.brotli_quality)
            return out
        if coding == "zstd":
            with needs_extras("Content-Encoding zstd"):
                import zstandard
            return zstandard.ZstdCompressor(level=self.zstd_level).compress(body)
        raise ValueError(f"no compressor for {coding!r}")

    def encode(self, response: Response, headers: Mapping[str, str]) -> Response:
        """``response`` in the coding the request's ``Accept-Encoding`` takes, when its media
        type is one compressed (a body from ``min_body_bytes``); a response that could have
        been compressed says ``Vary: Accept-Encoding`` either way (RFC 9110, 12.5.5), so a
        cache keeps one copy per coding."""
        if response.stream is None and not response.body:
            return response
        if _content_type(response.content_type) not in self.media_types:
            return response
        if any(name == "content-encoding" for name, _ in response.headers):
            return response
        response.headers.append(("vary", "accept-encoding"))
        if response.stream is None and len(response.body) < self.min_body_bytes:
            return response
        coding = negotiate(headers.get("accept-encoding"), self.codings)
        if coding is None:
            return response
        response.headers.append(("content-encoding", coding))
        if response.stream is not None:
            response.stream = compressed_stream(response.stream, self.stream_compressor(coding))
        elif len(response.body) >= OFF_LOOP_BYTES:
            body, response.body = response.body, b""
            response.stream = _compressed_off_loop(lambda: self.compress_body(coding, body))
        else:
            response.body = self.compress_body(coding, response.body)
        return response

    def decode_request(self, coding: str, body: bytes) -> bytes:
        """A request body in ``coding`` decoded (RFC 9110, 8.4), bounded by
        ``max_request_bytes``. Raises :class:`ContentEncodingError` (corrupt) or
        :class:`DecompressionLimitError`."""
        decoder = Decoder(
            coding, max_piece_bytes=self.max_request_bytes, max_total_bytes=self.max_request_bytes
        )
        decoded = decoder.feed(body)
        decoder.close()
        return decoded


def _content_type(value: str) -> str:
    return value.split(";", 1)[0].strip().lower()


async def compressed_stream(
    frames: AsyncGenerator[bytes, None], compressor: StreamCompressor
) -> AsyncGenerator[bytes, None]:
    """``frames`` compressed, one piece per frame, each flushed; then the coding's end. A
    stream that fails ends without it, so its client sees a truncated body, not a whole one."""
    compress = compressor.compress
    async with contextlib.aclosing(frames):
        async for frame in frames:
            yield compress(frame) if frame else b""
    yield compressor.finish()


async def _compressed_off_loop(compress: Callable[[], bytes]) -> AsyncGenerator[bytes, None]:
    yield await asyncio.to_thread(compress)


def content_coding(value: str | None) -> str | None:
    """The one coding a ``Content-Encoding`` field names (None: none, or ``identity``).
    Raises :class:`ContentEncodingError` for one we do not decode, or for codings stacked on
    one another (RFC 9110 allows them; no server here or in front of one sends them)."""
    if value is None:
        return None
    codings = [c for c in (_coding_name(part) for part in value.split(",")) if c != "identity"]
    codings = [c for c in codings if c]
    if not codings:
        return None
    if len(codings) > 1:
        raise ContentEncodingError(f"stacked content codings {value!r} are not decoded")
    if codings[0] not in DECODABLE:
        raise ContentEncodingError(
            f"content coding {codings[0]!r} is not one of {', '.join(DECODABLE)}"
        )
    return codings[0]


# -- decoders ---------------------------------------------------------------------------


class _Inflater:
    """gzip (several members in a row, as gzip(1) may write them) and deflate (the zlib
    format)."""

    __slots__ = ("_full", "_gzip", "_obj", "started")

    def __init__(self, gzip: bool) -> None:
        self._gzip = gzip
        self._obj = zlib.decompressobj(16 + zlib.MAX_WBITS if gzip else zlib.MAX_WBITS)
        self._full = False
        self.started = False

    def step(self, data: bytes, max_out: int) -> tuple[bytes, bytes]:
        """(output, input left over); output at most ``max_out`` bytes."""
        obj = self._obj
        if obj.eof:
            if not data:
                return b"", b""
            if not self._gzip:
                raise ContentEncodingError(f"{len(data)} bytes after the end of the deflate data")
            self._obj = obj = zlib.decompressobj(16 + zlib.MAX_WBITS)  # the next member
        self.started = True
        out = obj.decompress(data, max_out)
        # a full output may leave bytes inside zlib (the rest of a match) with no input left
        self._full = len(out) >= max_out and not obj.eof
        return out, obj.unused_data if obj.eof else obj.unconsumed_tail

    @property
    def ended(self) -> bool:
        return self._obj.eof

    def pending(self) -> bool:
        return self._full


class _BrotliDecoder:
    """brotli takes its whole input at once and bounds its output (``output_buffer_limit``,
    brotli 1.2); input goes in slices, so the ratio bound counts it as it is consumed."""

    __slots__ = ("_obj", "_waiting", "started")

    def __init__(self) -> None:
        self._obj = _brotli().Decompressor()
        self._waiting = False
        self.started = False

    def step(self, data: bytes, max_out: int) -> tuple[bytes, bytes]:
        obj = self._obj
        max_out = min(max_out, _BROTLI_STEP_BYTES)
        if self._waiting:  # brotli: only empty input until it can take more
            out: bytes = obj.process(b"", output_buffer_limit=max_out)
            self._waiting = not obj.can_accept_more_data()
            return out, data
        if obj.is_finished():
            raise ContentEncodingError(f"{len(data)} bytes after the end of the br data")
        self.started = True
        piece, rest = data[:_SLICE_BYTES], data[_SLICE_BYTES:]
        try:
            out = obj.process(piece, output_buffer_limit=max_out)
        except TypeError as exc:  # brotli < 1.2 cannot bound its output
            raise ContentEncodingError(
                "br: the installed brotli cannot bound its output (brotli>=1.2 can)"
            ) from exc
        self._waiting = not obj.can_accept_more_data()
        return out, rest

    @property
    def ended(self) -> bool:
        return bool(self._obj.is_finished()) and not self._waiting

    def pending(self) -> bool:
        return self._waiting


class _ZstdDecoder:
    """zstandard's decompressobj has no output bound, so it gets input slices small enough
    that what one can produce stays under ``max_out``, plus one block (module docstring)."""

    __slots__ = ("_ended", "_obj", "_zstandard", "started")

    def __init__(self) -> None:
        with needs_extras("Content-Encoding zstd"):
            import zstandard
        self._zstandard = zstandard
        self._obj = self._decompressobj()
        self._ended = False
        self.started = False

    def _decompressobj(self) -> Any:
        decompressor = self._zstandard.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW_BYTES)
        return decompressor.decompressobj()

    def step(self, data: bytes, max_out: int) -> tuple[bytes, bytes]:
        if self._ended:  # frames may follow one another (RFC 8878, section 3)
            self._obj = self._decompressobj()
            self._ended = False
        self.started = True
        size = max(_ZSTD_MIN_SLICE, max_out // _ZSTD_BLOCK_BYTES * _ZSTD_MIN_BLOCK_INPUT)
        piece, rest = data[:size], data[size:]
        obj = self._obj
        out: bytes = obj.decompress(piece)
        if obj.eof:
            self._ended = True
            rest = obj.unused_data + rest
        return out, rest

    @property
    def ended(self) -> bool:
        return self._ended

    def pending(self) -> bool:
        return False


class _Backend(Protocol):
    started: bool

    def step(self, data: bytes, max_out: int) -> tuple[bytes, bytes]: ...

    @property
    def ended(self) -> bool: ...

    def pending(self) -> bool: ...


@functools.cache
def _library_errors() -> tuple[type[Exception], ...]:
    """The libraries' own errors, those installed."""
    found: list[type[Exception]] = [zlib.error]
    with contextlib.suppress(ImportError):
        found.append(_brotli().error)
    with contextlib.suppress(ImportError):
        import zstandard

        found.append(zstandard.ZstdError)
    return tuple(found)


class Decoder:
    """One body's (or one stream's) decoder for ``coding``: :meth:`feed` the compressed bytes
    as they come and get the decoded ones; :meth:`close` at the end of the body.

    Bounds: at most ``max_piece_bytes`` out of one :meth:`feed`, ``max_total_bytes`` (None: no
    bound) out of all of them, and no more than ``max_ratio`` times the input consumed once
    ``ratio_floor_bytes`` are out. Passing one raises :class:`DecompressionLimitError`."""

    __slots__ = (
        "_backend",
        "_errors",
        "coding",
        "consumed_bytes",
        "max_piece_bytes",
        "max_ratio",
        "max_total_bytes",
        "produced_bytes",
        "ratio_floor_bytes",
    )

    def __init__(
        self,
        coding: str,
        *,
        max_piece_bytes: int,
        max_total_bytes: int | None = None,
        max_ratio: float = DEFAULT_MAX_RATIO,
        ratio_floor_bytes: int = DEFAULT_RATIO_FLOOR_BYTES,
    ) -> None:
        coding = _coding_name(coding)
        self.coding = coding
        self.max_piece_bytes = max_piece_bytes
        self.max_total_bytes = max_total_bytes
        self.max_ratio = max_ratio
        self.ratio_floor_bytes = ratio_floor_bytes
        self.consumed_bytes = 0
        self.produced_bytes = 0
        backend: _Backend
        if coding in ("gzip", "deflate"):
            backend = _Inflater(gzip=coding == "gzip")
        elif coding == "br":
            backend = _BrotliDecoder()
        elif coding == "zstd":
            backend = _ZstdDecoder()
        else:
            raise ContentEncodingError(
                f"content coding {coding!r} is not one of {', '.join(DECODABLE)}"
            )
        self._backend = backend
        self._errors = _library_errors()

    def _allowance(self, piece_bytes: int) -> int:
        """Bytes that may still come out before a bound is passed."""
        left = self.max_piece_bytes - piece_bytes
        if self.max_total_bytes is not None:
            left = min(left, self.max_total_bytes - self.produced_bytes)
        by_ratio = max(self.ratio_floor_bytes, int(self.max_ratio * self.consumed_bytes))
        return max(min(left, by_ratio - self.produced_bytes), 0)

    def _check(self, piece_bytes: int) -> None:
        if piece_bytes > self.max_piece_bytes:
            raise DecompressionLimitError(
                f"{self.coding}: one piece decodes to more than {self.max_piece_bytes} bytes"
            )
        if self.max_total_bytes is not None and self.produced_bytes > self.max_total_bytes:
            raise DecompressionLimitError(
                f"{self.coding}: the body decodes to more than {self.max_total_bytes} bytes"
            )
        produced = self.produced_bytes
        if produced > self.ratio_floor_bytes and produced > self.max_ratio * self.consumed_bytes:
            raise DecompressionLimitError(
                f"{self.coding}: {self.consumed_bytes} bytes decoded to {produced}, more than "
                f"{self.max_ratio:g} to 1: a decompression bomb"
            )

    def feed(self, data: bytes) -> bytes:
        """The decoded bytes of ``data`` (b"" until some are whole)."""
        backend = self._backend
        out: list[bytes] = []
        piece_bytes = 0
        stalled = 0
        try:
            while data or backend.pending():
                before = len(data)
                # one byte over what is allowed: its arrival proves the bound passed
                decoded, data = backend.step(data, self._allowance(piece_bytes) + 1)
                self.consumed_bytes += before - len(data)
                if decoded:
                    out.append(decoded)
                    piece_bytes += len(decoded)
                    self.produced_bytes += len(decoded)
                    self._check(piece_bytes)
                # a step may only change state (brotli's drain ending); two in a row that
                # neither take input nor give output would never end
                stalled = stalled + 1 if before and before == len(data) and not decoded else 0
                if stalled > 1:
                    raise ContentEncodingError(f"{self.coding}: the decoder stopped moving")
        except self._errors as exc:
            raise ContentEncodingError(f"{self.coding}: corrupt data: {exc}") from exc
        return out[0] if len(out) == 1 else b"".join(out)

    def close(self) -> None:
        """The body ended: its coding must have ended too (an empty body is let through)."""
        backend = self._backend
        if backend.started and not backend.ended:
            raise ContentEncodingError(f"{self.coding}: the body ended inside the compressed data")
