"""ONNX external data may only point inside the model's folder, wherever in the model the tensor hides."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from handlers.base import HandlerContext
from handlers.onnx.handler import OnnxRuntimeHandler, check_external_data
from runtime.config.pbtxt import parse_model_config
from runtime.errors import ModelLoadError
from tests.support import add_sub_config

OUTSIDE = "../../../etc/passwd"


def _external(name: str, location: str) -> TensorProto:
    tensor = numpy_helper.from_array(np.zeros(4, dtype=np.float32), name)
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value=location)
    return tensor


def _sparse(location: str):
    values = _external("values", location)
    indices = numpy_helper.from_array(np.arange(4, dtype=np.int64), "indices")
    return helper.make_sparse_tensor(values, indices, [8])


def _save(path: Path, graph, functions=()) -> Path:
    model = helper.make_model(graph, functions=list(functions),
                              opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("local", 1)])
    path.write_bytes(model.SerializeToString())
    return path


def _io():
    return ([helper.make_tensor_value_info("X", TensorProto.FLOAT, [4])],
            [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4])])


def sparse_initializer(location: str):
    inputs, outputs = _io()
    graph = helper.make_graph([helper.make_node("Identity", ["X"], ["Y"])], "g", inputs, outputs)
    graph.sparse_initializer.append(_sparse(location))
    return graph, ()


def sparse_constant(location: str):
    inputs, outputs = _io()
    constant = helper.make_node("Constant", [], ["C"], sparse_value=_sparse(location))
    graph = helper.make_graph([constant, helper.make_node("Identity", ["X"], ["Y"])], "g", inputs, outputs)
    return graph, ()


def function_body(location: str):
    inputs, outputs = _io()
    constant = helper.make_node("Constant", [], ["C"], value=_external("W", location))
    body = helper.make_function("local", "AddW", ["A"], ["B"], [constant, helper.make_node("Add", ["A", "C"], ["B"])],
                                [helper.make_opsetid("", 18)])
    graph = helper.make_graph([helper.make_node("AddW", ["X"], ["Y"], domain="local")], "g", inputs, outputs)
    return graph, (body,)


def dense_in_subgraph(location: str):
    inputs, outputs = _io()
    branch_inputs, branch_outputs = [], [helper.make_tensor_value_info("B", TensorProto.FLOAT, [4])]
    branch = helper.make_graph([helper.make_node("Constant", [], ["B"], value=_external("W", location))], "branch",
                               branch_inputs, branch_outputs)
    cond = helper.make_node("Constant", [], ["cond"], value=numpy_helper.from_array(np.array(True), "cond"))
    node = helper.make_node("If", ["cond"], ["Y"], then_branch=branch, else_branch=branch)
    return helper.make_graph([cond, node], "g", inputs, outputs), ()


@pytest.mark.parametrize("build", [sparse_initializer, sparse_constant, function_body, dense_in_subgraph])
def test_external_data_outside_the_folder_is_refused(tmp_path, build):
    graph, functions = build(OUTSIDE)
    with pytest.raises(ModelLoadError, match="refers to external data outside the model folder"):
        check_external_data(_save(tmp_path / "model.onnx", graph, functions))


@pytest.mark.parametrize("build", [sparse_initializer, sparse_constant, function_body, dense_in_subgraph])
def test_external_data_inside_the_folder_is_allowed(tmp_path, build):
    graph, functions = build("weights.bin")
    check_external_data(_save(tmp_path / "model.onnx", graph, functions))


def test_a_model_without_external_data_is_not_parsed_again(tmp_path):
    """The check reads a model with no external tensor without importing onnx (a cold start's time)."""
    import subprocess
    import sys

    inputs, outputs = _io()
    plain = _save(tmp_path / "plain.onnx", helper.make_graph([helper.make_node("Identity", ["X"], ["Y"])], "g",
                                                              inputs, outputs))
    external = _save(tmp_path / "external.onnx", sparse_initializer("weights.bin")[0])
    probe = ("import sys; from pathlib import Path; from handlers.onnx.handler import check_external_data; "
             "check_external_data(Path(sys.argv[1])); print('onnx' in sys.modules)")
    root = Path(__file__).resolve().parents[1]
    imported = [subprocess.run([sys.executable, "-c", probe, str(path)], cwd=root, capture_output=True, text=True,
                               check=True).stdout.strip() for path in (plain, external)]
    assert imported == ["False", "True"]


def test_a_corrupt_model_fails_its_load_either_way(tmp_path):
    """Bytes that look like an external-data entry are parsed (and refused); other garbage reaches onnxruntime."""
    (tmp_path / "marked.onnx").write_bytes(b"\xff" * 16 + b"\x0a\x08location" + b"\xff" * 16)
    with pytest.raises(ModelLoadError, match="cannot parse ONNX model"):
        check_external_data(tmp_path / "marked.onnx")
    garbage = tmp_path / "garbage" / "1" / "model.onnx"
    garbage.parent.mkdir(parents=True)
    garbage.write_bytes(b"\xff" * 64)
    spec = parse_model_config(add_sub_config('platform: "onnxruntime_onnx"'), "garbage")
    handler = OnnxRuntimeHandler(HandlerContext(spec=spec, version=1, repository_dir=tmp_path))
    with pytest.raises(ModelLoadError, match="onnxruntime could not load the model"):
        handler.load()
