"""The requests waiting for a model version, by priority level, as Triton's dynamic batcher keeps them.

With ``priority_levels`` in ``dynamic_batching``, level 1 is taken first and each level is first in, first out; a
request's ``priority`` parameter picks its level, and a priority of 0 or past the last level means
``default_priority_level`` (checked against Triton 2.51).  Each level has its own queue policy (bound and timeout)
where ``priority_queue_policy`` gives one.  Without levels there is one queue.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, Protocol, TypeVar


class Queued(Protocol):
    level: int  # the index of its level's queue (0: the first level)


T = TypeVar("T", bound=Queued)


class PriorityQueues(Generic[T]):
    """One FIFO queue per priority level; the first non-empty level is served first."""

    def __init__(self, levels: int = 0, default_level: int = 0) -> None:
        self.levels = max(levels, 1)
        self.default_level = default_level if levels else 1
        self._queues: list[deque[T]] = [deque() for _ in range(self.levels)]

    def index_of(self, priority: int) -> int:
        """The queue of a request with this ``priority`` (a level from 1; 0 or out of range: the default)."""
        level = priority if 1 <= priority <= self.levels else self.default_level
        return level - 1

    def __len__(self) -> int:
        return sum(len(queue) for queue in self._queues)

    def __bool__(self) -> bool:
        return any(self._queues)

    def size(self, index: int) -> int:
        return len(self._queues[index])

    def __iter__(self) -> Iterator[T]:
        """Every queued item, in the order they would be taken."""
        for queue in self._queues:
            yield from queue

    def append(self, item: T) -> None:
        self._queues[item.level].append(item)

    def extend(self, items: Iterable[T]) -> None:
        for item in items:
            self.append(item)

    def put_back(self, items: list[T]) -> None:
        """Return ``items`` (taken, in order) to the front of their levels, in their order."""
        for item in reversed(items):
            self._queues[item.level].appendleft(item)

    def pop(self) -> T | None:
        for queue in self._queues:
            if queue:
                return queue.popleft()
        return None

    def remove(self, item: T) -> None:
        with contextlib.suppress(ValueError):
            self._queues[item.level].remove(item)

    def sift(self, wanted: Callable[[T], bool | None], full: Callable[[], bool] = lambda: False) -> None:
        """Offer each queued item, by level then age, to ``wanted``: True takes it out, False leaves it queued,
        None drops it (a request already answered).  Offering stops once ``full()``: a batch filled from a long
        queue costs its own size, not the queue's length."""
        for queue in self._queues:
            kept: list[T] = []
            while queue and not full():
                item = queue.popleft()
                if wanted(item) is False:
                    kept.append(item)
            queue.extendleft(reversed(kept))

    def drain(self) -> Iterator[T]:
        """Every queued item, each queue emptied as it goes."""
        for queue in self._queues:
            while queue:
                yield queue.popleft()
