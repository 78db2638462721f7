"""The worker connection's framing (handlers/python/transport.py): send_pickled and recv_pickled against
multiprocessing's own Connection, both ways, over a real socket pair."""

from __future__ import annotations

import multiprocessing
import os
import threading

import pytest

from handlers.python.transport import recv_pickled, send_pickled


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
