#!/usr/bin/env bash
# Install the runtime into a fresh virtual environment: the container image's install step (see Dockerfile),
# run as-is by a CI test, so the image recipe is tested where no container engine runs.
#
#   scripts/install.sh VENV FLAVOR SOURCE
#     VENV    where the virtual environment goes (created; must not exist yet)
#     FLAVOR  cpu: ONNX Runtime + a CPU build of torch     gpu: onnxruntime-gpu + nvidia-ml-py + a CUDA build of torch
#             (either with the otel and openai extras: the image serves every feature)
#     SOURCE  the project's wheel file (what the image installs) or its source folder
#   Environment: PYTHON (default python3); TORCH_INDEX_URL, where torch comes from (the image sets PyTorch's
#   cpu or cu126 index; unset or empty, pip's own configuration decides); TORCH_FIND_LINKS, a folder holding torch's
#   wheel, looked in first (its dependencies still come from the index); PIP_NO_CACHE_DIR as pip reads it.
set -euo pipefail
VENV=${1:?usage: install.sh VENV cpu|gpu SOURCE}
FLAVOR=${2:?usage: install.sh VENV cpu|gpu SOURCE}
SOURCE=${3:?usage: install.sh VENV cpu|gpu SOURCE}
TORCH_VERSION=2.13.0
case "$FLAVOR" in
  cpu) EXTRAS=onnx,otel,openai ;;
  gpu) EXTRAS=gpu,otel,openai ;;
  *) echo "install.sh: FLAVOR must be cpu or gpu, not '$FLAVOR'" >&2; exit 2 ;;
esac
if [ -e "$VENV" ]; then
  echo "install.sh: $VENV already exists" >&2; exit 2
fi
"${PYTHON:-python3}" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
torch_args=("torch==$TORCH_VERSION")
if [ -n "${TORCH_INDEX_URL:-}" ]; then
  torch_args+=(--index-url "$TORCH_INDEX_URL")
fi
if [ -n "${TORCH_FIND_LINKS:-}" ]; then
  torch_args+=(--find-links "$TORCH_FIND_LINKS")
fi
"$VENV/bin/python" -m pip install -q "${torch_args[@]}"
"$VENV/bin/python" -m pip install -q "$SOURCE[$EXTRAS]"
# The code dataclasses compile for a start, compiled once here, beside the installed package
# (runtime/dataclass_code.py)
"$VENV/bin/python" -I -m runtime.dataclass_code  # -I: the installed package, wherever this runs from
# Fail the build, not the first cold start, if the install cannot serve.
"$VENV/bin/bootstrap" --help >/dev/null
"$VENV/bin/python" -c "import onnxruntime, torch, runtime.grpc, handlers.python.worker"
echo "installed serverless-triton ($FLAVOR) into $VENV"
