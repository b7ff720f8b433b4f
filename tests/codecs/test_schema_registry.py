"""The schema registry (codecs/schema_registry.py) and the compatibility rules (codecs/compat.py).

Test schemas are FileDescriptorSets built with ``descriptor_pb2``; each is checked to be one
protobuf itself accepts (a descriptor pool builds it) before the registry sees it.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool

import inferwire.codecs as ic
from inferwire.codecs import compat, delta_codec
from inferwire.codecs.errors import CorruptRegistryError, IncompatibleSchemaError, SchemaError
from inferwire.codecs.schema_registry import Compatibility, Schema, SchemaRegistry

F = descriptor_pb2.FieldDescriptorProto
C = Compatibility
PACKAGE = "test.v1"

# -- building schemas ------------------------------------------------------------------------


def field(
    name: str,
    number: int,
    type_: F.Type.ValueType = F.TYPE_INT32,
    *,
    label: F.Label.ValueType = F.LABEL_OPTIONAL,
    type_name: str = "",
) -> descriptor_pb2.FieldDescriptorProto:
    made = F(name=name, number=number, type=type_, label=label)
    if type_name:
        made.type_name = f".{PACKAGE}.{type_name}"
    return made


def base_file() -> descriptor_pb2.FileDescriptorProto:
    """Version 1 of the test schema; each change below edits a copy of it."""
    file = descriptor_pb2.FileDescriptorProto(name="test.proto", package=PACKAGE, syntax="proto3")
    chunk = file.message_type.add(name="Chunk")
    chunk.field.extend(
        [
            field("id", 1, F.TYPE_STRING),
            field("count", 2),
            field("ids", 3, F.TYPE_UINT32, label=F.LABEL_REPEATED),
            field("usage", 4, F.TYPE_MESSAGE, type_name="Usage"),
            field("text", 5, F.TYPE_STRING),
            field("raw", 6, F.TYPE_BYTES),
            field("part", 7, F.TYPE_MESSAGE, type_name="Chunk.Part"),
        ]
    )
    chunk.oneof_decl.add(name="content")
    chunk.field[4].oneof_index = 0
    chunk.field[5].oneof_index = 0
    chunk.reserved_range.add(start=9, end=10)  # a field 9 was removed long ago
    chunk.reserved_name.append("legacy")
    chunk.nested_type.add(name="Part").field.append(field("n", 1))
    file.message_type.add(name="Usage").field.append(field("tokens", 1, F.TYPE_UINT32))
    file.message_type.add(name="Old").field.append(field("x", 1))
    return file


def schema_of(*files: descriptor_pb2.FileDescriptorProto) -> Schema:
    pool = descriptor_pool.DescriptorPool()
    for file in files:
        pool.Add(file)  # raises if protobuf itself would refuse the schema
    return Schema(descriptor_pb2.FileDescriptorSet(file=files).SerializeToString())


def message(file: descriptor_pb2.FileDescriptorProto, path: str) -> descriptor_pb2.DescriptorProto:
    name, _, nested = path.partition(".")
    (found,) = [m for m in file.message_type if m.name == name]
    if nested:
        (found,) = [m for m in found.nested_type if m.name == nested]
    return found


def field_of(
    file: descriptor_pb2.FileDescriptorProto, path: str
) -> descriptor_pb2.FieldDescriptorProto:
    message_path, _, name = path.rpartition(".")
    (found,) = [f for f in message(file, message_path).field if f.name == name]
    return found


def remove_field(file: descriptor_pb2.FileDescriptorProto, path: str, *, reserve: bool) -> None:
    message_path, _, name = path.rpartition(".")
    owner = message(file, message_path)
    (index,) = [i for i, f in enumerate(owner.field) if f.name == name]
    number = owner.field[index].number
    del owner.field[index]
    if reserve:
        owner.reserved_range.add(start=number, end=number + 1)


def edited(change: Callable[[descriptor_pb2.FileDescriptorProto], None]) -> Schema:
    file = base_file()
    change(file)
    return schema_of(file)


BASE = schema_of(base_file())


# -- the changes and what each direction makes of them ----------------------------------------


def _add_field(file: descriptor_pb2.FileDescriptorProto) -> None:
    message(file, "Chunk").field.append(field("note", 8, F.TYPE_STRING))


def _add_message(file: descriptor_pb2.FileDescriptorProto) -> None:
    file.message_type.add(name="Extra").field.append(field("y", 1))


def _proto3_optional(file: descriptor_pb2.FileDescriptorProto) -> None:
    chunk = message(file, "Chunk")
    chunk.oneof_decl.add(name="_count")  # the synthetic oneof protoc writes for `optional`
    count = field_of(file, "Chunk.count")
    count.proto3_optional = True
    count.oneof_index = 1


def _remove_reserving(file: descriptor_pb2.FileDescriptorProto) -> None:
    remove_field(file, "Chunk.count", reserve=True)


def _remove_not_reserving(file: descriptor_pb2.FileDescriptorProto) -> None:
    remove_field(file, "Chunk.count", reserve=False)


def _remove_message(file: descriptor_pb2.FileDescriptorProto) -> None:
    (index,) = [i for i, m in enumerate(file.message_type) if m.name == "Old"]
    del file.message_type[index]


def _retype(file: descriptor_pb2.FileDescriptorProto) -> None:
    field_of(file, "Chunk.count").type = F.TYPE_INT64


def _retype_message(file: descriptor_pb2.FileDescriptorProto) -> None:
    field_of(file, "Chunk.usage").type_name = f".{PACKAGE}.Old"


def _retype_nested(file: descriptor_pb2.FileDescriptorProto) -> None:
    field_of(file, "Chunk.Part.n").type = F.TYPE_STRING


def _rename(file: descriptor_pb2.FileDescriptorProto) -> None:
    field_of(file, "Chunk.count").name = "total"


def _make_repeated(file: descriptor_pb2.FileDescriptorProto) -> None:
    field_of(file, "Chunk.count").label = F.LABEL_REPEATED


def _make_singular(file: descriptor_pb2.FileDescriptorProto) -> None:
    field_of(file, "Chunk.ids").label = F.LABEL_OPTIONAL


def _into_oneof(file: descriptor_pb2.FileDescriptorProto) -> None:
    chunk = message(file, "Chunk")
    (index,) = [i for i, f in enumerate(chunk.field) if f.name == "id"]
    moved = chunk.field[index]
    del chunk.field[index]
    moved.oneof_index = 0
    chunk.field.insert(3, moved)  # a oneof's fields must be consecutive


def _out_of_oneof(file: descriptor_pb2.FileDescriptorProto) -> None:
    field_of(file, "Chunk.raw").ClearField("oneof_index")


def _take_reserved(file: descriptor_pb2.FileDescriptorProto) -> None:
    chunk = message(file, "Chunk")
    del chunk.reserved_range[:]
    chunk.field.append(field("fresh", 9, F.TYPE_STRING))


# name: (change, rules broken when a new reader reads old data (BACKWARD), rules broken when
# an old reader reads new data (FORWARD))
CHANGES: dict[str, tuple[Callable[[Any], None], set[str], set[str]]] = {
    "add a field": (_add_field, set(), set()),
    "add a message": (_add_message, set(), set()),
    "make a field proto3 optional": (_proto3_optional, set(), set()),
    # An old reader never sees the field again, so a number removed and reserved is safe
    # both ways (https://protobuf.dev/programming-guides/proto3/#deleting).
    "remove a field, reserving its number": (_remove_reserving, set(), set()),
    "remove a field without reserving it": (
        _remove_not_reserving,
        {compat.FIELD_REMOVED_NOT_RESERVED},
        set(),
    ),
    "remove a message": (_remove_message, {compat.MESSAGE_REMOVED}, set()),
    "change a field's type": (
        _retype,
        {compat.FIELD_TYPE_CHANGED},
        {compat.FIELD_TYPE_CHANGED},
    ),
    "change a field's message type": (
        _retype_message,
        {compat.FIELD_TYPE_CHANGED},
        {compat.FIELD_TYPE_CHANGED},
    ),
    "change a nested message's field type": (
        _retype_nested,
        {compat.FIELD_TYPE_CHANGED},
        {compat.FIELD_TYPE_CHANGED},
    ),
    "give a field number another name": (
        _rename,
        {compat.FIELD_NUMBER_REUSED},
        {compat.FIELD_NUMBER_REUSED},
    ),
    "make a field repeated": (
        _make_repeated,
        {compat.FIELD_LABEL_CHANGED},
        {compat.FIELD_LABEL_CHANGED},
    ),
    "make a repeated field singular": (
        _make_singular,
        {compat.FIELD_LABEL_CHANGED},
        {compat.FIELD_LABEL_CHANGED},
    ),
    "move a field into a oneof": (
        _into_oneof,
        {compat.FIELD_ONEOF_CHANGED},
        {compat.FIELD_ONEOF_CHANGED},
    ),
    "move a field out of a oneof": (
        _out_of_oneof,
        {compat.FIELD_ONEOF_CHANGED},
        {compat.FIELD_ONEOF_CHANGED},
    ),
    "take a number the old version reserved": (
        _take_reserved,
        {compat.FIELD_USES_RESERVED_NUMBER},
        set(),
    ),
}


def rules_of(error: IncompatibleSchemaError) -> set[str]:
    assert all(isinstance(v, compat.Violation) for v in error.violations)
    return {v.rule for v in error.violations if isinstance(v, compat.Violation)}


BACKWARD_MODES = {C.BACKWARD, C.BACKWARD_TRANSITIVE, C.FULL, C.FULL_TRANSITIVE}
FORWARD_MODES = {C.FORWARD, C.FORWARD_TRANSITIVE, C.FULL, C.FULL_TRANSITIVE}


def test_every_rule_is_exercised() -> None:
    rules = {r for _, backward, forward in CHANGES.values() for r in backward | forward}
    assert rules == {
        compat.MESSAGE_REMOVED,
        compat.FIELD_TYPE_CHANGED,
        compat.FIELD_NUMBER_REUSED,
        compat.FIELD_LABEL_CHANGED,
        compat.FIELD_ONEOF_CHANGED,
        compat.FIELD_REMOVED_NOT_RESERVED,
        compat.FIELD_USES_RESERVED_NUMBER,
    }


@pytest.mark.parametrize("mode", list(C))
@pytest.mark.parametrize(
    ("change", "backward", "forward"), list(CHANGES.values()), ids=list(CHANGES)
)
def test_each_mode_accepts_or_refuses_each_change(
    mode: Compatibility,
    change: Callable[[Any], None],
    backward: set[str],
    forward: set[str],
) -> None:
    registry = SchemaRegistry(compatibility=mode)
    assert registry.register("s", BASE) == 1
    new = edited(change)
    broken = (backward if mode in BACKWARD_MODES else set()) | (
        forward if mode in FORWARD_MODES else set()
    )
    assert {v.rule for v in registry.check("s", new)} == broken
    if not broken:
        assert registry.register("s", new) == 2
        assert registry.versions("s") == [1, 2]
        return
    with pytest.raises(IncompatibleSchemaError) as info:
        registry.register("s", new)
    assert rules_of(info.value) == broken
    for rule in broken:
        assert rule in str(info.value)
    assert str(mode) in str(info.value)
    assert registry.versions("s") == [1]
    with pytest.raises(ic.UnknownSchemaError):
        registry.resolve(2)


@pytest.mark.parametrize(
    ("change", "backward", "forward"), list(CHANGES.values()), ids=list(CHANGES)
)
def test_compat_check_names_where_each_rule_is_broken(
    change: Callable[[Any], None], backward: set[str], forward: set[str]
) -> None:
    old = compat.messages(BASE.parsed())
    new = compat.messages(edited(change).parsed())
    for violations, rules in (
        (compat.check(old, new, reader_is_newer=True), backward),
        (compat.check(new, old, reader_is_newer=False), forward),
    ):
        assert {v.rule for v in violations} == rules
        for violation in violations:
            assert violation.path.startswith(f"{PACKAGE}.")
            assert violation.rule in str(violation)
            assert violation.path in str(violation)


def test_removing_a_field_is_backward_and_forward_asymmetric() -> None:
    new = edited(_remove_not_reserving)
    backward = SchemaRegistry(compatibility=C.BACKWARD)
    forward = SchemaRegistry(compatibility=C.FORWARD)
    for registry in (backward, forward):
        registry.register("s", BASE)
    with pytest.raises(IncompatibleSchemaError, match=compat.FIELD_REMOVED_NOT_RESERVED):
        backward.register("s", new)
    assert forward.register("s", new) == 2


# -- transitive modes: every earlier version, not just the last --------------------------------


def _reserve_5(file: descriptor_pb2.FileDescriptorProto) -> None:
    message(file, "Chunk").reserved_range.add(start=5, end=6)
    remove_field(file, "Chunk.text", reserve=False)


def _forget_reservations(file: descriptor_pb2.FileDescriptorProto) -> None:
    _reserve_5(file)
    del message(file, "Chunk").reserved_range[:]


def _unrelated_field(file: descriptor_pb2.FileDescriptorProto) -> None:
    _forget_reservations(file)
    message(file, "Chunk").field.append(field("other", 11))


def _reuse_5(file: descriptor_pb2.FileDescriptorProto) -> None:
    _unrelated_field(file)
    message(file, "Chunk").field.append(field("five", 5, F.TYPE_BOOL))


def _drop_count(file: descriptor_pb2.FileDescriptorProto) -> None:
    remove_field(file, "Chunk.count", reserve=False)


def _reuse_2(file: descriptor_pb2.FileDescriptorProto) -> None:
    _drop_count(file)
    message(file, "Chunk").field.append(field("second", 2, F.TYPE_STRING))


CHAINS = {
    # v1 reserves 5; v2 forgets the reservation; v3 adds a field; v4 takes 5. Each version is
    # fine beside the one before it; v4 breaks only v1's reservation.
    "reservation forgotten": [
        _reserve_5,
        _forget_reservations,
        _unrelated_field,
        _reuse_5,
    ],
    # v2 drops a field without reserving it (an old reader still reads new data); v3 gives
    # its number to a new field, which v1's readers would misread.
    "number reused": [lambda file: None, _drop_count, _reuse_2],
}
# The first version each mode refuses, or None when it takes the whole chain.
FIRST_REFUSED = {
    "reservation forgotten": {
        C.NONE: None,
        C.BACKWARD: None,
        C.FORWARD: None,
        C.FULL: None,
        C.BACKWARD_TRANSITIVE: 4,
        C.FORWARD_TRANSITIVE: None,
        C.FULL_TRANSITIVE: 4,
    },
    "number reused": {
        C.NONE: None,
        C.BACKWARD: 2,
        C.FORWARD: None,
        C.FULL: 2,
        C.BACKWARD_TRANSITIVE: 2,
        C.FORWARD_TRANSITIVE: 3,
        C.FULL_TRANSITIVE: 2,
    },
}


@pytest.mark.parametrize(
    ("chain", "mode", "refused"),
    [(chain, mode, at) for chain, modes in FIRST_REFUSED.items() for mode, at in modes.items()],
)
def test_transitive_modes_check_every_earlier_version(
    chain: str, mode: Compatibility, refused: int | None
) -> None:
    assert set(FIRST_REFUSED[chain]) == set(C)
    registry = SchemaRegistry()
    registry.set_compatibility("s", mode)
    for version, change in enumerate(CHAINS[chain], start=1):
        schema = edited(change)
        if version == refused:
            with pytest.raises(IncompatibleSchemaError):
                registry.register("s", schema)
            assert registry.versions("s") == list(range(1, version))
            return
        assert registry.register("s", schema) == version
    assert refused is None


def test_a_transitive_mode_names_the_rule_an_old_version_breaks() -> None:
    registry = SchemaRegistry(compatibility=C.BACKWARD_TRANSITIVE)
    for change in CHAINS["reservation forgotten"][:3]:
        registry.register("s", edited(change))
    with pytest.raises(IncompatibleSchemaError) as info:
        registry.register("s", edited(CHAINS["reservation forgotten"][3]))
    (violation,) = info.value.violations
    assert isinstance(violation, compat.Violation)
    assert violation.rule == compat.FIELD_USES_RESERVED_NUMBER
    assert violation.path == f"{PACKAGE}.Chunk.five = 5"


# -- ids, subjects, versions -------------------------------------------------------------------


def test_ids_subjects_and_versions() -> None:
    registry = SchemaRegistry()
    added = edited(_add_field)
    assert registry.register("a", BASE) == 1
    assert registry.register("a", added) == 2
    assert registry.register("a", BASE) == 1  # already a version: nothing added
    assert registry.versions("a") == [1, 2]
    assert registry.register("b", added) == 2  # one id per schema, across subjects
    assert registry.versions("b") == [1]
    assert registry.subjects() == ["a", "b"]
    latest = registry.version("a")
    assert (latest.subject, latest.version, latest.schema_id) == ("a", 2, 2)
    assert latest.schema == added
    assert registry.version("a", 1).schema == BASE
    assert registry.version("b", 1).schema_id == 2
    assert registry.resolve(1) == BASE
    assert registry.resolve(2) == added


@pytest.mark.parametrize(
    "ask",
    [
        lambda r: r.versions("missing"),
        lambda r: r.version("missing"),
        lambda r: r.version("a", 0),
        lambda r: r.version("a", 2),
        lambda r: r.version("a", -1),
    ],
    ids=["versions-of-unknown", "version-of-unknown", "version-0", "version-past", "version-neg"],
)
def test_asking_for_what_is_not_there_is_a_schema_error(ask: Callable[[Any], Any]) -> None:
    registry = SchemaRegistry()
    registry.register("a", BASE)
    with pytest.raises(SchemaError):
        ask(registry)


@pytest.mark.parametrize("schema_id", [0, 2, -1, 2**32])
def test_an_unknown_id_is_an_unknown_schema_error(schema_id: int) -> None:
    registry = SchemaRegistry()
    registry.register("a", BASE)
    with pytest.raises(ic.UnknownSchemaError) as info:
        registry.resolve(schema_id)
    assert info.value.schema_id == schema_id


def _with_comments(file: descriptor_pb2.FileDescriptorProto) -> None:
    location = file.source_code_info.location.add(path=[4, 0], span=[3, 0, 20, 1])
    location.leading_comments = " A chunk of a stream, commented.\n"
    file.source_code_info.location.add(
        path=[4, 0, 2, 1], span=[5, 2, 18]
    ).trailing_comments = " how many\n"


def test_a_comment_only_change_keeps_the_id() -> None:
    commented = edited(_with_comments)
    assert commented.descriptor_set != BASE.descriptor_set
    assert commented == BASE
    assert hash(commented) == hash(BASE)
    registry = SchemaRegistry()
    assert registry.register("a", BASE) == 1
    assert registry.register("a", commented) == 1
    assert registry.register("b", commented) == 1
    assert registry.versions("a") == [1]


def test_a_schema_that_is_not_a_descriptor_set_is_a_schema_error() -> None:
    registry = SchemaRegistry()
    for data in (b"\xff\xff\xff", b"", b"\x0a"):
        with pytest.raises(SchemaError):
            registry.register("a", Schema(data))
    assert registry.subjects() == []


def test_modes_per_subject() -> None:
    registry = SchemaRegistry()
    assert registry.default_compatibility == C.BACKWARD
    assert registry.compatibility("anything") == C.BACKWARD
    registry.set_compatibility("a", "FORWARD")
    assert registry.compatibility("a") == C.FORWARD
    assert registry.compatibility("b") == C.BACKWARD
    registry.register("a", BASE)
    registry.register("b", BASE)
    new = edited(_remove_not_reserving)
    assert registry.register("a", new) == 2
    with pytest.raises(IncompatibleSchemaError):
        registry.register("b", new)
    registry.set_compatibility("b", C.NONE)
    assert registry.register("b", new) == 2
    with pytest.raises(ValueError, match="SIDEWAYS"):
        registry.set_compatibility("b", "SIDEWAYS")


@pytest.mark.parametrize(
    ("mode", "backward", "forward", "transitive"),
    [
        (C.BACKWARD, True, False, False),
        (C.BACKWARD_TRANSITIVE, True, False, True),
        (C.FORWARD, False, True, False),
        (C.FORWARD_TRANSITIVE, False, True, True),
        (C.FULL, True, True, False),
        (C.FULL_TRANSITIVE, True, True, True),
        (C.NONE, False, False, False),
    ],
)
def test_what_each_mode_checks(
    mode: Compatibility, backward: bool, forward: bool, transitive: bool
) -> None:
    assert (mode.backward, mode.forward, mode.transitive) == (backward, forward, transitive)
    assert C(str(mode)) is mode


# -- persistence -------------------------------------------------------------------------------


def _saved_registry() -> SchemaRegistry:
    registry = SchemaRegistry(compatibility=C.FULL)
    registry.register("a", BASE)
    registry.register("a", edited(_add_field))
    registry.set_compatibility("b", C.NONE)
    registry.register("b", edited(_retype))
    registry.register(delta_codec.SUBJECT, delta_codec.DELTA_V1)
    return registry


def test_save_and_load_keep_ids_versions_and_modes(tmp_path: Path) -> None:
    registry = _saved_registry()
    path = tmp_path / "registry.json"
    registry.save(path)
    loaded = SchemaRegistry.load(path)
    assert loaded.to_json() == registry.to_json()
    assert loaded.default_compatibility == C.FULL
    assert loaded.compatibility("b") == C.NONE
    assert loaded.compatibility("a") == C.FULL
    assert loaded.subjects() == ["a", "b", delta_codec.SUBJECT]
    for subject in loaded.subjects():
        for version in loaded.versions(subject):
            before, after = registry.version(subject, version), loaded.version(subject, version)
            assert (after.schema_id, after.schema) == (before.schema_id, before.schema)
    # the same schema again keeps its id; a new one takes the next
    assert loaded.register("a", BASE) == 1
    assert loaded.register("c", edited(_add_field)) == 2
    assert loaded.register(delta_codec.SUBJECT, delta_codec.DELTA_V2) == 5
    # the modes still apply
    with pytest.raises(IncompatibleSchemaError):
        loaded.register("a", edited(_remove_not_reserving))


def test_a_stream_written_before_a_restart_decodes_after_it(tmp_path: Path) -> None:
    path = tmp_path / "registry.json"
    registry = _saved_registry()
    writer = delta_codec.DeltaCodec(schema=delta_codec.DELTA_V1, registry=registry)
    chunk = ic.TokenChunk(id="r", model="m", created=1, index=0, seq=0, token_ids=(1,), text="a")
    data = writer.encode(chunk)
    registry.save(path)
    reader = delta_codec.DeltaCodec(schema=delta_codec.DELTA_V1, registry=SchemaRegistry.load(path))
    assert reader.schema_id == writer.schema_id == 4
    assert reader.decode(data, ic.TokenChunk) == chunk


def test_save_replaces_the_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "registry.json"
    path.write_text("old contents")
    registry = _saved_registry()
    registry.save(path)
    registry.register("d", edited(_add_message))
    registry.save(path)
    assert [p.name for p in tmp_path.iterdir()] == ["registry.json"]  # no temporary left
    assert SchemaRegistry.load(path).to_json() == registry.to_json()


def _good_file() -> dict[str, Any]:
    return _saved_registry().to_json()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _mutated(change: Callable[[dict[str, Any]], object]) -> bytes:
    data = copy.deepcopy(_good_file())
    change(data)
    return json.dumps(data).encode()


CORRUPT_FILES = {
    "empty": b"",
    "not json": b"{not json",
    "not utf-8": b"\xff\xfe\x00",
    "a json list": b"[]",
    "a json string": b'"inferwire-schema-registry"',
    "wrong format tag": _mutated(lambda d: d.update(format="confluent")),
    "wrong file version": _mutated(lambda d: d.update(version=2)),
    "unknown default mode": _mutated(lambda d: d.update(default_compatibility="SIDEWAYS")),
    "no schemas": _mutated(lambda d: d.pop("schemas")),
    "schemas not a list": _mutated(lambda d: d.update(schemas={"1": "x"})),
    "bad base64": _mutated(lambda d: d["schemas"][0].update(descriptor_set="not base64!")),
    "descriptor that does not parse": _mutated(
        lambda d: d["schemas"][0].update(descriptor_set=_b64(b"\xff\xff\xff"))
    ),
    "descriptor set without files": _mutated(lambda d: d["schemas"][0].update(descriptor_set="")),
    "duplicate ids": _mutated(lambda d: d["schemas"][1].update(id=1)),
    "the same schema twice": _mutated(
        lambda d: d["schemas"][1].update(descriptor_set=d["schemas"][0]["descriptor_set"])
    ),
    "id zero": _mutated(lambda d: d["schemas"][0].update(id=0)),
    "id as text": _mutated(lambda d: d["schemas"][0].update(id="1")),
    "id as a bool": _mutated(lambda d: d["schemas"][0].update(id=True)),
    "subject naming an unknown id": _mutated(lambda d: d["subjects"]["a"]["versions"].append(9)),
    "versions not a list": _mutated(lambda d: d["subjects"]["a"].update(versions=1)),
    "unknown subject mode": _mutated(lambda d: d["subjects"]["b"].update(compatibility="SOME")),
    "subject without versions": _mutated(lambda d: d["subjects"]["a"].pop("versions")),
}


@pytest.mark.parametrize("content", list(CORRUPT_FILES.values()), ids=list(CORRUPT_FILES))
def test_a_corrupt_file_is_a_corrupt_registry_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "registry.json"
    path.write_bytes(content)
    with pytest.raises(CorruptRegistryError) as info:
        SchemaRegistry.load(path)
    assert isinstance(info.value, SchemaError)


def test_the_file_the_corrupt_ones_are_made_from_loads(tmp_path: Path) -> None:
    """Each corrupt file above is one change away from this one."""
    path = tmp_path / "registry.json"
    path.write_bytes(_mutated(lambda d: None))
    assert SchemaRegistry.load(path).to_json() == _good_file()
