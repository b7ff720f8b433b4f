"""Compatibility rules between two versions of a protobuf schema (a FileDescriptorSet).

``check(writer, reader)`` lists what would go wrong if data written with ``writer`` were read
with ``reader``. The registry runs it old -> new for BACKWARD (a new reader reads old data),
new -> old for FORWARD (an old reader reads new data), and both ways for FULL. The rules are
the protobuf language guide's "updating a message type" advice
(https://protobuf.dev/programming-guides/proto3/#updating), made strict:

- ``MESSAGE_REMOVED``: a newer schema dropped a message the older one has. (An older reader
  lacking a newer message is fine: the fields that use it are unknown to it and skipped.)
- ``FIELD_TYPE_CHANGED``: a field number keeps its name but changes type (or message type).
  Even the varint types the guide calls compatible truncate silently, so any change is refused.
- ``FIELD_NUMBER_REUSED``: a field number now carries a field of another name.
- ``FIELD_LABEL_CHANGED``: repeated became singular or back (a reader keeps only the last).
- ``FIELD_ONEOF_CHANGED``: a field moved into, out of, or between oneofs.
- ``FIELD_REMOVED_NOT_RESERVED``: a newer schema dropped a field without reserving its number,
  so a later version could reuse it.
- ``FIELD_USES_RESERVED_NUMBER``: a newer schema uses a number the older one reserved (older
  data may carry it with its retired meaning).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from google.protobuf import descriptor_pb2

MESSAGE_REMOVED: Final = "MESSAGE_REMOVED"
FIELD_TYPE_CHANGED: Final = "FIELD_TYPE_CHANGED"
FIELD_NUMBER_REUSED: Final = "FIELD_NUMBER_REUSED"
FIELD_LABEL_CHANGED: Final = "FIELD_LABEL_CHANGED"
FIELD_ONEOF_CHANGED: Final = "FIELD_ONEOF_CHANGED"
FIELD_REMOVED_NOT_RESERVED: Final = "FIELD_REMOVED_NOT_RESERVED"
FIELD_USES_RESERVED_NUMBER: Final = "FIELD_USES_RESERVED_NUMBER"

Messages = dict[str, descriptor_pb2.DescriptorProto]


@dataclass(frozen=True, slots=True)
class Violation:
    rule: str
    path: str
    detail: str

    def __str__(self) -> str:
        return f"{self.rule} at {self.path}: {self.detail}"


def messages(descriptor_set: descriptor_pb2.FileDescriptorSet) -> Messages:
    """Every message of the set by full name, nested ones included."""
    out: Messages = {}

    def add(prefix: str, message: descriptor_pb2.DescriptorProto) -> None:
        name = f"{prefix}.{message.name}" if prefix else message.name
        out[name] = message
        for nested in message.nested_type:
            add(name, nested)

    for file in descriptor_set.file:
        for message in file.message_type:
            add(file.package, message)
    return out


def _reserved(message: descriptor_pb2.DescriptorProto, number: int) -> bool:
    # ReservedRange.end is exclusive (descriptor.proto)
    return any(r.start <= number < r.end for r in message.reserved_range)


def _oneof(
    message: descriptor_pb2.DescriptorProto, field: descriptor_pb2.FieldDescriptorProto
) -> str | None:
    # proto3 `optional` is a synthetic oneof: presence, not a choice between fields
    if not field.HasField("oneof_index") or field.proto3_optional:
        return None
    return message.oneof_decl[field.oneof_index].name


def _type(field: descriptor_pb2.FieldDescriptorProto) -> str:
    kind = descriptor_pb2.FieldDescriptorProto.Type.Name(field.type)
    return f"{kind}({field.type_name})" if field.type_name else kind


def check(writer: Messages, reader: Messages, *, reader_is_newer: bool) -> list[Violation]:
    """What breaks when ``reader`` reads data written with ``writer``."""
    violations: list[Violation] = []
    for name, written in writer.items():
        read = reader.get(name)
        if read is None:
            if reader_is_newer:
                violations.append(Violation(MESSAGE_REMOVED, name, "message missing"))
            continue
        read_fields = {f.number: f for f in read.field}
        for field in written.field:
            path = f"{name}.{field.name} = {field.number}"
            other = read_fields.get(field.number)
            if other is None:
                if _reserved(read, field.number):
                    continue
                if reader_is_newer:
                    violations.append(
                        Violation(
                            FIELD_REMOVED_NOT_RESERVED,
                            path,
                            "field removed without reserving its number",
                        )
                    )
                continue
            if other.name != field.name:
                violations.append(
                    Violation(
                        FIELD_NUMBER_REUSED, path, f"number {field.number} now names {other.name!r}"
                    )
                )
                continue
            if _type(other) != _type(field):
                violations.append(
                    Violation(FIELD_TYPE_CHANGED, path, f"{_type(field)} became {_type(other)}")
                )
            if (other.label == field.LABEL_REPEATED) != (field.label == field.LABEL_REPEATED):
                violations.append(
                    Violation(FIELD_LABEL_CHANGED, path, "repeated and singular swapped")
                )
            if _oneof(read, other) != _oneof(written, field):
                violations.append(
                    Violation(
                        FIELD_ONEOF_CHANGED,
                        path,
                        f"oneof {_oneof(written, field)} became {_oneof(read, other)}",
                    )
                )
        # A retired number matters when a newer reader meets older data: that data may carry
        # the number with its old meaning. An older reader just skips it as unknown.
        if reader_is_newer:
            written_numbers = {f.number for f in written.field}
            violations.extend(
                Violation(
                    FIELD_USES_RESERVED_NUMBER,
                    f"{name}.{field.name} = {field.number}",
                    "number reserved by the older version",
                )
                for field in read.field
                if field.number not in written_numbers and _reserved(written, field.number)
            )
    return violations
