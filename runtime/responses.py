"""A request's response built from its model's outputs, as Triton answers: the outputs asked for (or all the model
produced) in the config's order, reshaped where the config says, classified where asked."""

from __future__ import annotations

import numpy as np

from runtime.config.spec import ModelSpec
from runtime.datatypes import datatype_of
from runtime.errors import InternalError
from runtime.extensions.classification import classify, requested_count
from runtime.models.model import ModelVersion
from runtime.types import InferRequest, InferResponse, InferTensor, RequestedOutput


def build_response(model: ModelVersion, request: InferRequest, arrays: dict[str, np.ndarray],
                   complete: bool = True) -> InferResponse:
    """The response built from a model's outputs; ``complete``: every requested output must be there (a decoupled
    model's responses may each carry some of them; since Triton 2.52 an ensemble leaves out the outputs its
    composing models did not produce, and its steps ask for theirs so)."""
    spec = model.spec
    complete = complete and not (request.outputs_optional or spec.is_ensemble)
    wanted = (_in_config_order(spec, request.outputs) if request.outputs
              else [(name, None) for name in _output_names(spec, arrays)])
    reshaped = spec.reshaped_outputs
    outputs: list[InferTensor] = []
    for name, parameters in wanted:
        array = arrays.get(name)
        if array is None:
            if not complete:
                continue
            raise InternalError(f"model '{spec.name}' did not produce output '{name}'")
        if reshaped and name in reshaped:
            declared = spec.output(name)
            if declared is not None and declared.dims.count(-1) <= 1:
                batch = [array.shape[0]] if spec.max_batch_size > 0 else []
                array = array.reshape(batch + list(declared.dims))
        if parameters:
            if count := requested_count(parameters):
                array = classify(array, count, model.labels.get(name, []), spec.max_batch_size > 0)
            parameters = dict(parameters)
        # numpy's shape: a tuple of ints already
        outputs.append(InferTensor(name, datatype_of(array), array.shape, array, parameters or {}))
    returned = getattr(arrays, "parameters", None)
    return InferResponse(spec.name, str(model.version), request.id, outputs, dict(returned) if returned else {})


def _in_config_order(spec: ModelSpec, requested: list[RequestedOutput]) -> list[tuple[str, dict]]:
    """Requested outputs once each, in the order the config lists them (as Triton answers): (name, parameters)."""
    by_name = {output.name: output.parameters for output in requested}
    ordered = [(t.name, by_name.pop(t.name)) for t in spec.outputs if t.name in by_name]
    return ordered + list(by_name.items())


def _output_names(spec: ModelSpec, arrays: dict[str, np.ndarray]) -> list[str]:
    declared = [t.name for t in spec.outputs if t.name in arrays]
    return declared + [name for name in arrays if spec.output(name) is None]
