"""Triton's ``cuda_shared_memory`` extension: clients register device memory they exported with
``cudaIpcGetMemHandle``; requests then read inputs from it and write outputs into it, by region name, as with
system shared memory (the regions share shared_memory.py's registry and its checks).

Inputs are copied from the device into host memory and outputs back (``cudaMemcpy``), the path Triton takes for a
model whose tensors live on the CPU; a GPU model then moves its inputs to its device as it does for any request.
Where CUDA IPC cannot be used (no cuda-python, no driver, no device), the extension answers as Triton 2.51 built
with CUDA answers on a host without a GPU: no regions, unregistering (all, or any name) succeeds, a named status is
NOT_FOUND and every registration is refused; Triton's shared-memory examples unregister CUDA regions before they
start, and go on to system shared memory.
"""

from __future__ import annotations

import binascii
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from runtime.errors import InvalidArgument
from runtime.extensions.cuda_ipc import IPC_HANDLE_BYTES
from runtime.extensions.shared_memory import SharedMemoryRegistry, check_registration

log = logging.getLogger(__name__)


def decode_ipc_handle(b64: Any) -> bytes:
    """The raw handle an HTTP registration carries base64-encoded (``{"raw_handle": {"b64": ...}}``), checked as
    Triton checks it: valid base64 of exactly one ``cudaIpcMemHandle_t``."""
    try:
        if not isinstance(b64, str):
            raise ValueError
        raw = binascii.a2b_base64(b64.encode("ascii"), strict_mode=True)
    except (ValueError, UnicodeEncodeError, binascii.Error):
        raw = b""
    if len(raw) != IPC_HANDLE_BYTES:
        raise InvalidArgument("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")
    return raw


class DeviceMemory(Protocol):
    """A client's device memory, opened in this process (cuda_ipc.CudaIpcMemory)."""

    def to_host(self, offset: int, byte_size: int) -> Any: ...  # a buffer of byte_size bytes

    def from_host(self, offset: int, payload: memoryview | bytes) -> None: ...

    def close(self) -> None: ...


MemoryOpener = Callable[[bytes, int, int], DeviceMemory]  # (raw IPC handle, device id, byte size)


@dataclass(eq=False)
class CudaRegion:
    """A registered CUDA region: the client's device memory, opened from its IPC handle."""

    name: str
    device_id: int
    byte_size: int
    memory: DeviceMemory
    users: int = 0
    unregistered: bool = False
    kind: str = "cuda"

    def read(self, offset: int, byte_size: int) -> memoryview:
        return memoryview(self.memory.to_host(offset, byte_size))

    def write(self, offset: int, payload: memoryview | bytes) -> None:
        self.memory.from_host(offset, payload)

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}

    def close(self) -> None:
        self.memory.close()


class CudaSharedMemoryRegistry:
    """The CUDA regions clients registered, kept in ``regions`` beside the system ones (one namespace, as in
    Triton).  Where CUDA IPC cannot be used (see the module's docstring) registrations are refused as Triton
    refuses them on a host without a GPU; ``open_memory`` opens a client's handle (cuda_ipc by default)."""

    def __init__(self, regions: SharedMemoryRegistry, open_memory: MemoryOpener | None = None):
        self.regions = regions
        self.open_memory = open_memory

    def register(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        open_memory = self.open_memory or _cuda_ipc_opener()
        if open_memory is None:  # Triton's words on a host without a GPU, whatever the request holds
            raise InvalidArgument("failed to register shared memory region: invalid args")
        check_registration(name, device_id=device_id, byte_size=byte_size)
        if not isinstance(raw_handle, bytes) or len(raw_handle) != IPC_HANDLE_BYTES:
            raise InvalidArgument("'raw_handle' must be one cudaIpcMemHandle_t (64 bytes)")
        self.regions.add(name, byte_size,
                         lambda: CudaRegion(name, device_id, byte_size, open_memory(raw_handle, device_id, byte_size)))

    def unregister(self, name: str = "") -> None:
        """Unregistering an unknown name (or all when none is registered) succeeds, as in Triton."""
        self.regions.unregister(name, kind="cuda")

    def status(self, name: str = "") -> list[dict[str, Any]]:
        return self.regions.status(name, kind="cuda")


def _cuda_ipc_opener() -> MemoryOpener | None:
    """cuda_ipc's opener where CUDA IPC works on this host; None (logged once) where it does not."""
    from runtime.extensions import cuda_ipc

    reason = cuda_ipc.cuda_ipc_unavailable()
    if reason is not None:
        _log_unavailable(reason)
        return None
    return cuda_ipc.CudaIpcMemory


@functools.cache
def _log_unavailable(reason: str) -> None:
    log.warning("CUDA shared memory registrations are refused: %s", reason)
