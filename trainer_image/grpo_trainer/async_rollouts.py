"""Generation overlapping training, with a bound on staleness (spec.grpo.maxStaleness, η).

With η > 0 the vLLM server samples the groups of the next steps while the trainer trains on the current
one. The policy version of the served weights is the number of optimizer steps they hold: the trainer
pushes version s-1 at the start of step s (TRL's weight sync), and trains step s on weights of version
s-1. A group sampled with version v and trained at step s has staleness (s-1) - v.

The rules, in the order they apply:

* A step's groups are sampled only when their staleness at training time can stay within η: the producer
  starts the request for step j once the served version is at least (j-1) - η. Nothing is sampled to be
  thrown away.
* Requests are made one at a time, in step order, by one thread on rank 0 (the only rank that talks to
  vLLM). No request starts while weights are pushed, and a push waits for the request in flight: a
  request finishes on the weights it started with, and its groups are stamped with that version. No
  group mixes two versions. Single-turn steps are sampled group by group (group_sampling.py): there a
  push does not wait for a request of a later step than the one the trainer takes next (with η >= 2
  the producer can be that far ahead); it interrupts the request, which keeps the groups complete
  before the push and samples the others again once it is done, on the new weights. The request of the
  next step is waited for: the trainer needs those groups now, and sampling them again would only make
  it wait longer. A step's groups may then hold two versions (each group one); its version for the
  staleness bound is the oldest.
* When a step takes its groups, the bound is checked again; groups found too stale, or sampled for other
  prompts than the step's, or whose request failed (a vLLM server lost mid-request), are dropped and
  counted, and the step samples anew on the spot, through TRL's synchronous path (which rides out a
  replaced server).
* After a restart nothing in flight survives: the resumed attempt samples from its checkpoint's weights.
  Prompt order is a function of the seed and the step, so the resumed job trains each step on the same
  prompts as before, and only the groups that were in flight at the kill are sampled again.

η = 0 never starts the producer: the trainer runs TRL's synchronous path untouched.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from grpo_trainer.group_sampling import Interrupted

log = logging.getLogger("grpo_trainer.async_rollouts")

# (prompt_ids, completion_ids, logprobs, logprob_token_ids): what TRL's VLLMGeneration hands on from vLLM.
Payload = tuple[Any, Any, Any, Any]


@dataclass
class Rollout:
    """The groups of one step, sampled by the producer."""

    step: int
    # What identifies the step's groups (their prompts' token ids; for episodes, their prompts and rows).
    prompts: list[Any]
    version: int
    # What ``generate`` is handed when it differs from ``prompts`` (episodes: the prompts and dataset rows).
    request: Any = None
    payload: Any = None
    error: BaseException | None = None
    started: float = 0.0
    finished: float = 0.0


@dataclass
class Taken:
    """What a step got from the producer: its groups, or None and why they must be sampled anew: a
    ``dropped`` reason (stale, request_failed, other_prompts: groups were sampled and thrown away) or none
    (nothing was sampled for the step), and ``detail`` in words."""

    rollout: Rollout | None
    staleness: int
    waited_seconds: float
    dropped: str | None = None
    detail: str = ""


@dataclass
class BusyClock:
    """Intervals in which generation ran, to measure how much of the training overlapped with it."""

    intervals: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=256))
    running_since: float | None = None

    def overlap(self, start: float, end: float) -> float:
        """Seconds of [start, end] in which generation ran."""
        spans = list(self.intervals)
        if self.running_since is not None:
            spans.append((self.running_since, end))
        total = 0.0
        for a, b in spans:
            total += max(0.0, min(b, end) - max(a, start))
        return total


class RolloutProducer:
    """Rank 0's generation thread. ``generate(prompts)`` samples the groups of ``prompts`` (one entry per
    group) from the served weights and returns TRL's payload; it runs on this thread only while no weight
    push is under way."""

    def __init__(
        self,
        generate: Callable[[Any], Any],
        max_staleness: int,
        version: int | None = None,
        interrupt: Callable[[], bool] | None = None,
    ):
        """``interrupt``, when given, is called as a push begins while a request is in flight; a ``generate``
        it stops raises :class:`Interrupted` (its request object keeps what was done), and the request is
        made again, first in line, once the push is over."""
        if max_staleness < 1:
            raise ValueError("the producer runs only with maxStaleness >= 1")
        self._generate = generate
        self._interrupt = interrupt
        # Requests a push interrupted (their groups in flight sampled again after it).
        self.interrupted = 0
        self.max_staleness = max_staleness
        # None until the first push: what a server serves before it is unknown (a fresh one serves the base
        # model, a resumed job trains from its checkpoint), so nothing is sampled before it.
        self.version = version
        self._cond = threading.Condition()
        self._queue: deque[Rollout] = deque()
        self._done: dict[int, Rollout] = {}
        self._in_flight: Rollout | None = None
        self._pushing = False
        self._broken = False
        self._closed = False
        self.clock = BusyClock()
        self._thread = threading.Thread(target=self._run, name="grpo-rollouts", daemon=True)
        self._thread.start()

    # -- the training thread ---------------------------------------------------------------------------

    def submit(self, step: int, prompts: list[Any], request: Any = None) -> None:
        """Queue the groups of ``step`` (later than every step queued before); ``generate`` gets ``request``
        when given, else ``prompts``."""
        with self._cond:
            self._queue.append(Rollout(step, prompts, version=-1, request=request))
            self._cond.notify_all()

    def pending(self) -> list[int]:
        """The steps queued, in flight or done and not taken yet."""
        with self._cond:
            steps = [r.step for r in self._queue] + list(self._done)
            if self._in_flight is not None:
                steps.append(self._in_flight.step)
            return sorted(steps)

    def take(self, step: int, prompts: list[Any], stop: Callable[[], bool] | None = None) -> Taken:
        """The groups of ``step``, waiting for them while they are being sampled. Earlier steps' leftovers
        are discarded (they can only be left after a fallback)."""
        started = time.monotonic()
        with self._cond:
            known = [r.step for r in self._queue] + list(self._done)
            if self._in_flight is not None:
                known.append(self._in_flight.step)
            if step not in known:
                return Taken(None, 0, 0.0, detail="not sampled ahead")
            while step not in self._done:
                if self._broken and self._in_flight is None:
                    return Taken(None, 0, time.monotonic() - started, detail="an earlier request failed")
                if stop is not None and stop():
                    return Taken(None, 0, time.monotonic() - started, detail="stopping")
                self._cond.wait(0.5)
            rollout = self._done.pop(step)
            for old in [s for s in self._done if s < step]:
                del self._done[old]
        waited = time.monotonic() - started
        staleness = (step - 1) - rollout.version
        if rollout.error is not None:
            detail = f"their request failed ({type(rollout.error).__name__}: {str(rollout.error)[:200]})"
            return Taken(None, 0, waited, dropped="request_failed", detail=detail)
        if rollout.prompts != prompts:
            return Taken(
                None, 0, waited, dropped="other_prompts", detail="sampled for other prompts than the step's"
            )
        if staleness > self.max_staleness:
            detail = f"staleness {staleness} > maxStaleness {self.max_staleness}"
            return Taken(None, staleness, waited, dropped="stale", detail=detail)
        return Taken(rollout, staleness, waited)

    @contextmanager
    def pushing(self, version: int | None = None) -> Iterator[None]:
        """Around a weight push (or a synchronous generation that may push): waits for the request in
        flight, and holds back new ones until the block ends. A push names the ``version`` it serves, which
        takes effect before any request can start again: none is stamped with the version pushed over."""
        with self._cond:
            self._pushing = True
            # A push of version v comes as the trainer starts step v + 1: a later step's groups can wait.
            later = self._in_flight is not None and version is not None and self._in_flight.step > version + 1
        if later and self._interrupt is not None and self._interrupt():
            with self._cond:
                self.interrupted += 1
        with self._cond:
            while self._in_flight is not None:
                self._cond.wait(0.5)
        pushed = False
        try:
            yield
            pushed = True
        finally:
            with self._cond:
                if pushed and version is not None:
                    self.version = version
                self._pushing = False
                self._broken = False
                self._cond.notify_all()

    def pushed(self, version: int) -> None:
        """Inside a ``pushing`` block, once the weights of ``version`` are in place: requests may start again
        before the block ends. What is left of it, the served-model probe, changes no weights; a lost server
        that it finds fails the requests sent to it, which holds them back until the block's end, after the
        replacement has the weights."""
        with self._cond:
            self.version = version
            self._pushing = False
            self._cond.notify_all()

    def discard_after(self, step: int) -> None:
        """Forget every step after ``step`` not sampled yet (their prompts are no longer coming)."""
        with self._cond:
            self._queue = deque(r for r in self._queue if r.step <= step)
            for old in [s for s in self._done if s > step]:
                del self._done[old]

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=5)

    # -- the producer thread ---------------------------------------------------------------------------

    def _startable(self) -> bool:
        if self._closed or self._pushing or self._broken or not self._queue or self.version is None:
            return False
        # Sampled now, step j trains on version (j-1) at the latest: within the bound or not started.
        return (self._queue[0].step - 1) - self.version <= self.max_staleness

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._startable():
                    self._cond.wait()
                if self._closed:
                    return
                rollout = self._queue.popleft()
                assert self.version is not None
                if rollout.version < 0:  # resumed after an interruption: its oldest groups' version stays
                    rollout.version = self.version
                    rollout.started = time.monotonic()
                self._in_flight = rollout
                self.clock.running_since = time.monotonic()
            try:
                rollout.payload = self._generate(
                    rollout.request if rollout.request is not None else rollout.prompts
                )
                # Sampled group by group: the step is as old as its oldest group.
                versions = getattr(rollout.payload, "versions", None)
                if versions:
                    rollout.version = min(versions)
            except Interrupted:
                with self._cond:
                    self.clock.intervals.append(
                        (self.clock.running_since or time.monotonic(), time.monotonic())
                    )
                    self.clock.running_since = None
                    self._in_flight = None
                    self._queue.appendleft(rollout)
                    self._cond.notify_all()
                continue
            except BaseException as exc:  # handed to the training thread, which decides what to do
                rollout.error = exc
                log.warning(
                    "sampling step %d ahead failed (%s: %s); the step samples anew when it comes",
                    rollout.step,
                    type(exc).__name__,
                    str(exc)[:300],
                )
            with self._cond:
                rollout.finished = time.monotonic()
                self.clock.intervals.append((self.clock.running_since or rollout.started, rollout.finished))
                self.clock.running_since = None
                self._in_flight = None
                self._done[rollout.step] = rollout
                # A failed request means a lost server: nothing more until the training thread has
                # recovered it (its synchronous sampling rides out the replacement).
                self._broken = rollout.error is not None
                self._cond.notify_all()
