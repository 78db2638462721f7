"""One object per event loop, made on first use, for state a loop's callbacks share (the deadline wheel, the HTTP
request watch) without holding the loop alive."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class LoopLocal(Generic[T]):
    """``make()``'s object for each loop, kept no longer than the loop.  Asked for on every request: the last
    loop's object is kept at hand, where a WeakKeyDictionary lookup makes a weak reference each time."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T] = weakref.WeakKeyDictionary()
        self._recent: tuple[weakref.ref, T] | None = None  # the last loop asked for (weakly) and its object

    def get(self, loop: asyncio.AbstractEventLoop) -> T:
        recent = self._recent
        if recent is not None and recent[0]() is loop:
            return recent[1]
        found = self._by_loop.get(loop)
        if found is None:
            found = self._by_loop[loop] = self._make()
        self._recent = (weakref.ref(loop), found)
        return found
