"""TensorFlow handlers (Triton's ``tensorflow_savedmodel`` and ``tensorflow_graphdef`` platforms), on the CPU
through ``tensorflow-cpu`` (the ``[tensorflow]`` extra).

- SavedModel (``model.savedmodel/``): the signature named by the ``TF_SIGNATURE_DEF`` parameter (default
  ``serving_default``, as Triton); config inputs and outputs are the signature's input and output keys.
- GraphDef (``model.graphdef``, a frozen graph): config inputs and outputs name the graph's tensors
  (``NAME`` meaning ``NAME:0``), as Triton's TensorFlow backend maps them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from handlers.base import HandlerContext, TensorHandler, require_module
from runtime.datatypes import as_bytes_array, datatype_of
from runtime.errors import InternalError, ModelLoadError

DEFAULT_SIGNATURE = "serving_default"


def _tensorflow() -> Any:
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ start-up chatter stays out of the log
    return require_module("tensorflow", "tensorflow", "tensorflow")


def _datatype(tf: Any, dtype: Any) -> str:
    if dtype == tf.string:
        return "BYTES"
    return datatype_of(np.empty(0, dtype=dtype.as_numpy_dtype))


class _TensorFlowHandler(TensorHandler):
    """What both formats share: feeding numpy arrays as tensors, checking the config against the model."""

    def __init__(self, context: HandlerContext) -> None:
        super().__init__(context)
        self.function: Any = None  # the SavedModel's signature, or the GraphDef's wrapped function
        self._tf: Any = None  # tensorflow, imported at load

    def _check(self, kind: str, declared: tuple, found: dict[str, tuple[Any, Any]]) -> None:
        """``found``: name -> (dtype, shape) of the model's tensors."""
        tf = self._tf
        batch_rank = 1 if self.spec.max_batch_size > 0 else 0
        for tensor in declared:
            if tensor.name not in found:
                raise ModelLoadError(f"config {kind} '{tensor.name}' is not in the TensorFlow model "
                                     f"(it has {sorted(found)})")
            dtype, shape = found[tensor.name]
            model_type = _datatype(tf, dtype)
            if model_type != tensor.datatype:
                raise ModelLoadError(f"config {kind} '{tensor.name}' is {tensor.datatype} but the model's is "
                                     f"{dtype.name}")
            dims = tensor.reshape if tensor.reshape is not None else tensor.dims
            if shape.rank is not None and shape.rank != batch_rank + len(dims):
                raise ModelLoadError(f"config {kind} '{tensor.name}' has rank {batch_rank + len(dims)} (with batch "
                                     f"dim) but the model's has rank {shape.rank}")

    def prepare(self, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
        tf = self._tf
        return {name: tf.constant(array) for name, array in inputs.items()}

    def collect(self, results: dict[str, Any]) -> dict[str, np.ndarray]:
        outputs = {}
        for tensor in self.spec.outputs:
            array = results[tensor.name].numpy()
            outputs[tensor.name] = as_bytes_array(array) if array.dtype == np.object_ else array
        return outputs

    def unload(self, deadline: float | None = None) -> None:
        self.function = None


class SavedModelHandler(_TensorFlowHandler):
    """A SavedModel's serving signature."""

    def load(self) -> None:
        tf = self._tf = _tensorflow()
        path = self.context.model_path
        if not path.is_dir():
            raise ModelLoadError(f"model '{self.spec.name}' version {self.context.version}: missing SavedModel folder "
                                 f"'{self.spec.default_model_filename}'")
        name = self.spec.parameters.get("TF_SIGNATURE_DEF", DEFAULT_SIGNATURE)
        try:
            loaded = tf.saved_model.load(str(path))
        except Exception as exc:  # noqa: BLE001 - TensorFlow raises many types
            raise ModelLoadError(f"TensorFlow could not load the SavedModel: {type(exc).__name__}: {exc}") from None
        if name not in loaded.signatures:
            raise ModelLoadError(f"the SavedModel has no signature '{name}' (it has {sorted(loaded.signatures)})")
        self._loaded = loaded  # the signature's variables live as long as the loaded object
        self.function = loaded.signatures[name]
        inputs = {key: (spec.dtype, spec.shape) for key, spec in self.function.structured_input_signature[1].items()}
        outputs = {key: (spec.dtype, spec.shape) for key, spec in self.function.structured_outputs.items()}
        self._check("input", self.spec.inputs, inputs)
        self._check("output", self.spec.outputs, outputs)
        missing = sorted(set(inputs) - {tensor.name for tensor in self.spec.inputs})
        if missing:
            raise ModelLoadError(f"SavedModel inputs {missing} are not in the config")

    def infer(self, feeds: dict[str, Any]) -> dict[str, Any]:
        try:
            return self.function(**feeds)
        except Exception as exc:  # noqa: BLE001
            raise InternalError(f"TensorFlow execution failed: {type(exc).__name__}: {exc}") from None

    def unload(self, deadline: float | None = None) -> None:
        super().unload(deadline)
        self._loaded = None


class GraphDefHandler(_TensorFlowHandler):
    """A frozen GraphDef, pruned to the config's inputs and outputs."""

    def load(self) -> None:
        tf = self._tf = _tensorflow()
        path = self.context.require_model_file()
        graph_def = tf.compat.v1.GraphDef()
        try:
            graph_def.ParseFromString(path.read_bytes())
        except Exception as exc:  # noqa: BLE001 - a DecodeError, or worse
            raise ModelLoadError(f"cannot parse the GraphDef: {type(exc).__name__}: {exc}") from None
        try:
            wrapped = tf.compat.v1.wrap_function(lambda: tf.compat.v1.import_graph_def(graph_def, name=""), [])
        except Exception as exc:  # noqa: BLE001
            raise ModelLoadError(f"TensorFlow could not import the GraphDef: {type(exc).__name__}: {exc}") from None
        graph = wrapped.graph

        def tensors(declared: tuple) -> dict[str, tuple[Any, Any]]:
            found = {}
            for tensor in declared:
                try:
                    node = graph.get_tensor_by_name(_tensor_name(tensor.name))
                except (KeyError, ValueError):
                    continue
                found[tensor.name] = (node.dtype, node.shape)
            return found

        self._check("input", self.spec.inputs, tensors(self.spec.inputs))
        self._check("output", self.spec.outputs, tensors(self.spec.outputs))
        self._input_names = [tensor.name for tensor in self.spec.inputs]
        try:
            self.function = wrapped.prune(
                feeds=[graph.get_tensor_by_name(_tensor_name(name)) for name in self._input_names],
                fetches=[graph.get_tensor_by_name(_tensor_name(tensor.name)) for tensor in self.spec.outputs])
        except Exception as exc:  # noqa: BLE001
            raise ModelLoadError(f"the GraphDef cannot compute the config's outputs from its inputs: {exc}") from None

    def infer(self, feeds: dict[str, Any]) -> dict[str, Any]:
        try:
            results = self.function(*[feeds[name] for name in self._input_names])
        except Exception as exc:  # noqa: BLE001
            raise InternalError(f"TensorFlow execution failed: {type(exc).__name__}: {exc}") from None
        return {tensor.name: result for tensor, result in zip(self.spec.outputs, results, strict=True)}


def _tensor_name(name: str) -> str:
    return name if ":" in name else f"{name}:0"
