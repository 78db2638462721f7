#!/usr/bin/env bash
# Create .venv, install the project with its test extras (torch 2.13.0 CPU) and its native gRPC edge, build the
# example models.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
# The native gRPC edge (setup.py) builds against Debian's libgrpc++; where it cannot be had, gRPC is served by
# grpcio and the server says so when it starts.
if ! pkg-config --exists grpc++ 2>/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  packages=(libgrpc++-dev pkg-config g++)
  apt-get install -y -q --no-install-recommends "${packages[@]}" >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${packages[@]}" >/dev/null; } \
    || echo "warning: libgrpc++-dev could not be installed: gRPC will be served by grpcio" >&2
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
.venv/bin/python -m examples.build_models
