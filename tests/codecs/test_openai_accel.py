"""The OpenAI chunk mapping's C extension (codecs/_openai_accel.c) against its Python reference.

Every property is differential: the compiled ``chunk_to_obj`` gives the reference's dict (the
same keys in the same order, the same values of the same types) or raises the reference's
error; the compiled ``chunk_from_obj`` gives the reference's chunk or raises the same
exception, with the same message, for any object at all, well formed or hostile. The dict
codecs write the same bytes and read the same chunks with the extension and without.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import math
import os
import struct
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import inferwire.codecs as ic
from inferwire import workloads
from inferwire.codecs import openai as oa
from tests.codecs.accel_helpers import CHUNK_CLASSES_IT_CANNOT_FILL, run_child
from tests.codecs.test_codecs import any_float, encode_stream, float_bits, token_chunks

ACCEL: Any = importlib.import_module("inferwire.codecs._openai_accel")
STREAM_WORKLOADS = workloads.names(kind="stream")
SEED = workloads.DEFAULT_SEED
DICT_CODECS = ["json", "orjson", "msgpack"]
OPTIONS = [(binary, extensions) for binary in (False, True) for extensions in (True, False)]


def configure() -> None:
    ACCEL.configure(
        ic.TokenChunk,
        ic.TokenLogprob,
        ic.TopLogprob,
        ic.Usage,
        oa.chunk_to_obj_reference,
        oa.chunk_from_obj_reference,
        oa._float,
    )


@pytest.fixture(autouse=True, scope="module")
def _extension_configured() -> None:
    """The extension bound even under INFERWIRE_PURE_PYTHON: these tests compare it."""
    configure()


def chunks_of(workload: str) -> list[ic.TokenChunk]:
    return [m for m in workloads.get(workload).messages(SEED) if isinstance(m, ic.TokenChunk)]


def layout(value: Any) -> Any:
    """``value`` with its types, its dicts' key order and its floats' bits spelled out: two
    layouts are equal only if the JSON and MessagePack bytes of the values are."""
    if type(value) is dict:
        return ("dict", [(key, layout(item)) for key, item in value.items()])
    if type(value) in (list, tuple):
        return (type(value).__name__, [layout(item) for item in value])
    if isinstance(value, float):
        return (type(value).__name__, struct.pack("<d", value))
    return (type(value).__name__, value)


def outcome(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """What a call gives: its result's layout, or its exception's type and message."""
    try:
        result = function(*args, **kwargs)
    except Exception as exc:  # the exception is the outcome compared
        return ("raises", type(exc), str(exc))
    if isinstance(result, ic.TokenChunk):
        return ("chunk", result, [layout(f) for f in dataclasses.astuple(result)])
    return ("returns", layout(result))


def check_to_obj(chunk: Any, **options: Any) -> None:
    assert outcome(ACCEL.chunk_to_obj, chunk, **options) == outcome(
        oa.chunk_to_obj_reference, chunk, **options
    )


def check_from_obj(obj: Any, *args: Any, **kwargs: Any) -> None:
    assert outcome(ACCEL.chunk_from_obj, obj, *args, **kwargs) == outcome(
        oa.chunk_from_obj_reference, obj, *args, **kwargs
    )


# -- the extension is there ---------------------------------------------------------------------


def test_the_extension_is_built_and_used_by_default() -> None:
    """CI runs the tests on a fresh install: this proves the extension was compiled."""
    assert ACCEL.API_VERSION == oa._ACCEL_API_VERSION
    assert ACCEL.__file__.endswith((".so", ".pyd"))
    if os.environ.get("INFERWIRE_PURE_PYTHON", "") in ("", "0"):
        assert oa.accelerated()
        assert oa.chunk_to_obj is ACCEL.chunk_to_obj
        assert oa.chunk_from_obj is ACCEL.chunk_from_obj
        assert oa._load_accelerator() is ACCEL


@pytest.mark.parametrize("arguments", CHUNK_CLASSES_IT_CANNOT_FILL)
def test_configure_refuses_classes_it_cannot_fill(arguments: tuple[Any, ...]) -> None:
    chunk = chunks_of("stream-16")[0]
    try:
        with pytest.raises((TypeError, AttributeError)):
            ACCEL.configure(
                *arguments, oa.chunk_to_obj_reference, oa.chunk_from_obj_reference, oa._float
            )
        # and the module is left unusable until configured again, not half-bound
        with pytest.raises(RuntimeError):
            ACCEL.chunk_to_obj(chunk)
        with pytest.raises(RuntimeError):
            ACCEL.chunk_from_obj({})
    finally:
        configure()
    with pytest.raises(TypeError):
        ACCEL.configure(ic.TokenChunk, ic.TokenLogprob, ic.TopLogprob, ic.Usage, None, None, None)
    configure()
    assert ACCEL.chunk_to_obj(chunk) == oa.chunk_to_obj_reference(chunk)


# -- chunk_to_obj: the reference's dict -----------------------------------------------------------


@pytest.mark.parametrize("workload", STREAM_WORKLOADS)
@pytest.mark.parametrize(("binary", "extensions"), OPTIONS)
def test_every_workload_chunk_maps_to_the_references_dict(
    workload: str, binary: bool, extensions: bool
) -> None:
    for chunk in chunks_of(workload):
        got = ACCEL.chunk_to_obj(chunk, binary=binary, extensions=extensions)
        want = oa.chunk_to_obj_reference(chunk, binary=binary, extensions=extensions)
        assert got == want
        assert layout(got) == layout(want)


@pytest.mark.parametrize("workload", STREAM_WORKLOADS)
def test_every_workload_chunk_is_read_back_from_the_references_dict(workload: str) -> None:
    for chunk in chunks_of(workload):
        obj = oa.chunk_to_obj_reference(chunk)
        got = ACCEL.chunk_from_obj(obj)
        assert got == chunk
        assert type(got) is ic.TokenChunk
        check_from_obj(obj)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chunk=token_chunks(any_float), options=st.sampled_from(OPTIONS))
def test_any_chunk_maps_like_the_reference(
    chunk: ic.TokenChunk, options: tuple[bool, bool]
) -> None:
    """Non-finite logprobs included: JSON's EncodeError, MessagePack's exact bits."""
    binary, extensions = options
    check_to_obj(chunk, binary=binary, extensions=extensions)
    if binary or all(math.isfinite(value) for value in logprob_values(chunk)):
        obj = oa.chunk_to_obj_reference(chunk, binary=binary)
        got = ACCEL.chunk_from_obj(obj)
        assert got == chunk or any(math.isnan(v) for v in logprob_values(chunk))
        assert float_bits(got) == float_bits(chunk)
        check_from_obj(obj)


def logprob_values(chunk: ic.TokenChunk) -> Iterator[float]:
    for lp in chunk.logprobs or ():
        yield lp.logprob
        yield from (t.logprob for t in lp.top)


def chunk_with(logprob: Any = -0.25, alternative: Any = -1.5, token: Any = "tok") -> ic.TokenChunk:
    top = (ic.TopLogprob(token="alt", logprob=alternative),)
    return ic.TokenChunk(
        id="chatcmpl-1",
        model="m",
        created=1732924800,
        index=0,
        seq=0,
        token_ids=(7, 8),
        text="hi",
        logprobs=(ic.TokenLogprob(token=token, logprob=logprob, top=top),),
        finish_reason="stop",
        usage=ic.Usage(prompt_tokens=3, completion_tokens=2),
    )


@pytest.mark.parametrize("value", [math.nan, -math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("where", ["logprob", "alternative"])
def test_a_non_finite_logprob_is_the_references_encode_error(value: float, where: str) -> None:
    chunk = chunk_with(**{where: value})
    with pytest.raises(ic.EncodeError, match="non-finite float") as raised:
        ACCEL.chunk_to_obj(chunk)
    with pytest.raises(ic.EncodeError) as expected:
        oa.chunk_to_obj_reference(chunk)
    assert str(raised.value) == str(expected.value)
    # MessagePack carries it, bit for bit: the same float object
    obj = ACCEL.chunk_to_obj(chunk, binary=True)
    entry = obj["choices"][0]["logprobs"]["content"][0]
    carried = entry["logprob"] if where == "logprob" else entry["top_logprobs"][0]["logprob"]
    assert carried is value
    check_to_obj(chunk, binary=True)


class Half(float):
    pass


class Text(str):
    pass


def replaced(**fields: Any) -> Any:
    return dataclasses.replace(chunk_with(), **fields)


UNEXPECTED: dict[str, Any] = {
    "int logprob": chunk_with(logprob=1),  # _finite passes it through
    "huge int logprob": chunk_with(logprob=2**2000),  # math.isfinite's OverflowError
    "float subclass logprob": chunk_with(logprob=Half(0.5)),
    "None logprob": chunk_with(logprob=None),
    "lone surrogate": chunk_with(token="\ud800"),  # str.encode's error
    "str subclass token": chunk_with(token=Text("t")),
    "bytes token": chunk_with(token=b"t"),
    "None token": chunk_with(token=None),
    "list token_ids": replaced(token_ids=[1, 2]),
    "None token_ids": replaced(token_ids=None),
    "bool seq": replaced(seq=True),
    "float seq": replaced(seq=0.0),
    "huge seq": replaced(seq=2**80),
    "negative seq": replaced(seq=-1),
    "int text": replaced(text=5),
    "None id": replaced(id=None),
    "list logprobs": replaced(logprobs=[]),
    "empty logprobs": replaced(logprobs=()),
    "str in logprobs": replaced(logprobs=("x",)),
    "bool usage": replaced(usage=ic.Usage(prompt_tokens=True, completion_tokens=2)),
    "float usage": replaced(usage=ic.Usage(prompt_tokens=1.5, completion_tokens=2)),  # type: ignore[arg-type]
    "duck usage": replaced(usage=types.SimpleNamespace(prompt_tokens=1, completion_tokens=2)),
    "int usage": replaced(usage=5),
    "duck chunk": types.SimpleNamespace(
        **{f.name: getattr(chunk_with(), f.name) for f in dataclasses.fields(ic.TokenChunk)}
    ),
    "unset slots": object.__new__(ic.TokenChunk),  # AttributeError
    "None": None,
}


@pytest.mark.parametrize("chunk", UNEXPECTED.values(), ids=UNEXPECTED.keys())
@pytest.mark.parametrize(("binary", "extensions"), OPTIONS)
def test_an_unexpected_field_is_the_references_to_map(
    chunk: Any, binary: bool, extensions: bool
) -> None:
    check_to_obj(chunk, binary=binary, extensions=extensions)


def test_a_top_logprob_of_an_unexpected_type_is_the_references_to_map() -> None:
    base = chunk_with()
    for top in [
        (None,),
        [ic.TopLogprob(token="a", logprob=0.0)],
        (ic.TokenLogprob(token="a", logprob=0.0),),
    ]:
        lp = ic.TokenLogprob(token="t", logprob=0.0, top=top)  # type: ignore[arg-type]
        for binary, extensions in OPTIONS:
            check_to_obj(
                dataclasses.replace(base, logprobs=(lp,)), binary=binary, extensions=extensions
            )


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((), {}),
        ((chunk_with(), True), {}),
        ((), {"chunk": chunk_with()}),
        ((chunk_with(),), {"binary": 1}),
        ((chunk_with(),), {"extensions": 0}),
        ((chunk_with(),), {"binary": None, "extensions": "yes"}),
        ((chunk_with(),), {"other": True}),
        ((chunk_with(),), {"binary": True, "extensions": True}),
        ((chunk_with(),), {"extensions": False}),
        ((chunk_with(),), {"".join(["bin", "ary"]): True}),  # a name that is not interned
    ],
)
def test_other_arguments_are_the_references(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    assert outcome(ACCEL.chunk_to_obj, *args, **kwargs) == outcome(
        oa.chunk_to_obj_reference, *args, **kwargs
    )


# -- chunk_from_obj: the reference's chunk or its exception, for any object -----------------------


def base_obj() -> dict[str, Any]:
    """A chunk with every field set: logprobs with alternatives, finish reason, usage."""
    chunk = chunk_with()
    two = dataclasses.replace(
        chunk,
        seq=3,
        logprobs=(*(chunk.logprobs or ()), ic.TokenLogprob(token="é", logprob=-2.0, top=())),
    )
    return oa.chunk_to_obj_reference(two)


def paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every key or index path inside ``value``'s dicts and lists."""
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, item in items:
        yield (*path, key)
        yield from paths(item, (*path, key))


def edited(
    obj: dict[str, Any], path: tuple[Any, ...], edit: Callable[[Any, Any], None]
) -> dict[str, Any]:
    copied = copy.deepcopy(obj)
    parent = copied
    for key in path[:-1]:
        parent = parent[key]
    edit(parent, path[-1])
    return copied


def remove(parent: Any, key: Any) -> None:
    del parent[key]


REPLACEMENTS: list[Any] = [
    None,
    True,
    False,
    0,
    1,
    -1,
    2**70,
    10**400,  # past a double: float()'s OverflowError
    1.5,
    math.nan,
    "",
    "x",
    "chat.completion.chunk",
    b"x",
    [],
    [1],
    [{}],
    {},
    {"content": []},
    (1,),
    Half(0.5),
    Text("x"),
]
OBJ_PATHS = list(paths(base_obj()))


@pytest.mark.parametrize("path", OBJ_PATHS, ids=lambda p: ".".join(map(str, p)))
def test_a_missing_key_is_the_references_error(path: tuple[Any, ...]) -> None:
    obj = edited(base_obj(), path, remove)
    check_from_obj(obj)


@pytest.mark.parametrize("path", OBJ_PATHS, ids=lambda p: ".".join(map(str, p)))
def test_any_value_anywhere_is_read_as_the_reference_reads_it(path: tuple[Any, ...]) -> None:
    """bool where an int is read, int where a float is, a dict in a list, ..."""
    for value in REPLACEMENTS:

        def put(parent: Any, key: Any, value: Any = value) -> None:
            parent[key] = value

        check_from_obj(edited(base_obj(), path, put))


def test_extra_keys_are_ignored_as_the_reference_ignores_them() -> None:
    obj = base_obj()
    dict_paths = [()] + [p for p in OBJ_PATHS if isinstance(lookup(obj, p), dict)]
    for path in dict_paths:
        widened = copy.deepcopy(obj)
        target = lookup(widened, path)
        target["extra"] = {"nested": [1, 2]}
        target[5] = "a key of another type"
        got = ACCEL.chunk_from_obj(widened)
        assert got == oa.chunk_from_obj_reference(widened) == oa.chunk_from_obj_reference(obj)
        check_from_obj(widened)


def lookup(obj: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        obj = obj[key]
    return obj


@pytest.mark.parametrize(
    "obj",
    [
        {**base_obj(), "object": "chat.completion"},  # the DecodeError raised directly
        {**base_obj(), "object": None},
        {**base_obj(), "choices": []},
        {**base_obj(), "choices": base_obj()["choices"] * 2},
        {**base_obj(), "choices": tuple(base_obj()["choices"])},
        {**base_obj(), "usage": None},
        {k: v for k, v in base_obj().items() if k != "usage"},
        {**base_obj(), "usage": {"prompt_tokens": 1, "completion_tokens": 2}},
        {**base_obj(), "usage": {"prompt_tokens": True, "completion_tokens": 2}},
        {**base_obj(), "usage": []},
        {**base_obj(), "seq": 2**100},
        {**base_obj(), "seq": -5},
        {**base_obj(), "created": True},
        types.MappingProxyType(base_obj()),
        type("Sub", (dict,), {})(base_obj()),
        [],
        None,
        "chat.completion.chunk",
        {},
    ],
    ids=lambda o: repr(o)[:60],
)
def test_hostile_objects_are_the_references(obj: Any) -> None:
    check_from_obj(obj)


def test_bools_are_not_integers_and_integers_are_numbers() -> None:
    obj = base_obj()
    choice = obj["choices"][0]
    for target, key in [(choice, "index"), (obj, "created"), (obj, "seq")]:
        for value in (True, False):
            broken = copy.deepcopy(obj)
            (broken if target is obj else broken["choices"][0])[key] = value
            with pytest.raises(TypeError):
                ACCEL.chunk_from_obj(broken)
    broken = copy.deepcopy(obj)
    broken["choices"][0]["token_ids"] = [1, True]
    with pytest.raises(TypeError, match="token_ids"):
        ACCEL.chunk_from_obj(broken)
    # an int logprob reads as a float, as _float reads it; a bool does not
    numbers = copy.deepcopy(obj)
    numbers["choices"][0]["logprobs"]["content"][0]["logprob"] = -3
    numbers["choices"][0]["logprobs"]["content"][0]["top_logprobs"][0]["logprob"] = 2**60 + 1
    got = ACCEL.chunk_from_obj(numbers)
    assert got.logprobs is not None
    assert type(got.logprobs[0].logprob) is float
    assert got.logprobs[0].logprob == -3.0
    assert got.logprobs[0].top[0].logprob == float(2**60 + 1)
    check_from_obj(numbers)
    numbers["choices"][0]["logprobs"]["content"][0]["logprob"] = True
    with pytest.raises(TypeError):
        ACCEL.chunk_from_obj(numbers)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((oa.finite_float,), {}),  # the reference's other number
        ((), {"number": oa.finite_float}),
        ((oa._float,), {}),
        ((), {"number": oa._float}),
        ((), {"position": None}),
        ((), {"position": 0}),  # an OpenAI server's chunk, without the extensions
        ((), {"position": 4}),
        ((oa._float,), {"number": oa._float}),  # twice: the reference's TypeError
        ((oa._float, 1), {}),
        ((), {"other": 1}),
    ],
)
def test_other_arguments_read_as_the_reference_reads(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    plain = oa.chunk_to_obj_reference(chunk_with(), extensions=False)
    for obj in (base_obj(), plain, {**base_obj(), "choices": []}, {**plain, "seq": 1}):
        check_from_obj(obj, *args, **kwargs)
    assert outcome(ACCEL.chunk_from_obj) == outcome(oa.chunk_from_obj_reference)
    assert outcome(ACCEL.chunk_from_obj, obj=base_obj()) == outcome(
        oa.chunk_from_obj_reference, obj=base_obj()
    )


_MUTATING_KEY = """
import sys
from inferwire.codecs import openai as oa
if not oa.accelerated():
    sys.exit("the extension is not in use")

victim = oa.chunk_to_obj_reference(oa.chunk_from_obj_reference(dict(eval(sys.argv[1]))))
choice = victim["choices"][0]
content = choice["logprobs"]["content"]

class Key:
    # in place of the key looked up, with its hash: the lookup calls __eq__, which empties
    # every container read before
    def __init__(self, name):
        self.name = name
    def __hash__(self):
        return hash(self.name)
    def __eq__(self, other):
        victim.clear(); choice.clear(); content.clear()
        return False

target = {"obj": victim, "choice": choice, "entry": content[0]}[sys.argv[2]]
target[Key(sys.argv[3])] = target.pop(sys.argv[3])
try:
    print(oa.chunk_from_obj(victim))
except Exception as exc:
    print(type(exc).__name__)
"""


@pytest.mark.parametrize(
    ("where", "key"),
    [
        ("obj", "choices"),
        ("obj", "usage"),
        ("choice", "logprobs"),
        ("choice", "delta"),
        ("entry", "logprob"),
    ],
)
def test_a_key_whose_comparison_empties_the_dicts_being_read_is_survived(
    where: str, key: str
) -> None:
    """Reading a dict can run Python code (a colliding key's __eq__) that frees what was read
    before: the extension holds what it reads. In a child process: a crash must not be this
    run's."""
    assert run_child("-c", _MUTATING_KEY, repr(base_obj()), where, key).strip()


# -- the codecs: the same bytes, the same chunks ---------------------------------------------------


def codec_pair(
    name: str, extensions: bool, monkeypatch: pytest.MonkeyPatch
) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    """Run ``(compiled, reference)`` of a function of a fresh codec of ``name``: the dict codec
    binds chunk_from_obj when it is made and looks chunk_to_obj up on each encode."""
    cls = type(ic.get(name))
    options = {} if name == "msgpack" else {"extensions": extensions}

    def using(to_obj: Any, from_obj: Any) -> Callable[[Any], Any]:
        def run(work: Callable[[ic.Codec], Any]) -> Any:
            with monkeypatch.context() as patch:
                patch.setattr(oa, "chunk_to_obj", to_obj)
                patch.setattr(oa, "chunk_from_obj", from_obj)
                return work(cls(**options))

        return run

    return (
        using(ACCEL.chunk_to_obj, ACCEL.chunk_from_obj),
        using(oa.chunk_to_obj_reference, oa.chunk_from_obj_reference),
    )


CODEC_CASES = [
    pytest.param(name, extensions, id=f"{name}-{'ext' if extensions else 'plain'}")
    for name in DICT_CODECS
    for extensions in ((True,) if name == "msgpack" else (True, False))
]


@pytest.mark.parametrize(("name", "extensions"), CODEC_CASES)
@pytest.mark.parametrize("workload", STREAM_WORKLOADS)
def test_the_codecs_write_and_read_the_same_with_and_without_the_extension(
    name: str, extensions: bool, workload: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    chunks = chunks_of(workload)
    compiled, reference = codec_pair(name, extensions, monkeypatch)

    def work(codec: ic.Codec) -> Any:
        frames = encode_stream(codec, chunks)
        unary = [codec.encode(chunk) for chunk in chunks]
        decoder = codec.stream_decoder(ic.TokenChunk)
        decoded = list(decoder.feed(b"".join(frames)))
        decoder.close()
        return frames, unary, decoded, [codec.decode(data, ic.TokenChunk) for data in unary]

    got = compiled(work)
    assert got == reference(work)
    if extensions:
        assert got[2] == got[3] == chunks


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(chunk=token_chunks(any_float))
def test_msgpack_carries_any_chunk_the_same_with_the_extension(
    chunk: ic.TokenChunk, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NaN and infinities included, bit for bit."""
    compiled, reference = codec_pair("msgpack", True, monkeypatch)

    def work(codec: ic.Codec) -> Any:
        data = codec.encode(chunk)
        return data, float_bits(codec.decode(data, ic.TokenChunk))

    assert compiled(work) == reference(work)
    assert compiled(work)[1] == float_bits(chunk)


@pytest.mark.parametrize("name", ["json", "orjson"])
def test_json_codecs_refuse_a_non_finite_logprob_the_same_with_the_extension(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled, reference = codec_pair(name, True, monkeypatch)

    def work(codec: ic.Codec) -> Any:
        return outcome(codec.encode, chunk_with(alternative=math.inf))

    got = compiled(work)
    assert got[:2] == ("raises", ic.EncodeError)
    assert got == reference(work)
