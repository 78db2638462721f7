"""The wait graph on its own: which waits could never end."""

from __future__ import annotations

import pytest

from runtime.errors import Unavailable
from runtime.scheduling.wait_graph import WaitGraph


def _graph(**capacities: int) -> WaitGraph:
    graph = WaitGraph()
    for node, capacity in capacities.items():
        graph.add_node(node, f"'{node}'", capacity)
    return graph


def test_a_wait_on_a_model_with_an_idle_instance_is_allowed():
    graph = _graph(a=2)
    first = graph.begin("a")
    graph.wait(first, "a")  # the second instance is idle: the call runs there


def test_two_instances_each_waiting_on_the_model_deadlock():
    graph = _graph(a=2)
    first, second = graph.begin("a"), graph.begin("a")
    graph.wait(first, "a")  # the second execution runs freely: it will finish and free its instance
    with pytest.raises(Unavailable, match="from model 'a' to model 'a' would wait forever"):
        graph.wait(second, "a")
    graph.end(first)  # the refused wait left nothing behind: the first one may wait again
    graph.wait(second, "a")


def test_two_models_waiting_on_each_other_deadlock():
    graph = _graph(ping=1, pong=1)
    on_ping, on_pong = graph.begin("ping"), graph.begin("pong")
    graph.wait(on_ping, "pong")
    with pytest.raises(Unavailable, match="'pong' to model 'ping'"):
        graph.wait(on_pong, "ping")
    graph.done(on_ping, "pong")
    graph.wait(on_pong, "ping")  # ping's execution no longer waits: it will finish


def test_a_wait_through_a_chain_of_running_executions_is_allowed():
    graph = _graph(a=1, b=1, c=1)
    on_a, on_b, on_c = graph.begin("a"), graph.begin("b"), graph.begin("c")
    graph.wait(on_a, "b")
    graph.wait(on_b, "c")  # c runs freely: b, then a, will finish
    with pytest.raises(Unavailable):
        graph.wait(on_c, "a")  # closes the cycle a -> b -> c -> a


def test_an_execution_needs_every_answer_it_waits_for():
    graph = _graph(a=1, b=1, c=1)
    on_a, on_c = graph.begin("a"), graph.begin("c")
    graph.wait(on_a, "b")  # b is idle
    graph.wait(on_c, "a")  # a's execution waits only on b: it will finish
    with pytest.raises(Unavailable):
        graph.wait(on_a, "c")  # a would need c's answer too, and c waits on a: one unanswerable wait is enough


def test_unknown_callers_and_nodes_block_nobody():
    graph = _graph(a=1)
    graph.wait(12345, "a")  # an execution that already ended (a decoupled model's later call)
    token = graph.begin("a")
    graph.wait(token, "unregistered")
    graph.end(token)
    graph.end(token)
