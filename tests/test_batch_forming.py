"""The batching decisions over a queue, checked directly (no scheduler, no instance): window, targets,
compatibility, requests handed over to be executed each alone."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from runtime.scheduling.batch_forming import (
    SEPARATE_EXECUTIONS,
    SEPARATE_SECONDS,
    BatchForming,
    QueuedRequest,
    batch_signature,
)
from runtime.scheduling.priority_queue import PriorityQueues
from runtime.types import InferRequest, InferTensor


def _forming(max_delay: float = 0.01, target: int = 16, concatenate: bool = False, batching: bool = True,
             separately: bool | None = None) -> BatchForming:
    return BatchForming(PriorityQueues(0, 0), batching, concatenate, 16 if batching else 0, target, max_delay,
                        None if separately is None else lambda: separately)


def _request(rows: int, width: int = 3) -> InferRequest:
    data = np.zeros((rows, width), dtype=np.float32)
    return InferRequest(model_name="m", inputs=[InferTensor("IN", "FP32", data.shape, data)])


def _queued(loop: asyncio.AbstractEventLoop, rows: int = 1, width: int = 3) -> QueuedRequest:
    request = _request(rows, width)
    return QueuedRequest(request, rows, batch_signature(request, True), loop.create_future())


def _steady_load(forming: BatchForming, gap: float, exec_seconds: float) -> None:
    forming.mean_gap = gap
    forming.last_arrival = time.monotonic()
    forming.exec_seconds = exec_seconds


def test_no_wait_before_anything_is_measured_or_without_a_delay():
    assert _forming().wait_window(1) == 0.0  # no execution measured yet
    zero = _forming(max_delay=0.0)
    _steady_load(zero, gap=0.0001, exec_seconds=0.01)
    assert zero.wait_window(1) == 0.0


def test_waits_only_when_the_queue_fills_sooner_than_an_execution_takes():
    forming = _forming()
    _steady_load(forming, gap=0.0002, exec_seconds=0.005)  # 15 more requests in 3 ms < 5 ms
    assert forming.wait_window(1) == pytest.approx(15 * 0.0002)
    _steady_load(forming, gap=0.001, exec_seconds=0.005)  # 15 ms to fill > 5 ms: run now
    assert forming.wait_window(1) == 0.0
    assert forming.wait_window(16) == 0.0  # already full


def test_the_window_never_exceeds_max_queue_delay():
    forming = _forming(max_delay=0.001)
    _steady_load(forming, gap=0.0005, exec_seconds=1.0)
    assert forming.wait_window(1) == pytest.approx(0.001)


def test_no_wait_when_arrivals_stopped():
    forming = _forming()
    _steady_load(forming, gap=0.0001, exec_seconds=0.01)
    forming.last_arrival = time.monotonic() - 1.0  # nothing for a second
    assert forming.wait_window(1) == 0.0


def test_the_target_bounds_what_is_taken():
    async def main():
        forming = _forming(target=8)
        loop = asyncio.get_running_loop()
        items = [_queued(loop, rows=3) for _ in range(5)]
        forming.queue.extend(items[1:])
        batch = [items[0]]
        total = forming.take_compatible(batch, 3)
        assert total == 9 and len(batch) == 3  # 3+3+3 passes 8 once, and stops there
        assert len(forming.queue) == 2
    asyncio.run(main())


def test_ragged_requests_are_not_concatenated_together():
    async def main():
        forming = _forming(concatenate=True)  # as for a tensor model
        loop = asyncio.get_running_loop()
        first, other, same = _queued(loop, 1, 3), _queued(loop, 1, 5), _queued(loop, 2, 3)
        forming.queue.extend([other, same])
        batch = [first]
        assert forming.take_compatible(batch, 1) == 3
        assert batch == [first, same]
        assert list(forming.queue) == [other]
    asyncio.run(main())


def test_without_batching_queued_requests_go_together_only_while_fast_and_the_instance_can():
    async def main():
        loop = asyncio.get_running_loop()
        fast = SEPARATE_SECONDS / SEPARATE_EXECUTIONS
        cases = [  # (exec_seconds, whether the instance can now, never: several instances) -> requests taken
            ((fast, True, False), SEPARATE_EXECUTIONS),
            ((fast * 1.5, True, False), 1),  # together they would take longer than SEPARATE_SECONDS
            ((None, True, False), 1),  # nothing measured yet
            ((fast, False, False), 1),  # its worker is down, or it is decoupled
            ((fast, True, True), 1),
        ]
        for (exec_seconds, can, never), taken in cases:
            forming = _forming(batching=False, separately=None if never else can)
            forming.exec_seconds = exec_seconds
            cancelled = _queued(loop)
            cancelled.future.cancel()
            forming.queue.extend([_queued(loop), cancelled] + [_queued(loop) for _ in range(SEPARATE_EXECUTIONS + 2)])
            batch = await forming.next_batch()
            assert len(batch) == taken and cancelled not in batch, (exec_seconds, can, never)
            assert sum(not item.future.done() for item in forming.queue) == SEPARATE_EXECUTIONS + 3 - taken
    asyncio.run(main())
