# syntax=docker/dockerfile:1
# The runtime as a container function. CPU image (default) or GPU image:
#   docker build -t serverless-triton:cpu .
#   docker build -t serverless-triton:gpu --build-arg FLAVOR=gpu .
#   docker run -p 8000-8002:8000-8002 -v $PWD/examples/model_repository:/models:ro serverless-triton:cpu
# The bases and where torch comes from are build arguments, so that the same file builds where neither registry
# is reachable: scripts/build_image.sh builds it with podman on a Debian base of its own and torch's wheel from
# the host (tests/e2e/test_image.py runs the result as a platform would).
# The install step is scripts/install.sh, which CI runs in a fresh venv (tests/e2e/test_container.py).
# Shared memory: the Python backend passes tensors through memfd (no /dev/shm needed); clients using the system
# shared-memory extension must share /dev/shm with the server (docker run --ipc=host, or a shared emptyDir).
ARG FLAVOR=cpu
ARG BASE_CPU=python:3.11-slim-bookworm
ARG BASE_GPU=nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04

# -- bases: Python for CPU hosts; CUDA + cuDNN runtime for GPU hosts; each with libgrpc++ for the native gRPC edge
# and HAProxy, which carries the one port ($PORT: REST and gRPC) to the two listeners (runtime/listen/port_proxy.py) --
FROM ${BASE_CPU} AS base-cpu
ARG TORCH_INDEX_CPU=https://download.pytorch.org/whl/cpu
RUN apt-get update && apt-get install -y --no-install-recommends 'libgrpc++1.51' haproxy \
    && rm -rf /var/lib/apt/lists/*
ENV TORCH_INDEX_URL=${TORCH_INDEX_CPU}

FROM ${BASE_GPU} AS base-gpu
ARG TORCH_INDEX_GPU=https://download.pytorch.org/whl/cu126
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv 'libgrpc++1.51t64' haproxy \
    && rm -rf /var/lib/apt/lists/*
ENV TORCH_INDEX_URL=${TORCH_INDEX_GPU} \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

# -- the wheel, built from the source tree on the image's own base (its Python, its libgrpc++: the native gRPC
# edge, runtime/grpc/native_edge.cc, is compiled here); the image installs the wheel, no source checkout ----------
FROM base-${FLAVOR} AS wheel
# a base whose Python is the distribution's (the GPU base's, a Debian one's) has its headers apart
RUN apt-get update && apt-get install -y --no-install-recommends g++ pkg-config 'libgrpc++-dev' \
        $(python3 -c 'import os, sysconfig; print("" if os.path.exists(sysconfig.get_paths()["include"] + "/Python.h") else "python3-dev")') \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md triton_python_backend_utils.py ./
COPY runtime runtime
COPY handlers handlers
COPY bootstrap bootstrap
RUN python3 -m venv /build && /build/bin/python -m pip wheel --no-cache-dir --no-deps -w /wheels . \
    && /build/bin/python -m zipfile -l /wheels/serverless_triton-*.whl | grep -q _native_edge \
    && /build/bin/python -m zipfile -l /wheels/serverless_triton-*.whl | grep -q _native_lanes

# -- the image -----------------------------------------------------------------------------------------------------
FROM base-${FLAVOR}
ARG FLAVOR
# a folder of wheels torch may come from instead of its index (mounted into the build: scripts/build_image.sh)
ARG TORCH_FIND_LINKS=
COPY scripts/install.sh /opt/serverless-triton/install.sh
COPY --from=wheel /wheels /wheels
RUN PIP_NO_CACHE_DIR=1 TORCH_FIND_LINKS="${TORCH_FIND_LINKS}" \
        /opt/serverless-triton/install.sh /opt/venv "${FLAVOR}" /wheels/serverless_triton-*.whl \
    && rm -rf /wheels
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin triton \
    && mkdir -p /models && chown triton /models
USER 10001
WORKDIR /home/triton
ENV PATH=/opt/venv/bin:$PATH \
    XDG_CACHE_HOME=/home/triton/.cache \
    PYTHONUNBUFFERED=1
# HTTP (also $PORT when a platform sets it), gRPC, Prometheus metrics
EXPOSE 8000 8001 8002
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/v2/health/ready' % os.environ.get('PORT', '8000'), timeout=2)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["bootstrap", "run"]
# A mounted or synced repository; for object storage: --model-repository s3://bucket/prefix (or function.yaml)
CMD ["--model-repository", "/models"]
