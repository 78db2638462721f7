"""Shared-memory regions that requests may name for their tensors (Triton's shared-memory extensions).

No region can be registered yet, so every region a request names is unknown (Triton's 404).
"""

from __future__ import annotations

from typing import Any

from runtime.errors import NotFound

REGION_PARAMETER = "shared_memory_region"


def require_no_regions(parameters: dict[str, Any]) -> None:
    """Refuse a tensor that names a shared-memory region: none is registered."""
    if REGION_PARAMETER in parameters:
        region = parameters[REGION_PARAMETER]
        raise NotFound(f"Unable to find shared memory region: '{str(region)[:128]}'")
