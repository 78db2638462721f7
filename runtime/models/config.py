"""Model configuration: ``config.pbtxt`` parsed with Triton's ModelConfig message.

:func:`parse_model_config` turns the text into a :class:`ModelSpec`, the typed
view every other module uses; the protobuf message is kept for the config
endpoints and the Python backend's ``args["model_config"]``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from google.protobuf import json_format, text_format
from google.protobuf.descriptor import FieldDescriptor

from runtime.datatypes import DATATYPES, WIRE_DTYPES, config_type_to_datatype
from runtime.errors import ModelLoadError
from runtime.models.config_support import check_supported
from runtime.protocol import model_config_pb2
from runtime.scheduling.ensemble_config import EnsembleStep, ensemble_steps
from runtime.scheduling.sequence_config import SequenceSpec, sequence_spec

ModelConfig = model_config_pb2.ModelConfig

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
ENSEMBLE = "ensemble"
_HANDLER_BY_BACKEND = {"onnxruntime": "onnxruntime", "pytorch": "pytorch", "python": "python", "openvino": "openvino",
                       "tensorrt": "tensorrt"}
# TensorFlow's backend serves two formats: the platform says which (Triton requires it).
_TENSORFLOW_HANDLERS = ("tensorflow_savedmodel", "tensorflow_graphdef")
_PLATFORM_BY_HANDLER = {"onnxruntime": "onnxruntime_onnx", "pytorch": "pytorch_libtorch", "python": "", "openvino": "",
                        "tensorflow_savedmodel": "tensorflow_savedmodel", "tensorflow_graphdef": "tensorflow_graphdef",
                        "tensorrt": "tensorrt_plan"}
_BACKEND_BY_HANDLER = {"tensorflow_savedmodel": "tensorflow", "tensorflow_graphdef": "tensorflow"}
DEFAULT_MODEL_FILENAMES = {"onnxruntime": "model.onnx", "pytorch": "model.pt", "python": "model.py",
                           "openvino": "model.xml", "tensorflow_savedmodel": "model.savedmodel",
                           "tensorflow_graphdef": "model.graphdef", "tensorrt": "model.plan"}


@dataclass(frozen=True)
class TensorSpec:
    """An input or output as the config declares it (dims exclude the batch dim)."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    reshape: tuple[int, ...] | None = None
    optional: bool = False
    allow_ragged_batch: bool = False
    label_filename: str = ""  # an output's class labels, one per line (the classification extension)


class ExactInput(NamedTuple):
    """What a request's input must be, exactly, for the one-pass check (``ModelSpec.exact_inputs``)."""

    datatype: str
    dims: tuple[int, ...]  # -1: any size
    dtype: np.dtype  # the wire (little-endian) dtype
    row_bytes: int  # bytes per batch row (the whole tensor without batching); 0 where a dim is -1


@dataclass(frozen=True)
class InstanceGroupSpec:
    kind: str  # KIND_GPU, KIND_CPU, KIND_MODEL (KIND_AUTO is resolved when the config is read)
    count: int
    gpus: tuple[int, ...] = ()
    name: str = ""
    rate_limiter_resources: tuple[tuple[str, int], ...] = ()  # held while executing (--rate-limit=execution_count)
    rate_limiter_priority: int = 0

    def instance_names(self) -> list[str]:
        """Triton's instance names: ``<group name>_<index>``."""
        return [f"{self.name}_{index}" for index in range(self.count)]

    def placed(self) -> list[tuple[str, int]]:
        """(name, device id) of each instance: the group's instances take its GPUs in turn."""
        return [(name, self.gpus[index % len(self.gpus)] if self.gpus else 0)
                for index, name in enumerate(self.instance_names())]


@dataclass(frozen=True)
class VersionPolicy:
    """Which numbered versions to serve: ``latest`` n, ``all``, or ``specific`` ones."""

    kind: str = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    def select(self, available: list[int]) -> list[int]:
        """The versions to load, ascending, out of those on disk."""
        ordered = sorted(set(available))
        if self.kind == "all":
            return ordered
        if self.kind == "specific":
            return [v for v in ordered if v in self.versions]
        return ordered[-self.num_versions :] if self.num_versions > 0 else []


@dataclass(frozen=True)
class QueuePolicy:
    max_queue_size: int = 0  # 0: unbounded in Triton; we apply a server default
    default_timeout_microseconds: int = 0
    timeout_action: str = "REJECT"
    allow_timeout_override: bool = False


@dataclass(frozen=True)
class DynamicBatchingSpec:
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_microseconds: int = 0
    queue_policy: QueuePolicy = field(default_factory=QueuePolicy)
    priority_levels: int = 0  # 0: one queue; else levels 1 (taken first) .. priority_levels
    default_priority_level: int = 0  # a request's level when it names none, or one out of range
    priority_queue_policies: dict[int, QueuePolicy] = field(default_factory=dict)  # a level's own policy

    def queue_policy_of(self, level: int) -> QueuePolicy:
        return self.priority_queue_policies.get(level, self.queue_policy)


@dataclass(frozen=True)
class ModelSpec:
    """Typed, validated model configuration."""

    name: str
    handler: str  # onnxruntime | pytorch | python | ensemble
    platform: str
    backend: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    instance_groups: tuple[InstanceGroupSpec, ...]
    version_policy: VersionPolicy
    dynamic_batching: DynamicBatchingSpec | None
    parameters: dict[str, str]
    default_model_filename: str
    proto: ModelConfig = field(repr=False, compare=False)
    decoupled: bool = False  # model_transaction_policy { decoupled: true }
    steps: tuple[EnsembleStep, ...] = ()  # ensemble_scheduling (platform "ensemble")
    response_cache: bool = False  # response_cache { enable: true }
    sequence: SequenceSpec | None = None  # sequence_batching (a stateful model)
    ignored_fields: tuple[str, ...] = ()  # warnings: config fields set that are not honoured (config_support)
    # every input by name when all are required and of fixed-size datatypes (else empty): a request that matches
    # exactly is validated in a few comparisons per input (validation.py)
    exact_inputs: dict[str, ExactInput] = field(init=False, repr=False, compare=False, default_factory=dict)
    reshaped_outputs: frozenset[str] = field(init=False, repr=False, compare=False, default=frozenset())
    reshapes_inputs: bool = field(init=False, repr=False, compare=False, default=False)  # any input's reshape set

    @property
    def is_ensemble(self) -> bool:
        return self.handler == ENSEMBLE

    def __post_init__(self) -> None:
        object.__setattr__(self, "_inputs_by_name", {t.name: t for t in self.inputs})
        object.__setattr__(self, "_outputs_by_name", {t.name: t for t in self.outputs})
        object.__setattr__(self, "reshaped_outputs", frozenset(t.name for t in self.outputs if t.reshape is not None))
        object.__setattr__(self, "reshapes_inputs", any(t.reshape is not None for t in self.inputs))
        if all(not t.optional and t.datatype in WIRE_DTYPES for t in self.inputs):
            object.__setattr__(self, "exact_inputs", {
                t.name: ExactInput(t.datatype, tuple(t.dims), WIRE_DTYPES[t.datatype],
                                   0 if -1 in t.dims else math.prod(t.dims) * WIRE_DTYPES[t.datatype].itemsize)
                for t in self.inputs})

    def input(self, name: str) -> TensorSpec | None:
        return self._inputs_by_name.get(name)

    def output(self, name: str) -> TensorSpec | None:
        return self._outputs_by_name.get(name)

    def instance_needs(self) -> list[tuple[tuple[tuple[str, int], ...], int]]:
        """Each instance's rate-limiter resources and priority, in the order instances are created."""
        return [(group.rate_limiter_resources, group.rate_limiter_priority)
                for group in self.instance_groups for _ in range(group.count)]

    @property
    def instance_count(self) -> int:
        return max(1, sum(group.count for group in self.instance_groups))

    def to_json_dict(self) -> dict:
        """The config as Triton's ``/config`` endpoint prints it (int64 fields as numbers)."""
        return config_to_json_dict(self.proto)

    def to_json(self) -> str:
        return json.dumps(self.to_json_dict())


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


def version_policy_of(text: str, folder_name: str) -> VersionPolicy:
    """Only the version policy of a config's text (what a sync needs to choose versions); ModelLoadError if the
    text does not parse. The rest is checked when the model loads."""
    return _version_policy(read_model_config(text, folder_name))


def _version_policy(config: ModelConfig) -> VersionPolicy:
    which = config.version_policy.WhichOneof("policy_choice")
    if which == "all":
        return VersionPolicy(kind="all")
    if which == "specific":
        return VersionPolicy(kind="specific", versions=tuple(config.version_policy.specific.versions))
    if which == "latest":
        return VersionPolicy(kind="latest", num_versions=config.version_policy.latest.num_versions)
    return VersionPolicy()


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


def read_model_config(text: str, folder_name: str) -> ModelConfig:
    """``config.pbtxt`` text as a ModelConfig, as written (nothing filled in)."""
    config = ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise ModelLoadError(f"model '{folder_name}': config.pbtxt syntax error: {exc}") from None
    return config


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
        version_policy=_version_policy(config),
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


_INT64_TYPES = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED64,
    FieldDescriptor.TYPE_SFIXED64,
}


def _as_triton_prints(value: object, descriptor) -> object:
    """json_format's output as Triton prints a config: int64 fields as numbers, and each message's fields in the
    .proto's declaration order (json_format puts the fields that are set first, defaults after)."""
    if not isinstance(value, dict):
        return value
    printed = {}
    for field_descriptor in descriptor.fields:
        key = field_descriptor.name
        if key not in value:
            continue
        item = value[key]
        if field_descriptor.type in _INT64_TYPES:
            item = [int(x) for x in item] if isinstance(item, list) else int(item)
        elif field_descriptor.message_type is not None:
            sub = field_descriptor.message_type
            if sub.GetOptions().map_entry:
                value_type = sub.fields_by_name["value"].message_type
                if value_type is not None:
                    item = {map_key: _as_triton_prints(entry, value_type) for map_key, entry in item.items()}
            elif isinstance(item, list):
                item = [_as_triton_prints(element, sub) for element in item]
            else:
                item = _as_triton_prints(item, sub)
        printed[key] = item
    return printed


def config_to_json_dict(config: ModelConfig) -> dict:
    data = json_format.MessageToDict(
        config, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    scheduling = data.get("ensemble_scheduling")
    if scheduling is not None and not scheduling.get("max_inflight_requests"):
        del scheduling["max_inflight_requests"]  # newer than Triton 2.51's config: it prints no such field
    return _as_triton_prints(data, config.DESCRIPTOR)
