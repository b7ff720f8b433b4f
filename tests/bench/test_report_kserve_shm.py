"""The report's shared memory section and advice lines: there only with the suite's raw file,
and every comparison computed from its figures, so data that turn a result around turn the
sentence and the advice around too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from inferwire.bench.report import kserve_shm

TIE = 0.10
HTTP_IMAGE = {"shm": 1000.0, "binary": 4000.0, "tensor": 3800.0}
HTTP_EMBED = {"shm": 900.0, "binary": 1500.0, "tensor": 1400.0}


def _info(workload: str, nbytes: int, us: dict[str, float]) -> dict[str, Any]:
    return {
        "workload": workload,
        "shape": [1, nbytes // 4],
        "tensor_bytes": nbytes,
        **{f"{p}_us": us[p] for p in kserve_shm.PATHS},
        **{f"server_cpu_{p}_us": us[p] / 4 for p in kserve_shm.PATHS},
        **{
            f"request_bytes_{p}": 300 if p.endswith("shm") else nbytes + 180
            for p in kserve_shm.PATHS
        },
        "shm_vs_binary": us["shm"] / us["binary"],
        "tensor_vs_binary": us["tensor"] / us["binary"],
        "shm_vs_tensor": us["shm"] / us["tensor"],
        "grpc_shm_vs_grpc": us["grpc_shm"] / us["grpc"],
        "correct": True,
    }


def _write(raw: Path, *infos: dict[str, Any]) -> None:
    benchmarks = [{"extra_info": i, "stats": {"median": 1e-3, "iqr": 1e-4}} for i in infos]
    (raw / kserve_shm.KSERVE_SHM_RAW).write_bytes(orjson.dumps({"benchmarks": benchmarks}))


def test_the_section_is_there_only_with_its_raw_file(tmp_path: Path) -> None:
    assert kserve_shm.section(tmp_path) == ""
    assert kserve_shm.advice_rows(tmp_path, TIE) == []
    _write(
        tmp_path,
        _info("image-fp32", 602112, {**HTTP_IMAGE, "grpc_shm": 1200.0, "grpc": 6000.0}),
        _info("embed-32x1024", 131072, {**HTTP_EMBED, "grpc_shm": 1100.0, "grpc": 1500.0}),
    )
    text = kserve_shm.section(tmp_path)
    assert (
        "| `image-fp32` | 1x150528, 588.0 KiB | 1,000 | 4,000 | 3,800 | 0.25x | 0.26x "
        "| 1,200 | 6,000 | 0.20x |"
    ) in text
    assert "shared memory takes 0.25x the time of the binary extension (4.0x faster)" in text
    assert "Over gRPC, shared memory takes 0.20x the time of tritonclient.grpc's tensor" in text
    assert "The bigger the tensor, the more shared memory saves: 0.60x" in text
    assert "over gRPC the more, 0.73x and 0.20x of the ordinary tensor's time" in text
    image, image_grpc, embeddings, embeddings_grpc = kserve_shm.advice_rows(tmp_path, TIE)
    assert image[0] == image_grpc[0] == "image tensor"
    assert image[2] == "Triton's system shared memory (`system_shared_memory`)"
    assert image[3].startswith("0.26x the time of the `tensor` codec per request")
    assert image_grpc[2] == "Triton's system shared memory (`system_shared_memory`) over `grpc`"
    assert image_grpc[3].startswith("0.20x the time of the ordinary tensor")
    assert embeddings[0] == embeddings_grpc[0] == "embeddings"


def test_data_that_turn_around_turn_the_findings_and_the_advice(tmp_path: Path) -> None:
    _write(
        tmp_path,
        _info(
            "embed-32x1024",
            131072,
            {"shm": 2000.0, "binary": 1000.0, "tensor": 1050.0, "grpc_shm": 1300.0, "grpc": 1000.0},
        ),
    )
    text = kserve_shm.section(tmp_path)
    assert "shared memory takes 2.00x the time of the binary extension (slower)" in text
    assert "the `tensor` codec and the binary extension cost the same within 10% (1.05x)" in text
    assert (
        "Over gRPC, shared memory takes 1.30x the time of tritonclient.grpc's tensor (slower)"
        in text
    )
    row, grpc_row = kserve_shm.advice_rows(tmp_path, TIE)
    assert row[2] == "the binary tensor data extension (`binary_tensor_data`)"
    assert grpc_row[2] == "the ordinary tensor (`raw_input_contents`) over `grpc`"
