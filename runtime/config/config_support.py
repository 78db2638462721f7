"""The fields of model_config.proto this server does not honour, so that none is dropped without a word.

A field whose absence would change what a model computes (extra batch inputs, an iterative sequence, a custom
operations library, a repository agent that decrypts or checks the files) makes the load fail, naming it.  A field
that only tunes how Triton runs a model (GPU memory, TensorRT profiles, rate limits, eager batching) is ignored with
a warning naming it.  docs/features.md lists both.
"""

from __future__ import annotations

from google.protobuf.message import Message

from runtime.errors import ModelLoadError
from runtime.protocol.model_config_pb2 import ModelConfig

# field path -> why it cannot be served (the load fails)
REFUSED = {
    "batch_input": "batch inputs (extra tensors Triton builds for a batch) are not built",
    "batch_output": "batch outputs (outputs scattered by Triton) are not built",
    "sequence_batching.iterative_sequence": "iterative sequences are not scheduled",
    "model_operations": "custom operation libraries are not loaded",
    "model_repository_agents": "repository agents (which may decrypt or check model files) are not run",
}
# field path -> what serving without it means (a warning)
IGNORED = {
    "dynamic_batching.preserve_ordering": "each request gets its own responses in its own order; responses of "
                                          "different requests are not held back to keep arrival order",
    "instance_group.passive": "passive instances are scheduled like any other",
    "instance_group.host_policy": "host policies are not applied",
    "instance_group.secondary_devices": "secondary devices are not used",
    "instance_group.profile": "TensorRT profiles do not apply",
    "optimization.priority": "model priority is not applied",
    "optimization.cuda": "CUDA graph and stream settings are not applied",
    "optimization.eager_batching": "eager batching is not applied",
    "optimization.gather_kernel_buffer_threshold": "the gather kernel is not used",
    "cc_model_filenames": "the default model file is used on every GPU",
    "metric_tags": "metric tags are not added to the model's metrics",
    "sequence_batching.state.use_same_buffer_for_input_output": "state buffers are copied",
    "sequence_batching.state.use_growable_memory": "state buffers are copied",
}


def is_set(message: Message, path: str) -> bool:
    """Whether the dotted field ``path`` is set in ``message`` (in any element of a repeated field on the way)."""
    name, _, rest = path.partition(".")
    field = message.DESCRIPTOR.fields_by_name[name]
    if field.is_repeated:
        values = getattr(message, name)
        if not rest:
            return len(values) > 0
        return any(is_set(value, rest) for value in values)
    if field.message_type is not None:
        if not message.HasField(name):
            return False
        return True if not rest else is_set(getattr(message, name), rest)
    return bool(getattr(message, name))


def check_supported(config: ModelConfig, model: str) -> list[str]:
    """ModelLoadError for a field that cannot be served; the warnings for the fields ignored."""
    for path, reason in REFUSED.items():
        if is_set(config, path):
            raise ModelLoadError(f"model '{model}': config field '{path}' is not supported here: {reason}")
    return [f"model '{model}': config field '{path}' is ignored: {meaning}"
            for path, meaning in IGNORED.items() if is_set(config, path)]
