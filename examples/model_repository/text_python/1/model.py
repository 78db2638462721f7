"""A Triton Python-backend model: upper-cases strings and reports their lengths."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        upper_config = pb_utils.get_output_config_by_name(self.model_config, "UPPER")
        length_config = pb_utils.get_output_config_by_name(self.model_config, "LENGTH")
        self.upper_dtype = pb_utils.triton_string_to_numpy(upper_config["data_type"])
        self.length_dtype = pb_utils.triton_string_to_numpy(length_config["data_type"])
        parameters = self.model_config.get("parameters", {})
        self.suffix = parameters.get("suffix", {}).get("string_value", "")

    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            try:
                words = [t.decode("utf-8") for t in text.reshape(-1)]
            except UnicodeDecodeError as exc:
                error = pb_utils.TritonError(f"TEXT must be UTF-8: {exc}", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            upper = np.array(
                [(word.upper() + self.suffix).encode("utf-8") for word in words],
                dtype=self.upper_dtype,
            ).reshape(text.shape)
            length = np.array([len(t) for t in text.reshape(-1)], dtype=self.length_dtype).reshape(text.shape)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor("UPPER", upper), pb_utils.Tensor("LENGTH", length)]
                )
            )
        return responses

    def finalize(self):
        pass
