"""The report's serving section, from ``raw/serving.json`` (``bench/bench_serving.py``): what
a FastAPI server pays per token the ways serving code streams today, against the
:mod:`inferwire.serving` helpers, and the client side (the openai SDK against the helper)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from . import spread
from .results import SERVING_RAW, infos
from .tables import table

SERVER_GROUP: Final = "serving-server"
"""The ``benchmark.group`` of the server-side benchmark."""
CLIENT_GROUP: Final = "serving-client"
ENCODE_GROUP: Final = "serving-encode"
HELPERS: Final = ("orjson", "msgspec-json", "delta")
SERVING_TARGET: Final = 3.0


def _x(value: float) -> str:
    return f"{value:.2f}x"


def _one(raw_dir: Path, group_key: str) -> dict[str, Any] | None:
    for info in infos(raw_dir / SERVING_RAW):
        if group_key in info:
            return info
    return None


def server_info(raw_dir: Path) -> dict[str, Any] | None:
    """The server-side benchmark's ``extra_info`` (None if the run has none)."""
    return _one(raw_dir, "paths")


def client_info(raw_dir: Path) -> dict[str, Any] | None:
    return _one(raw_dir, "parsers")


def encode_info(raw_dir: Path) -> dict[str, Any] | None:
    return _one(raw_dir, "ways")


def _ratio_cell(info: dict[str, Any], name: str) -> str:
    path = info["paths"][name]
    if name == info["baseline"]:
        return "1.00x (baseline)"
    text = spread.cell(info, f"paths.{name}.vs_pydantic", path["vs_pydantic"], _x)
    return f"{text} [{path['vs_pydantic_low']:.2f}-{path['vs_pydantic_high']:.2f}]"


def target_rows(raw_dir: Path) -> list[list[str]]:
    info = server_info(raw_dir)
    if info is None:
        return []
    target = float(info.get("target_ratio", SERVING_TARGET))
    rows = []
    for name in HELPERS:
        path = info["paths"].get(name)
        if path is None:
            continue
        ratio = path["vs_pydantic"]
        rows.append(
            [
                f"`inferwire.serving` with `{name}` vs vLLM's pydantic chunks (FastAPI, uvicorn)",
                "tokens per server CPU-second, paired",
                spread.cell(info, f"paths.{name}.vs_pydantic", ratio, _x),
                f">= {target:g}x",
                "met" if ratio >= target else "**missed**",
            ]
        )
    return rows


def best_helper(raw_dir: Path) -> tuple[str, float, float] | None:
    """(helper codec, its ratio over pydantic, the JSON helper's) for the advice: the fastest
    JSON helper (what an OpenAI client reads) and its ratio; None without a run."""
    info = server_info(raw_dir)
    if info is None:
        return None
    paths = info["paths"]
    json_helpers = {n: paths[n]["vs_pydantic"] for n in ("orjson", "msgspec-json") if n in paths}
    if not json_helpers:
        return None
    # within 10% the run cannot tell them apart: the first in the registry's order
    top = max(json_helpers.values())
    best = next(n for n, v in json_helpers.items() if v >= top * 0.9)
    return best, json_helpers[best], float(paths.get("delta", {}).get("vs_pydantic", 0.0))


def section(raw_dir: Path) -> str:
    """The report's serving section ("" if the run has none)."""
    info = server_info(raw_dir)
    if info is None:
        return ""
    paths = info["paths"]
    ways = (encode_info(raw_dir) or {}).get("ways", {})

    def alone(name: str) -> str:
        way = ways.get(name)
        return "" if way is None else f"{way['us_per_chunk']:.2f} ({way['vs_pydantic']:.1f}x)"

    rows = [
        [
            f"`{name}`",
            path["label"],
            f"{path['tokens_per_server_cpu_s']:,.0f}",
            f"{path['server_us_per_token']:,.1f}",
            _ratio_cell(info, name),
            alone(name),
            f"{path['tokens_per_s']:,.0f}",
            f"{path['wire_bytes_per_chunk']:,.0f}",
            "yes" if path["correct"] else "**no**",
        ]
        for name, path in paths.items()
    ]
    parts = [
        "## In your server: what serving code pays per token",
        "",
        f"One FastAPI app on uvicorn ({info.get('server_loop') or '?'}), pinned to one core, "
        f"streams the same `{info['workload']}` tokens (one token a chunk) each way: as vLLM's "
        "OpenAI server does (a pydantic chunk model per chunk, `model_dump_json`), as a "
        "hand-written app does (a dict, `json.dumps`), and through `inferwire.serving` "
        "(`ChunkBuilder` and the Starlette `stream_response`) with a codec; the JSON ways write "
        "the same OpenAI events. The streams are not paced: the generator is ahead of the "
        "wire, as in a busy server, where CPU per token is what limits it. The helpers then "
        "write the chunks the generator has ready at once in one write (never waiting for one), "
        "where the other ways write one a chunk; `orjson-per-chunk` is the helpers writing one "
        "a chunk too, the figure for a paced stream whose tokens come one at a time, which "
        "separates the encoding's share of the gain from the writes'. "
        f"{info['streams_per_round']} streams a round, {info['concurrency']} at a time; "
        f"every way once per round in a rotated order, {info['pairs']} rounds. *per server "
        "CPU-second*: tokens over the server process's CPU time, median over rounds; *vs "
        "pydantic*: the ratio within each round, median [lowest-highest round]. *chunk alone*: "
        "the way's generator drained in process, no server (making and encoding one chunk, "
        "the helpers one piece a chunk), median over interleaved rounds, and its speed-up over "
        "pydantic's; the rest of *server us per token* is the framework's and the server's. "
        "Every stream was decoded and checked against the workload.",
        "",
        table(
            [
                "way",
                "each chunk",
                "tokens per server CPU-second",
                "server us per token",
                "vs pydantic",
                "chunk alone, us",
                "tokens/s",
                "bytes per chunk",
                "correct",
            ],
            rows,
            left=(0, 1),
        ),
        "",
    ]
    client = client_info(raw_dir)
    if client is not None:
        parsers = client["parsers"]
        parts += [
            "The client side: one whole response parsed in process, one event a read, by the "
            "openai SDK (`chat.completions.create(stream=True)`'s `Stream` of "
            "`ChatCompletionChunk`) and by `inferwire.serving.httpx.iter_chunks` (the `orjson` "
            f"reader; the `delta` stream beside it), {client['rounds']} interleaved rounds, "
            "per chunk"
            + (
                f" (openai {client['versions']['openai']})."
                if "openai" in client.get("versions", {})
                else "."
            ),
            "",
            table(
                ["parser", "us per chunk", "SDK / this", "correct"],
                [
                    [
                        f"`{name}`",
                        spread.cell(
                            client,
                            f"parsers.{name}.us_per_chunk",
                            p["us_per_chunk"],
                            lambda v: f"{v:.2f}",
                        ),
                        spread.cell(client, f"parsers.{name}.vs_sdk", p["vs_sdk"], _x),
                        "yes" if p["correct"] else "**no**",
                    ]
                    for name, p in parsers.items()
                ],
            ),
            "",
        ]
    return "\n".join(parts)
