"""The inference core: every protocol adapter calls this, and it knows no protocol."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import numpy as np

from runtime import __version__
from runtime.config.spec import ModelSpec
from runtime.direct_path import DirectModel
from runtime.errors import InternalError, InvalidArgument, NotFound, ServingError, Unavailable, Unsupported
from runtime.extensions.cuda_shared_memory import CudaSharedMemoryRegistry
from runtime.extensions.custom_metrics import CustomMetrics
from runtime.extensions.log_settings import ServerLog
from runtime.extensions.response_cache import ResponseCache, through_cache
from runtime.extensions.shared_memory import (
    CLIENT_SHM_DISABLED,
    NOTHING_HELD,
    SharedMemoryRegistry,
    hold_regions,
    write_outputs,
)
from runtime.extensions.tracing import Trace, Tracer
from runtime.models.control import ModelControl
from runtime.models.direct_serving import direct_models
from runtime.models.lookup import parse_version
from runtime.models.manager import ModelManager
from runtime.models.model import ModelVersion
from runtime.models.on_demand import OnDemandLoader
from runtime.models.readiness import all_ready_checked, version_ready_checked
from runtime.responses import build_response
from runtime.scheduling.streaming import stream_responses
from runtime.tensor_pool import TensorPool
from runtime.types import InferRequest, InferResponse, ModelOutputs, StreamResponse
from runtime.validation import expected_shape, validate_request

logger = logging.getLogger(__name__)

SERVER_NAME = "triton"  # what Triton answers: tools and Triton's own examples check it
# The extensions this server serves, in Triton's order and spelling.
EXTENSIONS = ("classification", "sequence", "model_repository", "model_repository(unload_dependents)",
              "schedule_policy", "model_configuration", "system_shared_memory", "cuda_shared_memory",
              "binary_tensor_data", "parameters", "statistics", "trace", "logging")


class InferenceService:
    """Health, metadata, config and inference over a :class:`ModelManager`.

    ``strict_readiness`` (Triton's default): the server is ready only while every model it tried to load is
    ready; otherwise ready once the initial load finished.

    It is also what models see of the server (``handlers.base.ServerServices``): BLS requests, the model
    loading API and custom metrics go through it.
    """

    def __init__(self, manager: ModelManager, control: ModelControl | None = None, server_name: str = SERVER_NAME,
                 strict_readiness: bool = True, cache: ResponseCache | None = None,
                 tracer: Tracer | None = None, on_demand: OnDemandLoader | None = None,
                 tensor_pool: TensorPool | None = None, allow_client_shm: bool = False,
                 latency_histograms: bool = False) -> None:
        self.manager = manager
        self.on_demand = on_demand  # model control on_demand: loads at first call, unloads idle or to make room
        self.control = control or ModelControl(manager)
        self.server_name = server_name
        self.strict_readiness = strict_readiness
        self.initial_load_done = False
        self.shutting_down = False
        self.last_activity = time.monotonic()
        self._offer_watchers: list[Callable[[], None]] = []  # watch_direct_offer's
        self.in_flight = 0
        self.custom_metrics = CustomMetrics()
        self.log = ServerLog()  # the logging extension
        self.shared_memory = SharedMemoryRegistry()  # the shared-memory regions clients registered, system and CUDA
        self.cuda_shared_memory = CudaSharedMemoryRegistry(self.shared_memory)
        self.allow_client_shm = allow_client_shm  # clients may register regions (Triton 2.69: off by default)
        # Triton's histogram_latencies: every request's time to its first response is recorded (Triton 2.65: every
        # model's, not only decoupled ones'); the lanes, which do not time each request, then stand aside
        self.latency_histograms = latency_histograms
        self.tensor_pool = tensor_pool  # shared memory large tensors are received into, read there by workers
        self.tracer = tracer or Tracer()  # the trace extension
        self.tracer.model_known = lambda name: name in self.manager.models
        manager.retire_hooks.append(self._forget_custom_metrics)
        self.cache = cache  # the response cache (None: off)
        if cache is not None:
            manager.retire_hooks.append(cache.evict_model)
        self.loop: asyncio.AbstractEventLoop | None = None  # the event loop serving requests
        try:
            self.loop = asyncio.get_running_loop()
        except RuntimeError:
            pass  # set by load_initial_models, on the loop that serves
        manager.services = self

    # -- lifecycle (called by the server, never by an adapter) ---------------------------------------------
    async def load_initial_models(self) -> None:
        """The cold start, on the loop that serves: every model the control mode loads at start; readiness then
        answers as ``strict_readiness`` says."""
        self.loop = asyncio.get_running_loop()
        await self.control.initial_load()
        if self.on_demand is not None:
            await self.on_demand.load_always_loaded()
            self.on_demand.start()
        self.initial_load_done = True
        self._offer_changed()

    def begin_shutdown(self) -> None:
        """SIGTERM's drain began: readiness answers no from here on (and nothing more loads or unloads on
        demand)."""
        self.shutting_down = True
        if self.on_demand is not None:
            self.on_demand.cancel()
        self._offer_changed()

    def tensor_buffer(self, nbytes: int, aligned_at: int = 0) -> Any:
        """A writable buffer for ``nbytes`` of a request's tensors to be received into, in shared memory that a
        Python-backend worker reads in place (``runtime/tensor_pool.py``), its byte ``aligned_at`` (where the
        tensors start) at a multiple of 64; None: small, or the pool is full."""
        return self.tensor_pool.buffer(nbytes, aligned_at) if self.tensor_pool is not None else None

    # -- health and metadata -------------------------------------------------
    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        if not self.initial_load_done or self.shutting_down:
            return False
        return not self.strict_readiness or self.manager.all_ready()

    def server_metadata(self) -> dict:
        return {"name": self.server_name, "version": __version__, "extensions": list(EXTENSIONS)}

    async def ready_checked(self) -> bool:
        """:meth:`ready`, each ready model's own readiness check (``is_ready``) asked too under strict readiness,
        as Triton 2.68's ``/v2/health/ready``."""
        if not self.ready():
            return False
        return not self.strict_readiness or await all_ready_checked(self.manager.ready_model_versions())

    async def model_ready_checked(self, name: str, version: str = "") -> bool:
        """:meth:`model_ready`, the model's own readiness check (``is_ready``) asked too."""
        if not self.model_ready(name, version):
            return False
        try:
            return await version_ready_checked(self.manager.get(name, version))
        except ServingError:
            return False

    def model_ready(self, name: str, version: str = "") -> bool:
        parse_version(version)  # a version that is not a number is an error, not "not ready"
        if self.shutting_down:
            return False
        try:
            self.manager.get(name, version)
        except ServingError:
            return False
        return True

    def require_model(self, name: str, version: str = "") -> None:
        """Raise NotFound / Unavailable unless the model (version) can take requests."""
        self.manager.get(name, version)

    def model_metadata(self, name: str, version: str = "") -> dict:
        model = self.manager.get(name, version)
        spec = model.spec
        versions = [model.version] if version else self.manager.entry(name).ready_versions()
        return {
            "name": name,
            "versions": [str(v) for v in versions],
            "platform": spec.platform or spec.backend,
            "inputs": [
                {"name": t.name, "datatype": t.datatype, "shape": expected_shape(spec, t)} for t in spec.inputs
            ],
            "outputs": [
                {"name": t.name, "datatype": t.datatype, "shape": expected_shape(spec, t)} for t in spec.outputs
            ],
        }

    def model_config(self, name: str, version: str = "") -> ModelSpec:
        return self.manager.get(name, version).spec

    def model_directory(self, name: str, version: str = "") -> str:
        """A served model's folder (what sits beside config.pbtxt: a chat template, a tokenizer)."""
        folder = self.manager.get(name, version).model_dir
        return str(folder) if folder is not None else ""

    def model_statistics(self, name: str = "", version: str = "") -> dict:
        """Triton's statistics extension: every loaded version, or those of one model."""
        if name:
            entry = self.manager.models.get(name)
            loaded = {v: m for v, m in entry.versions.items() if m.in_service} if entry else {}
            if not loaded:
                raise InvalidArgument(f"requested model '{name}' is not available")
            number = parse_version(version)
            if number is not None and number not in loaded:
                raise InvalidArgument(f"requested model version is not available for model '{name}'")
            versions = [loaded[number]] if number is not None else [loaded[v] for v in sorted(loaded)]
        else:
            versions = [
                m for e in sorted(self.manager.models.values(), key=lambda e: e.name)
                for _, m in sorted(e.versions.items()) if m.in_service
            ]
        return {"model_stats": [m.stats.to_dict(m.name, m.version) for m in versions]}

    def repository_index(self, ready_only: bool = False) -> list[dict]:
        rows = self.manager.index()
        return [row for row in rows if row.get("state") == "READY"] if ready_only else rows

    # -- shared memory -----------------------------------------------------------------
    def check_client_shared_memory(self) -> None:
        """Triton 2.69's default: registering and unregistering are refused until the server allows them (asked
        before a registration's body is read, as Triton does, and again by each call below)."""
        if not self.allow_client_shm:
            raise Unsupported(CLIENT_SHM_DISABLED)

    def register_system_shared_memory(self, name: str, key: Any, offset: Any, byte_size: Any) -> None:
        self.check_client_shared_memory()
        self.shared_memory.register(name, key, offset, byte_size)

    def unregister_system_shared_memory(self, name: str = "") -> None:
        self.check_client_shared_memory()
        self.shared_memory.unregister(name)

    def system_shared_memory_status(self, name: str = "") -> list[dict]:
        return self.shared_memory.status(name)

    def register_cuda_shared_memory(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        self.check_client_shared_memory()
        self.cuda_shared_memory.register(name, raw_handle, device_id, byte_size)

    def unregister_cuda_shared_memory(self, name: str = "") -> None:
        self.check_client_shared_memory()
        self.cuda_shared_memory.unregister(name)

    def cuda_shared_memory_status(self, name: str = "") -> list[dict]:
        return self.cuda_shared_memory.status(name)

    # -- logging and tracing ---------------------------------------------------------
    def log_settings(self, changes: dict[str, Any] | None = None) -> dict[str, Any]:
        """The logging extension: the log settings in force, after applying ``changes`` if any."""
        return self.log.update(changes) if changes else self.log.current()

    def trace_settings(self, model: str = "", changes: dict[str, Any] | None = None) -> dict[str, Any]:
        """The trace extension: the settings in force (a model's, or the global ones), after applying ``changes``
        (key -> value, None clears) if any."""
        if changes is None:
            return self.tracer.settings(model)
        try:
            return self.tracer.update(changes, model)
        finally:
            self._offer_changed()  # a lane serves no traced request

    # -- model control -----------------------------------------------------------
    def model_control_mode(self) -> str:
        return self.control.mode

    async def load_model(self, name: str, parameters: dict | None = None) -> None:
        try:
            await self.control.load(name, parameters)
        finally:
            self._offer_changed()

    async def unload_model(self, name: str, parameters: dict | None = None) -> None:
        try:
            await self.control.unload(name, parameters)
        finally:
            self._offer_changed()
        if self.on_demand is not None:
            self.on_demand.forget(name)

    def _served(self, request: InferRequest) -> ModelVersion | None:
        """The model version a request goes to; None when it is to be loaded on demand first."""
        try:
            model = self.manager.get(request.model_name, request.model_version)
        except (NotFound, Unavailable):
            if self.on_demand is None or self.shutting_down or not self.on_demand.wants(request.model_name):
                raise
            return None
        if self.on_demand is not None:
            self.on_demand.touch(model.name)
        return model

    async def _load_on_demand(self, request: InferRequest) -> ModelVersion:
        """The model of a request that found it unloaded, loaded for it (model control on_demand)."""
        assert self.on_demand is not None  # _served returns None only then
        await self.on_demand.ensure_loaded(request.model_name)
        model = self.manager.get(request.model_name, request.model_version)
        self.on_demand.touch(model.name)
        return model

    def custom_metric(self, model: str, operation: str, *arguments: Any) -> Any:
        """A Python model's custom-metric call (pb_utils.MetricFamily / Metric)."""
        return self.custom_metrics.call(model, operation, *arguments)

    def _forget_custom_metrics(self, retiring: ModelVersion) -> None:
        """When a model's last serving version retires, its custom metric families go too."""
        entry = self.manager.models.get(retiring.name)
        if entry is None or not any(m.in_service for m in entry.versions.values() if m is not retiring):
            self.custom_metrics.forget_model(retiring.name)

    def is_decoupled(self, name: str, version: str = "") -> bool:
        """Whether the model (version) sends its responses decoupled (any number per request); a model to be
        loaded on demand is taken as not (its inference loads it, and says so if it is)."""
        spec = self.manager.serving_spec(name, version)  # asked before every inference: the plain case first
        if spec is not None:
            return spec.decoupled
        try:
            return self.manager.get(name, version).spec.decoupled
        except (NotFound, Unavailable):
            if self.on_demand is not None and self.on_demand.wants(name):
                return False
            raise

    async def ensure_model(self, name: str, version: str = "") -> None:
        """As :meth:`require_model`, loading the model first where model control is on_demand."""
        request = InferRequest(name, version)
        if self._served(request) is None:
            await self._load_on_demand(request)

    # -- the direct path (runtime/direct_path.py) --------------------------------
    def direct_models(self) -> list[DirectModel]:
        """The model versions a front end may serve plain requests of itself; none while the core does something
        to every request (tracing, loading on demand) or is shutting down."""
        if self.shutting_down or not self.tracer.idle or self.on_demand is not None or self.latency_histograms:
            return []
        return direct_models(self.manager)

    def watch_direct_offer(self, changed: Callable[[], None]) -> Callable[[], None]:
        """``changed`` is called where direct_models() may answer otherwise now (tracing's settings changed, models
        loaded or unloaded, the drain began); how to stop."""
        self._offer_watchers.append(changed)
        return lambda: self._offer_watchers.remove(changed) if changed in self._offer_watchers else None

    def _offer_changed(self) -> None:
        for changed in list(self._offer_watchers):
            changed()

    def note_activity(self) -> None:
        """A front end served requests past the core (the idle timeout counts from the last)."""
        self.last_activity = time.monotonic()

    def direct_response(self, request: InferRequest, outputs: ModelOutputs) -> InferResponse:
        """The response to a request served past the core, from its model's outputs, as :meth:`infer` builds it."""
        return build_response(self.manager.get(request.model_name, request.model_version), request, outputs)

    # -- inference -------------------------------------------------------------
    async def infer(self, request: InferRequest) -> InferResponse:
        """One request, one response (a decoupled model's responses need :meth:`infer_stream`)."""
        self.in_flight += 1
        trace = None
        let_go = NOTHING_HELD
        try:
            model = self._served(request) or await self._load_on_demand(request)
            spec = model.spec
            if request.trace is not None or not self.tracer.idle:
                trace = request.trace = self._start_trace(model, request)
            if spec.decoupled:
                raise Unsupported(f"model '{model.name}' uses the decoupled transaction policy: its responses "
                                  "come only through a stream")
            let_go = hold_regions(self.shared_memory, request)  # inputs read from their regions here
            batch_size = validate_request(spec, request)
            if spec.reshapes_inputs:
                _reshape_inputs(spec, request)
            started = time.perf_counter() if self.latency_histograms else 0.0
            result = await self._run(model, request, batch_size)
            response = build_response(model, request, result)
            write_outputs(self.shared_memory, request, response)
            if self.latency_histograms:
                model.stats.record_response(True, (time.perf_counter() - started) * 1000)
            if trace is not None and trace.parent is None:  # an ensemble's step sends no response of its own
                trace.event("INFER_RESPONSE_COMPLETE")
            return response
        finally:
            let_go()  # the regions it held: one unregistered meanwhile goes now
            self.in_flight -= 1
            self.last_activity = time.monotonic()
            if trace is not None:
                trace.event("REQUEST_END")
                self.tracer.finish(trace)

    async def infer_stream(self, request: InferRequest) -> AsyncGenerator[StreamResponse, None]:
        """Every response to one request: one for a model in default mode, any number (the last one marked
        final) for a decoupled model.  Lookup and validation errors raise before the first response."""
        self.in_flight += 1
        trace = None
        let_go = NOTHING_HELD
        try:
            model = self._served(request) or await self._load_on_demand(request)
            trace = request.trace = self._start_trace(model, request)
            let_go = hold_regions(self.shared_memory, request)  # inputs read from their regions here
            batch_size = validate_request(model.spec, request)
            _reshape_inputs(model.spec, request)
            timed = model.spec.decoupled or self.latency_histograms  # a plain model's one response: if asked
            last = time.perf_counter() if timed else 0.0
            first = True
            async for item in stream_responses(model, request, batch_size, build_response,
                                               lambda: self._run(model, request, batch_size)):
                if item.response is not None:
                    write_outputs(self.shared_memory, request, item.response)
                    if trace is not None and trace.parent is None:
                        trace.event("INFER_RESPONSE_COMPLETE")
                    if timed:  # time to first response, then between responses (an LLM's tokens)
                        now = time.perf_counter()
                        model.stats.record_response(first, (now - last) * 1000)
                        first, last = False, now
                yield item
        finally:
            let_go()  # the regions it held: one unregistered meanwhile goes now
            self.in_flight -= 1
            self.last_activity = time.monotonic()
            if trace is not None:
                trace.event("REQUEST_END")
                self.tracer.finish(trace)

    def _start_trace(self, model: ModelVersion, request: InferRequest) -> Trace | None:
        """This request's trace if it is sampled (an ensemble step's: a child of its ensemble's trace)."""
        parent = request.trace
        trace = (parent.child(model.name) if parent is not None
                 else self.tracer.start(model.name, context=request.trace_context))
        if trace is not None:
            trace.version, trace.request_id = model.version, request.id
            trace.event("REQUEST_START")
        return trace

    def _run(self, model: ModelVersion, request: InferRequest, batch_size: int) -> Awaitable[dict[str, np.ndarray]]:
        """A validated request's outputs: from the response cache where the model uses it, else from the model."""
        if self.cache is not None and model.spec.response_cache:
            return through_cache(self.cache, model, request, lambda: model.infer(request, batch_size))
        return model.infer(request, batch_size)


def _reshape_inputs(spec: ModelSpec, request: InferRequest) -> None:
    for tensor in request.inputs:
        declared = spec.input(tensor.name)
        if declared is not None and declared.reshape is not None:
            data = tensor.values()
            batch = [data.shape[0]] if spec.max_batch_size > 0 else []
            try:
                tensor.data = data.reshape(batch + list(declared.reshape))
            except ValueError:
                raise InternalError(f"input '{tensor.name}' cannot be reshaped to {list(declared.reshape)}") from None
