"""Whether a model's own queue is idle (nothing queued, nothing executing), told to whoever watches it.

A front end serves a request past the scheduler only while it is idle (``runtime/direct_path.py``): otherwise the
request would overtake those queued, or miss a batch it could join. While such a request executes, it holds the
model's instance: the scheduler asks the watchers' holds before it runs a batch, and waits for the instance first,
so that what arrived meanwhile is ordered and batched in the queue as it would be.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

# A watcher's hold on the instance: None where it holds nothing now, else what to await until it is free.
Hold = Callable[[], Awaitable[None] | None]


class IdleWatch:
    """Watchers told ``idle`` whenever it changes; ``is_idle`` says what it is now."""

    def __init__(self, is_idle: Callable[[], bool]) -> None:
        self._is_idle = is_idle
        self.watchers: list[Callable[[bool], None]] = []  # read before each check: none, nothing to do
        self.holds: list[Hold] = []
        self._told = True  # what the watchers were last told

    def watch(self, watcher: Callable[[bool], None], hold: Hold) -> Callable[[], None]:
        """Tell ``watcher(idle)`` now and on each change (on the loop), and ask ``hold`` before each batch; returns
        how to stop."""
        self.watchers.append(watcher)
        self.holds.append(hold)
        self._told = self._is_idle()
        watcher(self._told)

        def stop() -> None:
            if watcher in self.watchers:
                self.watchers.remove(watcher)
                self.holds.remove(hold)

        return stop

    def held(self) -> Awaitable[None] | None:
        """What to await before the instance is free, where a watcher's request holds it; None: it is free."""
        for hold in self.holds:
            waiting = hold()
            if waiting is not None:
                return waiting
        return None

    def busy(self) -> None:
        """A request was queued."""
        if self._told:
            self._told = False
            for watcher in self.watchers:
                watcher(False)

    def check(self) -> None:
        """Something left the queue or finished executing."""
        idle = self._is_idle()
        if idle != self._told:
            self._told = idle
            for watcher in self.watchers:
                watcher(idle)
