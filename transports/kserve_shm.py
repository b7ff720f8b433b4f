"""Triton's system shared memory extension, for both KServe v2 servers: the registry of the
regions a client registers, and the checks that keep every read and write inside them. The
protocols' side (routes, JSON, gRPC messages) is :mod:`.kserve_shm_wire`.

The extension: Triton's ``docs/protocol/extension_shared_memory.md``; its gRPC messages:
``protobuf/grpc_service.proto`` of triton-inference-server/common; what is refused and with
which code follows Triton's own manager (``src/shared_memory_manager.cc``, ``http_server.cc``,
``grpc/infer_handler.cc`` of triton-inference-server/server).

**A region** is the range [offset, offset + byte_size) of a POSIX shared memory object that the
client made (``tritonclient.utils.shared_memory``, or ``shm_open`` + ``ftruncate``). The server
opens ``/dev/shm/<key>`` as glibc's ``shm_open`` does (leading slashes dropped, no other slash),
read-write, checks the range lies inside the object, and maps it (from the page the offset falls
in, as ``mmap`` needs; only the range is reachable, through a memoryview of exactly it). It keeps
the descriptor and checks the object's size again before each access: a page past the end of an
object truncated under a mapping raises SIGBUS, which would kill the server. (A truncation that
races a request can still do so, as in Triton: the client owns the object.)

**Unlinked underneath.** On Linux a mapping holds the object's pages after ``shm_unlink``: a
registered region whose object was unlinked stays valid and usable (status lists it, inputs and
outputs go through it and the client still sees them through its own mapping) until it is
unregistered. A new object made under the same key is another object: register it again.

**Inputs** are read in place: a numeric input is a read-only numpy view of the region, no copy
(BYTES elements are copied out, each length checked against the span). Its byte size must be
the tensor's exactly (datatype x shape). **Outputs** are copied into the region; as Triton, the
span must hold at least the output's bytes, and the response carries no data for it.

**Errors**, with Triton's codes (each class carries its ``http_status`` and ``grpc_code``): a
region name not registered is :class:`RegionNotFoundError` (gRPC ``NOT_FOUND``, HTTP 404), a
name registered twice :class:`RegionExistsError` (``ALREADY_EXISTS``, HTTP 400), a server that
takes no regions :class:`ClientShmDisabledError` (``UNIMPLEMENTED``, 501), the rest
:class:`BadRequestError` (``INVALID_ARGUMENT``, 400).
Triton answers ``INTERNAL`` for a key that names no object; that is the client's argument, so
here it is ``INVALID_ARGUMENT``.

**Off unless allowed**, as in Triton (``--allow-client-shm``, default false): a
client that registers regions makes the server open, read and write any shared memory object
the server's user may, so register and unregister answer Triton's "Client shared memory is
disabled" (gRPC ``UNIMPLEMENTED``, HTTP 501) unless the registry is made with ``allow=True``
(``inferwire serve --allow-client-shm``). Status answers either way (no region).

Regions belong to one server process (one registry per server); :meth:`close` unregisters all:
the servers' ``stop()`` calls it, and it runs by itself when the registry is collected or the
interpreter exits.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

import inferwire.codecs as ic
from inferwire.codecs.tensors import (
    bytes_elements_from_raw,
    bytes_elements_to_raw,
    checked_dtype,
    checked_layout,
)

from .errors import BadRequestError, NotFoundError

EXTENSION: Final = "system_shared_memory"
"""The name in the server metadata's ``extensions``."""
REGION: Final = "shared_memory_region"
OFFSET: Final = "shared_memory_offset"
BYTE_SIZE: Final = "shared_memory_byte_size"
SHM_DIR: Final = "/dev/shm"
"""Where Linux's ``shm_open`` keeps its objects (glibc's ``__shm_directory``)."""
MAX_REGION_BYTES: Final = 1 << 32
"""The largest region one registration may map (4 GiB): a mapping takes address space and page
tables, not memory, but a client must not make the server map without bound."""
MAX_REGIONS: Final = 256
"""Regions registered at once; each holds a descriptor open (see the module docstring)."""
MAX_NAME_CHARS: Final = 256
DISABLED: Final = (
    "Client shared memory is disabled. Start the server with --allow-client-shm to enable."
)


class RegionNotFoundError(NotFoundError):
    """A shared memory region that is not registered."""

    http_status = 404
    grpc_code = "NOT_FOUND"


class RegionExistsError(BadRequestError):
    """A region name registered already."""

    http_status = 400
    grpc_code = "ALREADY_EXISTS"


class ClientShmDisabledError(BadRequestError):
    """Register or unregister on a server that takes no client regions (Triton's
    ``TRITONSERVER_ERROR_UNSUPPORTED``)."""

    http_status = 501
    grpc_code = "UNIMPLEMENTED"


@dataclass(frozen=True, slots=True, kw_only=True)
class RegionStatus:
    """One registered region, as status reports it."""

    name: str
    key: str
    offset: int
    byte_size: int

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "key": self.key,
            "offset": self.offset,
            "byte_size": self.byte_size,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorSpan:
    """Where a tensor's bytes are: an input's or requested output's shared memory parameters."""

    region: str
    offset: int
    byte_size: int


def _unmap(mapped: mmap.mmap) -> None:
    # BufferError: an array still views the region (a request in flight); the mapping goes
    # when the last view does, as Triton defers an unregister until its requests complete.
    with contextlib.suppress(BufferError):
        mapped.close()


class _Region:
    """A registered region: its mapping, a view of exactly its bytes, and the object's
    descriptor, to check before each access that the object still holds the region."""

    __slots__ = ("_fd", "_mapped", "status", "view")

    def __init__(self, status: RegionStatus, fd: int, mapped: mmap.mmap, view: memoryview) -> None:
        self.status = status
        self.view = view
        self._fd = fd
        self._mapped = mapped

    def span(self, offset: int, byte_size: int, where: str) -> memoryview:
        """The view of [offset, offset + byte_size) of the region, every bound checked."""
        name, size = self.status.name, self.status.byte_size
        # Triton's GetMemoryInfo: the offset must fall inside the region, and the span too.
        if offset >= size or offset + byte_size > size:
            raise BadRequestError(
                f"{where}: {byte_size} bytes at offset {offset} lie outside shared memory region "
                f"{name!r} ({size} bytes)"
            )
        try:
            held = os.fstat(self._fd).st_size
        except OSError as exc:
            raise BadRequestError(f"shared memory region {name!r}: {exc.strerror}") from exc
        if held < self.status.offset + size:
            raise BadRequestError(
                f"shared memory region {name!r}: its object {self.status.key!r} was truncated "
                f"to {held} bytes under it; unregister it"
            )
        return self.view[offset : offset + byte_size]

    def close(self) -> None:
        self.view.release()
        _unmap(self._mapped)
        os.close(self._fd)


def _object_path(key: str) -> str:
    name = key.lstrip("/")
    # glibc's shm_open refuses a name with another slash; "." and ".." would leave /dev/shm.
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise BadRequestError(f"key {key[:300]!r} is not a shared memory object's name")
    return os.path.join(SHM_DIR, name)


def _open_object(key: str) -> int:
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(_object_path(key), flags)
    except FileNotFoundError:
        raise BadRequestError(f"no shared memory object has the key {key[:300]!r}") from None
    except (OSError, ValueError, UnicodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise BadRequestError(f"cannot open shared memory object {key[:300]!r}: {why}") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise BadRequestError(f"{key[:300]!r} is not a shared memory object")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _map(fd: int, offset: int, byte_size: int) -> tuple[mmap.mmap, memoryview]:
    start = offset - offset % mmap.ALLOCATIONGRANULARITY  # mmap maps whole pages
    mapped = mmap.mmap(
        fd,
        byte_size + offset - start,
        mmap.MAP_SHARED,
        mmap.PROT_READ | mmap.PROT_WRITE,
        offset=start,
    )
    whole = memoryview(mapped)
    view = whole[offset - start : offset - start + byte_size]
    whole.release()
    return mapped, view


def _close_all(regions: dict[str, _Region]) -> None:
    while regions:
        regions.popitem()[1].close()


class SystemSharedMemory:
    """The regions registered with one server, by name. Thread-safe."""

    def __init__(
        self,
        *,
        allow: bool = False,
        max_region_bytes: int = MAX_REGION_BYTES,
        max_regions: int = MAX_REGIONS,
    ) -> None:
        self.allow = allow
        """Whether clients may register regions (off by default, as Triton's)."""
        self.max_region_bytes = max_region_bytes
        self.max_regions = max_regions
        self._regions: dict[str, _Region] = {}
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _close_all, self._regions)

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Map [offset, offset + byte_size) of the object ``key`` names as region ``name``."""
        if not self.allow:
            raise ClientShmDisabledError(DISABLED)
        check_name(name)
        if byte_size < 1:
            raise BadRequestError(f"shared memory region {name!r}: byte_size must be at least 1")
        if byte_size > self.max_region_bytes:
            raise BadRequestError(
                f"shared memory region {name!r}: {byte_size} bytes is more than this server "
                f"maps for one region ({self.max_region_bytes})"
            )
        with self._lock:
            if name in self._regions:
                raise RegionExistsError(f"shared memory region {name!r} already in manager")
            if len(self._regions) >= self.max_regions:
                raise BadRequestError(
                    f"{len(self._regions)} shared memory regions are registered, the most this "
                    "server holds: unregister one first"
                )
            fd = _open_object(key)
            try:
                held = os.fstat(fd).st_size
                if offset + byte_size > held:
                    raise BadRequestError(
                        f"failed to register shared memory region {name!r}: {byte_size} bytes at "
                        f"offset {offset} run past the end of object {key[:300]!r} ({held} bytes)"
                    )
                mapped, view = _map(fd, offset, byte_size)
            except OSError as exc:
                os.close(fd)
                raise BadRequestError(
                    f"failed to register shared memory region {name!r}: {exc.strerror}"
                ) from exc
            except BaseException:
                os.close(fd)
                raise
            status = RegionStatus(name=name, key=key, offset=offset, byte_size=byte_size)
            self._regions[name] = _Region(status, fd, mapped, view)

    def status(self, name: str = "") -> list[RegionStatus]:
        """Every region (``name`` empty), or the one named."""
        with self._lock:
            if not name:
                return [region.status for region in self._regions.values()]
            return [self._get(name).status]

    def unregister(self, name: str = "") -> None:
        """Unmap the region named, or every region (``name`` empty). A name not registered is
        no error, as in Triton."""
        if not self.allow:
            raise ClientShmDisabledError(DISABLED)
        with self._lock:
            if not name:
                _close_all(self._regions)
                return
            region = self._regions.pop(name, None)
            if region is not None:
                region.close()

    def close(self) -> None:
        """Unregister every region."""
        with self._lock:
            _close_all(self._regions)

    def span(self, span: TensorSpan, where: str) -> memoryview:
        """The bytes ``span`` names, checked to lie in its region."""
        with self._lock:
            return self._get(span.region).span(span.offset, span.byte_size, where)

    def _get(self, name: str) -> _Region:
        region = self._regions.get(name)
        if region is None:
            raise RegionNotFoundError(
                f"Unable to find system shared memory region: {name[:MAX_NAME_CHARS]!r}"
            )
        return region

    # -- tensors ----------------------------------------------------------------------------

    def read_tensor(
        self, name: str, datatype: str, shape: tuple[int, ...], span: TensorSpan
    ) -> ic.Tensor:
        """Input ``name``, read from ``span``: a read-only view of the region unless BYTES."""
        where = f"input {name!r}"
        try:
            dtype, count = checked_layout(datatype, shape)
            if datatype != "BYTES" and span.byte_size != count * dtype.itemsize:
                raise BadRequestError(
                    f"{where}: {datatype}{list(shape)} is {count * dtype.itemsize} bytes, "
                    f"{BYTE_SIZE} says {span.byte_size}"
                )
            view = self.span(span, where)
            if datatype == "BYTES":
                data = bytes_elements_from_raw(view, count)
            else:
                data = np.frombuffer(view, dtype=dtype, count=count)
                data.flags.writeable = False  # the client's memory: the model only reads it
                if datatype == "BOOL" and data.view(np.uint8).max(initial=0) > 1:
                    raise BadRequestError(f"{where}: a BOOL element is a byte 0 or 1")
        except ic.DecodeError as exc:
            raise BadRequestError(f"{where}: {exc}") from None
        return ic.Tensor(name=name, datatype=datatype, shape=shape, data=data.reshape(shape))

    def write_tensor(self, tensor: ic.Tensor, span: TensorSpan) -> int:
        """Copy ``tensor``'s bytes to the start of ``span``; returns how many."""
        where = f"output {tensor.name!r}"
        checked_dtype(tensor)
        source: np.ndarray[Any, Any]
        if tensor.datatype == "BYTES":
            source = np.frombuffer(bytes_elements_to_raw(tensor.data), dtype=np.uint8)
        else:
            source = np.ascontiguousarray(tensor.data).reshape(-1).view(np.uint8)
        if source.size > span.byte_size:
            raise BadRequestError(
                f"{where} is {source.size} bytes; {BYTE_SIZE} {span.byte_size} cannot hold it"
            )
        target = np.frombuffer(self.span(span, where), dtype=np.uint8, count=source.size)
        target[:] = source  # numpy copies through a buffer if the two overlap (an echoed input)
        return int(source.size)


def check_name(name: str) -> None:
    if not name or len(name) > MAX_NAME_CHARS or not name.isprintable():
        raise BadRequestError(
            f"a region name is 1 to {MAX_NAME_CHARS} printable characters, not "
            f"{name[:MAX_NAME_CHARS]!r}"
        )


def tensor_span(region: Any, offset: Any, byte_size: Any, where: str) -> TensorSpan | None:
    """The span three parameter values give (None: none given), each checked: the region and
    the byte size are required together, the offset is optional (0)."""
    if region is None:
        if offset is not None or byte_size is not None:
            raise BadRequestError(f"{where} gives {OFFSET} or {BYTE_SIZE} but no {REGION}")
        return None
    if type(region) is not str or not region:
        raise BadRequestError(f"{where}: {REGION} must be a region's name")
    if byte_size is None:
        raise BadRequestError(
            f"{where} names {REGION} {region[:MAX_NAME_CHARS]!r} but no {BYTE_SIZE}"
        )
    for key, value in ((OFFSET, offset), (BYTE_SIZE, byte_size)):
        if value is not None and (type(value) is not int or value < 0):
            raise BadRequestError(f"{where}: {key} must be a byte count, not {value!r}"[:300])
    return TensorSpan(region=region, offset=offset or 0, byte_size=byte_size)
