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


def test_a_burst_of_child_changes_is_one_run_after_the_batch_period() -> None:
    """Pod scheduled, started, ready: three changes within moments, one reconcile, no later than the
    period after the first of them (a steady stream of changes never postpones it)."""

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        queue: WorkQueue[str] = WorkQueue()
        start = loop.time()
        queue.add_batched("a", 0.2)
        await asyncio.sleep(0.1)
        queue.add_batched("a", 0.2)
        assert len(queue) == 0, "nothing runs before the period is over"
        key = await asyncio.wait_for(queue.get(), timeout=2)
        waited = loop.time() - start
        assert key == "a" and 0.15 <= waited < 0.3, waited
        queue.done(key)
        await asyncio.sleep(0.3)
        assert len(queue) == 0, "the burst ran once"
        queue.close()

    asyncio.run(scenario())


def test_a_batched_change_joins_a_waiting_run_and_a_run_drops_pending_schedules() -> None:
    async def scenario() -> None:
        queue: WorkQueue[str] = WorkQueue()
        queue.add("a")  # the job itself changed: runs at once
        queue.add_batched("a", 0.05)  # its pod changed too: the waiting run will see it
        key = await asyncio.wait_for(queue.get(), timeout=1)
        queue.done(key)
        await asyncio.sleep(0.1)
        assert len(queue) == 0, "no second run for a change the first one saw"

        queue.add_after("b", 0.05)  # e.g. a retry scheduled earlier
        queue.add("b")  # the job changed meanwhile: this run decides again and schedules its own follow-up
        key = await asyncio.wait_for(queue.get(), timeout=1)
        queue.done(key)
        await asyncio.sleep(0.1)
        assert len(queue) == 0, "the earlier schedule was dropped by the run"

        queue.add("c")
        key = await asyncio.wait_for(queue.get(), timeout=1)
        queue.add_batched("c", 0.05)  # changed while being reconciled: it may have missed it, so once more
        queue.done(key)
        assert len(queue) == 0, "not at once: after the batch period"
        key = await asyncio.wait_for(queue.get(), timeout=1)
        assert key == "c"
        queue.done(key)
        queue.close()

    asyncio.run(scenario())
