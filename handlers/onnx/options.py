"""ONNX Runtime session options and execution providers from a model's config, as Triton's onnxruntime backend
reads them: ``parameters`` (``intra_op_thread_count``, ``inter_op_thread_count``, ``execution_mode``,
``enable_mem_arena``, ``enable_mem_pattern``, ``memory.enable_memory_arena_shrinkage``,
``session.use_device_allocator_for_initializers``), ``optimization { graph { level } }`` and
``optimization { execution_accelerators { gpu_execution_accelerator / cpu_execution_accelerator } }``
(``tensorrt``, ``cuda``, ``openvino``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from handlers.base import parameter_flag
from runtime.errors import ModelLoadError

# Triton's TensorRT accelerator parameters -> the TensorRT execution provider's options (bools as "True"/"False")
_TRT_INT = {"max_workspace_size_bytes": "trt_max_workspace_size", "trt_max_partition_iterations": None,
            "trt_min_subgraph_size": None, "trt_dla_core": None, "trt_builder_optimization_level": None,
            "trt_auxiliary_streams": None, "trt_ep_context_embed_mode": None}
_TRT_BOOL = {"int8_use_native_calibration_table": "trt_int8_use_native_calibration_table", "trt_dla_enable": None,
             "trt_engine_cache_enable": None, "trt_dump_subgraphs": None, "trt_force_sequential_engine_build": None,
             "trt_context_memory_sharing_enable": None, "trt_layer_norm_fp32_fallback": None,
             "trt_timing_cache_enable": None, "trt_force_timing_cache": None, "trt_detailed_build_log": None,
             "trt_build_heuristics_enable": None, "trt_sparsity_enable": None, "trt_cuda_graph_enable": None,
             "trt_dump_ep_context_model": None}
_TRT_STRING = {"int8_calibration_table_name": "trt_int8_calibration_table_name", "trt_engine_cache_path": None,
               "trt_engine_cache_prefix": None, "trt_timing_cache_path": None, "trt_tactic_sources": None,
               "trt_extra_plugin_lib_paths": None, "trt_profile_min_shapes": None, "trt_profile_max_shapes": None,
               "trt_profile_opt_shapes": None, "trt_ep_context_file_path": None}
# Triton's deprecated CUDA parameters (model-level) that still configure the CUDA provider
_CUDA_PARAMETERS = ("cudnn_conv_algo_search", "gpu_mem_limit", "arena_extend_strategy", "do_copy_in_default_stream")


@dataclass
class SessionPlan:
    """What ``InferenceSession`` gets: options, providers, and config entries for every run."""

    options: Any
    providers: list = field(default_factory=list)
    run_entries: dict[str, str] = field(default_factory=dict)


def _count(value: str, name: str) -> int:
    if not value.strip().lstrip("-").isdigit():
        raise ModelLoadError(f"parameter '{name}' must be a whole number, not '{value}'")
    return int(value)


def tensorrt_options(parameters: dict[str, str], device_id: int) -> dict[str, Any]:
    options: dict[str, Any] = {"device_id": device_id}
    for key, value in parameters.items():
        if key == "precision_mode":
            mode = value.upper()
            if mode not in ("FP32", "FP16", "INT8"):
                raise ModelLoadError(f"tensorrt precision_mode must be FP32, FP16 or INT8, not '{value}'")
            options["trt_fp16_enable"] = mode in ("FP16", "INT8")
            options["trt_int8_enable"] = mode == "INT8"
        elif key in _TRT_INT:
            options[_TRT_INT[key] or key] = _count(value, key)
        elif key in _TRT_BOOL:
            options[_TRT_BOOL[key] or key] = parameter_flag(value, key)
        elif key in _TRT_STRING:
            options[_TRT_STRING[key] or key] = value
        else:
            raise ModelLoadError(f"unknown tensorrt accelerator parameter '{key}'")
    return options


def client_sized(config: Any) -> bool:
    """Whether a client chooses how large the model's tensors are: a dim of an input or output is variable (-1)
    beyond the batch. ONNX Runtime's CPU arena keeps the largest tensors it ever handed out for the session's
    life (four 50 MiB answers of an identity model left 200 MiB resident), so such a model runs without it unless
    its config says ``enable_mem_arena``: its tensors then go back when they are freed. Without the arena a tensor
    under 32 MiB costs the same (glibc reuses its heap, runtime/allocator.py); a larger one is mapped afresh."""
    return any(dim < 0 for tensor in (*config.input, *config.output) for dim in tensor.dims)


def session_plan(ort: Any, config: Any, parameters: dict[str, str], use_gpu: bool, device_id: int) -> SessionPlan:
    """Session options and providers for one instance (``use_gpu``: the instance may run on a GPU present)."""
    options = ort.SessionOptions()
    if parameters.get("intra_op_thread_count", "").strip():
        options.intra_op_num_threads = _count(parameters["intra_op_thread_count"], "intra_op_thread_count")
    if parameters.get("inter_op_thread_count", "").strip():
        options.inter_op_num_threads = _count(parameters["inter_op_thread_count"], "inter_op_thread_count")
    if "execution_mode" in parameters:
        mode = _count(parameters["execution_mode"], "execution_mode")
        options.execution_mode = ort.ExecutionMode.ORT_PARALLEL if mode == 1 else ort.ExecutionMode.ORT_SEQUENTIAL
    if "enable_mem_arena" in parameters:
        options.enable_cpu_mem_arena = parameter_flag(parameters["enable_mem_arena"], "enable_mem_arena")
    elif client_sized(config):
        options.enable_cpu_mem_arena = False
    if "enable_mem_pattern" in parameters:
        options.enable_mem_pattern = parameter_flag(parameters["enable_mem_pattern"], "enable_mem_pattern")
    if "session.use_device_allocator_for_initializers" in parameters:
        options.add_session_config_entry("session.use_device_allocator_for_initializers",
                                         parameters["session.use_device_allocator_for_initializers"])
    # Spinning intra-op threads burn the cores the event loop and other instances need (allow_spinning: "1").
    spinning = "1" if parameters.get("allow_spinning", "0") == "1" else "0"
    options.add_session_config_entry("session.intra_op.allow_spinning", spinning)
    options.add_session_config_entry("session.inter_op.allow_spinning", spinning)
    level = config.optimization.graph.level if config.optimization.HasField("graph") else 0
    levels = ort.GraphOptimizationLevel
    options.graph_optimization_level = {-1: levels.ORT_ENABLE_BASIC, 1: levels.ORT_ENABLE_EXTENDED,
                                        2: levels.ORT_DISABLE_ALL}.get(level, levels.ORT_ENABLE_ALL)
    run_entries = {}
    if "memory.enable_memory_arena_shrinkage" in parameters:
        run_entries["memory.enable_memory_arena_shrinkage"] = parameters["memory.enable_memory_arena_shrinkage"]

    available = set(ort.get_available_providers())
    accelerators = config.optimization.execution_accelerators
    providers: list = []
    if use_gpu and "CUDAExecutionProvider" in available:
        cuda: dict[str, Any] = {"device_id": device_id}
        cuda.update({key: parameters[key] for key in _CUDA_PARAMETERS if key in parameters})
        for accelerator in accelerators.gpu_execution_accelerator:
            if accelerator.name == "tensorrt":
                if "TensorrtExecutionProvider" not in available:
                    raise ModelLoadError("the tensorrt execution accelerator needs an onnxruntime-gpu built with "
                                         "TensorRT, and TensorRT's libraries, on this host")
                providers.append(("TensorrtExecutionProvider",
                                  tensorrt_options(dict(accelerator.parameters), device_id)))
            elif accelerator.name == "cuda":
                cuda.update(dict(accelerator.parameters))
            else:
                raise ModelLoadError(f"unknown gpu execution accelerator '{accelerator.name}' (tensorrt, cuda)")
        providers.append(("CUDAExecutionProvider", cuda))
    for accelerator in accelerators.cpu_execution_accelerator:
        if accelerator.name != "openvino":
            raise ModelLoadError(f"unknown cpu execution accelerator '{accelerator.name}' (openvino)")
        if "OpenVINOExecutionProvider" not in available:
            raise ModelLoadError("the openvino execution accelerator needs onnxruntime-openvino in place of "
                                 "onnxruntime (pip install onnxruntime-openvino)")
        providers.append(("OpenVINOExecutionProvider", dict(accelerator.parameters)))
    providers.append("CPUExecutionProvider")
    return SessionPlan(options, providers, run_entries)
