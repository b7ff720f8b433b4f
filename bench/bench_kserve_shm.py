"""A big tensor to a KServe v2 server on the same host, over HTTP three ways (Triton's system
shared memory extension, its binary tensor data extension, inferwire's ``tensor`` codec) and
over gRPC two ways (shared memory, and tritonclient.grpc's ordinary tensor path).

``bench_kserve_shm``, per workload (``image-fp32``: one 1x3x224x224 FP32 tensor, 588 KiB;
``embed-32x1024``: 32 FP32 embeddings of 1,024 dims, 128 KiB): one ``inferwire serve
--transport http1 --codec tensor --allow-client-shm`` process and one ``--transport grpc`` (the
same, it takes client regions), the echo model; the HTTP paths through one tritonclient.http
client (its geventhttpclient connection) and the gRPC paths through one tritonclient.grpc
client, so on each protocol the paths differ only in how the tensor travels. One request is
what a user does for one inference, whole:

- ``shm``: copy the array into a registered input region (``set_shared_memory_region``), infer
  with the input and the output both in regions (``InferInput.set_shared_memory``,
  ``InferRequestedOutput.set_shared_memory``), take the output as a numpy view of its region
  (``get_contents_as_numpy``). The regions are registered once, before timing, as a user does.
- ``binary``: the binary tensor data extension (``set_data_from_numpy(binary_data=True)``, the
  output requested as binary data), the output from ``InferResult.as_numpy``.
- ``tensor``: the request as an :class:`~inferwire.codecs.InferRequest` in the ``tensor``
  codec, posted to the same ``/v2/models/{m}/infer`` with the codec's media type, the answer
  decoded by the codec (tritonclient's own connection carries it: ``_post``, its only entry for
  a body it did not build).
- ``grpc_shm``: ``shm``'s steps with tritonclient.grpc, the same objects registered with the
  gRPC server under the same names.
- ``grpc``: tritonclient.grpc's ordinary path (``set_data_from_numpy``: the tensor's bytes in
  ``raw_input_contents``, the output from ``raw_output_contents`` by ``as_numpy``).

pytest-benchmark times ``shm``. The comparison is paired (as
:func:`~inferwire.bench.measure.paired.paired_ratio`, over every path): ``ROUNDS`` rounds, each
timing every path for ``MIN_SAMPLE_S`` worth of requests (each request timed, the round's
figure their median), one after the other in an order that rotates from round to round;
``extra_info`` holds each path's median over the rounds per request (``*_us``), the median of
the per-round ratios (``shm_vs_binary``, ``tensor_vs_binary``, ``shm_vs_tensor``,
``grpc_shm_vs_grpc``), the CPU time per request over the rounds of the server process that
served the path (``server_cpu_*_us``, its CPU clock read around each sample), the request
body's bytes on the wire (``request_bytes_*``), and ``correct``: every path's answer was the
input, bit for bit, after the timing. The servers are pinned to one core and this process to
the other when there are two.
"""

from __future__ import annotations

import contextlib
import gc
import os
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.grpc._utils as triton_grpc_utils
import tritonclient.http as triton
import tritonclient.utils.shared_memory as shm

import inferwire.codecs as ic
from inferwire import workloads
from inferwire.bench.procs import placement
from inferwire.transports import server_process

GROUP: Final = "kserve shm"
WORKLOADS: Final = ("image-fp32", "embed-32x1024")
PATHS: Final = ("shm", "binary", "tensor", "grpc_shm", "grpc")
GRPC_PATHS: Final = ("grpc_shm", "grpc")
"""The paths the gRPC server serves (the rest, the HTTP one's)."""
CODEC: Final = "tensor"
MODEL: Final = "echo"
ROUNDS: Final = 15
MIN_SAMPLE_S: Final = 0.02


@dataclass
class _Served:
    """The server processes, their clients, and this process's affinity to restore."""

    server: server_process.ServerProcess
    client: Any
    own_affinity: set[int]
    codec: ic.Codec
    grpc_server: server_process.ServerProcess
    grpc_client: Any


@pytest.fixture(scope="module")
def served() -> Iterator[_Served]:
    own = os.sched_getaffinity(0)
    cores = placement.split_cores()
    server = server_process.serve("http1", CODEC, "--allow-client-shm")
    grpc_server = server_process.serve("grpc", CODEC, "--allow-client-shm")
    with contextlib.ExitStack() as stack:
        for process in (server, grpc_server):
            process.start()
            stack.callback(process.stop)
        stack.callback(os.sched_setaffinity, 0, own)
        if cores is not None:
            for process in (server, grpc_server):
                assert process.process is not None
                placement.pin_threads(process.process.pid, cores[0])
            os.sched_setaffinity(0, {cores[1]})
        client = triton.InferenceServerClient(server.address, network_timeout=60.0)
        stack.callback(client.close)
        stack.callback(client.unregister_system_shared_memory)
        grpc_client = triton_grpc.InferenceServerClient(grpc_server.address)
        stack.callback(grpc_client.close)
        stack.callback(grpc_client.unregister_system_shared_memory)
        yield _Served(server, client, own, ic.get(CODEC), grpc_server, grpc_client)


def _tensor(workload: str) -> ic.Tensor:
    """The workload's one tensor: the image request's input, or the embeddings as a tensor."""
    (message,) = workloads.get(workload).messages()
    if isinstance(message, ic.InferRequest):
        return message.inputs[0]
    if isinstance(message, ic.EmbeddingBatch):
        vectors = message.vectors
        return ic.Tensor(name="embeddings", datatype="FP32", shape=vectors.shape, data=vectors)
    raise TypeError(f"{workload}: no tensor in a {type(message).__name__}")


@contextlib.contextmanager
def _regions(clients: tuple[Any, ...], nbytes: int) -> Iterator[tuple[Any, Any]]:
    """An input and an output region of ``nbytes`` each, made and registered with each of
    ``clients``' servers; removed after."""
    tag = uuid.uuid4().hex[:12]
    made = []
    try:
        for side in ("in", "out"):
            name, key = f"{side}-{tag}", f"/inferwire-bench-{side}-{tag}"
            handle = shm.create_shared_memory_region(name, key, nbytes, create_only=True)
            made.append(handle)
            for client in clients:
                client.register_system_shared_memory(name, key, nbytes)
        yield made[0], made[1]
    finally:
        for side in ("in", "out"):
            for client in clients:
                client.unregister_system_shared_memory(f"{side}-{tag}")
        for handle in made:
            shm.destroy_shared_memory_region(handle)


def _paths(
    served: _Served, tensor: ic.Tensor, regions: tuple[Any, Any]
) -> tuple[dict[str, Callable[[], np.ndarray[Any, Any]]], dict[str, int]]:
    """Each path as one whole request returning the output array; and its request body's
    bytes."""
    client, codec = served.client, served.codec
    array = np.ascontiguousarray(tensor.data)
    dtype, shape, nbytes = array.dtype, list(array.shape), array.nbytes
    region_in, region_out = regions
    in_name, out_name = region_in._triton_shm_name, region_out._triton_shm_name

    shm_input = triton.InferInput(tensor.name, shape, tensor.datatype)
    shm_input.set_shared_memory(in_name, nbytes)
    shm_output = triton.InferRequestedOutput("output_0", binary_data=False)
    shm_output.set_shared_memory(out_name, nbytes)

    def by_shm() -> np.ndarray[Any, Any]:
        shm.set_shared_memory_region(region_in, [array])
        client.infer(MODEL, [shm_input], outputs=[shm_output])
        out: np.ndarray[Any, Any] = shm.get_contents_as_numpy(region_out, dtype, shape)
        return out

    binary_input = triton.InferInput(tensor.name, shape, tensor.datatype)
    binary_output = triton.InferRequestedOutput("output_0", binary_data=True)

    def by_binary() -> np.ndarray[Any, Any]:
        binary_input.set_data_from_numpy(array, binary_data=True)
        result = client.infer(MODEL, [binary_input], outputs=[binary_output])
        out: np.ndarray[Any, Any] = result.as_numpy("output_0")
        return out

    request = ic.InferRequest(model=MODEL, id="", inputs=(tensor,))
    headers = {"Content-Type": codec.media_type}

    def by_tensor() -> np.ndarray[Any, Any]:
        body = codec.encode(request)
        response = client._post(f"v2/models/{MODEL}/infer", body, headers, None)
        answer = response.read()
        if response.status_code != 200:
            raise AssertionError(f"tensor codec: {response.status_code} {answer[:200]!r}")
        return codec.decode(answer, ic.InferResponse).outputs[0].data

    grpc_paths, grpc_sizes = _grpc_paths(served.grpc_client, tensor, regions)
    binary_input.set_data_from_numpy(array, binary_data=True)
    body = triton.InferenceServerClient.generate_request_body
    sizes = {
        "shm": len(body([shm_input], [shm_output])[0]),
        "binary": len(body([binary_input], [binary_output])[0]),
        "tensor": len(codec.encode(request)),
        **grpc_sizes,
    }
    return {"shm": by_shm, "binary": by_binary, "tensor": by_tensor, **grpc_paths}, sizes


def _grpc_paths(
    client: Any, tensor: ic.Tensor, regions: tuple[Any, Any]
) -> tuple[dict[str, Callable[[], np.ndarray[Any, Any]]], dict[str, int]]:
    """``grpc_shm`` and ``grpc`` as :func:`_paths` gives the HTTP ones; the sizes are the
    serialized ``ModelInferRequest``'s (gRPC's 5-byte message prefix and HTTP/2 framing
    not counted)."""
    array = np.ascontiguousarray(tensor.data)
    dtype, shape, nbytes = array.dtype, list(array.shape), array.nbytes
    region_in, region_out = regions
    shm_input = triton_grpc.InferInput(tensor.name, shape, tensor.datatype)
    shm_input.set_shared_memory(region_in._triton_shm_name, nbytes)
    shm_output = triton_grpc.InferRequestedOutput("output_0")
    shm_output.set_shared_memory(region_out._triton_shm_name, nbytes)

    def by_shm() -> np.ndarray[Any, Any]:
        shm.set_shared_memory_region(region_in, [array])
        client.infer(MODEL, [shm_input], outputs=[shm_output])
        out: np.ndarray[Any, Any] = shm.get_contents_as_numpy(region_out, dtype, shape)
        return out

    plain_input = triton_grpc.InferInput(tensor.name, shape, tensor.datatype)
    plain_output = triton_grpc.InferRequestedOutput("output_0")

    def by_tensor() -> np.ndarray[Any, Any]:
        plain_input.set_data_from_numpy(array)
        result = client.infer(MODEL, [plain_input], outputs=[plain_output])
        out: np.ndarray[Any, Any] = result.as_numpy("output_0")
        return out

    plain_input.set_data_from_numpy(array)

    def size(inputs: list[Any], outputs: list[Any]) -> int:
        request = triton_grpc_utils._get_inference_request(
            MODEL, inputs, "", "", outputs, 0, False, False, 0, None, None
        )
        return int(request.ByteSize())

    sizes = {
        "grpc_shm": size([shm_input], [shm_output]),
        "grpc": size([plain_input], [plain_output]),
    }
    return {"grpc_shm": by_shm, "grpc": by_tensor}, sizes


def _calls(work: Callable[[], Any], min_sample_s: float) -> int:
    """How many requests one sample needs to last ``min_sample_s``, from the quickest of
    three warm ones (as :mod:`inferwire.bench.measure.paired` sizes a side)."""
    if min_sample_s <= 0:
        return 1
    quickest = min(min(_timed(work, 1)) for _ in range(3))
    return max(1, min(1000, round(min_sample_s / max(quickest, 1e-9))))


def _timed(work: Callable[[], Any], calls: int) -> list[float]:
    """Each of ``calls`` requests' seconds."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return times


def _interleaved(
    paths: dict[str, Callable[[], Any]],
    rounds: int,
    min_sample_s: float,
    server_pids: dict[str, int],
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Per path, its median seconds per request in each round; and the CPU seconds per request
    over all rounds of the server that serves it (``server_pids``, by path). The order of the
    paths rotates from round to round. A round's figure is a median, not a mean, of its
    requests: on a shared machine a request now and then waits milliseconds for a core, and a
    mean carries those waits into every ratio."""
    calls = {name: _calls(work, min_sample_s) for name, work in paths.items()}
    clocks = {name: placement.cpu_clock(server_pids[name]) for name in paths}
    per_round: dict[str, list[float]] = {name: [] for name in paths}
    cpu_ns = dict.fromkeys(paths, 0)
    order = list(paths)
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()  # as paired_ratio and pytest-benchmark time: no collection billed to one path
    try:
        for i in range(rounds):
            turn = order[i % len(order) :] + order[: i % len(order)]
            for name in turn:
                before = time.clock_gettime_ns(clocks[name])
                per_round[name].append(statistics.median(_timed(paths[name], calls[name])))
                cpu_ns[name] += time.clock_gettime_ns(clocks[name]) - before
    finally:
        if enabled:
            gc.enable()
    cpu_s = {name: cpu_ns[name] / 1e9 / (calls[name] * rounds) for name in paths}
    return per_round, cpu_s


def _ratio(per_round: dict[str, list[float]], subject: str, baseline: str) -> float:
    return statistics.median(
        a / b for a, b in zip(per_round[subject], per_round[baseline], strict=True)
    )


@pytest.mark.parametrize("workload", WORKLOADS)
def bench_kserve_shm(benchmark: Any, served: _Served, workload: str) -> None:
    tensor = _tensor(workload)
    expected = np.ascontiguousarray(tensor.data).tobytes()
    nbytes = len(expected)
    with _regions((served.client, served.grpc_client), nbytes) as regions:
        paths, sizes = _paths(served, tensor, regions)
        benchmark.group = GROUP
        benchmark(paths["shm"])
        rounds = 1 if benchmark.disabled else ROUNDS
        sample_s = 0.0 if benchmark.disabled else MIN_SAMPLE_S
        pids = {}
        for name in PATHS:
            process = (served.grpc_server if name in GRPC_PATHS else served.server).process
            assert process is not None
            pids[name] = process.pid
        per_round, cpu_s = _interleaved(paths, rounds, sample_s, pids)
        correct = {name: work().tobytes() == expected for name, work in paths.items()}
    medians = {name: statistics.median(times) for name, times in per_round.items()}
    benchmark.extra_info.update(
        workload=workload,
        datatype=tensor.datatype,
        shape=list(tensor.shape),
        tensor_bytes=nbytes,
        transport="http1",
        client="tritonclient.http",
        grpc_transport="grpc",
        grpc_client="tritonclient.grpc",
        server_codec=CODEC,
        rounds=rounds,
        **{f"{name}_us": medians[name] * 1e6 for name in PATHS},
        **{f"server_cpu_{name}_us": cpu_s[name] * 1e6 for name in PATHS},
        **{f"request_bytes_{name}": sizes[name] for name in PATHS},
        shm_vs_binary=_ratio(per_round, "shm", "binary"),
        tensor_vs_binary=_ratio(per_round, "tensor", "binary"),
        shm_vs_tensor=_ratio(per_round, "shm", "tensor"),
        grpc_shm_vs_grpc=_ratio(per_round, "grpc_shm", "grpc"),
        **{f"correct_{name}": correct[name] for name in PATHS},
        correct=all(correct.values()),
        server_loop=served.server.loop,
    )
    assert all(correct.values()), f"{workload}: a path's answer differs: {correct}"
