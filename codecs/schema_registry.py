"""A schema registry: schemas by subject and version, stable ids, compatibility modes.

Modelled on Confluent Schema Registry (https://docs.confluent.io/platform/current/
schema-registry/fundamentals/schema-evolution.html): an id names one distinct schema across
all subjects; registering the same schema again returns its id; a subject's compatibility mode
decides which new versions it accepts. Schemas are protobuf FileDescriptorSets, compared in a
canonical form (no source comments, deterministic serialization) so a reformatted .proto keeps
its id. Decoders find a schema by id through a resolver: this registry, a
:class:`CachingResolver` in front of a remote one, or anything with ``resolve(id)``.
"""

from __future__ import annotations

import base64
import binascii
import enum
import json
import os
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf import message as pb_message

from . import compat
from .errors import (
    CorruptRegistryError,
    IncompatibleSchemaError,
    SchemaError,
    UnknownSchemaError,
)

FILE_FORMAT: Final = "inferwire-schema-registry"
FILE_VERSION: Final = 1


class Compatibility(enum.StrEnum):
    BACKWARD = "BACKWARD"
    BACKWARD_TRANSITIVE = "BACKWARD_TRANSITIVE"
    FORWARD = "FORWARD"
    FORWARD_TRANSITIVE = "FORWARD_TRANSITIVE"
    FULL = "FULL"
    FULL_TRANSITIVE = "FULL_TRANSITIVE"
    NONE = "NONE"

    @property
    def transitive(self) -> bool:
        return self.endswith("_TRANSITIVE")

    @property
    def backward(self) -> bool:
        return self.startswith(("BACKWARD", "FULL"))

    @property
    def forward(self) -> bool:
        return self.startswith(("FORWARD", "FULL"))


@dataclass(frozen=True, slots=True, eq=False)
class Schema:
    """A protobuf schema: a serialized FileDescriptorSet (``protoc --descriptor_set_out``)."""

    descriptor_set: bytes

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Schema:
        return cls(Path(path).read_bytes())

    def parsed(self) -> descriptor_pb2.FileDescriptorSet:
        parsed = descriptor_pb2.FileDescriptorSet()
        try:
            parsed.ParseFromString(self.descriptor_set)
        except pb_message.DecodeError as exc:
            raise SchemaError(f"not a FileDescriptorSet: {exc}") from exc
        if not parsed.file:
            raise SchemaError("a schema holds at least one .proto file")
        return parsed

    def build(self) -> descriptor_pool.DescriptorPool:
        """A descriptor pool holding the schema; :class:`SchemaError` if protobuf cannot build
        it (an unresolved type, a duplicate name...)."""
        pool = descriptor_pool.DescriptorPool()
        for file in self.parsed().file:
            try:
                pool.Add(file)
            except (TypeError, ValueError, KeyError) as exc:
                raise SchemaError(f"schema does not build: {exc}") from exc
        for file in self.parsed().file:
            try:
                pool.FindFileByName(file.name)
            except (TypeError, ValueError, KeyError) as exc:
                raise SchemaError(f"schema does not build: {exc}") from exc
        return pool

    def canonical(self) -> bytes:
        """The schema without source comments, serialized deterministically: its identity."""
        parsed = self.parsed()
        for file in parsed.file:
            file.ClearField("source_code_info")
        return parsed.SerializeToString(deterministic=True)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Schema):
            return NotImplemented
        return self.canonical() == other.canonical()

    def __hash__(self) -> int:
        return hash(self.canonical())


@dataclass(frozen=True, slots=True)
class RegisteredSchema:
    subject: str
    version: int
    schema_id: int
    schema: Schema


class SchemaResolver(Protocol):
    """Finds a schema by id: :class:`UnknownSchemaError` if there is none,
    :class:`~inferwire.codecs.errors.SchemaRegistryUnavailableError` if it cannot tell right now."""

    def resolve(self, schema_id: int, /) -> Schema: ...


class SchemaRegistry:
    """An in-process registry; thread-safe. ``save``/``load`` keep it across restarts."""

    def __init__(self, *, compatibility: Compatibility = Compatibility.BACKWARD) -> None:
        self.default_compatibility = Compatibility(compatibility)
        self._lock = threading.RLock()
        self._schemas: dict[int, Schema] = {}
        self._ids: dict[bytes, int] = {}  # canonical form -> id
        self._subjects: dict[str, list[int]] = {}  # subject -> schema id of each version
        self._modes: dict[str, Compatibility] = {}

    # -- reading -------------------------------------------------------------------------

    def resolve(self, schema_id: int, /) -> Schema:
        with self._lock:
            try:
                return self._schemas[schema_id]
            except KeyError:
                raise UnknownSchemaError(schema_id) from None

    def subjects(self) -> list[str]:
        with self._lock:
            return list(self._subjects)

    def versions(self, subject: str) -> list[int]:
        with self._lock:
            return list(range(1, len(self._subject(subject)) + 1))

    def version(self, subject: str, version: int | None = None) -> RegisteredSchema:
        """Version ``version`` of ``subject`` (numbered from 1); the latest when ``None``."""
        with self._lock:
            ids = self._subject(subject)
            number = len(ids) if version is None else version
            if not 1 <= number <= len(ids):
                raise SchemaError(f"subject {subject!r} has no version {version}")
            schema_id = ids[number - 1]
            return RegisteredSchema(subject, number, schema_id, self._schemas[schema_id])

    def compatibility(self, subject: str) -> Compatibility:
        with self._lock:
            return self._modes.get(subject, self.default_compatibility)

    def set_compatibility(self, subject: str, mode: Compatibility | str) -> None:
        with self._lock:
            self._modes[subject] = Compatibility(mode)

    # -- writing -------------------------------------------------------------------------

    def check(self, subject: str, schema: Schema) -> list[compat.Violation]:
        """What registering ``schema`` under ``subject`` would break, per the subject's mode."""
        with self._lock:
            mode = self.compatibility(subject)
            ids = self._subjects.get(subject, [])
            if mode is Compatibility.NONE or not ids:
                return []
            earlier = ids if mode.transitive else ids[-1:]
            new = compat.messages(schema.parsed())
            violations = []
            for schema_id in earlier:
                old = compat.messages(self._schemas[schema_id].parsed())
                if mode.backward:
                    violations += compat.check(old, new, reader_is_newer=True)
                if mode.forward:
                    violations += compat.check(new, old, reader_is_newer=False)
            return violations

    def register(self, subject: str, schema: Schema) -> int:
        """Add ``schema`` as the next version of ``subject``; its id (the same id again for a
        schema registered before). Raises :class:`IncompatibleSchemaError` naming each rule
        broken."""
        canonical = schema.canonical()
        with self._lock:
            schema_id = self._ids.get(canonical)
            ids = self._subjects.get(subject, [])
            if schema_id is not None and schema_id in ids:
                return schema_id  # already a version of this subject
            if schema_id is None:
                schema.build()  # a schema protobuf cannot build is no schema
            violations = self.check(subject, schema)
            if violations:
                rules = ", ".join(sorted({v.rule for v in violations}))
                raise IncompatibleSchemaError(
                    f"schema is not {self.compatibility(subject)} compatible with subject "
                    f"{subject!r}: {rules}; " + "; ".join(map(str, violations)),
                    tuple(violations),
                )
            if schema_id is None:
                schema_id = max(self._schemas, default=0) + 1
                self._schemas[schema_id] = Schema(canonical)
                self._ids[canonical] = schema_id
            self._subjects.setdefault(subject, []).append(schema_id)
            return schema_id

    def _subject(self, subject: str) -> list[int]:
        try:
            return self._subjects[subject]
        except KeyError:
            raise SchemaError(f"unknown subject {subject!r}") from None

    # -- persistence ---------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        with self._lock:
            return {
                "format": FILE_FORMAT,
                "version": FILE_VERSION,
                "default_compatibility": str(self.default_compatibility),
                "schemas": [
                    {"id": i, "descriptor_set": base64.b64encode(s.descriptor_set).decode()}
                    for i, s in sorted(self._schemas.items())
                ],
                "subjects": {
                    name: {
                        "compatibility": str(self._modes[name]) if name in self._modes else None,
                        "versions": ids,
                    }
                    for name, ids in self._subjects.items()
                },
            }

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the registry as JSON, atomically (a crash leaves the old file whole)."""
        target = Path(path)
        data = json.dumps(self.to_json(), indent=2).encode()
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SchemaRegistry:
        """A registry read from ``path``; :class:`CorruptRegistryError` if it is not valid."""
        try:
            data = json.loads(Path(path).read_bytes())
            return cls._from_json(data)
        except CorruptRegistryError as exc:
            raise CorruptRegistryError(f"{path}: {exc}") from exc
        except (
            ValueError,
            TypeError,
            KeyError,
            AttributeError,
            SchemaError,
            binascii.Error,
        ) as exc:
            raise CorruptRegistryError(f"{path}: {type(exc).__name__}: {exc}") from exc

    @classmethod
    def _from_json(cls, data: Any) -> SchemaRegistry:
        if data.get("format") != FILE_FORMAT or data.get("version") != FILE_VERSION:
            raise CorruptRegistryError("not an inferwire schema registry file of version 1")
        registry = cls(compatibility=Compatibility(data["default_compatibility"]))
        for entry in data["schemas"]:
            schema_id = entry["id"]
            if type(schema_id) is not int or schema_id < 1 or schema_id in registry._schemas:
                raise CorruptRegistryError(f"bad or repeated schema id {schema_id!r}")
            schema = Schema(base64.b64decode(entry["descriptor_set"], validate=True))
            canonical = schema.canonical()  # parses: a corrupt descriptor fails here
            if canonical in registry._ids:
                raise CorruptRegistryError(f"schema {schema_id} repeats another schema")
            registry._schemas[schema_id] = Schema(canonical)
            registry._ids[canonical] = schema_id
        for name, subject in data["subjects"].items():
            ids = subject["versions"]
            if (
                type(name) is not str
                or type(ids) is not list
                or not all(type(i) is int and i in registry._schemas for i in ids)
            ):
                raise CorruptRegistryError(f"subject {name!r} names unknown schema ids")
            registry._subjects[name] = list(ids)
            if subject["compatibility"] is not None:
                registry._modes[name] = Compatibility(subject["compatibility"])
        return registry


class CachingResolver:
    """Caches what another resolver finds, so each id is looked up once.

    Unknown ids are cached too (``negative_ttl_s``, at most ``max_negative`` of them), so a peer
    spraying random ids does not cause a lookup per frame. An unreachable source is not cached:
    its :class:`SchemaRegistryUnavailableError` reaches the caller, who may retry.
    """

    def __init__(
        self,
        source: SchemaResolver,
        *,
        negative_ttl_s: float = 60.0,
        max_negative: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._source = source
        self._negative_ttl_s = negative_ttl_s
        self._max_negative = max_negative
        self._clock = clock
        self._found: dict[int, Schema] = {}
        self._missing: OrderedDict[int, float] = OrderedDict()
        self._lock = threading.Lock()
        self.lookups = 0
        """How many times the source was asked (for tests and metrics)."""

    def resolve(self, schema_id: int, /) -> Schema:
        with self._lock:
            schema = self._found.get(schema_id)
            if schema is not None:
                return schema
            expiry = self._missing.get(schema_id)
            if expiry is not None:
                if self._clock() < expiry:
                    raise UnknownSchemaError(schema_id)
                del self._missing[schema_id]
        self.lookups += 1
        try:
            schema = self._source.resolve(schema_id)
        except UnknownSchemaError:
            with self._lock:
                self._missing[schema_id] = self._clock() + self._negative_ttl_s
                while len(self._missing) > self._max_negative:
                    self._missing.popitem(last=False)
            raise
        with self._lock:
            self._found[schema_id] = schema
        return schema
