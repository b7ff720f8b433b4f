"""The standard gRPC services beside the ``grpclib`` server's own: health checking
(``grpc.health.v1.Health``, grpc's doc/health-checking.md) and server reflection
(``grpc.reflection.v1alpha.ServerReflection``, grpc's doc/server-reflection.md), what the
``grpc`` server runs with grpcio's packages (:mod:`inferwire.transports.grpc_standard`).

They are written here rather than taken from ``grpclib.health`` and ``grpclib.reflection``
because those modules register their own copies of the standard ``.proto`` files in protobuf's
default pool under other file names: in a process that also imports grpcio's
(``grpc_health.v1.health_pb2``, as the ``grpc`` server does) the second import fails with
"duplicate symbol 'grpc.health.v1.HealthCheckRequest'". The messages here are grpcio's when its
packages are installed, else grpclib's: one set per process, whichever the ``grpc`` server uses.

Health answers ``SERVING`` for the whole server (the empty name) and each service by its full
name, ``NOT_FOUND`` to a check of any other, and ``NOT_SERVING`` to every check and watch once
:meth:`GrpclibStandard.stopping` is called, so a load balancer drains the server before its
port closes. Reflection lists the services and serves the descriptor files from protobuf's
default pool (where ``schemas/inferwire_pb2.py`` registers ``inferwire.proto``), each with the
files it imports. Requests are read bounded (``max_message_bytes``) like the ``Inference``
service's; bytes that are not the request message are ``INVALID_ARGUMENT``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any, Final

from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf import message as protobuf_message

from inferwire._runtime.extras import needs_extras

from . import grpclib_wire as wire
from .errors import MessageTooLargeError, ProtocolError

with needs_extras("the grpclib transport"):
    import grpclib.const
    import grpclib.exceptions
    import grpclib.server
    from grpclib.const import Cardinality, Status

try:  # grpcio's, when installed: the messages the grpc server's standard services use
    from grpc_health.v1 import health_pb2
    from grpc_reflection.v1alpha import reflection_pb2
except (ModuleNotFoundError, TypeError):  # TypeError: grpclib's copies registered first
    from grpclib.health.v1 import health_pb2
    from grpclib.reflection.v1alpha import reflection_pb2

HEALTH_SERVICE: Final = "grpc.health.v1.Health"
REFLECTION_SERVICE: Final = "grpc.reflection.v1alpha.ServerReflection"
_SERVING: Final = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING: Final = health_pb2.HealthCheckResponse.NOT_SERVING
_SERVICE_UNKNOWN: Final = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN

Stream = grpclib.server.Stream[Any, Any]


class GrpclibStandard:
    """Health and reflection for ``services`` (full names) on one grpclib server: served
    beside the service's own (grpclib takes it by its ``__mapping__``); :meth:`stopping` is
    called as the server begins to stop."""

    def __init__(self, services: Iterable[str], *, max_message_bytes: int) -> None:
        self.names = [*services, HEALTH_SERVICE, REFLECTION_SERVICE]
        self.max_message_bytes = max_message_bytes
        self.statuses: dict[str, int] = dict.fromkeys(["", *self.names], _SERVING)
        """The status of each name a check may ask about ("" is the whole server)."""
        self._watches: set[_Watch] = set()
        self._pool = descriptor_pool.Default()

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        """The methods, as grpclib's generated ``HealthBase`` and ``ServerReflectionBase``
        map them (bytes in and out: the server's codec passes bytes through)."""
        handler = grpclib.const.Handler
        health, reflection = f"/{HEALTH_SERVICE}", f"/{REFLECTION_SERVICE}"
        return {
            f"{health}/Check": handler(self._check, Cardinality.UNARY_UNARY, bytes, bytes),
            f"{health}/Watch": handler(self._watch, Cardinality.UNARY_STREAM, bytes, bytes),
            f"{reflection}/ServerReflectionInfo": handler(
                self._reflection, Cardinality.STREAM_STREAM, bytes, bytes
            ),
        }

    async def stopping(self, timeout_s: float = 1.0) -> None:
        """Report every name ``NOT_SERVING``, to checks and watches alike; returns once every
        watch has sent it (or after ``timeout_s``: a client that does not read holds none)."""
        for name in self.statuses:
            self.statuses[name] = _NOT_SERVING
        watches = list(self._watches)
        for watch in watches:
            watch.told.clear()
            watch.changed.set()
        if watches:
            waits = [asyncio.ensure_future(watch.told.wait()) for watch in watches]
            _, pending = await asyncio.wait(waits, timeout=timeout_s)
            for wait in pending:
                wait.cancel()

    # -- reading ------------------------------------------------------------------------------

    async def _next(self, stream: Stream, parse: Callable[[bytes], Any]) -> Any:
        """The call's next request message (None at its end), read bounded."""
        try:
            data = await wire.read_message(
                stream._stream, self.max_message_bytes, "grpclib standard service"
            )
        except MessageTooLargeError as exc:
            raise grpclib.exceptions.GRPCError(Status.RESOURCE_EXHAUSTED, str(exc)) from exc
        except (ProtocolError, wire.CutShortError) as exc:
            raise grpclib.exceptions.GRPCError(Status.INVALID_ARGUMENT, str(exc)) from exc
        if data is None:
            return None
        try:
            return parse(data)
        except protobuf_message.DecodeError as exc:
            raise grpclib.exceptions.GRPCError(
                Status.INVALID_ARGUMENT, f"not the request message: {exc}"
            ) from exc

    async def _request(self, stream: Stream, parse: Callable[[bytes], Any]) -> Any:
        request = await self._next(stream, parse)
        if request is None:
            raise grpclib.exceptions.GRPCError(Status.INVALID_ARGUMENT, "no request message")
        return request

    # -- health -------------------------------------------------------------------------------

    async def _check(self, stream: Stream) -> None:
        request = await self._request(stream, health_pb2.HealthCheckRequest.FromString)
        status = self.statuses.get(request.service)
        if status is None:  # doc/health-checking.md: an unknown service is NOT_FOUND
            raise grpclib.exceptions.GRPCError(
                Status.NOT_FOUND, f"unknown service {request.service!r}"
            )
        await stream.send_message(health_pb2.HealthCheckResponse(status=status).SerializeToString())

    async def _watch(self, stream: Stream) -> None:
        """The status now, then each change, until the client cancels or the server stops."""
        request = await self._request(stream, health_pb2.HealthCheckRequest.FromString)
        watch = _Watch()
        self._watches.add(watch)
        try:
            sent = None
            while True:
                watch.changed.clear()
                status = self.statuses.get(request.service, _SERVICE_UNKNOWN)
                if status != sent:
                    answer = health_pb2.HealthCheckResponse(status=status)
                    await stream.send_message(answer.SerializeToString())
                    sent = status
                watch.told.set()
                await watch.changed.wait()
        finally:
            watch.told.set()
            self._watches.discard(watch)

    # -- reflection ---------------------------------------------------------------------------

    async def _reflection(self, stream: Stream) -> None:
        parse = reflection_pb2.ServerReflectionRequest.FromString
        while (request := await self._next(stream, parse)) is not None:
            response = self._reflect(request)
            response.valid_host = request.host
            response.original_request.CopyFrom(request)
            await stream.send_message(response.SerializeToString())

    def _reflect(self, request: Any) -> Any:
        """The answer to one reflection request (grpc's server-reflection.md): an unknown
        name is ``NOT_FOUND``, a request of no known kind ``INVALID_ARGUMENT``, in the
        answer's ``error_response`` (the call goes on)."""
        response = reflection_pb2.ServerReflectionResponse
        kind = request.WhichOneof("message_request")
        pool = self._pool
        try:
            if kind == "list_services":
                services = [reflection_pb2.ServiceResponse(name=name) for name in self.names]
                return response(
                    list_services_response=reflection_pb2.ListServiceResponse(service=services)
                )
            if kind == "file_by_filename":
                return self._files(pool.FindFileByName(request.file_by_filename))
            if kind == "file_containing_symbol":
                return self._files(pool.FindFileContainingSymbol(request.file_containing_symbol))
            if kind == "file_containing_extension":
                wanted = request.file_containing_extension
                message = pool.FindMessageTypeByName(wanted.containing_type)
                extension: Any = pool.FindExtensionByNumber(message, wanted.extension_number)
                return self._files(extension.file)
            if kind == "all_extension_numbers_of_type":
                message = pool.FindMessageTypeByName(request.all_extension_numbers_of_type)
                numbers = sorted(e.number for e in pool.FindAllExtensions(message))
                return response(
                    all_extension_numbers_response=reflection_pb2.ExtensionNumberResponse(
                        base_type_name=message.full_name, extension_number=numbers
                    )
                )
        except KeyError:
            return _error(Status.NOT_FOUND, "not found")
        return _error(Status.INVALID_ARGUMENT, f"no request of kind {kind!r}")

    def _files(self, file: Any) -> Any:
        """``file`` and every file it imports, each once, serialized."""
        seen: set[str] = set()
        protos: list[bytes] = []
        pending = [file]
        while pending:
            current = pending.pop()
            if current.name in seen:
                continue
            seen.add(current.name)
            proto = _file_proto(current)
            protos.append(proto)
            pending += current.dependencies
        return reflection_pb2.ServerReflectionResponse(
            file_descriptor_response=reflection_pb2.FileDescriptorResponse(
                file_descriptor_proto=protos
            )
        )


class _Watch:
    """One ``Watch`` call: ``changed`` wakes it, ``told`` says it has sent the status."""

    __slots__ = ("changed", "told")

    def __init__(self) -> None:
        self.changed = asyncio.Event()
        self.told = asyncio.Event()


def _file_proto(file: Any) -> bytes:
    proto = descriptor_pb2.FileDescriptorProto()
    file.CopyToProto(proto)
    return proto.SerializeToString()


def _error(status: Status, message: str) -> Any:
    return reflection_pb2.ServerReflectionResponse(
        error_response=reflection_pb2.ErrorResponse(error_code=status.value, error_message=message)
    )
