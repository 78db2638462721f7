"""Triton's Python backend: the server-side handler, the worker process, the model runner."""

from handlers.python.backend import PythonBackendHandler

__all__ = ["PythonBackendHandler"]
