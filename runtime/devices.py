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


@functools.cache
def _nvml_handles() -> tuple:
    """NVML handles of the visible GPUs, in CUDA's order: ``CUDA_VISIBLE_DEVICES`` may name physical indices or
    UUIDs; unset, CUDA's device N is NVML's device N."""
    import pynvml

    pynvml.nvmlInit()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return tuple(pynvml.nvmlDeviceGetHandleByIndex(index) for index in range(gpu_count()))
    handles = []
    for entry in (part.strip() for part in visible.split(",")):
        if not entry or entry == "-1":
            break  # CUDA stops at the first invalid entry
        handles.append(pynvml.nvmlDeviceGetHandleByUUID(entry) if entry.startswith(("GPU-", "MIG-"))
                       else pynvml.nvmlDeviceGetHandleByIndex(int(entry)))
    return tuple(handles)


def gpu_memory_used() -> dict[int, int]:
    """Bytes in use on each visible GPU, by CUDA device number (what instance groups' ``gpus`` name): the whole
    device's, every process's, as NVML reports it; empty where there is no GPU."""
    if not gpu_count():
        return {}
    import pynvml

    return {index: pynvml.nvmlDeviceGetMemoryInfo(handle).used for index, handle in enumerate(_nvml_handles())}
