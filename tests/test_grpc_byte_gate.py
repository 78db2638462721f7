"""The byte bound of ModelStreamInfer streams (runtime/grpc/byte_gate.py), in process."""

from __future__ import annotations

import asyncio

import pytest

from runtime.grpc.byte_gate import ByteGate, StreamBytes


def test_holders_wait_in_order_until_bytes_come_back():
    async def scenario() -> list[str]:
        gate = ByteGate(100)
        order: list[str] = []
        await gate.acquire(80)

        async def take(name: str, size: int) -> None:
            await gate.acquire(size)
            order.append(name)

        waiting = [asyncio.create_task(take("big", 50)), asyncio.create_task(take("small", 10))]
        await asyncio.sleep(0)
        assert order == [] and gate.used == 80  # the small one fits, but waits behind the big one
        gate.release(80)
        await asyncio.gather(*waiting)
        assert gate.used == 60
        return order

    assert asyncio.run(scenario()) == ["big", "small"]


def test_one_holder_larger_than_the_bound_gets_in_alone():
    async def scenario() -> None:
        gate = ByteGate(100)
        await gate.acquire(500)  # nothing held: it passes
        blocked = asyncio.create_task(gate.acquire(1))
        await asyncio.sleep(0)
        assert not blocked.done()
        gate.release(500)
        await blocked
        assert gate.used == 1

    asyncio.run(scenario())


def test_a_cancelled_waiter_takes_nothing_and_blocks_nobody():
    async def scenario() -> None:
        shared = ByteGate(100)
        stream = StreamBytes(1000, shared)
        await shared.acquire(100)
        cancelled = asyncio.create_task(stream.acquire(60))
        await asyncio.sleep(0)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert stream.own.used == 0  # what it had taken of its own stream's bound went back
        shared.release(100)
        await stream.acquire(100)
        assert shared.used == 100 and stream.own.used == 100

    asyncio.run(scenario())
