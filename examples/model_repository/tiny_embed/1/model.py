"""A tiny deterministic embedding model: words hashed (CRC-32) into 32 buckets, the counts scaled to unit length."""

import zlib

import numpy as np
import triton_python_backend_utils as pb_utils

DIMENSIONS = 32


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)
            vectors = np.zeros((len(texts), DIMENSIONS), dtype=np.float32)
            for row, text in enumerate(texts):
                for word in text.decode("utf-8").lower().split():
                    vectors[row, zlib.crc32(word.encode()) % DIMENSIONS] += 1.0
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            vectors = vectors / np.where(norms == 0, 1.0, norms)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("embedding", vectors)]))
        return responses
