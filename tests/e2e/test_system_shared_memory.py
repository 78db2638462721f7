"""System shared memory as tritonclient users drive it: inputs read from and outputs written into registered
regions over HTTP and gRPC, bounds, keys that try to name other files, limits, and unmapping."""

from __future__ import annotations

import os
import queue
import threading
import time
import uuid
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from runtime.errors import AlreadyExists, InvalidArgument
from runtime.extensions.shared_memory import SharedMemoryRegistry
from tests.add_sub_models import PYTHON_ADD_SUB
from tests.support import ServerProcess, python_model_source, write_model

CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
A = np.array([1, 2, 3, 4], np.float32)
B = np.array([10, 20, 30, 40], np.float32)


@pytest.fixture
def served(tmp_path):
    write_model(tmp_path / "models", "add_sub", CONFIG, {"1/model.py": PYTHON_ADD_SUB})
    with ServerProcess(tmp_path / "models", "--allow-client-shm", "true") as process:
        yield process


@pytest.fixture
def regions():
    tag = uuid.uuid4().hex[:8]
    inputs = shm.create_shared_memory_region(f"in-{tag}", f"/st_test_in_{tag}", 32)
    outputs = shm.create_shared_memory_region(f"out-{tag}", f"/st_test_out_{tag}", 32)
    shm.set_shared_memory_region(inputs, [A, B])
    yield tag, inputs, outputs
    shm.destroy_shared_memory_region(inputs)
    shm.destroy_shared_memory_region(outputs)


def _through_regions(served, protocol: str, tag: str) -> tuple:
    """A client of ``protocol`` with regions "in" and "out" registered, the two inputs read from "in" and OUTPUT0
    asked for in "out": (module, client, inputs, requested output)."""
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(served.http_url if protocol == "http" else served.grpc_url)
    client.register_system_shared_memory("in", f"/st_test_in_{tag}", 32)
    client.register_system_shared_memory("out", f"/st_test_out_{tag}", 32)
    first, second = module.InferInput("INPUT0", [4], "FP32"), module.InferInput("INPUT1", [4], "FP32")
    first.set_shared_memory("in", 16)
    second.set_shared_memory("in", 16, offset=16)
    summed = module.InferRequestedOutput("OUTPUT0")
    summed.set_shared_memory("out", 16)
    return module, client, (first, second), summed


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_inputs_and_outputs_through_registered_regions(served, regions, protocol):
    tag, inputs, outputs = regions
    module, client, (first, second), summed = _through_regions(served, protocol, tag)
    result = client.infer("add_sub", [first, second], outputs=[summed, module.InferRequestedOutput("OUTPUT1")])
    np.testing.assert_array_equal(shm.get_contents_as_numpy(outputs, np.float32, [4]), A + B)  # written in place
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)  # the other output as usual

    status = client.get_system_shared_memory_status(**({} if protocol == "http" else {"as_json": True}))
    names = [r["name"] for r in status] if protocol == "http" else sorted(status["regions"])
    assert sorted(names) == ["in", "out"]
    client.unregister_system_shared_memory("in")
    with pytest.raises(InferenceServerException, match="Unable to find shared memory region: 'in'"):
        client.infer("add_sub", [first, second])
    client.unregister_system_shared_memory()
    assert not [name for name in _open_shm_objects(served) if tag in name]  # closed, nothing left behind


def _open_shm_objects(served) -> list[str]:
    """The shared-memory objects the server holds open or mapped."""
    opened = []
    for fd in Path(f"/proc/{served.process.pid}/fd").iterdir():
        try:
            opened.append(os.readlink(fd))
        except OSError:
            pass
    maps = Path(f"/proc/{served.process.pid}/maps").read_text().splitlines()
    return [name for name in opened + maps if "/dev/shm/" in name]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("use", ["input", "output"])
def test_a_region_its_client_shrinks_fails_that_request_only(served, regions, protocol, use):
    """A client may ftruncate its object after registering it: the request that names it gets 400, the server lives
    (a mapping read or written past the object's end was a SIGBUS that killed the server)."""
    tag, inputs, outputs = regions
    module, client, (first, second), summed = _through_regions(served, protocol, tag)
    shrunk = f"/dev/shm/st_test_{'in' if use == 'input' else 'out'}_{tag}"
    os.truncate(shrunk, 0)
    with pytest.raises(InferenceServerException, match="no longer holds its registered 32 bytes") as refused:
        client.infer("add_sub", [first, second], outputs=[summed])
    assert "400" in str(refused.value.status()) or "INVALID_ARGUMENT" in str(refused.value.status())
    os.truncate(shrunk, 32)  # grown back: the same registration serves again
    shm.set_shared_memory_region(inputs, [A, B])
    client.infer("add_sub", [first, second], outputs=[summed])
    np.testing.assert_array_equal(shm.get_contents_as_numpy(outputs, np.float32, [4]), A + B)
    client.unregister_system_shared_memory()
    assert served.process.poll() is None


def test_bad_keys_bounds_and_sizes_are_refused(served, regions, tmp_path):
    tag, *_ = regions
    base = f"http://{served.http_url}/v2/systemsharedmemory/region"
    outside = tmp_path / "secret.txt"
    outside.write_text("not yours")
    link = Path("/dev/shm") / f"st_test_link_{tag}"
    os.symlink(outside, link)
    try:
        for key in ("../../etc/passwd", "/../etc/passwd", "relative", f"/st_test_in_{tag}/x", "/",
                    f"/st_test_link_{tag}", "/st_test_no_such_object"):
            response = httpx.post(f"{base}/r/register", json={"key": key, "offset": 0, "byte_size": 4})
            assert response.status_code == 400 and "Unable to open shared memory region" in response.json()["error"]
    finally:
        link.unlink()
    past = httpx.post(f"{base}/r/register", json={"key": f"/st_test_in_{tag}", "offset": 16, "byte_size": 32})
    assert past.status_code == 400 and "Invalid shared memory region" in past.json()["error"]
    for bad in ({"key": f"/st_test_in_{tag}", "byte_size": -1}, {"key": 7, "byte_size": 4}, [1]):
        assert httpx.post(f"{base}/r/register", json=bad).status_code == 400

    client = httpclient.InferenceServerClient(served.http_url)
    client.register_system_shared_memory("in", f"/st_test_in_{tag}", 32)
    with pytest.raises(InferenceServerException, match="already in manager"):
        client.register_system_shared_memory("in", f"/st_test_in_{tag}", 32)
    first, second = httpclient.InferInput("INPUT0", [4], "FP32"), httpclient.InferInput("INPUT1", [4], "FP32")
    first.set_shared_memory("in", 16, offset=24)  # past the registered 32 bytes
    second.set_data_from_numpy(B)
    with pytest.raises(InferenceServerException, match="Invalid offset \\+ byte size"):
        client.infer("add_sub", [first, second])
    first = httpclient.InferInput("INPUT0", [4], "FP32")
    first.set_shared_memory("in", 12)  # fewer bytes than the shape needs
    with pytest.raises(InferenceServerException, match="byte size mismatch"):
        client.infer("add_sub", [first, second])
    assert httpx.get(f"http://{served.http_url}/v2/health/live").status_code == 200


def test_registrations_are_bounded(regions):
    tag, *_ = regions
    registry = SharedMemoryRegistry(max_regions=2, max_total_bytes=48)
    registry.register("a", f"/st_test_in_{tag}", 0, 16)
    with pytest.raises(AlreadyExists):
        registry.register("a", f"/st_test_in_{tag}", 0, 16)
    with pytest.raises(InvalidArgument, match="exceed"):
        registry.register("b", f"/st_test_in_{tag}", 0, 32 + 1)
    registry.register("b", f"/st_test_out_{tag}", 0, 16)
    with pytest.raises(InvalidArgument, match="at most 2"):
        registry.register("c", f"/st_test_out_{tag}", 0, 4)
    copied = registry.read({"shared_memory_region": "a", "shared_memory_byte_size": 16})
    registry.unregister()
    assert np.frombuffer(copied, np.float32).tolist() == A.tolist()  # a private copy, valid after unregistering
    assert registry.status() == []


SLOW_ADD_SUB = python_model_source("""
open(os.environ["ADD_SUB_STARTED"], "a").close()
time.sleep(1.0)
answers = []
for request in requests:
    a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
    b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
    answers.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]))
return answers
""")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_regions_unregistered_during_an_inference_stay_until_it_is_done(tmp_path, regions, protocol):
    """Triton 2.53 (server #7743, qa/L0_shared_memory test_unregister_shm_during_inference_*): unregistering every
    region while a request that uses them runs succeeds at once; the regions stay listed and usable (a second
    request placed then is served from them too) until the last such request is done, then are gone."""
    started = tmp_path / "started"
    write_model(tmp_path / "models", "add_sub", CONFIG, {"1/model.py": SLOW_ADD_SUB})
    with ServerProcess(tmp_path / "models", "--allow-client-shm", "true",
                       env={"ADD_SUB_STARTED": str(started)}) as served:
        tag, inputs, outputs = regions
        module, client, (first, second), summed = _through_regions(served, protocol, tag)
        answers: queue.Queue = queue.Queue()

        def ask() -> None:
            asking = module.InferenceServerClient(served.http_url if protocol == "http" else served.grpc_url)
            threading.Thread(target=lambda: answers.put(asking.infer("add_sub", [first, second], outputs=[summed]))
                             ).start()

        ask()
        deadline = time.monotonic() + 30
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        other = httpclient.InferenceServerClient(served.http_url)
        other.unregister_system_shared_memory()  # while the request runs: no error
        assert sorted(r["name"] for r in other.get_system_shared_memory_status()) == ["in", "out"]
        ask()  # placed after the unregister, while the first still holds the regions
        for _ in range(2):
            answers.get(timeout=30)
            np.testing.assert_array_equal(shm.get_contents_as_numpy(outputs, np.float32, [4]), A + B)
        deadline = time.monotonic() + 10
        while other.get_system_shared_memory_status() and time.monotonic() < deadline:
            time.sleep(0.02)  # the second request's end lets them go
        assert other.get_system_shared_memory_status() == []
        with pytest.raises(InferenceServerException, match="Unable to find system shared memory region: 'in'"):
            other.get_system_shared_memory_status("in")
        assert not [name for name in _open_shm_objects(served) if tag in name]
