"""The worker connection's framing (handlers/python/transport.py): send_pickled and recv_pickled against
multiprocessing's own Connection, both ways, over a real socket pair; and outputs named by their request's input."""

from __future__ import annotations

import multiprocessing
import os
import threading

import numpy as np
import pytest

from handlers.python.transport import REQUEST_INPUT, input_ref, recv_pickled, request_input, send_pickled
from runtime.types import InferTensor


@pytest.fixture
def pipe():
    left, right = multiprocessing.Pipe()
    yield left, right
    left.close()
    right.close()


def test_read_as_multiprocessing_reads_and_back(pipe) -> None:
    left, right = pipe
    send_pickled(left, ("results", 7, [("OUTPUT0", "FP32", (1, 4), -1, 0, 16, b"\0" * 16)]))
    assert right.recv() == ("results", 7, [("OUTPUT0", "FP32", (1, 4), -1, 0, 16, b"\0" * 16)])
    right.send(("segment", 3, 1 << 20))  # what Arena.announce sends, with multiprocessing's pickler
    assert recv_pickled(left) == ("segment", 3, 1 << 20)


def test_a_message_larger_than_the_socket_buffer_arrives_whole(pipe) -> None:
    left, right = pipe
    message = ("execute", 1, [os.urandom(4 << 20)])  # more than a socket buffer holds: written and read in parts
    sender = threading.Thread(target=send_pickled, args=(left, message))
    sender.start()
    assert recv_pickled(right) == message
    sender.join(10)


def test_messages_keep_their_boundaries(pipe) -> None:
    left, right = pipe
    for index in range(50):
        send_pickled(left, ("release", [index] * index))
    assert [recv_pickled(right) for _ in range(50)] == [("release", [index] * index) for index in range(50)]


def test_a_closed_peer_is_end_of_file(pipe) -> None:
    left, right = pipe
    send_pickled(left, ("ready", None))
    left.close()
    assert recv_pickled(right) == ("ready", None)
    with pytest.raises(EOFError):
        recv_pickled(right)


def test_a_peer_gone_mid_message_is_end_of_file(pipe) -> None:
    left, right = pipe
    os.write(left.fileno(), (1000).to_bytes(4, "big") + b"\x80\x05")  # a frame cut short
    left.close()
    with pytest.raises(EOFError):
        recv_pickled(right)


def test_an_output_is_named_by_its_input_only_when_it_is_that_input_whole_and_in_place() -> None:
    source = np.arange(40_000, dtype=np.float32)
    inputs = [(1, source)]
    assert input_ref("OUT", source, inputs) == ("OUT", "FP32", (40_000,), REQUEST_INPUT, 1, source.nbytes, None)
    assert input_ref("OUT", source.view(np.int32), inputs) is None  # same bytes, another type
    assert input_ref("OUT", source[1:], inputs) is None
    assert input_ref("OUT", source[::2], inputs) is None
    assert input_ref("OUT", source.copy(), inputs) is None
    assert input_ref("OUT", source, []) is None
    assert input_ref("OUT", np.array(["a"], dtype=object), [(0, np.array(["a"], dtype=object))]) is None


def test_the_server_answers_a_named_output_from_its_own_input_array() -> None:
    own = np.arange(12, dtype=np.float32)
    request_inputs = [InferTensor("A", "INT32", [1], np.zeros(1, np.int32)), InferTensor("B", "FP32", [12], own)]
    answer = request_input(request_inputs, ("OUT", "FP32", (3, 4), REQUEST_INPUT, 1, own.nbytes, None))
    assert answer.shape == (3, 4) and np.shares_memory(answer, own)
    np.testing.assert_array_equal(answer.reshape(-1), own)
    assert request_input(request_inputs, ("OUT", "FP32", (12,), REQUEST_INPUT, 2, own.nbytes, None)) is None
    assert request_input(request_inputs, ("OUT", "FP32", (6,), REQUEST_INPUT, 1, own.nbytes // 2, None)) is None
