"""The pre-parse limits (codecs/scan.py) in C (codecs/_scan.c) and in pure Python.

Every test runs on both implementations. Valid input is checked against the truth computed from
the object that was encoded: the scan passes at exactly its depth and element count, and one
below either raises. Arbitrary bytes are differential: both implementations return None, or
both raise the same one of the two errors, and nothing else.
"""

from __future__ import annotations

import array
import importlib
import importlib.util
import json
import shlex
import subprocess
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import msgspec
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferwire.codecs import scan
from inferwire.codecs.errors import DepthLimitError, ElementBudgetError
from tests.codecs.accel_helpers import peak_memory

C_SCAN: Any = importlib.import_module("inferwire.codecs._scan")
C_SCAN.configure(DepthLimitError, ElementBudgetError)  # also under INFERWIRE_PURE_PYTHON
IMPLS = pytest.mark.parametrize("impl", [C_SCAN, scan._py_impl], ids=["c", "python"])
MiB = 1024 * 1024
BIG = 2**40  # a limit no test input reaches

Check = Callable[[Any, int, int], None]
Outcome = type[Exception] | None


def outcome(check: Check, data: Any, max_depth: int, max_elements: int) -> Outcome:
    try:
        check(data, max_depth, max_elements)
    except (DepthLimitError, ElementBudgetError) as exc:
        return type(exc)
    return None


def depth_of(value: Any) -> int:
    if isinstance(value, list):  # not tuple: msgpack.ExtType is one
        return 1 + max(map(depth_of, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth_of, value.values()), default=0)
    return 0


def count_of(value: Any) -> int:
    if isinstance(value, list):
        return 1 + sum(map(count_of, value))
    if isinstance(value, dict):
        return 1 + sum(1 + count_of(item) for item in value.values())
    return 1


def assert_exact(check: Check, data: Any, depth: int, count: int) -> None:
    """The scan passes at exactly (depth, count), and refuses one less of either."""
    for max_depth in (max(depth, 1), BIG):
        assert outcome(check, data, max_depth, count) is None
        assert outcome(check, data, max_depth, BIG) is None
        assert outcome(check, data, max_depth, count - 1) is ElementBudgetError
    if depth > 1:
        assert outcome(check, data, depth - 1, BIG) is DepthLimitError
        assert outcome(check, data, depth - 1, count) is DepthLimitError


# -- the extension is there ---------------------------------------------------------------------


def test_the_extension_is_built_and_used_by_default() -> None:
    assert C_SCAN.API_VERSION == scan._ACCEL_API_VERSION
    assert C_SCAN.__file__.endswith((".so", ".pyd"))


# -- arguments ------------------------------------------------------------------------------------


@IMPLS
@pytest.mark.parametrize("fmt", ["json", "msgpack"])
def test_arguments(impl: Any, fmt: str) -> None:
    check = getattr(impl, f"check_{fmt}")
    with pytest.raises(ValueError, match="max_depth"):
        check(b"", 0, 10)
    with pytest.raises(ValueError, match="max_elements"):
        check(b"", 1, -1)
    with pytest.raises(TypeError):
        check(b"", 1.0, 10)
    with pytest.raises(TypeError):
        check("[]", 1, 10)
    with pytest.raises(BufferError):
        check(memoryview(b"[[]]")[::2], 1, 10)
    check(b"", 1, 0)  # nothing: no element
    check(b"\x90" if fmt == "msgpack" else b"[]", 2**100, 2**100)


@IMPLS
def test_any_contiguous_buffer(impl: Any) -> None:
    for data in (bytearray(b"[[]]"), memoryview(b"[[]]"), array.array("B", b"[[]]")):
        assert outcome(impl.check_json, data, 1, 10) is DepthLimitError
    # only the view's bytes are read, not the buffer behind it
    assert outcome(impl.check_json, memoryview(b"[[[[")[:1], 1, 10) is None
    assert outcome(impl.check_msgpack, memoryview(b"\x91\x91\x90")[:1], 1, 10) is None


@IMPLS
def test_the_buffer_is_released(impl: Any) -> None:
    """A bytearray with an export left cannot grow: each path must release it."""
    for check, data in ((impl.check_json, b"[[[ 1"), (impl.check_msgpack, b"\x91\x91\x91\x01")):
        buffer = bytearray(data)
        for max_depth, max_elements in ((1, 10), (10, 1), (10, 10)):
            outcome(check, buffer, max_depth, max_elements)
            buffer.append(0x20)
            buffer.pop()


# -- JSON -----------------------------------------------------------------------------------------

JSON_CASES = [
    # text, depth, count
    ("[]", 1, 1),
    ("{}", 1, 1),
    ("[[]]", 2, 2),
    ('{"a":[1]}', 2, 4),
    ("[1,2]", 1, 3),
    ('{"a":1}', 1, 3),
    ("1", 0, 1),
    ('"["', 0, 1),
    ("true", 0, 1),
    ("[[],[],{}]", 2, 4),
    ('{"a":{},"b":[]}', 2, 5),
    ('[[[{"a":[[]]}]]]', 6, 7),
    ("[-1.5e+300,0,true,false,null]", 1, 6),
    (' \n\t[ 1 , { "a" : [ ] } ] \r\n', 3, 5),
    # brackets, commas, colons and escaped quotes inside strings
    ('["[[[[", "]]]]", "{,:}", "\\"[", "\\\\", "\\\\\\"]"]', 1, 7),
    ('{"\\"[{": "\\\\", "k\\\\\\\\": "]"}', 1, 5),
    ('["\\u005b", "é[ü"]', 1, 3),
]


@IMPLS
@pytest.mark.parametrize(("text", "depth", "count"), JSON_CASES)
def test_json_exact(impl: Any, text: str, depth: int, count: int) -> None:
    assert (depth_of(json.loads(text)), count_of(json.loads(text))) == (depth, count)
    assert_exact(impl.check_json, text.encode(), depth, count)


@IMPLS
@pytest.mark.parametrize("depth", [1, 2, 3, 63, 64, 65, 100, 5000])
def test_json_deep(impl: Any, depth: int) -> None:
    assert_exact(impl.check_json, b"[" * depth + b"]" * depth, depth, depth)
    assert_exact(impl.check_json, b'{"a":' * depth + b"0" + b"}" * depth, depth, 2 * depth + 1)
    mixed = b'[{"k":' * depth + b"[]" + b"}]" * depth
    assert_exact(impl.check_json, mixed, 2 * depth + 1, 3 * depth + 1)


@IMPLS
@pytest.mark.parametrize("pad", range(0, 140, 3))
def test_json_across_block_boundaries(impl: Any, pad: int) -> None:
    """The C scan takes 64 bytes at a time: every token is moved across a boundary."""
    value = [1234567, 'a"b\\', {"k": [True, "x" * 70]}, -0.5, "[" * 40, [[{}]], "", "é" * 20]
    for text in (json.dumps(value), json.dumps(value, ensure_ascii=False, indent=1)):
        data = b" " * pad + text.encode()
        assert_exact(impl.check_json, data, depth_of(value), count_of(value))
        cut = data[: len(data) - 1 - pad % 40]  # invalid: both scans must still agree
        assert_agree("check_json", cut, (3, count_of(value) - 2))


@IMPLS
def test_json_invalid_bytes_only_stop(impl: Any) -> None:
    for text in (b'["abc', b'["abc\\"]', b'"\\', b"]]]]", b"[}", b"\xff\x00[", b"[1 2 3]"):
        assert outcome(impl.check_json, text, 2, 10) is None


@IMPLS
def test_json_stops_at_the_first_limit(impl: Any) -> None:
    """64 MiB of '[' is refused after the first few (no timing here: the tests assert
    behaviour; a scan that read on would show as a slow test, not a failed one)."""
    deep = b"[" * (64 * MiB)
    assert outcome(impl.check_json, deep, 1000, BIG) is DepthLimitError
    assert outcome(impl.check_json, deep, BIG, 1000) is ElementBudgetError


@IMPLS
def test_json_trailing_separators_are_one_token(impl: Any) -> None:
    """A megabyte of whitespace, commas or colons after the value is skipped in one step (the
    Python scan once retried its pattern from each byte of such a run: 25 minutes a MiB)."""
    for run in (b" ", b",", b":", b"\r\n"):
        assert outcome(impl.check_json, b"{}" + run * MiB, 64, 10) is None
        assert outcome(impl.check_json, b"[1" + run * MiB + b"]", 64, 10) is None


# -- MessagePack ----------------------------------------------------------------------------------

MSGPACK_VALUES: list[Any] = [
    [],
    {},
    [[]],
    {"a": [1]},
    [1, 2],
    {"a": 1},
    None,
    [None, True, False, 0, 127, -1, -32, 128, -33, 2**16, -(2**16), 2**32, -(2**32)],
    [2**64 - 1, -(2**63), 1.5, "", "a" * 31, b"", b"x"],
    list(range(15)),
    list(range(16)),  # array 16
    list(range(70_000)),  # array 32
    {str(i): i for i in range(15)},
    {str(i): [] for i in range(16)},  # map 16
    {str(i): {} for i in range(70_000)},  # map 32
    ["a" * 32, "a" * 255, "a" * 256, "a" * 70_000],  # str 8/16/32
    [b"a" * 255, b"a" * 256, b"a" * 70_000],  # bin 8/16/32
    [msgpack.ExtType(1, b"a" * n) for n in (1, 2, 4, 8, 16, 3, 17, 255, 256, 70_000)],
    [[[{"a": [[], {}, {"b": [1, [2, {"c": None}]]}]}]]],
]


@IMPLS
@pytest.mark.parametrize("value", MSGPACK_VALUES, ids=range(len(MSGPACK_VALUES)))
def test_msgpack_exact(impl: Any, value: Any) -> None:
    depth, count = depth_of(value), count_of(value)
    assert_exact(impl.check_msgpack, msgpack.packb(value), depth, count)
    single = msgpack.packb(value, use_single_float=True)  # float 32
    assert_exact(impl.check_msgpack, single, depth, count)
    if isinstance(value, list):
        value = [msgspec.msgpack.Ext(*v) if isinstance(v, msgpack.ExtType) else v for v in value]
    assert_exact(impl.check_msgpack, msgspec.msgpack.encode(value), depth, count)


@IMPLS
@pytest.mark.parametrize("depth", [1, 2, 3, 63, 64, 65, 100, 5000])
def test_msgpack_deep(impl: Any, depth: int) -> None:
    """Deeper than the C stack's fixed part (64): it grows, and still answers exactly."""
    assert_exact(impl.check_msgpack, b"\x91" * (depth - 1) + b"\x90", depth, depth)
    assert_exact(impl.check_msgpack, b"\x81\xa1a" * depth + b"\x00", depth, 2 * depth + 1)
    mixed = b"\x92\x81\xa1k" * depth + b"\x80" + b"\x01" * depth
    assert_exact(impl.check_msgpack, mixed, 2 * depth + 1, 4 * depth + 1)


@IMPLS
def test_msgpack_stops_after_the_first_object(impl: Any) -> None:
    assert outcome(impl.check_msgpack, b"\x90" + b"\x91" * 100, 1, 1) is None
    assert outcome(impl.check_msgpack, b"\x01\xdd\xff\xff\xff\xff", 1, 1) is None
    assert outcome(impl.check_msgpack, b"\xc1\x91\x91\x91", 1, 1) is None  # never used: stop


@IMPLS
@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"\xdd\xff\xff\xff\xff", ElementBudgetError),  # array 32 of 2**32 - 1
        (b"\xdf\xff\xff\xff\xff", ElementBudgetError),  # map 32 of 2**32 - 1 pairs
        (b"\x91" * 10 + b"\xdd\xff\xff\xff\xff", ElementBudgetError),
        (b"\xdc\xff\xff" + b"\x80" * MiB, ElementBudgetError),  # 1 MiB of empty maps
        (b"\xdd\x00\x10\x00\x00" + b"\x80" * MiB, ElementBudgetError),
        (b"\xdb\xff\xff\xff\xffabc", None),  # str 32 of 4 GiB: past the end
        (b"\xc6\xff\xff\xff\xffabc", None),  # bin 32
        (b"\xc9\xff\xff\xff\xff\x01abc", None),  # ext 32
        (b"\x92\xdb\xff\xff\xff\xff", None),
        (b"\xdd\xff\xff\xff", None),  # a cut count
    ],
)
def test_msgpack_lying_headers(impl: Any, data: bytes, expected: Outcome) -> None:
    """Refused (or passed to the parser) from the header alone: no time, no memory."""
    with peak_memory(MiB):
        assert outcome(impl.check_msgpack, data, 100, 10_000) is expected


@IMPLS
def test_msgpack_stops_at_the_first_limit(impl: Any) -> None:
    deep = b"\x91" * (64 * MiB)
    assert outcome(impl.check_msgpack, deep, 1000, BIG) is DepthLimitError
    assert outcome(impl.check_msgpack, deep, BIG, 1000) is ElementBudgetError


@IMPLS
def test_msgpack_truncated_only_stops(impl: Any) -> None:
    data = msgpack.packb([v for v in MSGPACK_VALUES if len(msgpack.packb(v)) < 2000])
    for cut in range(len(data)):
        assert outcome(impl.check_msgpack, data[:cut], BIG, BIG) is None


# -- properties -----------------------------------------------------------------------------------

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.text(alphabet=st.characters(codec="utf-8"))
    | st.text(alphabet='[]{}",:\\ ')
)
JSON_VALUES = st.recursive(
    SCALARS | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: (
        st.lists(children, max_size=6)
        | st.dictionaries(st.text(alphabet='ab[]{}",:\\ é'), children, max_size=6)
    ),
    max_leaves=40,
)
MSGPACK_SCALARS = (
    SCALARS
    | st.floats(width=32)  # also as float 32 (use_single_float)
    | st.binary(max_size=300)
    | st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=20))
)
MSGPACK_VALUES_ST = st.recursive(
    MSGPACK_SCALARS,
    lambda children: (
        st.lists(children, max_size=20)
        | st.dictionaries(st.text(max_size=3), children, max_size=18)
    ),
    max_leaves=60,
)
JSON_ENCODERS: list[Callable[[Any], bytes]] = [
    lambda v: json.dumps(v).encode(),
    lambda v: json.dumps(v, indent=2, ensure_ascii=False).encode(),
    orjson.dumps,
    msgspec.json.encode,
]


@IMPLS
@settings(deadline=None, max_examples=150)
@given(value=JSON_VALUES, encoder=st.sampled_from(JSON_ENCODERS))
def test_json_matches_the_object(impl: Any, value: Any, encoder: Callable[[Any], bytes]) -> None:
    assert_exact(impl.check_json, encoder(value), depth_of(value), count_of(value))


@IMPLS
@settings(deadline=None, max_examples=150)
@given(value=MSGPACK_VALUES_ST, use_single_float=st.booleans())
def test_msgpack_matches_the_object(impl: Any, value: Any, use_single_float: bool) -> None:
    data = msgpack.packb(value, use_single_float=use_single_float)
    assert_exact(impl.check_msgpack, data, depth_of(value), count_of(value))


LIMITS = st.tuples(st.integers(1, 12), st.integers(0, 60)) | st.just((BIG, BIG))
JSON_BYTES = (
    st.binary()
    | st.text(alphabet='[]{}",:\\ a1\n', max_size=300).map(str.encode)
    | st.text(alphabet='[]{}",: a1\n', min_size=60, max_size=300).map(str.encode)  # no escape
)
MSGPACK_BYTE = st.integers(0, 255) | st.sampled_from(
    b"\x80\x81\x8f\x90\x91\x9f\xa1\xc1\xc4\xc7\xd4\xd8\xd9\xdb\xdc\xdd\xde\xdf\x00\x01\xff"
)
MSGPACK_BYTES = st.binary() | st.lists(MSGPACK_BYTE, max_size=200).map(bytes)


def assert_agree(name: str, data: bytes, limits: tuple[int, int]) -> None:
    """Same answer from both, and only ever one of the two errors."""
    answers = [outcome(getattr(impl, name), data, *limits) for impl in (C_SCAN, scan._py_impl)]
    assert answers[0] == answers[1]


# 400 examples each (1,000 took 45 s of the test command): the same two implementations are
# also compared on prefixes of valid input and in the byte-loop build below, and the codecs'
# decoders are fuzzed with coverage guidance in test_atheris
@settings(deadline=None, max_examples=400)
@given(data=JSON_BYTES, limits=LIMITS)
def test_json_any_bytes(data: bytes, limits: tuple[int, int]) -> None:
    assert_agree("check_json", data, limits)


@settings(deadline=None, max_examples=400)
@given(data=MSGPACK_BYTES, limits=LIMITS)
def test_msgpack_any_bytes(data: bytes, limits: tuple[int, int]) -> None:
    assert_agree("check_msgpack", data, limits)


@settings(deadline=None, max_examples=150)
@given(value=MSGPACK_VALUES_ST, cut=st.integers(0), limits=LIMITS)
def test_any_prefix_of_valid_input(value: Any, cut: int, limits: tuple[int, int]) -> None:
    packed = msgpack.packb(value)
    assert_agree("check_msgpack", packed[: cut % (len(packed) + 1)], limits)
    text = orjson.dumps(value, default=repr)
    assert_agree("check_json", text[: cut % (len(text) + 1)], limits)


@pytest.fixture(scope="module")
def byte_loop_build(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The extension built without its SSE2 path, as it is where there is no SSE2."""
    source = Path(scan.__file__).with_name("_scan.c")
    compiler = sysconfig.get_config_var("CC")
    if not source.exists() or not compiler:
        pytest.skip("needs the C source and a compiler")
    target = tmp_path_factory.mktemp("scan") / f"_scan{sysconfig.get_config_var('EXT_SUFFIX')}"
    include = sysconfig.get_paths()["include"]
    command = [*shlex.split(compiler), "-shared", "-fPIC", "-O2", "-DINFERWIRE_SCAN_NO_SIMD"]
    command += [f"-I{include}", str(source), "-o", str(target)]
    built = subprocess.run(command, capture_output=True, text=True, check=False)
    if built.returncode != 0:
        pytest.skip(f"cannot compile the extension: {built.stderr[-500:]}")
    spec = importlib.util.spec_from_file_location("_scan", target)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.configure(DepthLimitError, ElementBudgetError)
    return module


@settings(deadline=None, max_examples=500)
@given(data=JSON_BYTES | st.builds(orjson.dumps, JSON_VALUES), limits=LIMITS)
def test_the_byte_loop_build_agrees(
    byte_loop_build: Any, data: bytes, limits: tuple[int, int]
) -> None:
    expected = outcome(scan._py_impl.check_json, data, *limits)
    assert outcome(byte_loop_build.check_json, data, *limits) == expected
    assert outcome(C_SCAN.check_json, data, *limits) == expected
