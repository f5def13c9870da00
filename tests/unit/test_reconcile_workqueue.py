"""The work queue that feeds the reconcile workers: one job never reconciled twice at once."""

from __future__ import annotations

import asyncio

from grpo_operator.runtime.workqueue import WorkQueue


def test_duplicates_collapse_and_a_busy_key_is_requeued_once() -> None:
    async def scenario() -> list[str]:
        queue: WorkQueue[str] = WorkQueue()
        queue.add("a")
        queue.add("a")
        queue.add("b")
        assert len(queue) == 2
        first = await queue.get()
        assert first == "a"
        queue.add("a")  # arrives while "a" is processed: must run again afterwards, but only once
        queue.add("a")
        second = await queue.get()
        assert second == "b"
        queue.done("b")
        assert len(queue) == 0, "a key in progress is not handed to a second worker"
        queue.done("a")
        third = await queue.get()
        queue.done(third)
        return [first, second, third]

    assert asyncio.run(scenario()) == ["a", "b", "a"]


def test_delayed_adds_keep_the_earliest_and_backoff_grows() -> None:
    async def scenario() -> None:
        queue: WorkQueue[str] = WorkQueue()
        queue.add_after("a", 0.05)
        queue.add_after("a", 10)  # later schedule does not postpone the earlier one
        key = await asyncio.wait_for(queue.get(), timeout=2)
        assert key == "a"
        queue.done(key)
        delays = [queue.add_rate_limited("b", base=0.01, cap=0.04) for _ in range(4)]
        assert delays == [0.01, 0.02, 0.04, 0.04]
        queue.forget("b")
        assert queue.add_rate_limited("b", base=0.01) == 0.01
        queue.discard("b")
        await asyncio.sleep(0.05)
        assert len(queue) == 0, "a discarded key's retry never fires"
        queue.close()

    asyncio.run(scenario())
