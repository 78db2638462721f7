"""Triton's ``cuda_shared_memory`` extension, as a server that opens no CUDA IPC handle answers it.

Triton 2.51 built with CUDA, on a host without a GPU, lists no regions, unregisters (all, or any name) without
error, answers a named status with NOT_FOUND and refuses every registration.  This server answers the same on every
host: Triton's shared-memory examples unregister CUDA regions before they start, and go on to system shared memory.
Opening a client's ``cudaIpcMemHandle_t`` belongs to the GPU path.
"""

from __future__ import annotations

import binascii
from typing import Any

from runtime.errors import InvalidArgument, NotFound

IPC_HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)


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


class CudaSharedMemoryRegistry:
    """The CUDA regions clients registered: none, since no handle is opened (see the module's docstring)."""

    def register(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        raise InvalidArgument("failed to register shared memory region: invalid args")

    def unregister(self, name: str = "") -> None:
        """Nothing is registered: unregistering any name (or all) succeeds, as in Triton."""

    def status(self, name: str = "") -> list[dict[str, Any]]:
        if name:
            raise NotFound(f"Unable to find cuda shared memory region: '{name[:128]}'")
        return []
