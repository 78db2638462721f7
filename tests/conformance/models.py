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


def write(root: Path, name: str, config: str | None, files: dict[str, str]) -> None:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (folder / "config.pbtxt").write_text(textwrap.dedent(config))
    for relative, text in files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def build_repository(root: Path) -> Path:
    """Models covering what the conformance cases touch (see the module docstring of test_conformance)."""
    write(root, "add_sub", ADD_SUB_CONFIG.format(name="add_sub", max_batch=0, dtype="TYPE_FP32", extra=""),
          {"1/model.py": ADD_SUB})
    write(root, "add_sub_int", ADD_SUB_CONFIG.format(name="add_sub_int", max_batch=0, dtype="TYPE_INT32",
                                                     extra=""), {"1/model.py": ADD_SUB})
    write(root, "batched", ADD_SUB_CONFIG.format(
        name="batched", max_batch=8, dtype="TYPE_FP32",
        extra="dynamic_batching { max_queue_delay_microseconds: 100 }"), {"1/model.py": ADD_SUB})
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
    write(root, "error_response", IDENTITY_CONFIG, {"1/model.py": ERROR_RESPONSE})
    write(root, "raising", IDENTITY_CONFIG, {"1/model.py": RAISING})
    write(root, "init_raises", IDENTITY_CONFIG, {"1/model.py": INIT_RAISES})
    write(root, "syntax_error", IDENTITY_CONFIG, {"1/model.py": SYNTAX_ERROR})
    write(root, "bad_config", 'backend: "python"\nmax_batch_size: {\n', {"1/model.py": ADD_SUB})
    return root
