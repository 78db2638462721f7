"""Tensors between the server and Python workers through shared memory: the arena, and what crashes leave."""

from __future__ import annotations

import os
import pickle
import threading
import time
from multiprocessing import Pipe
from pathlib import Path

import numpy as np
import psutil
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from handlers.python.transport import INLINE, INLINE_MAX_BYTES, Arena, PeerMemory
from runtime.memfd_arena import ALIGNMENT
from tests.support import ServerProcess, settled, write_model


def _pair(arena: Arena) -> PeerMemory:
    """The arena's segments mapped by a reader, as a worker maps them (descriptors through a real pipe)."""
    sender, receiver = Pipe()
    memory = PeerMemory()
    thread = threading.Thread(target=arena.announce, args=(sender, os.getpid()))
    thread.start()
    while receiver.poll(2):
        _, index, size = receiver.recv()
        memory.receive_segment(receiver, index, size)
    thread.join()
    sender.close()
    receiver.close()
    return memory


def test_tensors_round_trip_as_views_of_shared_memory():
    arena = Arena(initial_bytes=1 << 18, growth_bytes=1 << 16)
    data = np.arange(3 * INLINE_MAX_BYTES, dtype=np.float32).reshape(3, -1)
    text = np.array([b"a" * INLINE_MAX_BYTES, b"", "ünï".encode()], dtype=object)
    refs = [arena.write("X", data, "FP32"), arena.write("T", text, "BYTES")]
    assert all(segment != INLINE for _, _, _, segment, *_ in refs)
    memory = _pair(arena)
    view = memory.array(refs[0])
    np.testing.assert_array_equal(view, data)
    assert not view.flags.owndata and view.base is not None  # a view of the shared segment, not a copy
    assert memory.array(refs[1]).tolist() == text.tolist()
    assert memory.array(refs[0], copy=True).flags.owndata
    memory.close()
    arena.close()


def test_small_tensors_travel_inside_the_message_and_take_no_arena_space():
    arena = Arena(initial_bytes=1 << 16, growth_bytes=1 << 16)
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    text = np.array([b"a", b"", "ünï".encode()], dtype=object)
    refs = [arena.write("X", data, "FP32"), arena.write("T", text, "BYTES")]
    assert [segment for _, _, _, segment, *_ in refs] == [INLINE, INLINE] and arena.in_use() == 0
    refs = pickle.loads(pickle.dumps(refs))  # as the connection carries them
    memory = PeerMemory()
    received = memory.array(refs[0])
    np.testing.assert_array_equal(received, data)
    received[0, 0] = 42  # the model's own copy: writable, as shared-memory inputs are
    assert memory.array(refs[1]).tolist() == text.tolist()
    returned = []
    borrowed = memory.borrow(refs[0], returned.append)
    np.testing.assert_array_equal(borrowed, data)
    arena.free(refs)  # nothing to give back
    assert arena.in_use() == 0 and not returned
    arena.close()


def test_arena_reuses_freed_space_and_grows_by_segments():
    arena = Arena(initial_bytes=4096, growth_bytes=8192)
    first = [arena.allocate(1000) for _ in range(4)]  # 4 x 1024 aligned: exactly the first segment
    assert {segment for segment, _ in first} == {0}
    assert all(offset % ALIGNMENT == 0 for _, offset in first)
    spilled = arena.allocate(100)
    assert spilled[0] == 1 and arena.total_bytes == 4096 + 8192
    for segment, offset in first:
        arena.release(segment, offset, 1000)
    assert arena.allocate(4096) == (0, 0)  # the freed blocks coalesced into one
    assert arena.in_use() == 4096 + 128
    big = arena.allocate(100_000)  # larger than a growth step: a segment of its size
    assert big == (2, 0) and arena.segments[2].size >= 100_000
    arena.close()


CRASH_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
CRASH_MODEL = """
import os
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        data = pb_utils.get_input_tensor_by_name(requests[0], "IN").as_numpy()
        if data[0] < 0:
            os._exit(9)  # dies holding the shared memory of its inputs
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", data * 2)])]
"""
CRASHES = 100


def _shared_memory_fds(pid: int) -> int:
    folder = Path(f"/proc/{pid}/fd")
    count = 0
    for entry in folder.iterdir():
        try:
            if os.readlink(entry).startswith(("/memfd:", "/dev/shm/")):
                count += 1
        except OSError:
            pass
    return count


def _settled_shared_memory_fds(pid: int) -> int:
    """The count once it has held for a second: a retired lane ends its buffer a few reconcile ticks after the
    worker it served went away, later still on a loaded machine."""
    return settled(lambda: _shared_memory_fds(pid), steady=5, interval=0.25, timeout=20.0)


def test_worker_crashes_leave_no_shared_memory_or_descriptors(tmp_path):
    write_model(tmp_path / "models", "crashy", CRASH_CONFIG, {"1/model.py": CRASH_MODEL})
    process = ServerProcess(tmp_path / "models", "--model-control-mode", "explicit", "--load-model", "crashy")
    process.start()
    try:
        client = httpclient.InferenceServerClient(process.http_url, network_timeout=120)
        server = psutil.Process(process.process.pid)

        def infer(value: float) -> np.ndarray | None:
            while not client.is_model_ready("crashy"):  # its worker is being restarted
                time.sleep(0.02)
            tensor = httpclient.InferInput("IN", [4096], "FP32")  # 16 KiB through shared memory each time
            tensor.set_data_from_numpy(np.full([4096], value, dtype=np.float32), binary_data=True)
            try:
                return client.infer("crashy", [tensor]).as_numpy("OUT")
            except InferenceServerException as exc:
                assert value < 0 and "worker process exited with code 9" in exc.message(), exc.message()
                return None

        assert infer(-1.0) is None  # the first crash and restart: what stays from here on is the baseline
        np.testing.assert_array_equal(infer(1.0), np.full([4096], 2.0))
        # the lane follows the new worker within a quarter second, and ends the old's a few ticks later
        baseline_shm = _settled_shared_memory_fds(server.pid)
        baseline_fds = server.num_fds()
        dev_shm = set(os.listdir("/dev/shm"))
        for _ in range(CRASHES):
            assert infer(-1.0) is None
        np.testing.assert_array_equal(infer(1.0), np.full([4096], 2.0))
        assert _settled_shared_memory_fds(server.pid) == baseline_shm
        assert server.num_fds() <= baseline_fds + 2  # a client connection or two may come and go
        assert set(os.listdir("/dev/shm")) <= dev_shm
        children = [c for c in server.children() if "resource_tracker" not in " ".join(c.cmdline())]
        assert len(children) == 1 and children[0].status() != psutil.STATUS_ZOMBIE  # one worker, no zombies
        client.close()
    finally:
        assert process.stop() == 0, process.log()
