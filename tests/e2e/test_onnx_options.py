"""ONNX Runtime settings from the model config, as Triton's onnxruntime backend names them."""

from __future__ import annotations

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient

from examples.build_models import build_add_sub_onnx
from handlers.onnx.options import session_plan, tensorrt_options
from runtime.config.pbtxt import parse_model_config
from runtime.errors import ModelLoadError
from tests.conftest import ONNX_ADD_SUB_CONFIG
from tests.support import ServerProcess, write_model


def plan_for(extra: str, use_gpu: bool = False):
    spec = parse_model_config(ONNX_ADD_SUB_CONFIG + extra, "m")
    return session_plan(ort, spec.proto, spec.parameters, use_gpu, 0)


def test_parameters_and_graph_level_reach_the_session_options():
    plan = plan_for("""
        optimization { graph { level: 1 } }
        parameters { key: "intra_op_thread_count" value: { string_value: "2" } }
        parameters { key: "inter_op_thread_count" value: { string_value: "3" } }
        parameters { key: "execution_mode" value: { string_value: "1" } }
        parameters { key: "enable_mem_arena" value: { string_value: "0" } }
        parameters { key: "enable_mem_pattern" value: { string_value: "0" } }
        parameters { key: "memory.enable_memory_arena_shrinkage" value: { string_value: "cpu:0" } }
    """)
    options = plan.options
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (2, 3)
    assert options.execution_mode == ort.ExecutionMode.ORT_PARALLEL
    assert options.enable_cpu_mem_arena is False and options.enable_mem_pattern is False
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    assert plan.run_entries == {"memory.enable_memory_arena_shrinkage": "cpu:0"}
    assert plan.providers == ["CPUExecutionProvider"]
    levels = {-1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, 2: ort.GraphOptimizationLevel.ORT_DISABLE_ALL}
    for level, expected in levels.items():
        assert plan_for(f"optimization {{ graph {{ level: {level} }} }}").options.graph_optimization_level == expected
    assert plan_for("").options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL


def test_accelerators_the_host_lacks_are_refused_with_what_to_install():
    with pytest.raises(ModelLoadError, match="needs onnxruntime-openvino"):
        plan_for('optimization { execution_accelerators { cpu_execution_accelerator [ { name: "openvino" } ] } }')
    with pytest.raises(ModelLoadError, match="unknown cpu execution accelerator 'mkldnn'"):
        plan_for('optimization { execution_accelerators { cpu_execution_accelerator [ { name: "mkldnn" } ] } }')
    # a GPU accelerator only concerns instances on a GPU: a CPU instance runs on the CPU provider
    gpu = plan_for('optimization { execution_accelerators { gpu_execution_accelerator [ { name: "tensorrt" } ] } }')
    assert gpu.providers == ["CPUExecutionProvider"]
    with pytest.raises(ModelLoadError, match="parameter 'execution_mode' must be a whole number"):
        plan_for('parameters { key: "execution_mode" value: { string_value: "parallel" } }')


def test_tensorrt_parameters_map_to_the_provider_options_as_tritons_table_says():
    options = tensorrt_options({"precision_mode": "FP16", "max_workspace_size_bytes": "1073741824",
                                 "trt_engine_cache_enable": "1", "trt_engine_cache_path": "/tmp/trt"}, 1)
    assert options == {"device_id": 1, "trt_fp16_enable": True, "trt_int8_enable": False,
                       "trt_max_workspace_size": 1073741824, "trt_engine_cache_enable": True,
                       "trt_engine_cache_path": "/tmp/trt"}
    with pytest.raises(ModelLoadError, match="precision_mode must be FP32, FP16 or INT8"):
        tensorrt_options({"precision_mode": "FP8"}, 0)
    with pytest.raises(ModelLoadError, match="unknown tensorrt accelerator parameter 'turbo'"):
        tensorrt_options({"turbo": "1"}, 0)


def test_served_models_honour_the_settings_or_say_why_not(tmp_path):
    repository = tmp_path / "models"
    for name, extra in (("tuned", 'optimization { graph { level: 2 } }\n'
                                  'parameters { key: "execution_mode" value: { string_value: "1" } }\n'
                                  'parameters { key: "enable_mem_pattern" value: { string_value: "0" } }\n'),
                        ("wants_openvino", 'optimization { execution_accelerators { cpu_execution_accelerator '
                                           '[ { name: "openvino" } ] } }\n')):
        build_add_sub_onnx(repository / name / "1" / "model.onnx", datatype="INT32")
        write_model(repository, name, ONNX_ADD_SUB_CONFIG + extra)
    process = ServerProcess(repository, log=tmp_path / "server.log").start()
    try:
        client = httpclient.InferenceServerClient(process.http_url)
        inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
        assert client.infer("tuned", inputs).as_numpy("OUTPUT0").tolist() == [[2] * 16]
        index = {row["name"]: row for row in httpx.post(f"http://{process.http_url}/v2/repository/index").json()}
        assert "needs onnxruntime-openvino" in index["wants_openvino"]["reason"]
    finally:
        assert process.stop() == 0
