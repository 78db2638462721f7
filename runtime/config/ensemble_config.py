"""An ensemble's ``ensemble_scheduling``: its steps, and the checks of the graph they wire that need no other model
(Triton's words, in Triton's order: a repository poll rejects such a config before any model is loaded)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from runtime.errors import ModelLoadError


@dataclass(frozen=True)
class EnsembleStep:
    """One step of an ensemble: a request to ``model_name`` (``model_version`` -1: its newest ready version)."""

    model_name: str
    model_version: int
    input_map: dict[str, str]  # the step model's input -> the ensemble tensor it reads
    output_map: dict[str, str]  # the step model's output -> the ensemble tensor it writes


def ensemble_steps(config: Any, name: str, inputs: Sequence[Any], outputs: Sequence[Any]) -> tuple[EnsembleStep, ...]:
    """The steps of an ensemble's config, once the graph they form is sound; ModelLoadError otherwise."""
    steps = tuple(EnsembleStep(model_name=step.model_name, model_version=int(step.model_version),
                               input_map=dict(step.input_map), output_map=dict(step.output_map))
                  for step in config.ensemble_scheduling.step)
    if not steps:
        raise ModelLoadError(f"must specify 'step' for ensemble '{name}'")
    producer: dict[str, int] = {}
    for index, step in enumerate(steps):
        if not step.model_name:
            raise ModelLoadError(f"must specify 'model_name' in step {index} of ensemble '{name}'")
        for tensor in step.output_map.values():
            if tensor in producer:
                raise ModelLoadError(f"ensemble tensor '{tensor}' can appear in an output map only once for "
                                     f"ensemble '{name}' step {index}")
            producer[tensor] = index
    consumed = {tensor for step in steps for tensor in step.input_map.values()}
    for output in outputs:
        if output.name not in producer:
            raise ModelLoadError(f"ensemble output '{output.name}' for ensemble {name}' is not used")
    for tensor in inputs:
        if tensor.name not in consumed:
            raise ModelLoadError(f"ensemble input '{tensor.name}' for ensemble {name}' is not used")
    connected = {tensor.name for tensor in inputs}
    for output in outputs:
        missing = _first_unconnected(output.name, steps, producer, connected, set())
        if missing is not None:
            raise ModelLoadError(f"output '{output.name}' for ensemble '{name}' is not written: at least one of its "
                                 f"depending tensors, '{missing}', is not connected")
    wanted = consumed | {output.name for output in outputs}
    for tensor in producer:
        if tensor not in wanted:
            raise ModelLoadError(f"ensemble tensor '{tensor}' is unused in ensemble '{name}'")
    return steps


def _first_unconnected(tensor: str, steps: tuple[EnsembleStep, ...], producer: dict[str, int], connected: set[str],
                       path: set[str]) -> str | None:
    """A tensor ``tensor`` depends on that can never be written (no step writes it, or it lies on a cycle);
    None when every tensor it depends on comes from the ensemble's inputs."""
    if tensor in connected:
        return None
    index = producer.get(tensor)
    if index is None:
        return tensor
    path = path | {tensor}
    for source in steps[index].input_map.values():
        if source in path:  # a cycle: what this tensor needs waits for the tensor itself
            return tensor
        missing = _first_unconnected(source, steps, producer, connected, path)
        if missing is not None:
            return missing
    connected.add(tensor)
    return None


def load_order(names: Sequence[str], dependencies: Callable[[str], list[str]]) -> list[list[str]]:
    """``names`` in batches to load one after the other: an ensemble after the models it calls (among
    ``names``); each batch may load concurrently.  Ensembles that call each other in a circle come last, together
    (their load says what is missing)."""
    wanted = set(names)
    needs = {name: [d for d in dependencies(name) if d in wanted and d != name] for name in names}
    done: set[str] = set()
    remaining = list(names)
    batches: list[list[str]] = []
    while remaining:
        batch = [name for name in remaining if all(d in done for d in needs[name])] or remaining
        batches.append(batch)
        done.update(batch)
        remaining = [name for name in remaining if name not in done]
    return batches


def composing_models(steps: Sequence[EnsembleStep]) -> list[str]:
    """The models an ensemble's steps call, once each, in step order."""
    return list(dict.fromkeys(step.model_name for step in steps))
