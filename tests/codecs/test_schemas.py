"""The wire schemas: committed generated code matches its sources, and protobuf runs on upb."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool

import inferwire.schemas
from inferwire.codecs import protobuf_codec
from inferwire.schemas import generate
from inferwire.schemas import inferwire_pb2 as pb
from inferwire.schemas.kserve import inference_pb2 as kserve_pb

SCHEMAS = Path(inferwire.schemas.__file__).resolve().parent
PROTO_OUTPUTS = [
    "inferwire_pb2.py",
    "inferwire_pb2.pyi",
    "inferwire_pb2_grpc.py",
    "inferwire_grpc.py",  # grpclib's stubs of the same service
]
# The delta codec's schema versions, shipped as descriptor sets (the registry stores them).
DELTA_OUTPUTS = ["delta_v1.binpb", "delta_v2.binpb", "delta_v3.binpb"]
# The KServe v2 / Open Inference Protocol's gRPC messages.
KSERVE_OUTPUTS = [f"{generate.KSERVE}/{name}" for name in generate.KSERVE_OUTPUTS]


def _fb_files(root: Path) -> set[str]:
    return {
        p.relative_to(root).as_posix()
        for p in (root / "fb").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("schemas")
    generate.generate(out)
    return out


def test_generate_writes_every_committed_module(regenerated: Path) -> None:
    for name in [*PROTO_OUTPUTS, *DELTA_OUTPUTS, *KSERVE_OUTPUTS]:
        assert (regenerated / name).is_file(), name
    assert _fb_files(regenerated) == _fb_files(SCHEMAS)
    assert "fb/Envelope.py" in _fb_files(SCHEMAS)


@pytest.mark.parametrize(
    "name", [*PROTO_OUTPUTS, *DELTA_OUTPUTS, *KSERVE_OUTPUTS, *sorted(_fb_files(SCHEMAS))]
)
def test_committed_generated_code_is_what_the_generators_write(
    regenerated: Path, name: str
) -> None:
    """Regenerating changes nothing: `make regen` was run after the last schema edit."""
    committed = (SCHEMAS / name).read_bytes()
    assert (regenerated / name).read_bytes() == committed, (
        f"schemas/{name} differs from what schemas/generate.py writes: run `make regen`"
    )


def test_protobuf_runs_on_upb() -> None:
    assert protobuf_codec.BACKEND == "upb"


def test_the_proto_has_no_language_specific_options() -> None:
    """Any protoc target can use the file: no `option` statements (py_*, java_*, go_package)."""
    source = (SCHEMAS / "inferwire.proto").read_text(encoding="utf-8")
    assert not re.findall(r"^\s*option\s", source, flags=re.MULTILINE)
    assert pb.DESCRIPTOR.package == "inferwire.v1"
    assert pb.DESCRIPTOR.GetOptions().ListFields() == []


def test_the_grpc_service() -> None:
    service = pb.DESCRIPTOR.services_by_name["Inference"]
    methods = {m.name: m for m in service.methods}
    assert set(methods) == {"Infer", "Generate", "GenerateBatched", "Session"}
    streaming = {name: (m.client_streaming, m.server_streaming) for name, m in methods.items()}
    assert streaming == {
        "Infer": (False, False),
        "Generate": (False, True),
        "GenerateBatched": (False, True),
        "Session": (True, True),
    }
    assert methods["Infer"].input_type.name == "InferRequest"
    assert methods["Infer"].output_type.name == "InferResponse"
    assert methods["Generate"].output_type.name == "TokenChunk"
    assert methods["GenerateBatched"].output_type.name == "StreamBytes"


def test_the_proto_holds_the_whole_model() -> None:
    for message in (
        "TokenChunk",
        "TokenLogprob",
        "TopLogprob",
        "Usage",
        "EmbeddingBatch",
        "Tensor",
        "InferRequest",
        "InferResponse",
    ):
        assert message in pb.DESCRIPTOR.message_types_by_name
    logprob = pb.DESCRIPTOR.message_types_by_name["TopLogprob"].fields_by_name["logprob"]
    assert logprob.type == logprob.TYPE_DOUBLE  # a float would not round trip a double


def test_the_fbs_names_its_root_and_file_identifier() -> None:
    source = (SCHEMAS / "inferwire.fbs").read_text(encoding="utf-8")
    assert re.search(r"^root_type Envelope;", source, flags=re.MULTILINE)
    assert re.search(r'^file_identifier "IWF1";', source, flags=re.MULTILINE)
    assert "(python" not in source


@pytest.mark.parametrize("version", [1, 2, 3])
def test_each_delta_descriptor_set_is_its_proto(version: int) -> None:
    """One file, the .proto of its name, without source info (so no comment changes its id)."""
    descriptor_set = descriptor_pb2.FileDescriptorSet.FromString(
        (SCHEMAS / f"delta_v{version}.binpb").read_bytes()
    )
    (file,) = descriptor_set.file
    assert file.name == f"inferwire/schemas/delta_v{version}.proto"
    assert file.package == "inferwire.delta"
    assert file.syntax == "proto3"
    assert not file.HasField("source_code_info")
    assert (SCHEMAS / f"delta_v{version}.proto").is_file()


def test_delta_v2_is_v1_plus_usage() -> None:
    v1, v2 = (
        descriptor_pb2.FileDescriptorSet.FromString((SCHEMAS / f"delta_v{v}.binpb").read_bytes())
        for v in (1, 2)
    )
    messages_v1 = {m.name: m for m in v1.file[0].message_type}
    messages_v2 = {m.name: m for m in v2.file[0].message_type}
    assert set(messages_v2) == {*messages_v1, "Usage"}
    for name in ("Header", "Logprob"):
        assert messages_v2[name] == messages_v1[name]
    frame_v1, frame_v2 = messages_v1["Frame"], messages_v2["Frame"]
    assert list(frame_v2.field)[: len(frame_v1.field)] == list(frame_v1.field)
    (usage,) = list(frame_v2.field)[len(frame_v1.field) :]
    assert (usage.name, usage.number, usage.type_name) == ("usage", 8, ".inferwire.delta.Usage")


def test_the_kserve_messages_live_in_a_pool_of_their_own() -> None:
    """tritonclient.grpc defines the same ``inference.*`` names in the default pool: a process
    may import both only if ours are elsewhere."""
    assert kserve_pb.DESCRIPTOR.package == "inference"
    assert kserve_pb.DESCRIPTOR.pool is not descriptor_pool.Default()
    with pytest.raises(KeyError):
        descriptor_pool.Default().FindFileByName(kserve_pb.DESCRIPTOR.name)
    assert kserve_pb.DESCRIPTOR.GetOptions().ListFields() == []
