"""Triton's extensions the core consults: response cache, classification, shared memory, logging, tracing,
metrics."""
