"""A keyed work queue with the semantics of client-go's workqueue, for asyncio.

* A key is processed by at most one worker at a time: one job is never reconciled concurrently.
* Adding a key that is already waiting is a no-op; adding a key that is being processed marks it
  dirty, and it is processed once more afterwards (no event is lost, bursts collapse into one run).
* ``add_after`` schedules a key for later (deadlines, TTL, retries with backoff).
* ``add_batched`` gathers a burst of changes into one run: the key runs once, ``period`` after the first
  change, whatever arrives meanwhile (the Kubernetes Job controller does the same with pod events).
* Taking a key cancels its pending schedule: every run decides again from the current state and
  schedules its own follow-up (the next deadline, a retry), so an earlier schedule has nothing to add.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self) -> None:
        self._queue: asyncio.Queue[K] = asyncio.Queue()
        self._waiting: set[K] = set()
        self._processing: set[K] = set()
        self._dirty: set[K] = set()
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._failures: dict[K, int] = {}

    def add(self, key: K) -> None:
        if key in self._processing:
            self._dirty.add(key)
            return
        if key in self._waiting:
            return
        self._waiting.add(key)
        self._queue.put_nowait(key)

    def add_after(self, key: K, delay: float) -> None:
        """Add ``key`` after ``delay`` seconds; an earlier pending schedule for the key wins."""
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        existing = self._timers.get(key)
        if existing is not None and not existing.cancelled() and existing.when() <= due:
            return
        if existing is not None:
            existing.cancel()
        self._timers[key] = loop.call_at(due, self._fire, key)

    def add_batched(self, key: K, period: float) -> None:
        """Run ``key`` within ``period`` seconds: at once if it is already waiting, else when the earliest
        pending schedule (this one or an earlier) comes due."""
        if key in self._waiting:
            return  # the run it waits for will see this change too
        self.add_after(key, period)

    def add_rate_limited(self, key: K, base: float = 1.0, cap: float = 300.0) -> float:
        """Retry ``key`` with exponential backoff per key (1, 2, 4 ... ``cap`` seconds); returns the delay."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        delay = float(min(cap, base * (2.0**failures)))
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        """Reset the key's backoff after a successful run."""
        self._failures.pop(key, None)

    def discard(self, key: K) -> None:
        """Drop scheduled retries of a key whose object is gone."""
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        self._failures.pop(key, None)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    async def get(self) -> K:
        key = await self._queue.get()
        self._waiting.discard(key)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        self._processing.add(key)
        return key

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def __len__(self) -> int:
        return len(self._waiting)

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
