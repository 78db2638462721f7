"""gRPC adapter (``inference.GRPCInferenceService``) over the inference core."""
