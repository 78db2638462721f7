"""Triton's Python backend: the server-side handler (backend.py), the worker process (worker.py), the model
runner (runner.py). Empty on purpose: a worker process imports only its own side."""
