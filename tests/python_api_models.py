"""Python models written against Triton's documented Python-backend API, for tests/e2e/test_python_api.py."""

from __future__ import annotations

from pathlib import Path

from examples.build_models import build_add_sub_onnx
from tests.conformance.models import AUTO_COMPLETE  # completes to X [3] -> Y = 2X, max batch 8
from tests.support import write_model

HEADER = ("import asyncio\nimport json\nimport os\nimport threading\nimport time\nimport numpy as np\n"
          "import triton_python_backend_utils as pb_utils\n\n\n")

ONNX_ADD_SUB = """
    platform: "onnxruntime_onnx"
    max_batch_size: 8
    dynamic_batching { max_queue_delay_microseconds: 200000 }
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
             { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""

# -- BLS --------------------------------------------------------------------------------------------------------
BLS_CONFIG = """
    backend: "python"
    max_batch_size: 0
    input [ { name: "TARGET" data_type: TYPE_STRING dims: [ 1 ] }, { name: "A" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "ERROR" data_type: TYPE_STRING dims: [ 1 ] } ]
    instance_group [ { kind: KIND_CPU count: 2 } ]
"""
BLS = HEADER + '''
def _answer(out=None, error=""):
    out = np.zeros([0], np.float32) if out is None else np.asarray(out, np.float32)
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out),
                                       pb_utils.Tensor("ERROR", np.array([error.encode()], dtype=object))])


class TritonPythonModel:
    def execute(self, requests):
        return [self.one(r) for r in requests]

    def one(self, request):
        target = pb_utils.get_input_tensor_by_name(request, "TARGET").as_numpy()[0].decode()
        a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
        if target == "repeat":
            values = []
            for response in pb_utils.InferenceRequest(
                    model_name="repeat", requested_output_names=["OUT"],
                    inputs=[pb_utils.Tensor("IN", a.astype(np.int32))]).exec(decoupled=True):
                if response.has_error():
                    return _answer(error=response.error().message())
                tensor = pb_utils.get_output_tensor_by_name(response, "OUT")
                values.append(-1 if tensor is None else int(tensor.as_numpy()[0]))  # -1: the bare final flag
            return _answer(values)
        if target == "self":
            inner = pb_utils.InferenceRequest(model_name="bls", requested_output_names=["OUT", "ERROR"],
                                              inputs=[pb_utils.Tensor("TARGET", np.array([b"self"], dtype=object)),
                                                      pb_utils.Tensor("A", a)])
            response = inner.exec()
            if response.has_error():
                return _answer(error=response.error().message())
            return _answer(pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy(),
                           pb_utils.get_output_tensor_by_name(response, "ERROR").as_numpy()[0].decode())
        timeout = 200_000 if target == "slow" else 0
        # As python_backend's examples/bls/sync_model.py: names given as bytes (the BYTES tensor's element itself),
        # which Triton's pybind11 API reads as text.
        inputs = [pb_utils.Tensor(b"INPUT0", a.reshape(1, 4)), pb_utils.Tensor("INPUT1", np.ones([1, 4], np.float32))]
        if target == "slow":
            inputs = [pb_utils.Tensor("IN", a)]
        model_name = pb_utils.get_input_tensor_by_name(request, b"TARGET").as_numpy()[0]
        response = pb_utils.InferenceRequest(model_name=model_name, requested_output_names=[b"OUTPUT0"]
                                             if target != "slow" else ["OUT"], inputs=inputs, timeout=timeout).exec()
        if response.has_error():
            return _answer(error=f"{response.error().code()}|{response.error().message()}")
        if target != "slow":
            return _answer(pb_utils.get_output_tensor_by_name(response, b"OUTPUT0").as_numpy().reshape(-1))
        return _answer(response.output_tensors()[0].as_numpy().reshape(-1))
'''

SLOW_CONFIG = """
    backend: "python"
    max_batch_size: 0
    input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
    output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
SLOW = HEADER + '''
class TritonPythonModel:
    def execute(self, requests):
        time.sleep(1.5)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN")
                                                            .as_numpy())]) for r in requests]
'''

ASYNC_BLS = HEADER + '''
class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            calls = [pb_utils.InferenceRequest(model_name="onnx_add_sub", requested_output_names=["OUTPUT0"],
                                               inputs=[pb_utils.Tensor("INPUT0", a.reshape(1, 4) * k),
                                                       pb_utils.Tensor("INPUT1", np.zeros([1, 4], np.float32))]
                                               ).async_exec() for k in range(1, 5)]
            answers = await asyncio.gather(*calls)  # four BLS requests in flight at once
            total = sum(pb_utils.get_output_tensor_by_name(r, "OUTPUT0").as_numpy() for r in answers)
            pb_utils.Logger.log_info(f"async_bls summed {len(answers)} answers")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", total.reshape(-1)),
                                                         pb_utils.Tensor("ERROR", np.array([b""], dtype=object))]))
        return responses
'''

# -- decoupled ------------------------------------------------------------------------------------------------------
REPEAT_CONFIG = """
    backend: "python"
    max_batch_size: 0
    model_transaction_policy { decoupled: true }
    input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
    output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
    instance_group [ { kind: KIND_CPU count: 1 } ]
"""
# Sends each element of IN as a response of its own, from a thread started by execute (which returns at once);
# a negative element means: wait that many tenths of a second, checking whether the client went away.
REPEAT = HEADER + '''
class TritonPythonModel:
    def initialize(self, args):
        self.folder = args["model_repository"]

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.respond, args=(request,), daemon=True).start()
        return None

    def respond(self, request):
        values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
        sender = request.get_response_sender()
        for value in values:
            if value < 0:
                for _ in range(-value):
                    if request.is_cancelled():
                        with open(os.path.join(self.folder, "cancelled"), "a") as marker:
                            marker.write(request.request_id() + "\\n")
                        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                        return
                    time.sleep(0.1)
                continue
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        try:
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([0], np.int32))]))
        except pb_utils.TritonModelException as exc:
            pb_utils.Logger.log_warn(f"repeat: {exc}")
'''

GENERATE_CONFIG = """
    backend: "python"
    max_batch_size: 0
    model_transaction_policy { decoupled: true }
    input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
    output [ { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] } ]
"""
# LLM-style token streaming: one response per word, sent from execute, with response parameters.
GENERATE = HEADER + '''
class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()[0].decode()
            sender = request.get_response_sender()
            for index, word in enumerate(text.split()):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("text_output", np.array([word.encode()],
                                                        dtype=object))], parameters={"index": index}))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

# Decoupled, with request rescheduling (the documented pattern): the first time a request comes, it is
# rescheduled; the second time, it is answered with how many times it was seen.
RESCHEDULE = HEADER + '''
class TritonPythonModel:
    def initialize(self, args):
        self.seen = {}

    def execute(self, requests):
        for request in requests:
            key = request.request_id()
            self.seen[key] = self.seen.get(key, 0) + 1
            if self.seen[key] < 2:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                continue
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([self.seen[key]], np.int32))]),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

# -- logging, metrics, parameters, dlpack -------------------------------------------------------------------------
IDENTITY_CONFIG = """
    backend: "python"
    max_batch_size: 0
    input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
    output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
OBSERVED = HEADER + '''
class TritonPythonModel:
    def initialize(self, args):
        self.requests = pb_utils.MetricFamily(name="observed_requests", description="Requests seen",
                                              kind=pb_utils.MetricFamily.COUNTER)
        self.size = pb_utils.MetricFamily(name="observed_last_size", description="Size of the last input",
                                          kind=pb_utils.MetricFamily.GAUGE)
        self.values = pb_utils.MetricFamily(name="observed_values", description="Input values",
                                            kind=pb_utils.MetricFamily.HISTOGRAM)
        labels = {"model": "observed", "flavour": "test"}
        self.counter = self.requests.Metric(labels=labels)
        self.gauge = self.size.Metric(labels=labels)
        self.histogram = self.values.Metric(labels=labels, buckets=[1.0, 10.0])
        pb_utils.Logger.log_info("observed initialized")

    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            self.counter.increment(1)
            self.gauge.set(float(data.size))
            for value in data:
                self.histogram.observe(float(value))
            pb_utils.Logger.log_warn(f"observed counter at {self.counter.value():g}")
            pb_utils.Logger.log_error("observed error line")
            pb_utils.Logger.log_verbose("observed verbose line")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", data)],
                                                        parameters={"count": int(self.counter.value()),
                                                                    "note": "hello", "flag": True}))
        return responses
'''

DLPACK = HEADER + '''
import torch


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "IN")
            doubled = torch.from_dlpack(tensor) * 2  # read-only inputs (shared memory, gRPC) export too
            via_capsule = torch.utils.dlpack.from_dlpack(tensor.to_dlpack())
            assert torch.equal(via_capsule, torch.from_dlpack(tensor))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack("OUT", doubled)]))
        return responses
'''

BAD_CODE = HEADER + '''
class TritonPythonModel:
    async def helper(self, requests):
        return []

    def execute(self, requests):
        return self.helper(requests)  # the coroutine is never awaited
'''

# -- auto-complete and model control -------------------------------------------------------------------------------
CONTROL_CONFIG = """
    backend: "python"
    max_batch_size: 0
    input [ { name: "ACTION" data_type: TYPE_STRING dims: [ 1 ] } ]
    output [ { name: "READY" data_type: TYPE_BOOL dims: [ 1 ] } ]
"""
CONTROL = HEADER + '''
class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            action = pb_utils.get_input_tensor_by_name(request, "ACTION").as_numpy()[0].decode()
            if action == "load":
                pb_utils.load_model("controlled")
            elif action == "unload":
                pb_utils.unload_model("controlled")
            ready = pb_utils.is_model_ready("controlled")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("READY", np.array([ready]))]))
        return responses
'''

CRASHING = HEADER + '''
class TritonPythonModel:
    def execute(self, requests):
        os._exit(3)
'''


def build_python_api_repository(root: Path) -> Path:
    """Every model the Python-API tests serve."""
    build_add_sub_onnx(root / "onnx_add_sub" / "1" / "model.onnx", dims=4)
    write_model(root, "onnx_add_sub", ONNX_ADD_SUB)
    write_model(root, "bls", BLS_CONFIG, {"1/model.py": BLS})
    write_model(root, "async_bls", BLS_CONFIG, {"1/model.py": ASYNC_BLS})
    write_model(root, "slow", SLOW_CONFIG, {"1/model.py": SLOW})
    write_model(root, "repeat", REPEAT_CONFIG, {"1/model.py": REPEAT})
    write_model(root, "generate", GENERATE_CONFIG, {"1/model.py": GENERATE})
    write_model(root, "reschedule", REPEAT_CONFIG, {"1/model.py": RESCHEDULE})
    write_model(root, "observed", IDENTITY_CONFIG, {"1/model.py": OBSERVED})
    write_model(root, "dlpack", IDENTITY_CONFIG, {"1/model.py": DLPACK})
    in_process = 'parameters { key: "isolation" value { string_value: "thread" } }'
    write_model(root, "dlpack_thread", IDENTITY_CONFIG + in_process, {"1/model.py": DLPACK})
    write_model(root, "bad_code", IDENTITY_CONFIG, {"1/model.py": BAD_CODE})
    folder = root / "auto_complete" / "1"
    folder.mkdir(parents=True)
    (folder / "model.py").write_text(AUTO_COMPLETE)  # no config.pbtxt at all
    write_model(root, "control", CONTROL_CONFIG, {"1/model.py": CONTROL})
    write_model(root, "controlled", IDENTITY_CONFIG, {"1/model.py": SLOW})
    write_model(root, "crashing", IDENTITY_CONFIG, {"1/model.py": CRASHING})
    return root
