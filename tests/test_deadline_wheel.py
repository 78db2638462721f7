"""The deadline wheel: deadlines fire once due (within a slot), cancelled ones never, and its timeout turns its
own cancellation into TimeoutError as asyncio.timeout does."""

from __future__ import annotations

import asyncio
import logging

import pytest
import uvloop

from runtime.deadline_wheel import DeadlineWheel, deadline_wheel


def _run(scenario, loop_kind: str = "asyncio"):
    return uvloop.run(scenario()) if loop_kind == "uvloop" else asyncio.run(scenario())


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_a_deadline_fires_once_due_and_not_before(loop_kind):
    async def scenario() -> list[float]:
        loop = asyncio.get_running_loop()
        wheel = DeadlineWheel(resolution=0.01)
        fired: list[float] = []
        began = loop.time()
        for delay in (0.08, 0.03, 0.05):  # an earlier deadline after a later one still fires on time
            wheel.call_later(delay, lambda delay=delay: fired.append((loop.time() - began, delay)))
        await asyncio.sleep(0.2)
        return fired

    fired = _run(scenario, loop_kind)
    assert [delay for _, delay in fired] == [0.03, 0.05, 0.08]
    for elapsed, delay in fired:
        assert delay - 0.003 <= elapsed < delay + 0.05


def test_a_cancelled_deadline_never_fires_and_cancelling_twice_or_late_is_harmless():
    async def scenario() -> list[str]:
        wheel = DeadlineWheel()
        fired: list[str] = []
        kept = wheel.call_later(0.02, lambda: fired.append("kept"))
        dropped = wheel.call_later(0.02, lambda: fired.append("dropped"))
        assert len(wheel) == 2
        dropped.cancel()
        dropped.cancel()
        assert len(wheel) == 1
        await asyncio.sleep(0.06)
        kept.cancel()  # after it fired
        assert len(wheel) == 0
        return fired

    assert _run(scenario) == ["kept"]


def test_a_callback_may_cancel_another_deadline_of_its_slot():
    async def scenario() -> list[str]:
        wheel = DeadlineWheel()
        fired: list[str] = []
        later = None

        def first() -> None:
            fired.append("first")
            assert later is not None
            later.cancel()

        wheel.call_later(0.02, first)
        later = wheel.call_later(0.02, lambda: fired.append("cancelled"))
        wheel.call_later(0.02, lambda: fired.append("third"))
        await asyncio.sleep(0.06)
        return fired

    assert _run(scenario) == ["first", "third"]


def test_a_failing_callback_is_reported_and_the_others_still_run(caplog):
    async def scenario() -> list[str]:
        wheel = DeadlineWheel()
        fired: list[str] = []
        wheel.call_later(0.01, lambda: 1 / 0)
        wheel.call_later(0.01, lambda: fired.append("next"))
        await asyncio.sleep(0.05)
        return fired

    with caplog.at_level(logging.ERROR):
        assert _run(scenario) == ["next"]
    assert "a deadline's callback failed" in caplog.text


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_the_timeout_raises_timeout_error_past_its_deadline_and_nothing_within_it(loop_kind):
    async def scenario() -> None:
        wheel = deadline_wheel()
        with wheel.timeout(1):
            await asyncio.sleep(0.01)
        with pytest.raises(TimeoutError), wheel.timeout(0.03):
            await asyncio.Event().wait()
        current = asyncio.current_task()
        assert current is not None and current.cancelling() == 0  # the task carries on, not cancelled
        assert len(wheel) == 0

    _run(scenario, loop_kind)


def test_a_cancel_from_elsewhere_stays_a_cancel_inside_the_timeout():
    async def scenario() -> None:
        async def waiting() -> None:
            with deadline_wheel().timeout(10):
                await asyncio.Event().wait()

        task = asyncio.ensure_future(waiting())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    _run(scenario)


def test_each_loop_has_its_own_wheel():
    async def wheel() -> DeadlineWheel:
        first = deadline_wheel()
        assert deadline_wheel() is first
        return first

    assert asyncio.run(wheel()) is not asyncio.run(wheel())
