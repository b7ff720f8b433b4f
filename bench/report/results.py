"""The raw results of a run as the report reads them: the file of each suite under ``raw/``,
the codec results as :class:`Result`, and any suite's benchmarks as plain records."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

CODECS_RAW: Final = "codecs.json"
TRANSPORTS_RAW: Final = "transports.json"
CONNECTIONS_RAW: Final = "connections.json"
STAGES_RAW: Final = "stages.json"
LOAD_RAW: Final = "load.json"
PEERS_RAW: Final = "peers.json"
FAULTS_RAW: Final = "faults.json"
RUN_KEY: Final = "run"
"""In each raw file: the run it belongs to (repeats, stability), written by ``inferwire bench``."""
REPEATS_DIR: Final = "repeats"
"""``raw/repeats/<n>/``: repeat n of a repeated run, each suite's file as one run wrote it."""


@dataclass(frozen=True, slots=True)
class Result:
    codec: str
    workload: str
    op: str
    median_s: float
    iqr_s: float
    rounds: int
    wire_bytes: int
    messages: int
    correct: bool
    paired_ratio: float | None = None
    """codec / direct from alternating back-to-back runs (wrapper benchmarks only)."""
    paired_library_share: float | None = None
    """library / codec, the same way."""
    paired_ratio_unary: float | None = None
    """delta / orjson with orjson unframed (the delta time target's second reading)."""

    @property
    def spread(self) -> float:
        return self.iqr_s / self.median_s if self.median_s else 0.0


def codec_results(path: Path) -> tuple[list[Result], dict[str, Any]]:
    """The codec results of ``raw/codecs.json``, and the whole file (its machine info)."""
    raw = json.loads(path.read_text())
    results = []
    for bench in raw["benchmarks"]:
        info = bench["extra_info"]
        stats = bench["stats"]
        results.append(
            Result(
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
            )
        )
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
