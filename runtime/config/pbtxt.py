"""Model configuration read: ``config.pbtxt`` parsed with Triton's ModelConfig message, checked, its defaults
filled in as Triton fills them, and turned into the :class:`~runtime.config.spec.ModelSpec` every other module uses
(``runtime/config/spec.py``).
"""

from __future__ import annotations

from google.protobuf import json_format

from runtime.config.config_support import check_supported
from runtime.config.config_text import read_model_config, version_policy
from runtime.config.ensemble_config import ensemble_steps
from runtime.config.layout import DEFAULT_MODEL_FILENAMES
from runtime.config.sequence_config import sequence_spec
from runtime.config.spec import (
    ENSEMBLE,
    DynamicBatchingSpec,
    InstanceGroupSpec,
    ModelConfig,
    ModelSpec,
    QueuePolicy,
    TensorSpec,
)
from runtime.datatypes import DATATYPES, config_type_to_datatype
from runtime.errors import ModelLoadError
from runtime.protocol import model_config_pb2

# platform / backend string -> handler name and its default model file name.
_HANDLER_BY_PLATFORM = {
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "tensorflow_savedmodel": "tensorflow_savedmodel",
    "tensorflow_graphdef": "tensorflow_graphdef",
    "tensorrt_plan": "tensorrt",
    "python": "python",
    "ensemble": "ensemble",
}
_HANDLER_BY_BACKEND = {"onnxruntime": "onnxruntime", "pytorch": "pytorch", "python": "python", "openvino": "openvino",
                       "tensorrt": "tensorrt"}
# TensorFlow's backend serves two formats: the platform says which (Triton requires it).
_TENSORFLOW_HANDLERS = ("tensorflow_savedmodel", "tensorflow_graphdef")
_PLATFORM_BY_HANDLER = {"onnxruntime": "onnxruntime_onnx", "pytorch": "pytorch_libtorch", "python": "", "openvino": "",
                        "tensorflow_savedmodel": "tensorflow_savedmodel", "tensorflow_graphdef": "tensorflow_graphdef",
                        "tensorrt": "tensorrt_plan"}
_BACKEND_BY_HANDLER = {"tensorflow_savedmodel": "tensorflow", "tensorflow_graphdef": "tensorflow"}


def _tensor_spec(message, kind: str, model: str) -> TensorSpec:
    if not message.name:
        raise ModelLoadError(f"model '{model}': an {kind} has no name")
    type_name = model_config_pb2.DataType.Name(message.data_type)
    if type_name == "TYPE_INVALID":
        raise ModelLoadError(f"model '{model}': {kind} '{message.name}' has no data_type")
    datatype = config_type_to_datatype(type_name)
    if datatype not in DATATYPES:
        raise ModelLoadError(
            f"model '{model}': {kind} '{message.name}' has unsupported data_type {type_name}"
        )
    dims = tuple(int(d) for d in message.dims)
    if any(d < -1 for d in dims):
        raise ModelLoadError(f"model '{model}': {kind} '{message.name}' has invalid dims {list(dims)}")
    reshape = tuple(int(d) for d in message.reshape.shape) if message.HasField("reshape") else None
    return TensorSpec(
        name=message.name,
        datatype=datatype,
        dims=dims,
        reshape=reshape,
        optional=bool(getattr(message, "optional", False)),
        allow_ragged_batch=bool(getattr(message, "allow_ragged_batch", False)),
        label_filename=getattr(message, "label_filename", ""),
    )


def _queue_policy(policy: model_config_pb2.ModelQueuePolicy) -> QueuePolicy:
    return QueuePolicy(
        max_queue_size=policy.max_queue_size,
        default_timeout_microseconds=policy.default_timeout_microseconds,
        timeout_action=model_config_pb2.ModelQueuePolicy.TimeoutAction.Name(policy.timeout_action),
        allow_timeout_override=policy.allow_timeout_override,
    )


def _dynamic_batching(config: ModelConfig, model: str) -> DynamicBatchingSpec | None:
    if not config.HasField("dynamic_batching"):
        return None
    batching = config.dynamic_batching
    levels = batching.priority_levels
    if levels:  # checked as Triton checks them
        if not 1 <= batching.default_priority_level <= levels:
            raise ModelLoadError(f"default priority level must be in range [1, {levels}] for {model}")
        if any(not 1 <= level <= levels for level in batching.priority_queue_policy):
            raise ModelLoadError(f"priority queue policy must have priority level in range [1, {levels}] for "
                                 f"{model}")
    return DynamicBatchingSpec(
        preferred_batch_sizes=tuple(batching.preferred_batch_size),
        max_queue_delay_microseconds=batching.max_queue_delay_microseconds,
        queue_policy=_queue_policy(batching.default_queue_policy),
        priority_levels=levels,
        default_priority_level=batching.default_priority_level if levels else 0,
        priority_queue_policies={level: _queue_policy(policy)
                                 for level, policy in batching.priority_queue_policy.items()} if levels else {},
    )


def _handler_name(config: ModelConfig, model: str) -> str:
    by_platform = _HANDLER_BY_PLATFORM.get(config.platform) if config.platform else None
    by_backend = _HANDLER_BY_BACKEND.get(config.backend) if config.backend else None
    if config.backend == "tensorflow":
        if by_platform not in _TENSORFLOW_HANDLERS:
            raise ModelLoadError(f"model '{model}': backend 'tensorflow' needs platform 'tensorflow_savedmodel' or "
                                 "'tensorflow_graphdef'")
        return by_platform
    if config.platform and by_platform is None:
        raise ModelLoadError(f"model '{model}': unknown platform '{config.platform}' (served here: "
                             f"{', '.join(sorted(p for p in _HANDLER_BY_PLATFORM if p != ENSEMBLE))}, ensemble; "
                             f"backends {', '.join(sorted(_HANDLER_BY_BACKEND))})")
    if config.backend and by_backend is None:
        raise ModelLoadError(f"model '{model}': unknown backend '{config.backend}'")
    if by_platform and by_backend and by_platform != by_backend:
        raise ModelLoadError(
            f"model '{model}': platform '{config.platform}' does not match backend '{config.backend}'"
        )
    handler = by_platform or by_backend
    if handler is None:
        raise ModelLoadError(f"model '{model}': config sets neither platform nor backend")
    return handler


def _check_file_name(file_name: str, model: str) -> str:
    if not file_name or "/" in file_name or "\\" in file_name or file_name in (".", ".."):
        raise ModelLoadError(f"model '{model}': invalid default_model_filename '{file_name}'")
    return file_name


def _fill_defaults(config: ModelConfig, handler: str, gpu_count: int) -> None:
    """What Triton fills into a config it reads, so ``/config`` and ``args["model_config"]`` read the same."""
    if handler == ENSEMBLE:  # no model file, no instances: Triton fills in only the transaction policy
        config.model_transaction_policy.SetInParent()
        return
    if not config.default_model_filename:
        config.default_model_filename = DEFAULT_MODEL_FILENAMES[handler]
    optimization = config.optimization
    if not optimization.HasField("input_pinned_memory"):
        optimization.input_pinned_memory.enable = True
    if not optimization.HasField("output_pinned_memory"):
        optimization.output_pinned_memory.enable = True
    batching = config.dynamic_batching
    if config.HasField("dynamic_batching") and config.max_batch_size > 0 and not batching.preferred_batch_size:
        batching.preferred_batch_size.append(config.max_batch_size)
    kinds = model_config_pb2.ModelInstanceGroup
    if not config.instance_group:
        if gpu_count:
            config.instance_group.add(name=config.name, kind=kinds.KIND_GPU, count=1, gpus=range(gpu_count))
        else:
            config.instance_group.add(name=config.name, kind=kinds.KIND_CPU, count=1)
    for group in config.instance_group:
        if group.kind == kinds.KIND_AUTO:
            group.kind = kinds.KIND_GPU if gpu_count else kinds.KIND_CPU
        if group.kind == kinds.KIND_GPU and gpu_count and not group.gpus:
            group.gpus.extend(range(gpu_count))


def parse_model_config(text: str, folder_name: str, gpu_count: int = 0) -> ModelSpec:
    """Parse ``config.pbtxt`` text for the model in folder ``folder_name`` (``gpu_count``: GPUs this server
    may place instances on; KIND_AUTO and missing instance groups resolve against it, as in Triton).

    Raises ModelLoadError with a client-presentable reason for any problem.
    """
    return spec_from_config(read_model_config(text, folder_name), folder_name, gpu_count)


def read_model_config_json(text: str, folder_name: str) -> ModelConfig:
    """A config given as JSON (Triton's load ``config`` parameter, which replaces config.pbtxt), as written."""
    config = ModelConfig()
    try:
        json_format.Parse(text, config)
    except json_format.ParseError as exc:
        raise ModelLoadError(f"model '{folder_name}': the 'config' parameter is not a valid model config: "
                             f"{str(exc)[:512]}") from None
    return config


def spec_from_config(config: ModelConfig, folder_name: str, gpu_count: int = 0) -> ModelSpec:
    """Check a model config, fill in what Triton fills in, and type it."""
    if config.name and config.name != folder_name:
        raise ModelLoadError(
            f"model '{folder_name}': config name '{config.name}' does not match its folder name"
        )
    config.name = folder_name
    handler = _handler_name(config, folder_name)
    if not config.backend and handler != ENSEMBLE:
        config.backend = _BACKEND_BY_HANDLER.get(handler, handler)
    if not config.platform and _PLATFORM_BY_HANDLER[handler]:
        config.platform = _PLATFORM_BY_HANDLER[handler]
    if config.max_batch_size < 0:
        raise ModelLoadError(f"model '{folder_name}': max_batch_size must not be negative")
    inputs = tuple(_tensor_spec(m, "input", folder_name) for m in config.input)
    outputs = tuple(_tensor_spec(m, "output", folder_name) for m in config.output)
    for kind, tensors in (("input", inputs), ("output", outputs)):
        names = [t.name for t in tensors]
        if len(names) != len(set(names)):
            raise ModelLoadError(f"model '{folder_name}': duplicate {kind} names")
    if handler != "python" and (not inputs or not outputs):
        raise ModelLoadError(f"model '{folder_name}': config must declare its inputs and outputs")
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    _fill_defaults(config, handler, gpu_count)
    groups = []
    for index, group in enumerate(config.instance_group):
        if group.count == 0:
            group.count = 1
        if group.count < 0:
            raise ModelLoadError(f"model '{folder_name}': instance_group count must be positive")
        if not group.name:
            group.name = f"{folder_name}_{index}"
        groups.append(
            InstanceGroupSpec(
                kind=model_config_pb2.ModelInstanceGroup.Kind.Name(group.kind),
                count=group.count,
                gpus=tuple(group.gpus),
                name=group.name,
                rate_limiter_resources=tuple((r.name, r.count) for r in group.rate_limiter.resources),
                rate_limiter_priority=group.rate_limiter.priority,
            )
        )
    batching = _dynamic_batching(config, folder_name)
    if batching and config.max_batch_size == 0:
        raise ModelLoadError(f"model '{folder_name}': dynamic_batching needs max_batch_size > 0")
    file_name = "" if handler == ENSEMBLE else _check_file_name(config.default_model_filename, folder_name)
    return ModelSpec(
        name=folder_name,
        handler=handler,
        platform=config.platform,
        backend=config.backend,
        max_batch_size=config.max_batch_size,
        inputs=inputs,
        outputs=outputs,
        instance_groups=tuple(groups),
        version_policy=version_policy(config),
        dynamic_batching=batching,
        parameters={key: value.string_value for key, value in config.parameters.items()},
        default_model_filename=file_name,
        proto=config,
        decoupled=config.model_transaction_policy.decoupled,
        steps=ensemble_steps(config, folder_name, inputs, outputs) if handler == ENSEMBLE else (),
        response_cache=config.response_cache.enable,
        sequence=sequence_spec(config, folder_name),
        ignored_fields=tuple(check_supported(config, folder_name)),
    )
