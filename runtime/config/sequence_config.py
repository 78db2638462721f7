"""A model's ``sequence_batching`` as the sequence scheduler (``sequence.py``) reads it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.datatypes import config_type_to_datatype
from runtime.errors import ModelLoadError
from runtime.protocol import model_config_pb2

DEFAULT_IDLE_SECONDS = 1.0  # Triton's default max_sequence_idle_microseconds
_KINDS = ("CONTROL_SEQUENCE_START", "CONTROL_SEQUENCE_END", "CONTROL_SEQUENCE_READY", "CONTROL_SEQUENCE_CORRID")


@dataclass(frozen=True)
class ControlInput:
    """An input the server fills for each request of a sequence."""

    name: str
    kind: str  # one of _KINDS
    datatype: str
    false_value: Any = 0
    true_value: Any = 1


@dataclass(frozen=True)
class StateSpec:
    """Implicit state: the model reads ``input_name`` and writes ``output_name``; the server carries the value
    from one request of a sequence to the next (zeros, or ``initial_state``'s zeros, at START)."""

    input_name: str
    output_name: str
    datatype: str
    dims: tuple[int, ...]


@dataclass(frozen=True)
class SequenceSpec:
    strategy: str  # direct | oldest
    idle_seconds: float
    controls: tuple[ControlInput, ...]
    max_candidates: int = 0  # oldest: sequences an instance holds at once (0: max_batch_size)
    states: tuple[StateSpec, ...] = ()
    max_queue_delay_seconds: float = 0.0  # how long a batch may wait to fill (either strategy)
    preferred_batch_sizes: tuple[int, ...] = ()  # oldest: batch sizes worth waiting for


def sequence_spec(config: Any, model: str) -> SequenceSpec | None:
    """The ``sequence_batching`` of a config (None without one); ModelLoadError for a control it cannot use."""
    if not config.HasField("sequence_batching"):
        return None
    batching = config.sequence_batching
    strategy = batching.WhichOneof("strategy_choice") or "direct"
    controls = []
    for control_input in batching.control_input:
        for control in control_input.control:
            kind = type(control).Kind.Name(control.kind)
            if kind not in _KINDS:
                raise ModelLoadError(f"model '{model}': control kind {kind} is not supported")
            if kind == "CONTROL_SEQUENCE_CORRID":
                datatype = config_type_to_datatype(model_config_pb2.DataType.Name(control.data_type))
                controls.append(ControlInput(control_input.name, kind, datatype))
                continue
            for field_name, datatype in (("int32_false_true", "INT32"), ("fp32_false_true", "FP32"),
                                         ("bool_false_true", "BOOL")):
                values = list(getattr(control, field_name))
                if values:
                    if len(values) != 2:
                        raise ModelLoadError(f"model '{model}': control '{control_input.name}' needs a false and a "
                                             "true value")
                    controls.append(ControlInput(control_input.name, kind, datatype, values[0], values[1]))
                    break
            else:
                raise ModelLoadError(f"model '{model}': control '{control_input.name}' has no false/true values")
    idle = batching.max_sequence_idle_microseconds / 1e6 or DEFAULT_IDLE_SECONDS
    candidates = batching.oldest.max_candidate_sequences if strategy == "oldest" else 0
    chosen = batching.oldest if strategy == "oldest" else batching.direct
    preferred = tuple(int(size) for size in batching.oldest.preferred_batch_size) if strategy == "oldest" else ()
    return SequenceSpec(strategy=strategy, idle_seconds=idle, controls=tuple(controls), max_candidates=candidates,
                        states=tuple(_state(state, model) for state in batching.state),
                        max_queue_delay_seconds=chosen.max_queue_delay_microseconds / 1e6,
                        preferred_batch_sizes=preferred)


def _state(state: Any, model: str) -> StateSpec:
    if not state.input_name or not state.output_name:
        raise ModelLoadError(f"model '{model}': a sequence state needs an input_name and an output_name")
    dims = tuple(int(d) for d in state.dims)
    if any(d < 0 for d in dims):
        raise ModelLoadError(f"model '{model}': state '{state.input_name}' needs fixed dims, not {list(dims)}")
    for initial in state.initial_state:
        if initial.WhichOneof("state_data") == "data_file":
            raise ModelLoadError(f"model '{model}': state '{state.input_name}': initial_state from a data_file is "
                                 "not supported (zero_data is)")
    datatype = config_type_to_datatype(model_config_pb2.DataType.Name(state.data_type))
    return StateSpec(state.input_name, state.output_name, datatype, dims)
