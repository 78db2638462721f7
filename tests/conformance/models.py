"""The Python-backend repository both servers serve in the conformance suite."""

from __future__ import annotations

import textwrap
from pathlib import Path

HEADER = "import json\nimport numpy as np\nimport triton_python_backend_utils as pb_utils\n\n\n"

ADD_SUB = HEADER + """
class TritonPythonModel:
    def initialize(self, args):
        self.config = json.loads(args["model_config"])

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", (a + b).astype(a.dtype)),
                                                         pb_utils.Tensor("OUTPUT1", (a - b).astype(a.dtype))]))
        return responses
"""

ADD_SUB_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: {max_batch}
input [ {{ name: "INPUT0" data_type: {dtype} dims: [ 4 ] }}, {{ name: "INPUT1" data_type: {dtype} dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: {dtype} dims: [ 4 ] }}, {{ name: "OUTPUT1" data_type: {dtype} dims: [ 4 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
{extra}
"""

TEXT = HEADER + """
class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            upper = np.array([t.upper() for t in text.reshape(-1)], dtype=np.object_).reshape(text.shape)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("UPPER", upper)]))
        return responses
"""
TEXT_CONFIG = """
name: "text"
backend: "python"
max_batch_size: 0
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "UPPER" data_type: TYPE_STRING dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU } ]
"""

VERSION = HEADER + """
class TritonPythonModel:
    def initialize(self, args):
        self.version = int(args["model_version"])

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("VERSION", np.array([self.version], dtype=np.int32))])
                for _ in requests]
"""
VERSION_CONFIG = """
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "VERSION" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU }} ]
{policy}
"""

ERROR_RESPONSE = HEADER + """
class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError("IN must be positive")) for _ in requests]
"""
RAISING = HEADER + """
class TritonPythonModel:
    def execute(self, requests):
        raise ValueError("boom from execute")
"""
INIT_RAISES = HEADER + """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("initialize failed on purpose")

    def execute(self, requests):
        return []
"""
ARGS = HEADER + """
class TritonPythonModel:
    def initialize(self, args):
        self.args = dict(args)
        self.args["model_config"] = json.loads(self.args["model_config"])
        self.args.pop("model_repository", None)  # the two servers serve different copies

    def execute(self, requests):
        text = json.dumps(self.args, sort_keys=True).encode()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("ARGS", np.array([text], dtype=np.object_))])
                for _ in requests]
"""
ARGS_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "ARGS" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 2 } ]
"""
SYNTAX_ERROR = "import triton_python_backend_utils as pb_utils\n\nclass TritonPythonModel:\n    def execute(self\n"
IDENTITY_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU } ]
"""

# Answers its input after sleeping that many seconds.
SLEEPY = HEADER + """
import time


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            time.sleep(float(value[0]))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]))
        return responses
"""

# -- the Python-backend API past plain execute: decoupled, BLS, async execute, auto-complete -------------------
REPEAT = HEADER + """
class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            for value in pb_utils.get_input_tensor_by_name(request, "IN").as_numpy():
                if value < 0:  # a negative value is sent half a second later
                    __import__("time").sleep(0.5)
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
REPEAT_CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU } ]
"""
WORDS = HEADER + """
class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
            sender = request.get_response_sender()
            for word in text.split():
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("text_output",
                                                                        np.array([word], dtype=np.object_))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
WORDS_CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU } ]
"""
# Calls TARGET with A (and ones): OUT holds what came back (each response's first value, for a decoupled target),
# CODE the error code of a failed call (-1 when it succeeded).
BLS = HEADER + """
def answer(values, code=-1):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.asarray(values, np.float32).reshape(-1)),
                                       pb_utils.Tensor("CODE", np.array([code], np.int32))])


class TritonPythonModel:
    def execute(self, requests):
        return [self.call(request) for request in requests]

    def call(self, request):
        target = pb_utils.get_input_tensor_by_name(request, "TARGET").as_numpy()[0].decode()
        a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
        if target.startswith("repeat"):
            inner = pb_utils.InferenceRequest(model_name="repeat", requested_output_names=["OUT"],
                                              inputs=[pb_utils.Tensor("IN", a.astype(np.int32))])
            if target == "repeat":
                values = []
                for response in inner.exec(decoupled=True):
                    if response.has_error():
                        return answer([], int(response.error().code()))
                    outputs = response.output_tensors()
                    values.append(outputs[0].as_numpy()[0] if outputs else -1)
                return answer(values)
            response = inner.exec()
        else:
            inputs = [pb_utils.Tensor("INPUT0", a), pb_utils.Tensor("INPUT1", np.ones_like(a))]
            response = pb_utils.InferenceRequest(model_name=target, requested_output_names=["OUTPUT0"],
                                                 inputs=inputs).exec()
        if response.has_error():
            return answer([], int(response.error().code()))
        return answer(response.output_tensors()[0].as_numpy())
"""
BLS_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "TARGET" data_type: TYPE_STRING dims: [ 1 ] }, { name: "A" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "CODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU } ]
"""
ASYNC_BLS = HEADER + """
import asyncio


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            calls = [pb_utils.InferenceRequest(model_name="add_sub", requested_output_names=["OUTPUT0"],
                                               inputs=[pb_utils.Tensor("INPUT0", a * k),
                                                       pb_utils.Tensor("INPUT1", np.zeros_like(a))]).async_exec()
                     for k in (1, 2, 3)]
            total = sum(r.output_tensors()[0].as_numpy() for r in await asyncio.gather(*calls))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", total),
                                                         pb_utils.Tensor("CODE", np.array([-1], np.int32))]))
        return responses
"""
AUTO_COMPLETE = HEADER + """
class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [3]})
        auto_complete_model_config.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [3]})
        auto_complete_model_config.set_max_batch_size(8)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X")
                                                            .as_numpy() * 2)]) for r in requests]
"""
PARTIAL_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 3 ] } ]
"""


CLASSIFY_CONFIG = """
name: "classify"
backend: "python"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "labels.txt" },
         { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


DOUBLE = HEADER + """
class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * 2)]) for r in requests]
"""
DOUBLE_CONFIG = """
backend: "python"
max_batch_size: 8
input [ {{ name: "X" data_type: {dtype} dims: [ 4 ] }} ]
output [ {{ name: "Y" data_type: {dtype} dims: [ 4 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""


def ensemble_config(steps: list[tuple[str, dict, dict]], inputs=("A", "B"), outputs=("DOUBLED", "DIFF"),
                    max_batch: int = 8) -> str:
    """An ensemble over ``steps`` (model, input_map, output_map); FP32 [4] tensors throughout."""
    def tensors(names):
        return ", ".join(f'{{ name: "{n}" data_type: TYPE_FP32 dims: [ 4 ] }}' for n in names)

    def step(model, ins, outs):
        maps = [f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in ins.items()]
        maps += [f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outs.items()]
        return f'{{ model_name: "{model}" model_version: -1 {" ".join(maps)} }}'

    return (f'platform: "ensemble"\nmax_batch_size: {max_batch}\ninput [ {tensors(inputs)} ]\n'
            f'output [ {tensors(outputs)} ]\nensemble_scheduling {{ step [ {", ".join(step(*s) for s in steps)} ] }}\n')


ADD_SUB_STEP = ("batched", {"INPUT0": "A", "INPUT1": "B"}, {"OUTPUT0": "sum", "OUTPUT1": "DIFF"})
DOUBLE_STEP = ("double", {"X": "sum"}, {"Y": "DOUBLED"})
ENSEMBLES = {  # name -> config; each needs an empty version folder
    "pipeline": ensemble_config([ADD_SUB_STEP, DOUBLE_STEP]),
    "pipeline_parallel": ensemble_config([("double", {"X": "A"}, {"Y": "DOUBLED"}),
                                          ("double", {"X": "B"}, {"Y": "DIFF"})]),
    "pipeline_of_pipeline": ensemble_config([("pipeline", {"A": "A", "B": "B"},
                                              {"DOUBLED": "DOUBLED", "DIFF": "DIFF"})]),
    "ensemble_cycle": ensemble_config([
        ("batched", {"INPUT0": "A", "INPUT1": "t1"}, {"OUTPUT0": "t2", "OUTPUT1": "DIFF"}),
        ("double", {"X": "t2"}, {"Y": "t1"}), ("double", {"X": "t2"}, {"Y": "DOUBLED"})], inputs=("A",)),
    "ensemble_unused_tensor": ensemble_config([ADD_SUB_STEP, DOUBLE_STEP, ("double", {"X": "B"}, {"Y": "spare"})]),
    "ensemble_missing_model": ensemble_config([ADD_SUB_STEP, ("nonexistent", {"X": "sum"}, {"Y": "DOUBLED"})]),
    "ensemble_dtype_mismatch": ensemble_config([ADD_SUB_STEP, ("double_int", {"X": "sum"}, {"Y": "DOUBLED"})]),
    "ensemble_batch_too_big": ensemble_config([ADD_SUB_STEP, DOUBLE_STEP], max_batch=16),
}
# A decoupled step (repeat: one response per value) followed by a plain one: the ensemble streams.
STREAMING_ENSEMBLE = """
platform: "ensemble"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "repeat" model_version: -1 input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "o" } },
  { model_name: "double_one" model_version: -1 input_map { key: "X" value: "o" } output_map { key: "Y" value: "Y" } }
] }
"""
DOUBLE_ONE_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU } ]
"""


ACCUMULATE = HEADER + """
class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            value = int(pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().reshape(-1)[0])
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy().tolist()
            ready = pb_utils.get_input_tensor_by_name(request, "READY").as_numpy().tolist()
            has_corrid = pb_utils.get_input_tensor_by_name(request, "CORRID") is not None
            key = request.correlation_id()
            self.sums[key] = (0 if start[0][0] else self.sums.get(key, 0)) + value
            seen = json.dumps([key, request.flags(), start, ready, has_corrid, json.loads(request.parameters())])
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT", np.array([[self.sums[key]]], np.int32)),
                pb_utils.Tensor("SEEN", np.array([[seen.encode()]], dtype=object))]))
        return responses
"""
ACCUMULATE_CONFIG = """
backend: "python"
max_batch_size: 4
sequence_batching {
  max_sequence_idle_microseconds: 60000000
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "SEEN" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


# What a model sees of pb_utils and of its request, as text: the module's listing, its version folder (the last two
# parts: the servers serve copies of the repository), the memory types' values, or the request's parameters.
PROBE = HEADER + """
class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            what = pb_utils.get_input_tensor_by_name(request, "WHAT").as_numpy()[0].decode()
            if what == "dir":
                text = json.dumps(sorted(name for name in dir(pb_utils) if not name.startswith("__")))
            elif what == "model_dir":
                text = "/".join(pb_utils.get_model_dir().split("/")[-2:])
            elif what == "memory_types":
                text = json.dumps([int(pb_utils.TRITONSERVER_MEMORY_CPU), int(pb_utils.TRITONSERVER_MEMORY_GPU)])
            else:
                text = request.parameters()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("TEXT", np.array([text.encode()],
                                                                                          dtype=np.object_))]))
        return responses
"""
PROBE_CONFIG = """
name: "probe"
backend: "python"
max_batch_size: 0
input [ { name: "WHAT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""


def write(root: Path, name: str, config: str | None, files: dict[str, str]) -> None:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (folder / "config.pbtxt").write_text(textwrap.dedent(config))
    for relative, text in files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def build_repository(root: Path, label_files: bool = True) -> Path:
    """Models covering what the conformance cases touch (see the module docstring of test_conformance).

    ``label_files``: include the model with a ``label_filename`` (the poll-mode suite leaves it out: with it in
    the repository, Triton 2.51's poll stopped picking up changes after its first reload in our runs)."""
    write(root, "add_sub", ADD_SUB_CONFIG.format(name="add_sub", max_batch=0, dtype="TYPE_FP32", extra=""),
          {"1/model.py": ADD_SUB})
    write(root, "add_sub_int", ADD_SUB_CONFIG.format(name="add_sub_int", max_batch=0, dtype="TYPE_INT32",
                                                     extra=""), {"1/model.py": ADD_SUB})
    write(root, "batched", ADD_SUB_CONFIG.format(
        name="batched", max_batch=8, dtype="TYPE_FP32",
        extra="dynamic_batching { max_queue_delay_microseconds: 100 }"), {"1/model.py": ADD_SUB})
    if label_files:
        write(root, "classify", CLASSIFY_CONFIG, {"1/model.py": ADD_SUB, "labels.txt": "cat\ndog\nbird\n"})
    write(root, "double", DOUBLE_CONFIG.format(dtype="TYPE_FP32"), {"1/model.py": DOUBLE})
    write(root, "double_int", DOUBLE_CONFIG.format(dtype="TYPE_INT32"), {"1/model.py": DOUBLE})
    write(root, "double_one", DOUBLE_ONE_CONFIG, {"1/model.py": DOUBLE})
    write(root, "accumulate", ACCUMULATE_CONFIG, {"1/model.py": ACCUMULATE})
    for name, config in {**ENSEMBLES, "streaming_ensemble": STREAMING_ENSEMBLE}.items():
        write(root, name, config, {})
        (root / name / "1").mkdir()
    write(root, "text", TEXT_CONFIG, {"1/model.py": TEXT})
    write(root, "versions_latest", VERSION_CONFIG.format(policy="version_policy: { latest { num_versions: 2 } }"),
          {f"{v}/model.py": VERSION for v in (1, 2, 3)})
    write(root, "versions_all", VERSION_CONFIG.format(policy="version_policy: { all { } }"),
          {f"{v}/model.py": VERSION for v in (1, 2)})
    write(root, "versions_specific", VERSION_CONFIG.format(policy="version_policy: { specific { versions: [1, 3] } }"),
          {f"{v}/model.py": VERSION for v in (1, 2, 3)})
    write(root, "versions_default", VERSION_CONFIG.format(policy=""), {f"{v}/model.py": VERSION for v in (1, 4)})
    no_group = ADD_SUB_CONFIG.format(name="no_instance_group", max_batch=4, dtype="TYPE_FP32", extra="")
    write(root, "no_instance_group", no_group.replace("instance_group [ { kind: KIND_CPU count: 1 } ]", ""),
          {"1/model.py": ADD_SUB})
    write(root, "args", ARGS_CONFIG, {"1/model.py": ARGS})
    write(root, "counted", ADD_SUB_CONFIG.format(  # only the statistics and metrics cases call it
        name="counted", max_batch=8, dtype="TYPE_FP32", extra=""), {"1/model.py": ADD_SUB})
    cached = ADD_SUB_CONFIG.format(name="cached", max_batch=0, dtype="TYPE_FP32",
                                   extra="response_cache { enable: true }")
    write(root, "cached", cached, {"1/model.py": ADD_SUB})  # only the statistics cases call it (the pair caches)
    write(root, "error_response", IDENTITY_CONFIG, {"1/model.py": ERROR_RESPONSE})
    write(root, "raising", IDENTITY_CONFIG, {"1/model.py": RAISING})
    write(root, "init_raises", IDENTITY_CONFIG, {"1/model.py": INIT_RAISES})
    write(root, "syntax_error", IDENTITY_CONFIG, {"1/model.py": SYNTAX_ERROR})
    write(root, "bad_config", 'backend: "python"\nmax_batch_size: {\n', {"1/model.py": ADD_SUB})
    write(root, "repeat", REPEAT_CONFIG, {"1/model.py": REPEAT})
    write(root, "words", WORDS_CONFIG, {"1/model.py": WORDS})
    write(root, "bls", BLS_CONFIG, {"1/model.py": BLS})
    write(root, "async_bls", BLS_CONFIG, {"1/model.py": ASYNC_BLS})
    write(root, "auto_complete", None, {"1/model.py": AUTO_COMPLETE})  # no config.pbtxt at all
    write(root, "auto_complete_partial", PARTIAL_CONFIG, {"1/model.py": AUTO_COMPLETE})
    write(root, "probe", PROBE_CONFIG, {"1/model.py": PROBE})
    write(root, "sleepy", IDENTITY_CONFIG, {"1/model.py": SLEEPY})
    return root
