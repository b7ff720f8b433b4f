"""Coverage-guided fuzzing of every codec's decoders with atheris (libFuzzer).

    .venv/bin/python tests/codecs/fuzz/fuzz_codecs.py [CORPUS_DIR ...] [-atheris_runs=N] \
        [libFuzzer flags]

One entry point for every codec: the first input byte picks the codec (the delta codec twice:
its C extension and its pure-Python path), the second the type to decode into and whether the
rest goes to ``decode`` (below 0xC0) or through a stream decoder (0xC0 and up: the third byte
says where to split the bytes in two feeds, then ``close()``). A value of the requested type
or a ``DecodeError`` may come back; anything else escapes, and libFuzzer reports it as a crash
with the input that caused it. A hang is caught by libFuzzer's ``-timeout`` (seconds a run).

The seed corpus is real encodings of every workload (arrays cropped, streams cut to their last
chunks, so that seeds stay under ``-max_len``), prefixed to say which codec and type they are,
written to the first corpus directory given (created if missing; a fresh temporary one if
none: libFuzzer exits the process, so it cannot be removed here).

The codec modules are imported under ``atheris.instrument_imports``: their Python code is
instrumented for coverage (the libraries they call, C extensions included, are not).
tests/codecs/test_atheris.py runs this for a bounded number of runs.
"""

from __future__ import annotations

import hashlib
import sys
import tempfile
from pathlib import Path
from typing import Any

import atheris  # type: ignore[import-untyped]

with atheris.instrument_imports(include=["inferwire.codecs"]):
    import inferwire.codecs as ic
    from inferwire.codecs.delta_codec import DeltaCodec

    # the codec modules load lazily, on first use: load them here, instrumented
    CODECS: list[tuple[str, ic.Codec]] = [
        (name, ic.get(name, extensions=True)) for name in ic.names()
    ]
    CODECS.append(("delta-pure", DeltaCodec(pure_python=True)))

# after the codecs, which it imports: imported first, they would not be instrumented
from inferwire import workloads
from inferwire.workloads import hostile

STREAM = 0xC0
MAX_LEN = 4096
TYPES = {label: sorted(codec.types, key=lambda t: t.__name__) for label, codec in CODECS}


def _read_through(value: Any) -> Any:
    """A zero-copy view materialized: a fault in its bytes surfaces on access."""
    return value.materialize() if hasattr(value, "materialize") else value


def _check(value: Any, type_: type[Any], label: str) -> None:
    if not isinstance(value, type_):
        raise AssertionError(f"{label}: asked for {type_.__name__}, got {type(value).__name__}")


def test_one_input(data: bytes) -> None:
    if len(data) < 3:
        return
    label, codec = CODECS[data[0] % len(CODECS)]
    types = TYPES[label]
    type_ = types[(data[1] & 0x3F) % len(types)]
    values: list[Any] = []
    try:
        if data[1] >= STREAM:
            payload = data[3:]
            split = len(payload) * data[2] // 256
            decoder = codec.stream_decoder(type_)
            for piece in (payload[:split], payload[split:]):
                values += [_read_through(chunk) for chunk in decoder.feed(piece)]
            decoder.close()
        else:
            values.append(_read_through(codec.decode(data[2:], type_)))
    except ic.DecodeError:
        pass
    for value in values:
        _check(value, type_, label)


def seeds() -> list[bytes]:
    """Every codec's encodings of every workload it carries, unary and streamed."""
    out: list[bytes] = []
    for index, (label, codec) in enumerate(CODECS):
        for workload in workloads.names():
            messages = [hostile.cropped(m, side=2) for m in workloads.get(workload).messages()]
            type_ = type(messages[0])
            if type_ not in codec.types:
                continue
            kind = TYPES[label].index(type_)
            ends = {id(m): m for m in (messages[0], messages[-1])}.values()
            out.extend(bytes([index, kind]) + codec.encode(message) for message in ends)
            encoder = codec.stream_encoder()
            stream = b"".join([*(encoder.encode(m) for m in messages[-4:]), encoder.end()])
            out.append(bytes([index, STREAM | kind, 128]) + stream)
    return [seed for seed in out if len(seed) <= MAX_LEN]


def main(argv: list[str]) -> None:
    corpus_dirs = [arg for arg in argv[1:] if not arg.startswith("-")]
    if corpus_dirs:
        corpus = Path(corpus_dirs[0])
        corpus.mkdir(parents=True, exist_ok=True)
    else:
        corpus = Path(tempfile.mkdtemp(prefix="fuzz-codecs-"))
        print(f"seed corpus in {corpus}", file=sys.stderr)
        argv = [argv[0], str(corpus), *argv[1:]]
    for seed in seeds():
        (corpus / hashlib.sha1(seed).hexdigest()).write_bytes(seed)
    if not any(arg.startswith("-max_len=") for arg in argv):
        argv.append(f"-max_len={MAX_LEN}")
    atheris.Setup(argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
