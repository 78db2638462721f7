"""Sequence batching (``sequence_batching``): stateful models whose requests come in sequences, each request
carrying a correlation ID (``sequence_id``, a number or a string) and the START / END flags.

Every sequence is held by one instance from its START to its END (or until it stays idle past
``max_sequence_idle_microseconds``), its requests run one at a time and in order, and the model receives the
control inputs its config asks for (START, END, READY, CORRID) with each request.  Requests of different
sequences on one instance are batched together, up to ``max_batch_size``.  An instance holds at most
``max_batch_size`` sequences (``direct``) or ``max_candidate_sequences`` (``oldest``); a new sequence beyond
that waits for one to end, as a queued request waits: bounded in time (``slot_timeout``, or the request's shorter
``timeout``) and in number (the model's queue size), past either UNAVAILABLE.  Implicit state (``state``) is
carried here too: each request gets the state the previous request of its sequence wrote (zeros at START), and the
state outputs never reach the client.
Errors use Triton's words.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from runtime.config.sequence_config import SequenceSpec
from runtime.datatypes import numpy_dtype
from runtime.errors import InvalidArgument, Unavailable
from runtime.handler import ModelHandler
from runtime.scheduling.request_parameters import requested_timeout
from runtime.scheduling.scheduler import DEFAULT_MAX_QUEUE_SIZE, Scheduler
from runtime.scheduling.stats import ModelStatistics
from runtime.scheduling.wait_graph import WaitGraph
from runtime.types import InferRequest, InferTensor

START, END = 1, 2  # request flags (TRITONSERVER_REQUEST_FLAG_SEQUENCE_START / _END)
# How long a new sequence waits for a slot by default (server.sequence_slot_timeout_seconds): Triton waits without
# end, so one client holding every slot with heartbeats locked every other client out.
DEFAULT_SLOT_TIMEOUT_SECONDS = 30.0


@dataclass(eq=False)
class _Sequence:
    correlation_id: int | str
    instance: int
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)
    state: dict[str, np.ndarray] = field(default_factory=dict)  # implicit state: input name -> its next value


class SequenceScheduler:
    """Routes each sequence to one instance's scheduler and feeds the model its control inputs."""

    def __init__(self, spec: Any, instances: list[ModelHandler], executor: ThreadPoolExecutor,
                 stats: ModelStatistics, default_max_queue_size: int = DEFAULT_MAX_QUEUE_SIZE,
                 slot_timeout: float = DEFAULT_SLOT_TIMEOUT_SECONDS, waits: WaitGraph | None = None) -> None:
        """``slot_timeout``: how long a new sequence waits for a slot when every one is held (a request's own
        shorter ``timeout`` wins); at most ``default_max_queue_size`` new sequences wait at once."""
        self.spec = spec
        self.sequence: SequenceSpec = spec.sequence
        self.max_waiting = default_max_queue_size
        self.slot_timeout = slot_timeout
        self._waiting = 0  # new sequences waiting for a slot
        self._schedulers = [Scheduler(spec, [instance], executor, stats, default_max_queue_size, batch_always=True,
                                      max_delay=self.sequence.max_queue_delay_seconds,
                                      preferred_sizes=self.sequence.preferred_batch_sizes, waits=waits)
                            for instance in instances]
        per_instance = self.sequence.max_candidates or max(1, spec.max_batch_size)
        self._capacity = [per_instance] * len(instances)
        self._sequences: dict[int | str, _Sequence] = {}
        self._freed = asyncio.Condition()
        self._reaper = asyncio.create_task(self._release_idle())

    @property
    def pending(self) -> int:
        return sum(scheduler.pending for scheduler in self._schedulers)

    def is_overdue(self, instance: ModelHandler) -> bool:
        """Whether ``instance`` executes past its execute timeout (see ``Scheduler.is_overdue``)."""
        return any(scheduler.is_overdue(instance) for scheduler in self._schedulers)

    def overdue(self) -> dict[ModelHandler, float]:
        """Instances executing past their execute timeout (see ``Scheduler.overdue``)."""
        return {instance: seconds for scheduler in self._schedulers
                for instance, seconds in scheduler.overdue().items()}

    async def submit(self, request: InferRequest, batch_size: int) -> tuple[Any, int]:
        model = self.spec.name
        parameters = request.parameters
        correlation_id = _correlation_id(parameters.get("sequence_id", 0))
        if correlation_id in (0, ""):
            raise InvalidArgument(f"inference request to model '{model}' must specify a non-zero or non-empty "
                                  "correlation ID")
        if self.spec.max_batch_size > 0 and batch_size != 1:
            raise InvalidArgument(f"inference request to model '{model}' must specify batch-size 1 due to "
                                  "requirements of sequence batcher")
        start, end = _flag(parameters, "sequence_start"), _flag(parameters, "sequence_end")
        sequence = self._sequences.get(correlation_id)
        if sequence is None:
            if not start:
                raise InvalidArgument(f"inference request for sequence {correlation_id} to model '{model}' must "
                                      "specify the START flag on the first request of the sequence")
            sequence = await self._open(correlation_id, requested_timeout(request))
        async with sequence.lock:
            if self._sequences.get(correlation_id) is not sequence:  # released (idle) while this one waited
                raise InvalidArgument(f"inference request for sequence {correlation_id} to model '{model}' must "
                                      "specify the START flag on the first request of the sequence")
            ran = False
            try:
                request.correlation_id, request.flags = correlation_id, (START if start else 0) | (END if end else 0)
                request.inputs += self._controls(request, start, end) + self._states(sequence, start)
                result, queue_ns = await self._schedulers[sequence.instance].submit(request, batch_size)
                ran = True
                self._keep_states(sequence, result)
                return result, queue_ns
            finally:
                sequence.last_used = time.monotonic()
                if end or (start and not ran):  # ended, or its START never ran (refused, timed out, cancelled)
                    await self._close(sequence)

    async def _open(self, correlation_id: int | str, timeout: float) -> _Sequence:
        """A new sequence on the instance with the most room, waiting for room if every instance is full: at
        most ``slot_timeout`` (or the request's shorter ``timeout``), behind at most ``max_waiting`` others."""
        model = self.spec.name
        if self._waiting >= self.max_waiting:
            raise Unavailable(f"Exceeds maximum queue size ({self.max_waiting}) of model '{model}': every sequence "
                              f"slot is held and {self._waiting} new sequences wait for one")
        limit = min(timeout, self.slot_timeout) if timeout else self.slot_timeout
        self._waiting += 1
        try:
            async with asyncio.timeout(limit), self._freed:
                while True:
                    held = [0] * len(self._capacity)
                    for sequence in self._sequences.values():
                        held[sequence.instance] += 1
                    free = [index for index, capacity in enumerate(self._capacity) if held[index] < capacity]
                    if free:
                        instance = min(free, key=lambda index: held[index])
                        sequence = _Sequence(correlation_id, instance)
                        self._sequences[correlation_id] = sequence
                        return sequence
                    await self._freed.wait()
        except TimeoutError:
            raise Unavailable(f"Request timeout expired: no sequence slot of model '{model}' became free within "
                              f"{limit:g} s (every slot is held by a sequence that has not ended)") from None
        finally:
            self._waiting -= 1

    async def _close(self, sequence: _Sequence) -> None:
        async with self._freed:
            if self._sequences.get(sequence.correlation_id) is sequence:
                del self._sequences[sequence.correlation_id]
            self._freed.notify_all()

    async def _release_idle(self) -> None:
        """Release sequences idle past ``max_sequence_idle_microseconds`` (their next request must START)."""
        interval = min(max(self.sequence.idle_seconds / 4, 0.01), 1.0)
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for sequence in list(self._sequences.values()):
                if not sequence.lock.locked() and now - sequence.last_used > self.sequence.idle_seconds:
                    await self._close(sequence)

    def _controls(self, request: InferRequest, start: bool, end: bool) -> list[InferTensor]:
        shape = (1, 1) if self.spec.max_batch_size > 0 else (1,)
        tensors = []
        for control in self.sequence.controls:
            if control.kind == "CONTROL_SEQUENCE_CORRID":
                value = corrid_value(request.correlation_id, control.datatype)
            else:
                on = {"CONTROL_SEQUENCE_START": start, "CONTROL_SEQUENCE_END": end,
                      "CONTROL_SEQUENCE_READY": True}[control.kind]
                value = control.true_value if on else control.false_value
            if control.datatype == "BYTES":
                array = np.full(shape, str(value).encode(), dtype=np.object_)
            else:
                array = np.full(shape, value, dtype=numpy_dtype(control.datatype))
            tensors.append(InferTensor(control.name, control.datatype, shape, array))
        return tensors

    def _states(self, sequence: _Sequence, start: bool) -> list[InferTensor]:
        """The implicit state inputs: what the previous request wrote, or zeros at the START of a sequence."""
        batch = (1,) if self.spec.max_batch_size > 0 else ()
        tensors = []
        for state in self.sequence.states:
            value = None if start else sequence.state.get(state.input_name)
            if value is None:
                value = np.zeros(batch + state.dims, dtype=numpy_dtype(state.datatype))
            tensors.append(InferTensor(state.input_name, state.datatype, tuple(value.shape), value))
        return tensors

    def _keep_states(self, sequence: _Sequence, result: Any) -> None:
        """Take the state outputs out of a result (clients never see them) and keep private copies of them."""
        if not isinstance(result, dict):
            return
        for state in self.sequence.states:
            value = result.pop(state.output_name, None)
            if value is not None:
                sequence.state[state.input_name] = np.array(value, copy=True)

    async def close(self) -> None:
        self._reaper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reaper
        for scheduler in self._schedulers:
            await scheduler.close()


def _correlation_id(value: Any) -> int | str:
    """A request's ``sequence_id``: a string, or a number that fits an unsigned 64-bit integer (Triton's words for
    anything else, with 400 where Triton 2.51 answers 500)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)) or (isinstance(value, int)
                                                                         and not 0 <= value < 1 << 64):
        raise InvalidArgument("Unable to parse 'sequence_id': attempt to access JSON non-string as string")
    return value


def _flag(parameters: dict[str, Any], key: str) -> bool:
    value = parameters.get(key, False)
    if not isinstance(value, bool):
        raise InvalidArgument(f"Unable to parse '{key}': attempt to access JSON non-boolean as boolean")
    return value


def corrid_value(correlation_id: int | str, datatype: str) -> int | str:
    """The CORRID control's value: the ID itself; for a string ID in a numeric control, what Triton 2.51 gives
    (checked against it): the string's tensor serialization (4-byte little-endian length, then the bytes) read
    as that number, zero-padded or cut to its size ("abc" in UINT64: 0x0063626100000003)."""
    if datatype == "BYTES" or isinstance(correlation_id, int):
        return correlation_id
    dtype = numpy_dtype(datatype).newbyteorder("<")
    serialized = struct.pack("<I", len(correlation_id.encode())) + correlation_id.encode()
    return np.frombuffer(serialized[:dtype.itemsize].ljust(dtype.itemsize, b"\0"), dtype=dtype)[0].item()
