"""Triton's protocol messages (``model_config.proto``, ``grpc_service.proto``), generated code from tritonclient.

Copied from the pinned tritonclient wheel by ``scripts/vendor_protocol.py`` so that the server does not import
the client package to read a config. The classes are tritonclient's own: both register the same descriptors.
"""
