"""handlers.base.first_load_alone: the first load of each in-process framework runs alone (two frameworks
initialising at once deadlocked a server start), later loads and out-of-process handlers run in parallel."""

from __future__ import annotations

import threading
import time

from handlers.base import ModelHandler, TensorHandler, first_load_alone


def _overlapped(first: type[ModelHandler], second: type[ModelHandler]) -> bool:
    """Whether a load of ``second`` ran while a load of ``first`` was inside the gate."""
    inside = threading.Event()
    overlapped = threading.Event()

    def slow_load() -> None:
        with first_load_alone(first):
            inside.set()
            time.sleep(0.3)

    thread = threading.Thread(target=slow_load)
    thread.start()
    inside.wait(5)
    with first_load_alone(second):
        if thread.is_alive():
            overlapped.set()
    thread.join()
    return overlapped.is_set()


def test_first_loads_of_two_frameworks_do_not_overlap():
    class FrameworkA(TensorHandler):
        pass

    class FrameworkB(TensorHandler):
        pass

    assert not _overlapped(FrameworkA, FrameworkB)


def test_a_framework_loaded_once_loads_in_parallel():
    class Loaded(TensorHandler):
        pass

    class Fresh(TensorHandler):
        pass

    with first_load_alone(Loaded):
        pass
    assert _overlapped(Fresh, Loaded)


def test_a_handler_without_an_in_process_framework_is_never_held():
    class Framework(TensorHandler):
        pass

    class OutOfProcess(ModelHandler):
        pass

    assert _overlapped(Framework, OutOfProcess)


def test_a_failed_first_load_leaves_the_next_one_alone_too():
    class Failing(TensorHandler):
        pass

    class Other(TensorHandler):
        pass

    try:
        with first_load_alone(Failing):
            raise RuntimeError("load failed")
    except RuntimeError:
        pass
    assert not _overlapped(Failing, Other)
