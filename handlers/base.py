"""What the backends share beyond the handler contract (``runtime/handler.py``, re-exported here for them):
importing a framework or failing the load with the extra that installs it, and reading a yes/no parameter."""

from __future__ import annotations

import importlib
from types import ModuleType

from runtime.errors import ModelLoadError
from runtime.handler import (  # noqa: F401 - the contract, re-exported for the backends
    DEFAULT_EXECUTE_TIMEOUT_SECONDS,
    REQUEUE,
    RESCHEDULE,
    ExecutionTiming,
    HandlerContext,
    ModelHandler,
    RequestResult,
    Reschedule,
    ServerServices,
    StartedExecution,
    TensorHandler,
    first_load_alone,
)

PACKAGE = "serverless-triton"


def require_module(module: str, extra: str, backend: str) -> ModuleType:
    """Import a backend's framework, or fail the load naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ModelLoadError(
            f"the {backend} backend needs the '{module.split('.')[0]}' package, which is not installed "
            f"({exc}): pip install '{PACKAGE}[{extra}]'"
        ) from None


def parameter_flag(value: str, name: str) -> bool:
    """A config parameter's yes/no (``true``/``1``/``yes``/``on`` or ``false``/``0``/``no``/``off``, as Triton's
    backends read them); ModelLoadError naming the parameter for anything else."""
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise ModelLoadError(f"parameter '{name}' must be true or false (1 or 0), not '{value}'")
