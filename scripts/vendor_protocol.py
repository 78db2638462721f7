"""Copies Triton's generated protocol modules out of the pinned tritonclient wheel into ``runtime/protocol``.

The server needs only the generated protobuf modules (``model_config_pb2``, ``service_pb2``); importing them from
``tritonclient.grpc`` runs the whole client package first (grpc, the client classes, ml_dtypes, packaging), which
is a tenth of a cold start. The copies are the wheel's files, byte for byte, except that ``service_pb2`` imports
its sibling from here. They register the same descriptors in protobuf's default pool, so their message classes
are tritonclient's own (``tests/test_protocol.py`` checks both). Run it after changing the tritonclient pin:

    .venv/bin/python -m scripts.vendor_protocol

The type stubs beside them (``*_pb2.pyi``, what mypy reads) are protoc's ``--pyi_out`` over the modules' own
descriptors; grpcio-tools wants another protobuf than the server's pin, so make them in a scratch venv:

    .venv/bin/python -m scripts.vendor_protocol --descriptors /tmp/set.pb
    python -m venv /tmp/stubs && /tmp/stubs/bin/pip install grpcio-tools
    /tmp/stubs/bin/python -m grpc_tools.protoc --descriptor_set_in=/tmp/set.pb --pyi_out=/tmp/pyi \
        model_config.proto grpc_service.proto
    then copy /tmp/pyi/model_config_pb2.pyi here, and grpc_service_pb2.pyi as service_pb2.pyi with its first
    import made ``from runtime.protocol import model_config_pb2 as _model_config_pb2``
    (tests/test_protocol.py checks that the stubs name every message of the descriptors)
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


def write_descriptors(path: Path) -> None:
    """The vendored modules' descriptors as one FileDescriptorSet, for protoc's stub generator."""
    from google.protobuf import descriptor_pb2

    from runtime.protocol import model_config_pb2, service_pb2

    descriptors = descriptor_pb2.FileDescriptorSet()
    for module in (model_config_pb2, service_pb2):
        module.DESCRIPTOR.CopyToProto(descriptors.file.add())
    path.write_bytes(descriptors.SerializeToString())


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--descriptors":
        write_descriptors(Path(sys.argv[2]))
        return 0
    for name, text in generated_sources().items():
        (TARGET / f"{name}.py").write_text(text, encoding="utf-8")
        print(f"wrote {TARGET / name}.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
