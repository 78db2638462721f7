#!/usr/bin/env bash
# Prepare real NVIDIA Triton (tritonserver 2.51 + Python backend, from the nvidia-pytriton 0.7.0 wheel) as the
# oracle of the conformance suite. Idempotent: a prepared ORACLE_HOME is reused (CI keeps it between runs when
# its cache folder survives). Prints nothing but errors; exits 0 when `$ORACLE_HOME/ready` exists.
#   ORACLE_HOME  default: ${XDG_CACHE_HOME:-$HOME/.cache}/serverless-triton/triton-oracle
#   PYTHON       a CPython 3.8-3.13 (default python3); its minor version picks the backend stub
set -euo pipefail
ORACLE_HOME=${ORACLE_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/serverless-triton/triton-oracle}
PYTHON=${PYTHON:-python3}
[ -f "$ORACLE_HOME/ready" ] && exit 0
mkdir -p "$ORACLE_HOME"
[ -x "$ORACLE_HOME/venv/bin/python" ] || "$PYTHON" -m venv "$ORACLE_HOME/venv"
"$ORACLE_HOME/venv/bin/pip" install -q --disable-pip-version-check nvidia-pytriton==0.7.0 numpy
SP=$("$ORACLE_HOME/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
PYVER=$("$ORACLE_HOME/venv/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
# The same preparation as pytriton's Triton._prepare_triton_inference_server: copy the server tree, keep the
# backend stub of this Python beside libtriton_python.so.
rm -rf "$ORACLE_HOME/tritonserver"
cp -r "$SP/pytriton/tritonserver" "$ORACLE_HOME/tritonserver"
rm -rf "$ORACLE_HOME/tritonserver/python_backend_stubs"
cp "$SP/pytriton/tritonserver/python_backend_stubs/$PYVER/triton_python_backend_stub" \
   "$ORACLE_HOME/tritonserver/backends/python/"
echo "$SP" > "$ORACLE_HOME/ready"
