"""The V2 REST endpoints as a Starlette app: a thin adapter over the core's interface (:class:`InferenceApi`)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from runtime.api import InferenceApi
from runtime.auth import HEALTH_PATHS, TokenAuth
from runtime.direct_path import DirectLanes
from runtime.errors import InvalidArgument, ServingError, Unauthenticated, Unsupported
from runtime.extensions.cuda_shared_memory import decode_ipc_handle
from runtime.header_forward import HeaderForward
from runtime.http.body import DEFAULT_BODY_TIMEOUT, ByteBudget, read_body
from runtime.http.codec import parse_json
from runtime.http.generate import GenerateEndpoints
from runtime.http.infer_route import InferRoute
from runtime.http.limits import DEFAULT_JSON_BUDGET_BYTES, DEFAULT_MAX_BODY_BYTES
from runtime.http.restricted import RestrictedApiMiddleware
from runtime.http.sending import UnsentBytes
from runtime.http.status import error_body, error_status
from runtime.restricted_api import RestrictedApis

if TYPE_CHECKING:  # prometheus_client loads with the first scrape
    from prometheus_client import CollectorRegistry

logger = logging.getLogger(__name__)


def error_response(error: ServingError) -> Response:
    return Response(error_body(error.message), status_code=error_status(error), media_type="application/json")


def _unsigned_member(body: dict, key: str) -> int:
    """A registration's unsigned integer member, refused in Triton's words (Triton answers these 500; we 400)."""
    if key not in body:
        raise InvalidArgument(f"attempt to access non-existing object member '{key}'")
    value = body[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidArgument("attempt to access JSON non-unsigned-integer as unsigned-integer")
    return value


class V2Endpoints:
    """Route handlers; each one parses, calls the core, and encodes."""

    def __init__(self, service: InferenceApi, body_timeout: float = DEFAULT_BODY_TIMEOUT) -> None:
        self.service = service
        self.body_timeout = body_timeout

    @staticmethod
    def _model(request: Request) -> tuple[str, str]:
        return request.path_params["model_name"], str(request.path_params.get("model_version", ""))

    async def live(self, request: Request) -> Response:
        return Response(status_code=200 if self.service.live() else 400)

    async def ready(self, request: Request) -> Response:
        if self.service.shutting_down:
            return Response(status_code=503)
        return Response(status_code=200 if await self.service.ready_checked() else 400)

    async def server_metadata(self, request: Request) -> Response:
        return JSONResponse(self.service.server_metadata())

    async def model_metadata(self, request: Request) -> Response:
        return JSONResponse(self.service.model_metadata(*self._model(request)))

    async def model_ready(self, request: Request) -> Response:
        if await self.service.model_ready_checked(*self._model(request)):
            return Response(status_code=200)
        return JSONResponse({"error": "Model version not ready"}, status_code=400)

    async def model_config(self, request: Request) -> Response:
        return JSONResponse(self.service.model_config(*self._model(request)).to_json_dict())

    async def model_statistics(self, request: Request) -> Response:
        name = request.path_params.get("model_name", "")
        return JSONResponse(self.service.model_statistics(name, str(request.path_params.get("model_version", ""))))

    async def repository_index(self, request: Request) -> Response:
        body = await read_body(request, 1 << 16, self.body_timeout)
        ready_only = False
        if body.strip():
            options = parse_json(body)
            if not isinstance(options, dict) or not isinstance(options.get("ready", False), bool):
                raise InvalidArgument("repository index options must be a JSON object with a boolean 'ready'")
            ready_only = options.get("ready", False)
        return JSONResponse(self.service.repository_index(ready_only))

    async def _setting_changes(self, request: Request, what: str) -> dict | None:
        """A settings update's JSON object (POST; an empty body changes nothing), None for a GET."""
        if request.method != "POST":
            return None
        body = await read_body(request, 1 << 16, self.body_timeout)
        changes = parse_json(body) if body.strip() else {}
        if not isinstance(changes, dict):
            raise InvalidArgument(f"{what} must be a JSON object")
        return changes

    async def logging(self, request: Request) -> Response:
        return JSONResponse(self.service.log_settings(await self._setting_changes(request, "log settings")))

    async def _registration(self, request: Request, fields: str) -> dict:
        """A shared-memory registration's JSON object (InvalidArgument naming its ``fields`` otherwise)."""
        body = parse_json(await read_body(request, 1 << 16, self.body_timeout))
        if not isinstance(body, dict):
            raise InvalidArgument(f"a shared memory registration must be a JSON object with {fields}")
        return body

    async def register_system_shared_memory(self, request: Request) -> Response:
        self.service.check_client_shared_memory()  # before the body, as Triton
        body = await self._registration(request, "'key', 'offset' and 'byte_size'")
        self.service.register_system_shared_memory(request.path_params["region"], body.get("key"),
                                                   body.get("offset", 0), body.get("byte_size"))
        return Response(status_code=200)

    async def unregister_system_shared_memory(self, request: Request) -> Response:
        self.service.check_client_shared_memory()  # before the body, as Triton
        self.service.unregister_system_shared_memory(request.path_params.get("region", ""))
        return Response(status_code=200)

    async def system_shared_memory_status(self, request: Request) -> Response:
        return JSONResponse(self.service.system_shared_memory_status(request.path_params.get("region", "")))

    async def register_cuda_shared_memory(self, request: Request) -> Response:
        self.service.check_client_shared_memory()  # before the body, as Triton
        body = await self._registration(request, "'raw_handle', 'device_id' and 'byte_size'")
        if "raw_handle" not in body:
            raise InvalidArgument("Shared memory register request has no 'raw_handle' field")
        handle = body["raw_handle"]
        raw = decode_ipc_handle(handle.get("b64") if isinstance(handle, dict) else None)
        device_id, byte_size = (_unsigned_member(body, key) for key in ("device_id", "byte_size"))
        self.service.register_cuda_shared_memory(request.path_params["region"], raw, device_id, byte_size)
        return Response(status_code=200)

    async def unregister_cuda_shared_memory(self, request: Request) -> Response:
        self.service.check_client_shared_memory()  # before the body, as Triton
        self.service.unregister_cuda_shared_memory(request.path_params.get("region", ""))
        return Response(status_code=200)

    async def cuda_shared_memory_status(self, request: Request) -> Response:
        return JSONResponse(self.service.cuda_shared_memory_status(request.path_params.get("region", "")))

    async def trace_setting(self, request: Request) -> Response:
        changes = await self._setting_changes(request, "trace settings")
        return JSONResponse(self.service.trace_settings(request.path_params.get("model_name", ""), changes))

    async def _control_parameters(self, request: Request) -> dict:
        body = await read_body(request, 1 << 20, self.body_timeout)
        if not body.strip():
            return {}
        message = parse_json(body)
        parameters = message.get("parameters", {}) if isinstance(message, dict) else None
        if not isinstance(parameters, dict):
            raise InvalidArgument("the request must be a JSON object with an optional 'parameters' object")
        return parameters

    async def load_model(self, request: Request) -> Response:
        parameters = await self._control_parameters(request)
        await self.service.load_model(request.path_params["model_name"], parameters)
        return Response(status_code=200)

    async def unload_model(self, request: Request) -> Response:
        parameters = await self._control_parameters(request)
        await self.service.unload_model(request.path_params["model_name"], parameters)
        return Response(status_code=200)

    async def infer_other_methods(self, request: Request) -> Response:
        """Never called: InferRoute serves every POST to an infer path; the route answers other methods 405."""
        raise Unsupported("inference takes POST")  # pragma: no cover


async def _serving_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServingError)
    return error_response(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return JSONResponse({"error": exc.detail}, status_code=exc.status_code)


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    logger.exception("unexpected error serving %s %s", request.method, request.url.path)
    return JSONResponse({"error": "internal server error"}, status_code=500)


class TokenAuthMiddleware:
    """Refuses every request without the token (401), except the health endpoints when exempt."""

    def __init__(self, app: ASGIApp, auth: TokenAuth, exempt_health: bool = True) -> None:
        self.app = app
        self.auth = auth
        self.exempt = HEALTH_PATHS if exempt_health else frozenset()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.exempt:
            await self.app(scope, receive, send)
            return
        values = [v for k, v in scope["headers"] if k == b"authorization"]
        try:
            self.auth.check(values[0].decode("latin-1") if len(values) == 1 else None)
        except Unauthenticated as exc:
            response = error_response(exc)
            response.headers["WWW-Authenticate"] = "Bearer"
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def create_http_app(
    service: InferenceApi,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    auth: TokenAuth | None = None,
    exempt_health: bool = True,
    body_timeout: float = DEFAULT_BODY_TIMEOUT,
    json_budget: int = DEFAULT_JSON_BUDGET_BYTES,
    unsent: UnsentBytes | None = None,
    restrictions: RestrictedApis | None = None,
    lanes: DirectLanes | None = None,
    header_forward: HeaderForward | None = None,
    more_routes: Sequence[BaseRoute] = (),
    guard: Callable[[ASGIApp], ASGIApp] | None = None,
) -> ASGIApp:
    """The ASGI application serving the V2 REST protocol: Starlette's routes, with inference dispatched first
    (``InferRoute``) and, given ``auth``, every request checked before either; given ``restrictions``, calls of a
    restricted API group refused without its header.  ``unsent``: the process's bound on answers being sent to
    clients (send timeout, bytes); ``lanes``: where a lone infer request with binary tensors may be served past the
    core (``lane_route.py``); ``header_forward``: which headers infer requests carry as parameters (no lanes then,
    for a lane would not see them); ``more_routes``: other protocols' routes beside the V2 ones (the OpenAI
    adapter's), ``guard`` a middleware of theirs, inside the token's."""
    endpoints = V2Endpoints(service, body_timeout)
    generate = GenerateEndpoints(service, body_timeout)
    model = "/v2/models/{model_name}"
    versioned = model + "/versions/{model_version:int}"  # Triton's routes take only numbers
    routes: list[BaseRoute] = [
        Route("/v2/health/live", endpoints.live, methods=["GET"]),
        Route("/v2/health/ready", endpoints.ready, methods=["GET"]),
        Route("/v2", endpoints.server_metadata, methods=["GET"]),
        Route("/v2/repository/index", endpoints.repository_index, methods=["POST"]),
        Route("/v2/models/stats", endpoints.model_statistics, methods=["GET"]),
        Route("/v2/logging", endpoints.logging, methods=["GET", "POST"]),
        Route("/v2/systemsharedmemory/status", endpoints.system_shared_memory_status, methods=["GET"]),
        Route("/v2/systemsharedmemory/unregister", endpoints.unregister_system_shared_memory, methods=["POST"]),
        Route("/v2/systemsharedmemory/region/{region}/status", endpoints.system_shared_memory_status,
              methods=["GET"]),
        Route("/v2/systemsharedmemory/region/{region}/register", endpoints.register_system_shared_memory,
              methods=["POST"]),
        Route("/v2/systemsharedmemory/region/{region}/unregister", endpoints.unregister_system_shared_memory,
              methods=["POST"]),
        Route("/v2/cudasharedmemory/status", endpoints.cuda_shared_memory_status, methods=["GET"]),
        Route("/v2/cudasharedmemory/unregister", endpoints.unregister_cuda_shared_memory, methods=["POST"]),
        Route("/v2/cudasharedmemory/region/{region}/status", endpoints.cuda_shared_memory_status, methods=["GET"]),
        Route("/v2/cudasharedmemory/region/{region}/register", endpoints.register_cuda_shared_memory,
              methods=["POST"]),
        Route("/v2/cudasharedmemory/region/{region}/unregister", endpoints.unregister_cuda_shared_memory,
              methods=["POST"]),
        Route("/v2/trace/setting", endpoints.trace_setting, methods=["GET", "POST"]),
        Route("/v2/models/{model_name}/trace/setting", endpoints.trace_setting, methods=["GET", "POST"]),
        Route("/v2/repository/models/{model_name}/load", endpoints.load_model, methods=["POST"]),
        Route("/v2/repository/models/{model_name}/unload", endpoints.unload_model, methods=["POST"]),
    ]
    for prefix in (model, versioned):
        routes += [
            Route(prefix, endpoints.model_metadata, methods=["GET"]),
            Route(prefix + "/ready", endpoints.model_ready, methods=["GET"]),
            Route(prefix + "/config", endpoints.model_config, methods=["GET"]),
            Route(prefix + "/infer", endpoints.infer_other_methods, methods=["POST"]),
            Route(prefix + "/stats", endpoints.model_statistics, methods=["GET"]),
            Route(prefix + "/generate", generate.generate, methods=["POST"]),
            Route(prefix + "/generate_stream", generate.generate_stream, methods=["POST"]),
        ]
    routes.extend(more_routes)
    exception_handlers = {ServingError: _serving_error, HTTPException: _http_error, Exception: _unexpected_error}
    app = Starlette(routes=routes, exception_handlers=exception_handlers)
    app.router.redirect_slashes = False  # Triton answers 404 to a trailing slash, not a redirect
    served: ASGIApp = InferRoute(app, service, max_body_bytes, body_timeout, ByteBudget(json_budget),
                                 unsent or UnsentBytes(), None if header_forward else lanes, header_forward)
    if restrictions:
        served = RestrictedApiMiddleware(served, restrictions)
    if guard is not None:
        served = guard(served)
    return TokenAuthMiddleware(served, auth, exempt_health) if auth else served


def create_metrics_app(make_registry: Callable[[], CollectorRegistry], auth: TokenAuth | None = None,
                       guard: Callable[[ASGIApp], ASGIApp] | None = None) -> Starlette:
    """Prometheus ``/metrics`` from the registry ``make_registry`` makes (the server's: it knows the core), served
    on its own port, 8002 by default; ``guard``: a middleware inside the token's (``--openai-restricted-api``'s
    ``metrics`` group).

    prometheus_client and psutil load with the registry, which is made by the first scrape or by
    ``app.state.prepare_metrics()`` (the server calls it in a thread of its own once the cold start's models are
    loaded), so they stay off the path to ready and off the event loop that answers the first requests.
    """
    registry: CollectorRegistry | None = None
    making = threading.Lock()

    def prepare_metrics() -> None:
        nonlocal registry
        with making:
            if registry is None:
                registry = make_registry()

    async def metrics(request: Request) -> Response:
        from runtime.extensions.metrics import CONTENT_TYPE, render_metrics

        prepare_metrics()
        assert registry is not None  # made by prepare_metrics
        return Response(render_metrics(registry), media_type=CONTENT_TYPE)

    middleware = [Middleware(TokenAuthMiddleware, auth=auth, exempt_health=False)] if auth else []
    if guard is not None:
        middleware.append(Middleware(guard))
    app = Starlette(
        routes=[Route("/metrics", metrics, methods=["GET"])],
        middleware=middleware,
        exception_handlers={HTTPException: _http_error, Exception: _unexpected_error},
    )
    app.state.prepare_metrics = prepare_metrics
    return app
