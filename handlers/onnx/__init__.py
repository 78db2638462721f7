"""ONNX Runtime: the handler (``handler.py``), the session options read from Triton's config (``options.py``) and
auto-complete from the graph (``auto_complete.py``)."""
