#!/usr/bin/env bash
# Create .venv, install the project with its test extras (torch 2.13.0 CPU) and its native gRPC edge, build the
# example models.
set -euo pipefail
cd "$(dirname "$0")/.."
# The interpreter: PYTHON if set, else the distribution's python3 where it can make a venv and build the native
# edge (Debian's and Ubuntu's are built with PGO and LTO, as the container image's is), else python3 on PATH. A
# CPython built without them (pyenv's default) ran our request path 17-29% slower (docs/benchmarks.md).
if [ -z "${PYTHON:-}" ]; then
  PYTHON=python3
  if [ -x /usr/bin/python3 ] && /usr/bin/python3 -c '
import ensurepip, os, sys, sysconfig, venv
sys.exit(sys.version_info < (3, 11) or not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))
' 2>/dev/null; then
    PYTHON=/usr/bin/python3
  fi
fi
# The native gRPC edge (setup.py) builds against Debian's libgrpc++; where it cannot be had, gRPC is served by
# grpcio and the server says so when it starts.
if ! pkg-config --exists grpc++ 2>/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  packages=(libgrpc++-dev pkg-config g++)
  apt-get install -y -q --no-install-recommends "${packages[@]}" >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${packages[@]}" >/dev/null; } \
    || echo "warning: libgrpc++-dev could not be installed: gRPC will be served by grpcio" >&2
fi
# HAProxy carries the one port (--single-port: REST and gRPC on $PORT) to the two listeners at their speed
# (runtime/listen/port_proxy.py); without it the server serves that port with hypercorn, slower, and says so.
if ! command -v haproxy >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  apt-get install -y -q --no-install-recommends haproxy >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends haproxy >/dev/null; } \
    || echo "warning: haproxy could not be installed: the one port will be served by hypercorn" >&2
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
# the code dataclasses compile for the start, compiled once here (runtime/dataclass_code.py; scripts/install.sh too)
.venv/bin/python -m runtime.dataclass_code >/dev/null
.venv/bin/python -m examples.build_models
