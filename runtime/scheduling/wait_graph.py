"""Who waits on whom: executions that hold a model instance while waiting on requests of their own (BLS calls,
the steps of an ensemble they called), so that a request which could only wait forever is refused at once.

A deadlock needs no single chain of calls: with two instances of a model that calls itself, two concurrent
requests each hold one instance and each wait for a free one; with A and B calling each other, a request to A
holds A and waits for B while a request to B holds B and waits for A.  Each chain alone looks harmless.

The graph knows every model version's instances (a node with a capacity) and every execution running on one (a
token), and which nodes each execution waits on.  An execution *progresses* when every node it waits on
progresses (it needs all its answers); a node progresses when it has an idle instance or one of its executions
progresses (its queue then drains).  The executions that do not progress, in the least fixed point of these two
rules, are deadlocked.  Every new wait is checked before it is added: one that would leave its own execution
deadlocked is refused, so that the graph never holds a deadlock.  Everything runs on the event loop (no lock).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass, field
from itertools import count

from runtime.errors import Unavailable


@dataclass
class _Node:
    label: str
    capacity: int
    running: set[int] = field(default_factory=set)  # execution tokens


class _Execution:
    __slots__ = ("node", "waits")

    def __init__(self, node: Hashable) -> None:
        self.node = node
        self.waits: Counter = Counter()  # node -> requests of this execution waiting on it


class WaitGraph:
    """The server's executions and the waits between them (one per server)."""

    def __init__(self) -> None:
        self._nodes: dict[Hashable, _Node] = {}
        self._executions: dict[int, _Execution] = {}
        self._tokens = count(1)

    def add_node(self, node: Hashable, label: str, capacity: int) -> None:
        """A scheduler (a model version's instances, ``capacity`` of them) whose requests may be waited on."""
        self._nodes[node] = _Node(label, capacity)

    def remove_node(self, node: Hashable) -> None:
        self._nodes.pop(node, None)

    def begin(self, node: Hashable) -> int:
        """An execution starts on one of ``node``'s instances; its token (carried by the requests it sends)."""
        token = next(self._tokens)
        self._executions[token] = _Execution(node)
        if node in self._nodes:
            self._nodes[node].running.add(token)
        return token

    def end(self, token: int) -> None:
        execution = self._executions.pop(token, None)
        if execution is not None and execution.node in self._nodes:
            self._nodes[execution.node].running.discard(token)

    def wait(self, token: int, node: Hashable) -> None:
        """Execution ``token`` now waits on a request queued at ``node``; Unavailable (nothing added) when that
        wait could never end.  Every wait added must be ended with :meth:`done`."""
        execution = self._executions.get(token)
        if execution is None or node not in self._nodes:
            return  # the caller holds no instance (it finished, or runs outside any scheduler): it blocks nobody
        execution.waits[node] += 1
        if token not in self._progressing():
            self.done(token, node)
            caller, target = self._label(execution.node), self._nodes[node].label
            raise Unavailable(f"a request from model {caller} to model {target} would wait forever: every instance "
                              f"of {target} is held by an execution that itself waits, directly or through other "
                              f"models, on the instance of {caller} making this request (BLS calls in a cycle)")

    def done(self, token: int, node: Hashable) -> None:
        execution = self._executions.get(token)
        if execution is None:
            return
        execution.waits[node] -= 1
        if execution.waits[node] <= 0:
            del execution.waits[node]

    def _label(self, node: Hashable) -> str:
        known = self._nodes.get(node)
        return known.label if known is not None else "?"

    def _progressing(self) -> set[int]:
        """The executions that will finish: the least fixed point described in the module's docstring."""
        free = {node for node, state in self._nodes.items() if len(state.running) < state.capacity}
        progressing: set[int] = set()
        changed = True
        while changed:
            changed = False
            for token, execution in self._executions.items():
                if token not in progressing and all(node in free for node in execution.waits):
                    progressing.add(token)
                    free.add(execution.node)
                    changed = True
        return progressing
