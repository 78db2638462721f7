"""CUDA IPC memory a client exported (``cudaIpcGetMemHandle``), opened in this process through cuda-python's
bindings, the library tritonclient's own ``cuda_shared_memory`` uses on the client's side.

Imported only when a client registers a CUDA region; on a host without the bindings, a driver or a GPU,
:func:`cuda_ipc_unavailable` says why and nothing CUDA is touched.  The allocation behind a handle is looked up
(``cuMemGetAddressRange``) so a registration claiming more bytes than the client allocated is refused instead of
copying past its end.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from typing import Any

import numpy as np

from runtime.errors import InvalidArgument

IPC_HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)


@functools.cache
def _bindings() -> tuple[Any, Any]:
    import cuda.bindings.driver as driver
    import cuda.bindings.runtime as runtime

    return runtime, driver


@functools.cache
def cuda_ipc_unavailable() -> str | None:
    """Why CUDA IPC memory cannot be opened here, or None when it can (the answer is kept)."""
    try:
        runtime, _ = _bindings()
    except ImportError:
        return "cuda-python is not installed (pip install 'serverless-triton[gpu]')"
    error, count = runtime.cudaGetDeviceCount()
    if error != runtime.cudaError_t.cudaSuccess:
        return f"CUDA is not usable here: {_error_name(error)}"
    return None if count else "this host has no CUDA device"


class CudaIpcMemory:
    """``byte_size`` bytes of a client's device memory, opened from its IPC handle on ``device_id``; copied to and
    from host memory with ``cudaMemcpy`` (synchronous), closed once with :meth:`close`."""

    def __init__(self, raw_handle: bytes, device_id: int, byte_size: int):
        runtime, driver = _bindings()
        self.device_id = device_id
        self._closed = False
        self._lock = threading.Lock()
        count = _check(runtime.cudaGetDeviceCount(), "cudaGetDeviceCount")
        if device_id >= count:
            raise InvalidArgument(f"failed to register CUDA shared memory region: device {device_id} does not exist "
                                  f"({count} CUDA device(s) here)")
        if len(raw_handle) != IPC_HANDLE_BYTES:
            raise InvalidArgument("'raw_handle' must be one cudaIpcMemHandle_t (64 bytes)")
        self._set_device()
        handle = runtime.cudaIpcMemHandle_t()
        ctypes.memmove(handle.getPtr(), raw_handle, IPC_HANDLE_BYTES)
        self.pointer = int(_check(runtime.cudaIpcOpenMemHandle(handle, runtime.cudaIpcMemLazyEnablePeerAccess),
                                  "failed to open CUDA IPC handle"))
        try:
            base, size = _check(driver.cuMemGetAddressRange(driver.CUdeviceptr(self.pointer)), "cuMemGetAddressRange")
            available = int(base) + int(size) - self.pointer
            if byte_size > available:
                raise InvalidArgument(f"failed to register CUDA shared memory region: byte_size {byte_size} is more "
                                      f"than the {available} bytes the client allocated")
        except BaseException:
            runtime.cudaIpcCloseMemHandle(self.pointer)
            raise

    def to_host(self, offset: int, byte_size: int) -> np.ndarray:
        runtime, _ = _bindings()
        host = np.empty(byte_size, np.uint8)
        self._memcpy(host.ctypes.data, self.pointer + offset, byte_size, runtime.cudaMemcpyKind.cudaMemcpyDeviceToHost)
        return host

    def from_host(self, offset: int, payload: memoryview | bytes) -> None:
        runtime, _ = _bindings()
        host = np.frombuffer(payload, np.uint8)
        self._memcpy(self.pointer + offset, host.ctypes.data, host.size, runtime.cudaMemcpyKind.cudaMemcpyHostToDevice)

    def close(self) -> None:
        runtime, _ = _bindings()
        with self._lock:
            if not self._closed:
                self._closed = True
                self._set_device()
                runtime.cudaIpcCloseMemHandle(self.pointer)

    def _memcpy(self, destination: int, source: int, count: int, kind: Any) -> None:
        """One synchronous copy on this memory's device (nothing for no bytes); refused once it is closed."""
        if not count:
            return
        runtime, _ = _bindings()
        with self._lock:
            if self._closed:
                raise InvalidArgument("CUDA shared memory region was unregistered")
            self._set_device()
            _check(runtime.cudaMemcpy(destination, source, count, kind), "cudaMemcpy")

    def _set_device(self) -> None:
        runtime, _ = _bindings()
        _check(runtime.cudaSetDevice(self.device_id), "cudaSetDevice")


def _check(result: tuple, what: str) -> Any:
    """The value(s) after a binding's status, or InvalidArgument naming the CUDA error."""
    error, *values = result
    if int(error) != 0:
        raise InvalidArgument(f"{what}: {_error_name(error)}")
    return values[0] if len(values) == 1 else tuple(values) if values else None


def _error_name(error: Any) -> str:
    return getattr(error, "name", str(error))
