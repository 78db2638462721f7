"""The GPUs this process may use (for placing instances, and Triton's KIND_AUTO)."""

from __future__ import annotations

import functools
import os


@functools.cache
def gpu_count() -> int:
    """CUDA devices visible to this process: NVML's count (nvidia-ml-py, in the ``[gpu]`` extra), narrowed by
    ``CUDA_VISIBLE_DEVICES``; 0 where there is no driver or no NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception:  # noqa: BLE001 - ImportError, NVMLError_LibraryNotFound, ...: no GPU to use
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = min(count, len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"]))
    return count
