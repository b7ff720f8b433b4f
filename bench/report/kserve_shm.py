"""The report's section on Triton's system shared memory extension, from ``raw/kserve_shm.json``
(``bench/bench_kserve_shm.py``): per workload, one inference's cost over HTTP with the tensor in
shared memory, as the binary tensor data extension, and in the ``tensor`` codec, and over gRPC in
shared memory and as tritonclient.grpc's ordinary tensor, paired in one run; the findings, each
computed from those figures; and the "What should I use?" line for a big tensor between a client
and a server on the same host.

Nothing here is written ahead of the data: a finding that compares two paths states the ratio
the run measured and names the faster one by it, so a run that turns a result around turns the
sentence around with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from . import spread
from .results import KSERVE_SHM_RAW, records
from .tables import table

__all__ = ["KSERVE_SHM_RAW", "Row", "advice_rows", "findings", "rows", "section"]

GROUP: Final = "kserve shm"
"""The ``benchmark.group`` of bench_kserve_shm.py's results."""
PATHS: Final = ("shm", "binary", "tensor", "grpc_shm", "grpc")
"""The HTTP paths, then the gRPC ones."""
PATH_NAMES: Final = {
    "shm": "system shared memory (`system_shared_memory`)",
    "binary": "binary tensor data extension (`binary_tensor_data`)",
    "tensor": "`tensor` codec",
    "grpc_shm": "system shared memory (`system_shared_memory`) over `grpc`",
    "grpc": "ordinary tensor (`raw_input_contents`) over `grpc`",
}
"""As the advice names them: its verdicts compare the first name in backquotes."""
LABELS: Final = {"image-fp32": "image tensor", "embed-32x1024": "embeddings"}
"""The advice's payload names (``advice.PAYLOADS``) of the suite's workloads."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One workload's figures (see bench_kserve_shm.py for how each is measured)."""

    workload: str
    shape: tuple[int, ...]
    tensor_bytes: int
    us: dict[str, float]
    """Median per request, by path."""
    server_cpu_us: dict[str, float]
    request_bytes: dict[str, int]
    shm_vs_binary: float
    tensor_vs_binary: float
    shm_vs_tensor: float
    grpc_shm_vs_grpc: float
    correct: bool
    info: dict[str, Any]


def rows(path: Path) -> list[Row]:
    """The suite's rows, in the order they ran; none if the run has no such file."""
    out = []
    for info in records(path):
        if "shm_vs_binary" not in info:
            continue
        out.append(
            Row(
                workload=info["workload"],
                shape=tuple(info["shape"]),
                tensor_bytes=int(info["tensor_bytes"]),
                us={p: float(info[f"{p}_us"]) for p in PATHS},
                server_cpu_us={p: float(info[f"server_cpu_{p}_us"]) for p in PATHS},
                request_bytes={p: int(info[f"request_bytes_{p}"]) for p in PATHS},
                shm_vs_binary=float(info["shm_vs_binary"]),
                tensor_vs_binary=float(info["tensor_vs_binary"]),
                shm_vs_tensor=float(info["shm_vs_tensor"]),
                grpc_shm_vs_grpc=float(info["grpc_shm_vs_grpc"]),
                correct=bool(info["correct"]),
                info=info,
            )
        )
    return out


def _x(value: float) -> str:
    return f"{value:.2f}x"


def _us(value: float) -> str:
    return f"{value:,.0f}"


def _kib(count: int) -> str:
    return f"{count / 1024:,.1f} KiB" if count >= 1024 else f"{count} B"


def _compare(ratio: float, subject: str, baseline: str, tie: float) -> str:
    """``subject`` against ``baseline`` by a paired time ratio (subject / baseline)."""
    if abs(ratio - 1) <= tie:
        return f"{subject} and {baseline} cost the same within {tie:.0%} ({_x(ratio)})"
    if ratio < 1:
        return f"{subject} takes {_x(ratio)} the time of {baseline} ({1 / ratio:.1f}x faster)"
    return f"{subject} takes {_x(ratio)} the time of {baseline} (slower)"


def findings(found: list[Row], tie: float) -> list[str]:
    """One sentence per question, from the figures."""
    out = []
    for row in found:
        name = f"`{row.workload}` ({_kib(row.tensor_bytes)})"
        saved = row.server_cpu_us["binary"] - row.server_cpu_us["shm"]
        out.append(
            f"- {name}: "
            + _compare(row.shm_vs_binary, "shared memory", "the binary extension", tie)
            + "; "
            + _compare(row.shm_vs_tensor, "shared memory", "the `tensor` codec", tie)
            + "; "
            + _compare(row.tensor_vs_binary, "the `tensor` codec", "the binary extension", tie)
            + f". The server's CPU per request: {_us(row.server_cpu_us['shm'])} us with shared "
            f"memory, {_us(row.server_cpu_us['binary'])} us with the binary extension "
            f"({_us(saved)} us {'saved' if saved >= 0 else 'added'}); the request body "
            f"{_kib(row.request_bytes['shm'])} against {_kib(row.request_bytes['binary'])}. "
            "Over gRPC, "
            + _compare(row.grpc_shm_vs_grpc, "shared memory", "tritonclient.grpc's tensor", tie)
            + f"; server CPU {_us(row.server_cpu_us['grpc_shm'])} against "
            f"{_us(row.server_cpu_us['grpc'])} us."
            + ("" if row.correct else " **A path's answer was wrong in this run.**")
        )
    if len(found) >= 2:
        small, large = sorted(found, key=lambda r: r.tensor_bytes)[:: len(found) - 1]
        grows = large.shm_vs_binary < small.shm_vs_binary
        grpc_grows = large.grpc_shm_vs_grpc < small.grpc_shm_vs_grpc
        out.append(
            f"- The bigger the tensor, the {'more' if grows else 'less'} shared memory saves: "
            f"{_x(small.shm_vs_binary)} of the binary extension's time at "
            f"{_kib(small.tensor_bytes)}, {_x(large.shm_vs_binary)} at "
            f"{_kib(large.tensor_bytes)}; over gRPC the {'more' if grpc_grows else 'less'}, "
            f"{_x(small.grpc_shm_vs_grpc)} and {_x(large.grpc_shm_vs_grpc)} of the ordinary "
            "tensor's time."
        )
    return out


def section(raw_dir: Path, tie: float = 0.10) -> str:
    """The report's section ("" if the run has none)."""
    found = rows(raw_dir / KSERVE_SHM_RAW)
    if not found:
        return ""
    header = [
        "workload",
        "tensor",
        "shm",
        "binary",
        "`tensor`",
        "shm vs binary",
        "shm vs `tensor`",
        "gRPC shm",
        "gRPC tensor",
        "gRPC shm vs tensor",
        "server CPU shm / binary / `tensor` / gRPC shm / gRPC tensor",
        "correct",
    ]
    body = [
        [
            f"`{r.workload}`",
            f"{'x'.join(map(str, r.shape))}, {_kib(r.tensor_bytes)}",
            *(spread.cell(r.info, f"{p}_us", r.us[p], _us) for p in PATHS[:3]),
            spread.cell(r.info, "shm_vs_binary", r.shm_vs_binary, _x),
            spread.cell(r.info, "shm_vs_tensor", r.shm_vs_tensor, _x),
            *(spread.cell(r.info, f"{p}_us", r.us[p], _us) for p in PATHS[3:]),
            spread.cell(r.info, "grpc_shm_vs_grpc", r.grpc_shm_vs_grpc, _x),
            " / ".join(_us(r.server_cpu_us[p]) for p in PATHS),
            "yes" if r.correct else "**no**",
        ]
        for r in found
    ]
    return "\n".join(
        [
            "## A big tensor on the same host: shared memory",
            "",
            "One inference of the echo model on an `http1` server (`inferwire serve "
            "--allow-client-shm`, another process on this host), the whole of what a client "
            "does for it, three ways through the same HTTP client (tritonclient.http's "
            "connection): the tensor in Triton's system shared memory (copied into a registered "
            "input region, the output written by the server into a registered output region "
            "and read there), as the binary tensor data extension, and in inferwire's `tensor` "
            "codec; and on a `grpc` server, two ways through one tritonclient.grpc client: "
            "shared memory, and its ordinary tensor (`raw_input_contents`). Median "
            "microseconds per "
            "request; *vs*: the median of per-round ratios, the paths interleaved in rotating "
            "order (paired); *server CPU*: the server process's CPU time per request, in us. "
            "*correct*: every path's output was the input, bit for bit. Regions are registered "
            "once, outside the timing, as a client does.",
            "",
            table(header, body, left=range(2)),
            "",
            *findings(found, tie),
            "",
        ]
    )


def advice_rows(raw_dir: Path, tie: float) -> list[list[str]]:
    """The advice's lines per payload for a client on the server's host, over HTTP and over
    gRPC (:func:`_http_advice`, :func:`_grpc_advice`). [] without the suite's file."""
    out = []
    for row in rows(raw_dir / KSERVE_SHM_RAW):
        if not row.correct:
            continue
        out.append(_http_advice(row, tie))
        out.append(_grpc_advice(row, tie))
    return out


def _http_advice(row: Row, tie: float) -> list[str]:
    """The line for a tritonclient.http client on the server's host: shared memory when the
    run measured it faster than the better of the binary extension and the ``tensor`` codec by
    more than ``tie``, else that one (named with shared memory when within ``tie``)."""
    other = "binary" if row.us["binary"] <= row.us["tensor"] else "tensor"
    ratio = row.shm_vs_binary if other == "binary" else row.shm_vs_tensor
    margin = (
        f"{_x(ratio)} the time of the {PATH_NAMES[other]} per request "
        f"({_kib(row.tensor_bytes)} tensor), "
        f"{_us(row.server_cpu_us['shm'])} against {_us(row.server_cpu_us[other])} us "
        "of server CPU"
    )
    if ratio < 1 - tie:
        use = f"Triton's {PATH_NAMES['shm']}"
    elif ratio > 1 + tie:
        use = f"the {PATH_NAMES[other]}"
    else:
        use = f"the {PATH_NAMES[other]} or system shared memory (within {tie:.0%})"
    return [
        LABELS.get(row.workload, row.workload),
        "client on the server's host (KServe v2, tritonclient)",
        use,
        margin,
        "client and server on different hosts: the binary tensor data extension or "
        "the `tensor` codec (see service to service)",
    ]


def _grpc_advice(row: Row, tie: float) -> list[str]:
    """The line for a tritonclient.grpc client on the server's host: shared memory or the
    ordinary tensor, by their paired ratio."""
    ratio = row.grpc_shm_vs_grpc
    if ratio < 1 - tie:
        use = f"Triton's {PATH_NAMES['grpc_shm']}"
    elif ratio > 1 + tie:
        use = f"the {PATH_NAMES['grpc']}"
    else:
        use = f"the {PATH_NAMES['grpc']} or system shared memory (within {tie:.0%})"
    return [
        LABELS.get(row.workload, row.workload),
        "client on the server's host (KServe v2 over gRPC, tritonclient.grpc)",
        use,
        f"{_x(ratio)} the time of the {PATH_NAMES['grpc']} per request "
        f"({_kib(row.tensor_bytes)} tensor), {_us(row.server_cpu_us['grpc_shm'])} against "
        f"{_us(row.server_cpu_us['grpc'])} us of server CPU",
        "client and server on different hosts: the ordinary tensor",
    ]
