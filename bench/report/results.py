"""The raw results of a run as the report reads them: the file of each suite under ``raw/``,
the codec results as :class:`Result`, and any suite's benchmarks as plain records."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from . import spread

CODECS_RAW: Final = "codecs.json"
TRANSPORTS_RAW: Final = "transports.json"
CONNECTIONS_RAW: Final = "connections.json"
STAGES_RAW: Final = "stages.json"
LOAD_RAW: Final = "load.json"
PEERS_RAW: Final = "peers.json"
FAULTS_RAW: Final = "faults.json"
GRPC_RAW: Final = "grpc.json"
SERVING_RAW: Final = "serving.json"
COMPRESSION_RAW: Final = "compression.json"
KSERVE_SHM_RAW: Final = "kserve_shm.json"
RUN_KEY: Final = "run"
"""In each raw file: the run it belongs to (repeats, stability), written by ``inferwire bench``."""
REPEATS_DIR: Final = "repeats"
"""``raw/repeats/<n>/``: repeat n of a repeated run, each suite's file as one run wrote it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Result:
    """One codec's figures for one workload and operation."""

    codec: str
    workload: str
    op: str
    median_s: float
    """Per call: the whole message or stream (this machine's, at the time of the run)."""
    iqr_s: float
    rounds: int
    wire_bytes: int
    messages: int
    correct: bool
    paired_ratio: float | None = None
    """Paired within a run: codec / direct (wrapper levels), large / small decode (flat
    decode), delta / orjson (delta time), memcpy / tensor encode (memcpy, tobytes)."""
    paired_library_share: float | None = None
    """library / codec, the same way."""
    paired_ratio_unary: float | None = None
    """delta / orjson with orjson unframed (the delta time target's second reading)."""
    paired_ratio_upb: float | None = None
    """flatbuffers / protobuf through upb's messages (the FlatBuffers encode target: protobuf as
    users get it, where inferwire's own protobuf path for token chunks is compiled)."""
    wire_bytes_by_codec: Mapping[str, int] = field(default_factory=dict)
    """Each codec's bytes in a benchmark of several codecs on one workload (the FlatBuffers
    encode targets': flatbuffers, the builder, the baseline and its variants)."""
    paired_vs_json: float | None = None
    """json's time / this codec's in the same rounds (a speed-up; the library level: json's
    library call / this one's)."""
    paired_vs_orjson: float | None = None
    """orjson's time / this codec's in the same rounds."""
    repeats: Mapping[str, list[float]] = field(default_factory=dict)
    """Each repeat's value of a float field, by field name (none for a run of one repeat)."""

    @property
    def spread(self) -> float:
        return self.iqr_s / self.median_s if self.median_s else 0.0

    def cell(self, name: str, fmt: Callable[[float], str]) -> str:
        """Field ``name`` formatted, with its range over the run's repeats (``spread.cell``)."""
        value = getattr(self, name)
        assert isinstance(value, float | int), name
        return spread.cell({spread.REPEATS_KEY: self.repeats}, name, float(value), fmt)


def _repeats(info: Mapping[str, Any], paths: Mapping[str, str]) -> dict[str, list[float]]:
    """The repeats of the figures at ``paths`` (field name -> dotted path in the raw file)."""
    return {name: got for name, path in paths.items() if (got := spread.values(info, path))}


def _interleaved(info: dict[str, Any]) -> list[Result]:
    """One Result per codec of a ``bench_codecs_interleaved`` benchmark."""
    out = []
    for codec, figures in info["codecs"].items():
        paths = {
            "median_s": f"codecs.{codec}.median_s",
            "iqr_s": f"codecs.{codec}.iqr_s",
            "paired_vs_json": f"vs_json.{codec}",
            "paired_vs_orjson": f"vs_orjson.{codec}",
        }
        out.append(
            Result(
                codec=codec,
                workload=info["workload"],
                op=info["op"],
                median_s=figures["median_s"],
                iqr_s=figures["iqr_s"],
                rounds=info["rounds"],
                wire_bytes=figures["wire_bytes"],
                messages=info["messages"],
                correct=figures["correct"],
                paired_vs_json=info.get("vs_json", {}).get(codec),
                paired_vs_orjson=info.get("vs_orjson", {}).get(codec),
                repeats=_repeats(info, paths),
            )
        )
    return out


def _wrapper(info: dict[str, Any]) -> list[Result]:
    """One Result per codec and level (op ``codec-encode``, ``direct-encode``, ...) of a
    ``bench_wrapper`` benchmark; the paired figures sit on the level they describe."""
    out = []
    op = info["op"]
    for codec, levels in info["levels"].items():
        for level in ("codec", "direct", "library"):
            paired = {
                "codec": {
                    "paired_ratio": f"codec_vs_direct.{codec}",
                    "paired_library_share": f"library_share.{codec}",
                },
                "library": {"paired_vs_json": f"library_vs_json.{codec}"},
            }.get(level, {})
            figures = {name: _at(info, path) for name, path in paired.items()}
            out.append(
                Result(
                    codec=codec,
                    workload=info["workload"],
                    op=f"{level}-{op}",
                    median_s=levels[level]["median_s"],
                    iqr_s=levels[level]["iqr_s"],
                    rounds=info["rounds"],
                    wire_bytes=levels["wire_bytes"],
                    messages=info["messages"],
                    correct=levels["correct"],
                    paired_ratio=figures.get("paired_ratio"),
                    paired_library_share=figures.get("paired_library_share"),
                    paired_vs_json=figures.get("paired_vs_json"),
                    repeats=_repeats(
                        info,
                        {
                            "median_s": f"levels.{codec}.{level}.median_s",
                            "iqr_s": f"levels.{codec}.{level}.iqr_s",
                            **paired,
                        },
                    ),
                )
            )
    return out


def _at(info: Mapping[str, Any], path: str) -> float | None:
    """The number at a dotted path, if the run has it."""
    value: Any = info
    for key in path.split("."):
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    return float(value)


def _single(bench: dict[str, Any]) -> Result:
    """A benchmark of one codec (the targets, and a run's files from before the interleaved
    benchmarks: ``bench_codec``, per-level ``bench_wrapper``)."""
    info = bench["extra_info"]
    stats = bench["stats"]
    paths = {
        "median_s": "stats.median",
        "paired_ratio": "paired_ratio",
        "paired_library_share": "paired_library_share",
        "paired_ratio_unary": "paired_ratio_unary",
        "paired_ratio_upb": "upb_paired_ratio",
    }
    return Result(
        codec=info["codec"],
        workload=info["workload"],
        op=info["op"],
        median_s=stats["median"],
        iqr_s=stats["iqr"],
        rounds=stats["rounds"],
        wire_bytes=info["wire_bytes"],
        messages=info["messages"],
        correct=info["correct"],
        paired_ratio=info.get("paired_ratio"),
        paired_library_share=info.get("paired_library_share"),
        paired_ratio_unary=info.get("paired_ratio_unary"),
        paired_ratio_upb=info.get("upb_paired_ratio"),
        wire_bytes_by_codec=info.get("wire_bytes_by_codec", {}),
        repeats=_repeats(info, paths),
    )


def codec_results(path: Path) -> tuple[list[Result], dict[str, Any]]:
    """The codec results of ``raw/codecs.json``, and the whole file (its machine info).

    Interleaved benchmarks give one Result per codec; a one-codec ``bench_codec`` entry is
    read only where no interleaved benchmark covers its (codec, workload, op): a file written
    before the interleaved benchmarks (or with ``standalone`` ones selected) still reports."""
    raw = json.loads(path.read_text())
    grouped: list[Result] = []
    single: list[Result] = []
    for bench in raw["benchmarks"]:
        info = bench["extra_info"]
        if "codecs" in info:
            grouped += _interleaved(info)
        elif "levels" in info:
            grouped += _wrapper(info)
        else:
            single.append(_single(bench))
    covered = {(r.codec, r.workload, r.op) for r in grouped}
    results = grouped + [r for r in single if (r.codec, r.workload, r.op) not in covered]
    return results, raw


def records(path: Path) -> list[dict[str, Any]]:
    """Each benchmark's ``extra_info`` with its median and interquartile range (``median_s``,
    ``iqr_s``); none if the run has no such file."""
    if not path.exists():
        return []
    raw = json.loads(path.read_text())
    return [
        {
            **bench["extra_info"],
            "median_s": bench["stats"]["median"],
            "iqr_s": bench["stats"]["iqr"],
        }
        for bench in raw["benchmarks"]
    ]


def infos(path: Path) -> list[dict[str, Any]]:
    """Each benchmark's ``extra_info``; none if the run has no such file."""
    if not path.exists():
        return []
    return [bench["extra_info"] for bench in json.loads(path.read_text())["benchmarks"]]
