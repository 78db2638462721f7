"""A model's configuration as every module but the parser sees it: typed, validated, immutable.

``runtime.config.pbtxt`` reads ``config.pbtxt`` (Triton's ModelConfig message) into a :class:`ModelSpec`; the
message itself is kept on the spec for the config endpoints (printed here as Triton prints it) and for the Python
backend's ``args["model_config"]``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import NamedTuple, cast

import numpy as np
from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor

from runtime.config.config_text import VersionPolicy
from runtime.config.ensemble_config import EnsembleStep
from runtime.config.sequence_config import SequenceSpec
from runtime.datatypes import WIRE_DTYPES
from runtime.protocol import model_config_pb2

ModelConfig = model_config_pb2.ModelConfig
ENSEMBLE = "ensemble"  # the ensemble platform's handler name


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
    # what every valid request's inputs look like past the batch dim, when that is fixed (every input required,
    # its dims fixed, not reshaped, not ragged): the batch signature of them all (scheduling/batch_forming.py)
    fixed_input_signature: tuple | None = field(init=False, repr=False, compare=False, default=None)
    _inputs_by_name: dict[str, TensorSpec] = field(init=False, repr=False, compare=False, default_factory=dict)
    _outputs_by_name: dict[str, TensorSpec] = field(init=False, repr=False, compare=False, default_factory=dict)

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
        if self.inputs and all(not t.optional and -1 not in t.dims and t.reshape is None and not t.allow_ragged_batch
                               for t in self.inputs):
            object.__setattr__(self, "fixed_input_signature",
                               tuple(sorted((t.name, t.datatype, tuple(t.dims)) for t in self.inputs)))

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
    return cast(dict, _as_triton_prints(data, config.DESCRIPTOR))
