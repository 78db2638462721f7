"""CUDA shared memory as Triton built with CUDA answers it on a host where no IPC handle is opened: no regions,
unregistering succeeds, registrations are refused in Triton's words (the conformance suite compares each answer)."""

from __future__ import annotations

import base64

import pytest
from tritonclient.utils import InferenceServerException

from runtime.errors import InvalidArgument, NotFound
from runtime.extensions.cuda_shared_memory import IPC_HANDLE_BYTES, CudaSharedMemoryRegistry, decode_ipc_handle

HANDLE = base64.b64encode(bytes(IPC_HANDLE_BYTES)).decode()


def test_a_handle_must_be_base64_of_one_ipc_handle():
    assert decode_ipc_handle(HANDLE) == bytes(IPC_HANDLE_BYTES)
    for bad in ("!!", "AAAA", base64.b64encode(bytes(IPC_HANDLE_BYTES + 1)).decode(), None, 5, "é"):
        with pytest.raises(InvalidArgument, match="must be a valid base64 encoded cudaIpcMemHandle_t"):
            decode_ipc_handle(bad)


def test_registry_lists_nothing_and_refuses_registrations():
    registry = CudaSharedMemoryRegistry()
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
