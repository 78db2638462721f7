"""The contract every backend implements: one loaded instance of one model version (``ModelHandler``,
``TensorHandler``), what it is given (``HandlerContext``, with the server's ``ServerServices`` passed down so that a
handler never imports the core) and what it answers (``RequestResult``, ``RESCHEDULE``, ``REQUEUE``,
``ExecutionTiming``).

It lives in ``runtime`` so that the core depends on nothing above it: the backends (``handlers/``) implement it,
and the composition root hands the core the registry that names them.
"""

from __future__ import annotations

import abc
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from runtime.config.spec import ModelSpec
from runtime.direct_path import DirectChannel
from runtime.errors import ModelLoadError, ServingError
from runtime.types import InferRequest

# How long one execution may run (server.execute_timeout_seconds; a Python model's execute_timeout_seconds parameter
# overrides it): past it the batch's requests fail, a Python worker is recycled, and an instance that cannot be
# (a framework thread) keeps the model unready until it returns.  Triton has no such bound.
DEFAULT_EXECUTE_TIMEOUT_SECONDS = 60.0


_FIRST_LOAD_LOCK = threading.Lock()
_FIRST_LOADS_DONE: set[type] = set()


@contextmanager
def first_load_alone(handler: type[ModelHandler]) -> Iterator[None]:
    """Run the first load (and warm-up) of each in-process framework's handler alone; later loads run in parallel.

    Two frameworks initialising at once in one process can deadlock: TensorFlow's import held Python's import lock
    while OpenVINO's pybind11 sat in a C++ once-flag initialising its numpy API, each waiting for the other (seen
    loading a repository of every backend on two cores, one start in sixteen). A framework initialised once is safe.
    """
    if not handler.in_process_framework or handler in _FIRST_LOADS_DONE:
        yield
        return
    with _FIRST_LOAD_LOCK:
        yield
        _FIRST_LOADS_DONE.add(handler)


class Reschedule:
    """A result meaning: put this request back in the queue, it runs again in a later batch. The model asked for it
    (a Python model called ``request.set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)``), or, not
    ``executed``, the instance never reached it (its worker was lost first): then it counts in no execution."""

    def __init__(self, executed: bool = True) -> None:
        self.executed = executed

    def __repr__(self) -> str:
        return "RESCHEDULE" if self.executed else "REQUEUE"


RESCHEDULE = Reschedule()
REQUEUE = Reschedule(executed=False)

# What a handler returns for one request: output name -> array (a ModelOutputs may carry response
# parameters too), the error for that request, or RESCHEDULE / REQUEUE.
RequestResult = dict[str, np.ndarray] | ServingError | Reschedule


class ServerServices(Protocol):
    """What the server offers a model (BLS, the model loading API, custom metrics, its event loop), passed
    down to handlers so that they never import the core."""

    loop: Any  # the server's asyncio event loop
    tensor_pool: Any  # runtime.tensor_pool.TensorPool: the shared memory large inputs may already lie in

    async def infer(self, request: InferRequest) -> Any: ...
    def infer_stream(self, request: InferRequest) -> Any: ...  # an async iterator of responses
    async def load_model(self, name: str, parameters: dict | None = None) -> None: ...
    async def unload_model(self, name: str, parameters: dict | None = None) -> None: ...
    def model_ready(self, name: str, version: str = "") -> bool: ...
    def is_decoupled(self, name: str, version: str = "") -> bool: ...
    def model_config(self, name: str, version: str = "") -> Any: ...
    def custom_metric(self, model: str, operation: str, *arguments: Any) -> Any: ...


@dataclass(frozen=True)
class HandlerContext:
    """Everything a handler needs to load one instance of a model version."""

    spec: ModelSpec
    version: int
    repository_dir: Path
    instance_index: int = 0
    use_gpu: bool = True  # GPU when the instance group allows it and one is present
    device_id: int = 0
    instance_name: str = ""  # Triton's <group name>_<index>
    kind: str = "KIND_CPU"  # the instance's group kind
    services: ServerServices | None = None
    execute_timeout: float = DEFAULT_EXECUTE_TIMEOUT_SECONDS  # the server's default bound on one execution
    environments_dir: Path | None = None  # private folder for what models unpack to run (EXECUTION_ENV_PATH)

    @property
    def model_dir(self) -> Path:
        return self.repository_dir / self.spec.name

    @property
    def version_dir(self) -> Path:
        return self.model_dir / str(self.version)

    @property
    def model_path(self) -> Path:
        return self.version_dir / self.spec.default_model_filename

    @property
    def gpu_allowed(self) -> bool:
        return self.use_gpu and self.kind != "KIND_CPU"

    def require_model_file(self) -> Path:
        path = self.model_path
        if not path.is_file():
            raise ModelLoadError(
                f"model '{self.spec.name}' version {self.version}: "
                f"missing model file '{self.spec.default_model_filename}'"
            )
        return path


@dataclass
class ExecutionTiming:
    """Where one execution's time went, as Triton's statistics split it."""

    input_ns: int = 0  # preparing inputs for the framework (copies, conversions, IPC out)
    infer_ns: int = 0  # the model itself
    output_ns: int = 0  # turning results back into arrays (conversions, IPC in, splitting a batch)


class StartedExecution(Protocol):
    """An execution begun by :meth:`ModelHandler.start_execute`: awaiting ``results`` gives one result per
    request. Cancelling the wait abandons the answer, not the execution (the instance stays busy until it ends)."""

    async def results(self) -> list[RequestResult]: ...


class ModelHandler(abc.ABC):
    """A loaded model instance.  ``execute`` runs in a worker thread; a CPU :class:`TensorHandler` measured to
    run in well under a millisecond may run on the event loop (``runtime.scheduling.scheduler``), so it must not
    block on it.

    An instance runs one execution at a time; ``timing`` holds the phases of the current one.
    """

    def __init__(self, context: HandlerContext) -> None:
        self.context = context
        self.spec = context.spec
        self.device = "cpu"
        self.timing = ExecutionTiming()
        self.execute_timeout = context.execute_timeout  # seconds one execution may take (see the default's note)

    @abc.abstractmethod
    def load(self) -> None:
        """Load the model; raise ModelLoadError with a reason on failure."""

    @abc.abstractmethod
    def execute(self, requests: list[InferRequest]) -> list[RequestResult]:
        """Run a list of requests, returning exactly one result per request."""

    @property
    def available(self) -> bool:
        """Whether this instance can take work now (a Python worker being restarted cannot)."""
        return True

    @property
    def unavailable_reason(self) -> str:
        return ""

    @property
    def worker_restarts(self) -> int:
        """How many times this instance's worker process was lost and restarted (backends with one)."""
        return 0

    @property
    def checks_readiness(self) -> bool:
        """Whether the model has a readiness check of its own (a Python model's ``is_ready``)."""
        return False

    def check_ready(self) -> bool:
        """The model's own readiness check, within its bound (blocking: called in a thread)."""
        return True

    # Whether load and warm-up run a framework inside this process (ONNX Runtime, torch, TensorFlow, OpenVINO), so
    # that the first load of this class must run alone (first_load_alone).
    in_process_framework = False

    # Whether an execution may send requests of its own and wait for them (a Python model's BLS calls): only
    # such executions are tracked for wait cycles (runtime/scheduling/wait_graph.py).
    sends_requests = False

    @property
    def bounds_own_executions(self) -> bool:
        """Whether this instance ends an execution past ``execute_timeout`` itself (a worker process it recycles);
        otherwise the scheduler answers the requests at the timeout and holds the instance until the run returns."""
        return False

    def start_execute(self, requests: list[InferRequest]) -> StartedExecution | None:
        """Begin ``requests`` on the event loop without blocking, where this instance can (a model in another
        process); None: the scheduler runs :meth:`execute` in a worker thread instead."""
        return None

    @property
    def takes_separate_executions(self) -> bool:
        """Whether requests queued for this instance (of a model without dynamic batching) may be handed to it
        together, each executed alone: begun in one hand-off by :meth:`start_separate_executions`, else run one by
        one in one worker thread."""
        return False

    def start_separate_executions(self, requests: list[InferRequest]) -> StartedExecution | None:
        """Begin an execution of each of ``requests`` alone, one after another, in one hand-off (a model in another
        process: one wake-up each way for all of them, where each would pay its own); None: the scheduler runs them
        one by one in a worker thread instead."""
        return None

    def direct_channel(self) -> DirectChannel | None:
        """A side door a front end may send plain requests through itself (``runtime/direct_path.py``): a model in
        a worker process of its own; None (the default) where there is none now."""
        return None

    def cancel(self, request: InferRequest) -> None:
        """The client of a request this instance is executing went away (a model may notice)."""

    def unload(self, deadline: float | None = None) -> None:
        """Release the model (the Python backend calls ``finalize`` here).

        ``deadline`` (``time.monotonic()``) bounds the time it may take: work still running then is abandoned.
        """


class TensorHandler(ModelHandler):
    """A handler whose model maps input arrays to output arrays (ONNX, TorchScript).

    Such models can run many requests as one batch: the scheduler concatenates
    inputs along the batch dim and calls :meth:`run` once.  A run has three timed
    phases: :meth:`prepare`, :meth:`infer`, :meth:`collect`.
    """

    in_process_framework = True

    @property
    def takes_separate_executions(self) -> bool:
        return True  # one thread hand-off for several runs

    @abc.abstractmethod
    def prepare(self, inputs: dict[str, np.ndarray]) -> Any:
        """Named input arrays as the framework takes them."""

    @abc.abstractmethod
    def infer(self, feeds: Any) -> Any:
        """Run the model on prepared inputs."""

    @abc.abstractmethod
    def collect(self, results: Any) -> dict[str, np.ndarray]:
        """The framework's results as named output arrays."""

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the model on named input arrays, returning every output (timed into :attr:`timing`)."""
        started = time.perf_counter_ns()
        feeds = self.prepare(inputs)
        prepared = time.perf_counter_ns()
        results = self.infer(feeds)
        inferred = time.perf_counter_ns()
        outputs = self.collect(results)
        self.timing.input_ns += prepared - started
        self.timing.infer_ns += inferred - prepared
        self.timing.output_ns += time.perf_counter_ns() - inferred
        return outputs

    def execute(self, requests: list[InferRequest]) -> list[RequestResult]:
        results: list[RequestResult] = []
        for request in requests:
            try:
                results.append(self.run(request.input_arrays()))
            except ServingError as exc:
                results.append(exc)
        return results


# The backends' registry, as the composition root passes it in: a handler name (runtime/config/pbtxt.py) -> its class.
HandlerRegistry = Callable[[str], type[ModelHandler]]
