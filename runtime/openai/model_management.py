"""Model management on the OpenAI-compatible endpoints, as Triton 2.68's OpenAI frontend has it:
``POST /v1/models/{model}/load`` and ``/unload``, in explicit model control only (ours: explicit and on_demand),
answered once the model is ready or gone, with its frontend's words and FastAPI's error body (``{"detail": ...}``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from runtime.api import InferenceApi
from runtime.errors import ServingError, Status

CONTROLLED_MODES = ("explicit", "on_demand")


class ModelManagementRoutes:
    """The two routes over the core; ``unloaded`` is told each model unloaded (the OpenAI routes' cache)."""

    def __init__(self, service: InferenceApi, unloaded: Callable[[str], None]) -> None:
        self.service = service
        self.unloaded = unloaded

    async def load_model(self, request: Request) -> Response:
        name = request.path_params["model"]
        refused = self._refusal()
        if refused is not None:
            return refused
        if self.service.model_ready(name):
            return _detail(400, f"Model '{name}' is already loaded")
        try:
            await self.service.load_model(name)
        except ServingError as exc:
            return _failed(exc, f"Failed to load model '{name}'")
        return JSONResponse({"id": name, "object": "model", "created": int(time.time()),
                             "owned_by": "Triton Inference Server"})

    async def unload_model(self, request: Request) -> Response:
        name = request.path_params["model"]
        refused = self._refusal()
        if refused is not None:
            return refused
        if not self.service.model_ready(name):
            return _detail(400, f"Unknown model: {name}")
        try:
            await self.service.unload_model(name)  # the requests under way finish first
        except ServingError as exc:
            return _failed(exc, f"Failed to unload model '{name}'")
        self.unloaded(name)
        return JSONResponse({"status": "success", "model": name})

    def _refusal(self) -> Response | None:
        if self.service.model_control_mode() not in CONTROLLED_MODES:
            return _detail(400, "Model load/unload requires --model-control-mode=explicit")
        return None


def _failed(error: ServingError, what: str) -> Response:
    return _detail(500 if error.status is Status.INTERNAL else 400, f"{what}: {error.message}")


def _detail(status: int, message: str) -> Response:
    return JSONResponse({"detail": message}, status_code=status)
