"""The standard gRPC services every gRPC server of inferwire runs beside its own: health
checking (``grpc.health.v1.Health``, grpc's doc/health-checking.md) and server reflection
(``grpc.reflection.v1alpha.ServerReflection``, grpc's doc/server-reflection.md), from the
``grpcio-health-checking`` and ``grpcio-reflection`` packages.

Health answers ``SERVING`` for the whole server (the empty service name) and for each service
by its full name while the server runs, and ``NOT_SERVING`` to every check and watch once it
begins to stop, so a load balancer drains it before the port closes. Reflection lists the
services and serves their descriptors, so ``grpcurl`` and other tools need no ``.proto``.

The descriptors come from a pool assembled here: the KServe messages live in a pool of their
own (see ``schemas/generate.py``), not in protobuf's default pool where the reflection
service would look by default.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import grpc.aio
from google.protobuf import descriptor, descriptor_pb2, descriptor_pool
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2


def _pool(files: Iterable[descriptor.FileDescriptor]) -> descriptor_pool.DescriptorPool:
    """A pool holding ``files`` and everything they import, each added after its imports."""
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(file: descriptor.FileDescriptor) -> None:
        if file.name in added:
            return
        for dependency in file.dependencies:
            add(dependency)
        proto = descriptor_pb2.FileDescriptorProto()
        file.CopyToProto(proto)
        pool.AddSerializedFile(proto.SerializeToString())
        added.add(file.name)

    for file in files:
        add(file)
    return pool


class StandardServices:
    """Health and reflection for ``services`` (service descriptors) on one ``grpc.aio`` server.
    :meth:`add` before the server starts, :meth:`stopping` before it stops."""

    def __init__(self, services: Sequence[descriptor.ServiceDescriptor]) -> None:
        self.services = services
        self.health = health.aio.HealthServicer()

    @property
    def names(self) -> list[str]:
        """Every service the server answers, the standard ones included."""
        own = [service.full_name for service in self.services]
        return [*own, health.SERVICE_NAME, reflection.SERVICE_NAME]

    async def add(self, server: grpc.aio.Server) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        for name in [health.OVERALL_HEALTH, *self.names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        files = [service.file for service in self.services]
        pool = _pool([*files, health_pb2.DESCRIPTOR, reflection_pb2.DESCRIPTOR])
        reflection.enable_server_reflection(self.names, server, pool=pool)

    async def stopping(self) -> None:
        """Report every service ``NOT_SERVING``, to checks and watches alike."""
        await self.health.enter_graceful_shutdown()
