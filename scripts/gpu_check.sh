#!/usr/bin/env bash
# On a host with an NVIDIA GPU: install the GPU extras, run the GPU tests (pytest -m gpu) and a short GPU
# benchmark (served vs bare onnxruntime-gpu at equal batch), all within about 8 minutes.
#   PYTHON      the interpreter to use as is (its torch must see CUDA; the project's dependencies importable, the
#               project itself from this folder); unset: a .venv-gpu is made, with torch from TORCH_INDEX_URL
#               (default PyTorch's cu126 index) and the [gpu,test] extras, onnxruntime-gpu in place of the CPU
#               onnxruntime. Where that interpreter's onnxruntime has no CUDA provider, the ONNX-on-CUDA tests are
#               left out (said so) and the rest run.
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi -L
if [ -z "${PYTHON:-}" ]; then
  VENV=.venv-gpu
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q torch==2.13.0 --index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cu126}"
  "$VENV/bin/python" -m pip install -q -e '.[test,gpu]'
  "$VENV/bin/python" -m pip uninstall -q -y onnxruntime  # both ship the onnxruntime module: keep the GPU one
  "$VENV/bin/python" -m pip install -q --force-reinstall --no-deps "onnxruntime-gpu>=1.18"
  PYTHON="$VENV/bin/python"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the servers' Python workers import the project too
"$PYTHON" - <<'PY'
import onnxruntime, torch
assert torch.cuda.is_available(), "torch does not see CUDA"
print("torch", torch.__version__, torch.cuda.get_device_name(0), "| onnxruntime", onnxruntime.__version__,
      onnxruntime.get_available_providers())
PY
LEAVE_OUT=()
if ! "$PYTHON" -c 'import onnxruntime, sys; sys.exit("CUDAExecutionProvider" not in onnxruntime.get_available_providers())'
then
  echo "onnxruntime here has no CUDA provider: the ONNX-on-CUDA tests are left out"
  LEAVE_OUT=(-k "not add_sub_gpu and not kind_gpu_instances")
fi
"$PYTHON" -m examples.build_models
timeout 420 "$PYTHON" -m pytest -q -s -p no:cacheprovider -m gpu "${LEAVE_OUT[@]}" \
  tests/e2e/test_gpu_cuda_shared_memory.py tests/e2e/test_gpu_on_demand.py tests/e2e/test_gpu.py
# front-end processes across cores are not a GPU matter (bench_frontends measures them): left out, so the whole
# benchmark fits its limit (on the H200 it was cut off at 120 s inside that part)
timeout 150 "$PYTHON" -m scripts.benchmark --quick --skip-mlserver --skip-triton --skip-frontends \
  --output bench_results_gpu.json
