"""The shared tensor pool (runtime/tensor_pool.py): buffers come back once nothing refers to them, arrays are
found where they lie, a full pool says so, and a peer maps the same memory through its descriptors."""

from __future__ import annotations

import asyncio
import gc
import mmap
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from runtime.tensor_pool import MEMFD_NAME, MIN_BYTES, TensorPool


def test_a_buffer_returns_once_it_and_its_views_are_gone() -> None:
    pool = TensorPool(max_bytes=8 << 20, segment_bytes=4 << 20)
    buffer = pool.buffer(600_000)
    assert buffer is not None and buffer.nbytes == 600_000 and buffer.flags.writeable
    tensor = np.frombuffer(memoryview(buffer)[1000:1000 + 4 * 1000], dtype=np.float32)
    del buffer
    gc.collect()
    assert pool.in_use() >= 600_000  # the tensor, a view of it, holds it
    del tensor
    assert pool.in_use() == 0


@pytest.mark.parametrize("aligned_at", [0, 1, 43, 64, 1000])
def test_the_byte_asked_for_lies_at_a_multiple_of_64_and_the_padding_comes_back(aligned_at: int) -> None:
    pool = TensorPool(max_bytes=8 << 20, segment_bytes=4 << 20)
    held = pool.buffer(100_003)  # the next one starts elsewhere
    used = pool.in_use()
    buffer = pool.buffer(600_000, aligned_at)
    assert buffer.nbytes == 600_000 and (buffer.ctypes.data + aligned_at) % 64 == 0
    del buffer
    gc.collect()
    assert pool.in_use() == used and held is not None


def test_small_requests_and_a_full_pool_get_none() -> None:
    pool = TensorPool(max_bytes=2 << 20, segment_bytes=1 << 20)
    assert pool.buffer(MIN_BYTES - 1) is None
    held = [pool.buffer(1 << 20), pool.buffer(1 << 20)]
    assert all(buffer is not None for buffer in held)
    assert pool.buffer(MIN_BYTES) is None  # full: the caller receives into its own memory
    held.pop()
    assert pool.buffer(MIN_BYTES) is not None


def test_arrays_are_located_where_they_lie() -> None:
    pool = TensorPool(max_bytes=64 << 20, segment_bytes=1 << 20)
    buffers = [pool.buffer(700_000) for _ in range(3)]  # more than one segment
    assert len(pool.segments) >= 2
    for buffer in buffers:
        tensor = np.frombuffer(memoryview(buffer)[64:64 + 4 * 1024], dtype=np.float32).reshape(2, 512)
        segment, offset = pool.locate(tensor)
        mapped = np.frombuffer(pool.segments[segment].map, dtype=np.float32, count=1024, offset=offset)
        tensor[:] = np.arange(1024, dtype=np.float32).reshape(2, 512)
        assert np.array_equal(mapped, tensor.reshape(-1))
        assert pool.locate(tensor[:, ::2]) is None  # not contiguous
    assert pool.locate(np.zeros(100_000, np.uint8)) is None
    assert pool.locate(np.array([b"x"] * 10, dtype=object)) is None


def test_a_peer_maps_the_same_memory_by_descriptor() -> None:
    pool = TensorPool(max_bytes=8 << 20, segment_bytes=1 << 20)
    buffer = pool.buffer(100_000)
    buffer[:] = 7
    segment, offset = pool.locate(buffer)
    descriptor = os.dup(pool.segments[segment].fd)
    assert os.readlink(f"/proc/self/fd/{descriptor}").startswith(f"/memfd:{MEMFD_NAME}")
    peer = mmap.mmap(descriptor, pool.segments[segment].size)
    assert peer[offset:offset + 100_000] == b"\x07" * 100_000
    peer.close()
    os.close(descriptor)


def test_buffers_taken_and_dropped_from_many_threads_all_return() -> None:
    pool = TensorPool(max_bytes=64 << 20, segment_bytes=4 << 20)

    def churn() -> int:
        given = 0
        for size in range(MIN_BYTES, MIN_BYTES + 200 * 4096, 4096):
            buffer = pool.buffer(size)
            if buffer is not None and len(buffer) == size:
                buffer[-1] = 1
                given += 1
        return given

    with ThreadPoolExecutor(4) as threads:  # each thread's count comes back here, where it is checked
        given = [future.result(timeout=30) for future in [threads.submit(churn) for _ in range(4)]]
    assert given == [200] * 4
    assert pool.in_use() == 0


def test_no_descriptor_left_for_a_segment_gets_none() -> None:
    """memfd_create failing (here: out of descriptors) is a full pool, not an error in the listener's hands."""
    code = (
        "import os, resource\n"
        "from runtime.tensor_pool import TensorPool\n"
        "pool = TensorPool()\n"
        "opened = len(os.listdir('/proc/self/fd'))\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (opened, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
        "print(pool.buffer(1 << 20))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            cwd=Path(__file__).resolve().parent.parent)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "None"


def test_the_core_offers_buffers_unless_the_pool_is_off(tmp_path: Path) -> None:
    """server.tensor_pool_bytes reaches the core: its size bounds the buffers offered, 0 offers none."""
    from tests.in_process import core

    async def main() -> None:
        async with core(tmp_path, tensor_pool_bytes=32 << 20) as service:
            assert service.tensor_buffer(1 << 20) is not None
            assert service.tensor_buffer(33 << 20) is None  # past the pool's size
        async with core(tmp_path, tensor_pool_bytes=0) as service:
            assert service.tensor_buffer(1 << 20) is None

    asyncio.run(main())
