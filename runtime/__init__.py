"""Serverless, Triton-compatible inference runtime: the protocol-neutral core."""

__version__ = "0.1.0"
