"""Copies Triton's generated protocol modules out of the pinned tritonclient wheel into ``runtime/protocol``.

The server needs only the generated protobuf modules (``model_config_pb2``, ``service_pb2``); importing them from
``tritonclient.grpc`` runs the whole client package first (grpc, the client classes, ml_dtypes, packaging), which
is a tenth of a cold start. The copies are the wheel's files, byte for byte, except that ``service_pb2`` imports
its sibling from here. They register the same descriptors in protobuf's default pool, so their message classes
are tritonclient's own (``tests/test_protocol.py`` checks both). Run it after changing the tritonclient pin:

    .venv/bin/python -m scripts.vendor_protocol
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

TARGET = Path(__file__).resolve().parents[1] / "runtime" / "protocol"
MODULES = ("model_config_pb2", "service_pb2")
SIBLING_IMPORT = ("from tritonclient.grpc import model_config_pb2", "from runtime.protocol import model_config_pb2")


def generated_sources() -> dict[str, str]:
    """Each module's text as it goes into ``runtime/protocol``."""
    package = Path(importlib.util.find_spec("tritonclient").submodule_search_locations[0]) / "grpc"
    sources = {}
    for name in MODULES:
        text = (package / f"{name}.py").read_text(encoding="utf-8")
        if name == "service_pb2":
            if SIBLING_IMPORT[0] not in text:
                raise SystemExit(f"{name}.py no longer imports its sibling as expected: update this script")
            text = text.replace(*SIBLING_IMPORT)
        sources[name] = text
    return sources


def main() -> int:
    for name, text in generated_sources().items():
        (TARGET / f"{name}.py").write_text(text, encoding="utf-8")
        print(f"wrote {TARGET / name}.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
