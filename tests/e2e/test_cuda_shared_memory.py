"""CUDA shared memory as Triton built with CUDA answers it on a host where no IPC handle is opened: no regions,
unregistering succeeds, registrations are refused in Triton's words (the conformance suite compares each answer).
The registry's rules for CUDA regions (one namespace with system regions, status and unregister by kind, bounds,
closing once the last copy is done) are checked here with host memory standing in for a client's device memory;
tests/e2e/test_gpu_cuda_shared_memory.py opens real IPC handles on a GPU host."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from runtime.errors import AlreadyExists, InvalidArgument, NotFound
from runtime.extensions.cuda_ipc import cuda_ipc_unavailable
from runtime.extensions.cuda_shared_memory import IPC_HANDLE_BYTES, CudaSharedMemoryRegistry, decode_ipc_handle
from runtime.extensions.shared_memory import SharedMemoryRegistry

HANDLE = base64.b64encode(bytes(IPC_HANDLE_BYTES)).decode()


def test_a_handle_must_be_base64_of_one_ipc_handle():
    assert decode_ipc_handle(HANDLE) == bytes(IPC_HANDLE_BYTES)
    for bad in ("!!", "AAAA", base64.b64encode(bytes(IPC_HANDLE_BYTES + 1)).decode(), None, 5, "é"):
        with pytest.raises(InvalidArgument, match="must be a valid base64 encoded cudaIpcMemHandle_t"):
            decode_ipc_handle(bad)


@pytest.mark.skipif(cuda_ipc_unavailable() is None, reason="CUDA IPC works on this host")
def test_registry_lists_nothing_and_refuses_registrations():
    registry = CudaSharedMemoryRegistry(SharedMemoryRegistry())
    assert registry.status() == []
    registry.unregister()
    registry.unregister("never-registered")
    with pytest.raises(NotFound, match="Unable to find cuda shared memory region: 'x'"):
        registry.status("x")
    with pytest.raises(InvalidArgument, match="failed to register shared memory region: invalid args"):
        registry.register("x", bytes(IPC_HANDLE_BYTES), 0, 16)


def test_tritonclient_starts_clean_over_http(http_client):
    http_client.unregister_cuda_shared_memory()
    http_client.unregister_cuda_shared_memory("x")
    assert http_client.get_cuda_shared_memory_status() == []
    with pytest.raises(InferenceServerException, match="Unable to find cuda shared memory region"):
        http_client.get_cuda_shared_memory_status("x")
    with pytest.raises(InferenceServerException, match="invalid args"):  # its client sends the handle base64'd
        http_client.register_cuda_shared_memory("x", HANDLE.encode(), 0, 16)
    assert "cuda_shared_memory" in http_client.get_server_metadata()["extensions"]


def test_tritonclient_starts_clean_over_grpc(grpc_client):
    grpc_client.unregister_cuda_shared_memory()
    assert len(grpc_client.get_cuda_shared_memory_status().regions) == 0
    with pytest.raises(InferenceServerException, match="invalid args"):
        grpc_client.register_cuda_shared_memory("x", bytes(IPC_HANDLE_BYTES), 0, 16)


class HostMemory:
    """Host bytes in place of a client's device memory (the registry's side of a CUDA region)."""

    def __init__(self, raw_handle: bytes, device_id: int, byte_size: int):
        self.bytes = bytearray(byte_size)
        self.closed = False

    def to_host(self, offset: int, byte_size: int) -> bytes:
        return bytes(self.bytes[offset:offset + byte_size])

    def from_host(self, offset: int, payload) -> None:
        view = memoryview(payload).cast("B")
        self.bytes[offset:offset + len(view)] = view

    def close(self) -> None:
        assert not self.closed, "closed twice"
        self.closed = True


def test_cuda_and_system_regions_share_one_namespace_and_go_by_kind():
    opened: list[HostMemory] = []

    def open_memory(raw, device_id, byte_size):
        opened.append(HostMemory(raw, device_id, byte_size))
        return opened[-1]

    regions = SharedMemoryRegistry()
    cuda = CudaSharedMemoryRegistry(regions, open_memory)
    system = shm.create_shared_memory_region("sys", "/st_test_cuda_ns", 16)
    try:
        regions.register("sys", "/st_test_cuda_ns", 0, 16)
        with pytest.raises(AlreadyExists):
            cuda.register("sys", bytes(IPC_HANDLE_BYTES), 0, 16)
        assert opened == []  # refused before the handle was opened
        cuda.register("gpu", bytes(IPC_HANDLE_BYTES), 1, 16)
        assert cuda.status() == [{"name": "gpu", "device_id": 1, "byte_size": 16}]
        assert [r["name"] for r in regions.status()] == ["sys"]
        with pytest.raises(NotFound, match="Unable to find cuda shared memory region: 'sys'"):
            cuda.status("sys")
        with pytest.raises(NotFound, match="Unable to find system shared memory region: 'gpu'"):
            regions.status("gpu")
        # a request names a region without its kind
        regions.write({"shared_memory_region": "gpu", "shared_memory_byte_size": 16},
                      np.arange(4, dtype=np.float32).tobytes(), "OUT")
        got = regions.read({"shared_memory_region": "gpu", "shared_memory_offset": 4, "shared_memory_byte_size": 8})
        assert np.frombuffer(got, np.float32).tolist() == [1.0, 2.0]
        with pytest.raises(InvalidArgument, match="Invalid offset"):
            regions.read({"shared_memory_region": "gpu", "shared_memory_offset": 8, "shared_memory_byte_size": 16})
        regions.unregister()  # system regions only
        assert cuda.status() and not opened[0].closed
        cuda.unregister()
        assert cuda.status() == [] and opened[0].closed
    finally:
        regions.close()
        shm.destroy_shared_memory_region(system)


def test_cuda_registrations_are_checked_before_the_handle_is_opened():
    cuda = CudaSharedMemoryRegistry(SharedMemoryRegistry(max_total_bytes=32), HostMemory)
    for name, handle, device, size, match in (("x", bytes(63), 0, 8, "one cudaIpcMemHandle_t"),
                                              ("", bytes(64), 0, 8, "needs a name"),
                                              ("x", bytes(64), -1, 8, "'device_id' must be"),
                                              ("x", bytes(64), 0, True, "'byte_size' must be"),
                                              ("x", bytes(64), 0, 33, "would exceed 32 bytes")):
        with pytest.raises(InvalidArgument, match=match):
            cuda.register(name, handle, device, size)
    assert cuda.status() == []


def test_an_unregistered_cuda_region_closes_when_its_last_copy_is_done():
    memory: list[HostMemory] = []
    regions = SharedMemoryRegistry()
    cuda = CudaSharedMemoryRegistry(regions, lambda *args: memory.append(HostMemory(*args)) or memory[-1])
    cuda.register("gpu", bytes(IPC_HANDLE_BYTES), 0, 8)
    original = memory[0].to_host

    def unregister_midway(offset, byte_size):
        cuda.unregister("gpu")  # a client unregisters while the copy runs
        assert not memory[0].closed
        return original(offset, byte_size)

    memory[0].to_host = unregister_midway
    regions.read({"shared_memory_region": "gpu", "shared_memory_byte_size": 8})
    assert memory[0].closed and cuda.status() == []
