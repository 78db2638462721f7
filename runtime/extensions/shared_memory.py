"""System shared memory (Triton's extension): clients register POSIX shared-memory objects as named regions;
requests then name a region, offset and size for an input (copied from there) or an output (written there
instead of into the response).

A key names a POSIX shared-memory object only (``/name``: one leading slash, no other, no ``.``/``..``, never
a path), opened without following links and never mapped (see :class:`Region`); offsets and sizes are checked
against the registered range.  Registrations are bounded in number and total size.  A request holds the regions
its inputs and outputs name from its start to its end: one unregistered meanwhile stays listed and usable until
the last request holding it is done (Triton 2.53), then goes; everything is closed at shutdown.

The registry holds CUDA regions too (cuda_shared_memory.py opens them): Triton keeps one namespace for both kinds,
so a request names a region without saying its kind, while registration status and unregistering go by kind.
"""

from __future__ import annotations

import os
import re
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

import numpy as np

from runtime.datatypes import serialize_bytes
from runtime.errors import AlreadyExists, InvalidArgument, NotFound, Unsupported
from runtime.types import InferRequest, InferResponse

REGION_PARAMETER = "shared_memory_region"
OFFSET_PARAMETER = "shared_memory_offset"
SIZE_PARAMETER = "shared_memory_byte_size"
SHM_ROOT = "/dev/shm"
_KEY = re.compile(r"/[A-Za-z0-9_.\-]{1,250}")
DEFAULT_MAX_REGIONS = 256
DEFAULT_MAX_TOTAL_BYTES = 64 << 30


# Triton 2.69's words (src/common.h) when a client registers or unregisters a region the server does not allow
CLIENT_SHM_DISABLED = ("Client shared memory is disabled. Start the server with '--allow-client-shm=true' to "
                       "enable.")

class SharedRegion(Protocol):
    """A registered region of either kind, as the registry and the data path use it."""

    name: str
    kind: str  # "system" or "cuda": what status and unregister select by
    byte_size: int
    users: int  # requests copying from or into it now: it is closed when the last is done
    unregistered: bool

    def read(self, offset: int, byte_size: int) -> memoryview: ...

    def write(self, offset: int, payload: memoryview | bytes) -> None: ...

    def status(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


@dataclass(eq=False)
class Region:
    """A registered region: ``byte_size`` bytes from ``offset`` of the object ``key``, open as ``fd``.

    Its bytes are copied in and out with ``pread``/``pwrite``, never through a mapping: the object belongs to the
    client, who may shrink it (``ftruncate``) at any moment, and touching a mapping past the object's end would
    kill the server with SIGBUS.  A read past the end comes back short instead, and a write is checked against the
    object's size first: either way that request fails, and only that request.
    """

    name: str
    key: str
    offset: int
    byte_size: int
    fd: int
    users: int = 0  # requests copying from or into it now (the fd stays open until they are done)
    unregistered: bool = False
    kind: str = "system"

    def read(self, offset: int, byte_size: int) -> memoryview:
        """A private copy of ``byte_size`` bytes at ``offset`` (InvalidArgument if the object no longer holds them)."""
        buffer = np.empty(byte_size, np.uint8)  # uninitialised: pread fills it
        view = buffer.data
        done = 0
        while done < byte_size:
            count = os.preadv(self.fd, [view[done:]], self.offset + offset + done)
            if count <= 0:
                raise self._shrunk()
            done += count
        return view

    def write(self, offset: int, payload: memoryview | bytes) -> None:
        """Copy ``payload`` to ``offset`` (InvalidArgument if the object no longer reaches that far; a write past
        its end would grow the client's object)."""
        if self.offset + offset + len(payload) > os.fstat(self.fd).st_size:
            raise self._shrunk()
        view = memoryview(payload).cast("B")
        done = 0
        while done < len(view):
            done += os.pwrite(self.fd, view[done:], self.offset + offset + done)

    def _shrunk(self) -> InvalidArgument:
        return InvalidArgument(f"shared memory region '{self.name[:128]}' no longer holds its registered "
                               f"{self.byte_size} bytes: its object '{self.key[:128]}' was truncated")

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def close(self) -> None:
        os.close(self.fd)


class SharedMemoryRegistry:
    """The shared-memory regions registered with this server, system and CUDA (thread-safe)."""

    def __init__(self, max_regions: int = DEFAULT_MAX_REGIONS, max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES):
        self.max_regions = max_regions
        self.max_total_bytes = max_total_bytes
        self._regions: dict[str, SharedRegion] = {}
        self._lock = threading.Lock()

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Open ``byte_size`` bytes at ``offset`` of the POSIX shared-memory object ``key`` as region ``name``."""
        check_registration(name, offset=offset, byte_size=byte_size)
        self.add(name, byte_size, lambda: Region(name, key, offset, byte_size, _open(key, offset, byte_size)))

    def add(self, name: str, byte_size: int, open_region: Callable[[], SharedRegion]) -> None:
        """Register the region ``open_region`` opens as ``name``, within the limits and the one namespace of both
        kinds (it is opened only once the name and the limits allow it)."""
        with self._lock:
            if name in self._regions:
                raise AlreadyExists(f"shared memory region '{name[:128]}' already in manager")
            if len(self._regions) >= self.max_regions:
                raise InvalidArgument(f"at most {self.max_regions} shared memory regions can be registered")
            if sum(r.byte_size for r in self._regions.values()) + byte_size > self.max_total_bytes:
                raise InvalidArgument(f"registered shared memory would exceed {self.max_total_bytes} bytes")
            self._regions[name] = open_region()

    def unregister(self, name: str = "", kind: str = "system") -> None:
        """Unregister one region of ``kind`` (or, with no name, all of that kind); an unknown name is not an
        error, as in Triton.  A region a request is copying from or into is closed when that copy is done."""
        with self._lock:
            self._drop([r for r in self._regions.values() if r.kind == kind and (not name or r.name == name)])

    def status(self, name: str = "", kind: str = "system") -> list[dict[str, Any]]:
        with self._lock:
            regions = [r for r in self._regions.values() if r.kind == kind and (not name or r.name == name)]
            if name and not regions:
                raise NotFound(f"Unable to find {kind} shared memory region: '{name[:128]}'")
            return [r.status() for r in regions]

    def _drop(self, regions: list[SharedRegion]) -> None:
        """Unregister ``regions``: at once where no request holds one, else once the last that does is done (it
        stays listed and usable until then, as in Triton 2.53, server #7743)."""
        for region in regions:
            region.unregistered = True
            if not region.users:
                del self._regions[region.name]
                region.close()

    def read(self, parameters: dict[str, Any]) -> memoryview | None:
        """A copy of the bytes a tensor's parameters name, None if they name no region."""
        found = self._acquire(parameters)
        if found is None:
            return None
        region, offset, byte_size = found
        try:
            return region.read(offset, byte_size)
        finally:
            self._release(region)

    def write(self, parameters: dict[str, Any], payload: memoryview | bytes, output: str) -> None:
        """Write ``payload`` (output ``output``) where a requested output's parameters name."""
        found = self._acquire(parameters)
        if found is None:
            return
        try:
            self.write_held(found, payload, output)
        finally:
            self._release(found[0])

    def hold(self, parameters: dict[str, Any]) -> tuple[SharedRegion, int, int] | None:
        """The region a tensor's parameters name, held (``release`` it) until the request is done: an unregister
        meanwhile takes effect once it is (Triton 2.53, server #7743)."""
        return self._acquire(parameters)

    def release(self, region: SharedRegion) -> None:
        self._release(region)

    def write_held(self, held: tuple[SharedRegion, int, int], payload: memoryview | bytes, output: str) -> None:
        """Write ``payload`` (output ``output``) into a region this request holds."""
        region, offset, byte_size = held
        if len(payload) > byte_size:
            raise InvalidArgument(f"shared memory size specified with the request for output '{output}' "
                                  f"({byte_size} bytes) should be at least {len(payload)} bytes to hold the results")
        region.write(offset, payload)

    def _acquire(self, parameters: dict[str, Any]) -> tuple[SharedRegion, int, int] | None:
        """The region a tensor's parameters name (checked against its registered range), marked in use."""
        if REGION_PARAMETER not in parameters:
            return None
        name = parameters[REGION_PARAMETER]
        offset, byte_size = parameters.get(OFFSET_PARAMETER, 0), parameters.get(SIZE_PARAMETER)
        if not isinstance(name, str):
            raise InvalidArgument(f"'{REGION_PARAMETER}' must be a string")
        for value, key in ((offset, OFFSET_PARAMETER), (byte_size, SIZE_PARAMETER)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidArgument(f"'{key}' must be a non-negative integer")
        with self._lock:
            region = self._regions.get(name)
            if region is None:
                raise NotFound(f"Unable to find shared memory region: '{name[:128]}'")
            if offset + byte_size > region.byte_size:
                raise InvalidArgument(f"Invalid offset + byte size for shared memory region: '{name[:128]}'")
            region.users += 1
            return region, cast(int, offset), cast(int, byte_size)  # checked above

    def _release(self, region: SharedRegion) -> None:
        with self._lock:
            region.users -= 1
            if region.unregistered and not region.users:
                if self._regions.get(region.name) is region:
                    del self._regions[region.name]
                region.close()

    def close(self) -> None:
        """Unregister every region, of both kinds (at shutdown)."""
        with self._lock:
            self._drop(list(self._regions.values()))


def check_registration(name: Any, **sizes: Any) -> None:
    """A registration's name and its whole-number fields, as both kinds check them."""
    if not isinstance(name, str) or not name or len(name) > 256:
        raise InvalidArgument("a shared memory region needs a name (at most 256 characters)")
    for what, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InvalidArgument(f"shared memory '{what}' must be a non-negative integer")


def _open(key: str, offset: int, byte_size: int) -> int:
    """Open a POSIX shared-memory object by its key (never a path, never through a link); its fd."""
    unable = InvalidArgument(f"Unable to open shared memory region: '{str(key)[:128]}'")
    if not isinstance(key, str) or not _KEY.fullmatch(key) or key in ("/.", "/.."):
        raise unable
    try:
        fd = os.open(os.path.join(SHM_ROOT, key[1:]), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        raise unable from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise unable
        if offset + byte_size > info.st_size or info.st_size == 0:
            raise InvalidArgument(f"Invalid shared memory region: '{key[:128]}'")
    except BaseException:
        os.close(fd)
        raise
    return fd


def hold_regions(registry: SharedMemoryRegistry | None, request: InferRequest) -> Callable[[], None]:
    """Read each input that names a region from there, and hold the regions of the request's inputs and outputs
    (the outputs' in ``request.output_regions``) until the returned call lets them go, once the request is done: a
    region unregistered meanwhile stays listed and usable until then (Triton 2.53, server #7743)."""
    inputs = [t for t in request.inputs if REGION_PARAMETER in t.parameters]
    outputs = [o for o in request.outputs if REGION_PARAMETER in o.parameters]
    if not inputs and not outputs:
        return NOTHING_HELD
    regions = _require(registry)
    held: list[SharedRegion] = []
    try:
        for tensor in inputs:
            found = regions.hold(tensor.parameters)
            if found is not None:
                held.append(found[0])
                tensor.raw = found[0].read(found[1], found[2])
        for output in outputs:
            found = regions.hold(output.parameters)
            if found is not None:
                held.append(found[0])
                request.output_regions[output.name] = found
    except BaseException:
        _let_go(regions, request, held)
        raise
    return lambda: _let_go(regions, request, held)


def _let_go(registry: SharedMemoryRegistry, request: InferRequest, held: list[SharedRegion]) -> None:
    request.output_regions = {}
    while held:
        registry.release(held.pop())


def _nothing_held() -> None:
    return None


NOTHING_HELD: Callable[[], None] = _nothing_held  # what hold_regions returns where it holds nothing


def write_outputs(registry: SharedMemoryRegistry | None, request: InferRequest, response: InferResponse) -> None:
    """Write each output the request asked for in a region in the one it holds (``hold_regions``); the response
    then carries no data for it."""
    if not request.output_regions:
        return
    for tensor in response.outputs:
        held = request.output_regions.get(tensor.name)
        if held is None:
            continue
        data = np.ascontiguousarray(tensor.data)
        if tensor.datatype == "BYTES":
            payload: Any = serialize_bytes(data)
        else:
            payload = data.reshape(-1).view(np.uint8).data
        _require(registry).write_held(held, payload, tensor.name)
        tensor.data = None
        tensor.in_shared_memory = True


def _require(registry: SharedMemoryRegistry | None) -> SharedMemoryRegistry:
    if registry is None:
        raise Unsupported("shared memory is not available on this server")
    return registry


def require_no_regions(parameters: dict[str, Any]) -> None:
    """Refuse a tensor that names a shared-memory region where none may be used (the generate extension)."""
    if REGION_PARAMETER in parameters:
        region = parameters[REGION_PARAMETER]
        raise NotFound(f"Unable to find shared memory region: '{str(region)[:128]}'")
