"""The reconcile loop: observe a job's children, call reconcile(), carry out the plan.

The runtime's own informers (informer.py) watch GRPOJobs, every child kind and nodes; their events only
put the job's key into a work queue (kopf watches none of these: it runs the process's lifecycle). A small pool of workers takes keys off
the queue — one job is never reconciled by two workers at once — and a resync loop re-queues every job periodically, because deadlines are time-based and
a missed watch event must not leave a job unattended. The loop holds no state that matters: an
operator restarted at any point re-derives everything from the cluster.

The Controller is made of separate parts, each given what it uses when it is made (``Controller.__init__``
is the whole wiring):

- ``ApiCalls`` (api_calls.py): the API client and the thread pools its calls run in;
- ``JobMemories`` (job_memory.py): what the operator remembers of each job between reconciles, one record
  per job, the only place records are kept;
- ``WatchCaches`` (wakeups.py): the informers' caches, once started;
- ``Wakeups`` (wakeups.py): what puts a job into the work queue (watch events, the resync);
- ``Observer`` (observe.py): what reconcile decides from;
- ``PlanExecutor`` (apply_plan.py): carrying out the plan, with
- ``EventRecorder`` (events.py): the job's Events, posted in the background.

This module holds the workers; one job's pass is ``reconcile_key``: ``observer.observe`` → ``reconcile``
(pure) → ``executor.execute``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

from kubernetes.client.exceptions import ApiException

from grpo_operator.api.resource import KIND
from grpo_operator.observability import HealthState, OperatorMetrics
from grpo_operator.reconcile import Plan, reconcile
from grpo_operator.runtime.api_calls import ApiCalls
from grpo_operator.runtime.apply_plan import PlanExecutor, StatusConflict
from grpo_operator.runtime.events import EventRecorder
from grpo_operator.runtime.informer import ClusterCache
from grpo_operator.runtime.job_memory import JobMemories, Key
from grpo_operator.runtime.kube_client import Kube, Obj
from grpo_operator.runtime.observe import Observer
from grpo_operator.runtime.wakeups import Wakeups, WatchCaches
from grpo_operator.runtime.workqueue import WorkQueue
from grpo_operator.settings import OperatorSettings

log = logging.getLogger("grpo_operator")


class Controller:
    """Workers that take jobs off the queue and reconcile them: observe (Observer), decide (``reconcile``),
    carry out the plan (PlanExecutor); the informers and the resync queue the jobs (Wakeups)."""

    def __init__(
        self,
        settings: OperatorSettings,
        kube: Kube,
        metrics: OperatorMetrics | None = None,
        health: HealthState | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.jobs = JobMemories()
        self.metrics = metrics or OperatorMetrics(self.jobs.phases, self.jobs.showbacks)
        self.health = health or HealthState(stale_after=max(120.0, 4 * settings.resync_seconds))
        self.queue: WorkQueue[Key] = WorkQueue()
        self.caches = WatchCaches()
        self.api = ApiCalls(kube, self.metrics, self.health, settings.workers)
        self.events = EventRecorder(self.api, self.metrics, settings.component, clock)
        self.wakeups = Wakeups(
            settings, self.api, self.jobs, self.queue, self.caches, self.metrics, self.health
        )
        self.observer = Observer(self.api, self.jobs, self.caches)
        self.executor = PlanExecutor(self.api, self.jobs, self.queue, self.caches, self.events, self.metrics)
        # Port of the /metrics server once started (the settings may ask for port 0 = any free port).
        self.http_port: int | None = None
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def cache(self) -> ClusterCache | None:
        """The watch caches (``caches.cluster``); the bench sets them to kopf-fed ones (bench/kopf_watching.py)."""
        return self.caches.cluster

    @cache.setter
    def cache(self, cache: ClusterCache | None) -> None:
        self.caches.cluster = cache

    # The ways in from outside: watch events (from the informers, or the bench's kopf handlers) and Events.

    def job_event(
        self, event_type: str | None, namespace: str, name: str, resource_version: str | None
    ) -> None:
        self.wakeups.job_event(event_type, namespace, name, resource_version)

    def child_event(self, namespace: str, job: str, kind: str) -> None:
        self.wakeups.child_event(namespace, job, kind)

    async def emit_events(self, job: Obj, events: list[tuple[str, str, str]]) -> None:
        await self.events.emit(job, events)

    async def flush_events(self, timeout: float | None = None) -> None:
        await self.events.flush(timeout)

    def start(self, watch: bool = True) -> None:
        if watch:
            self.caches.cluster = self.wakeups.watch()
        self.health.workers_alive = self._workers_alive
        for i in range(self.settings.workers):
            self._tasks.append(asyncio.create_task(self._worker(), name=f"grpo-reconcile-{i}"))
        self._tasks.append(asyncio.create_task(self.wakeups.resync_loop(), name="grpo-resync"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        await self.events.flush(timeout=5.0)
        if self.caches.cluster is not None:
            await self.caches.cluster.informers.stop()
        self.queue.close()
        self.api.shutdown()

    def _workers_alive(self) -> bool:
        watching = self.caches.cluster is None or self.caches.cluster.informers.alive()
        return watching and bool(self._tasks) and not any(t.done() for t in self._tasks)

    async def _worker(self) -> None:
        while True:
            key = await self.queue.get()
            self.metrics.queue_depth.set(len(self.queue))
            try:
                await self.reconcile_key(key)
            except Exception:  # a bug in one job's reconcile must not kill the worker
                log.exception("reconciling %s/%s crashed; retrying with backoff", *key)
                self.metrics.reconciles.labels(result="error").inc()
                self.queue.add_rate_limited(key)
            finally:
                self.queue.done(key)

    async def reconcile_key(self, key: Key) -> Plan | None:
        """One full reconcile of one job; returns the plan it carried out (None if the job is gone)."""
        namespace, name = key
        started = time.perf_counter()
        try:
            try:
                job = await self.observer.get_job(namespace, name)
            except ApiException as exc:
                if exc.status == 404:
                    self.jobs.forget(key)
                    self.queue.discard(key)
                    self.metrics.reconciles.labels(result="gone").inc()
                    return None
                raise
            observed, verified = await self.observer.observe(job)
            now = self.clock()
            plan = reconcile(job, observed, now, self.settings)
            found = await self.observer.probe(job, observed, plan)
            if found:
                # Objects already exist under names the plan would create: decide again knowing them
                # (the job's own, not yet in the cache, or someone else's: a conflict).
                observed = dataclasses.replace(observed, objects=observed.objects + tuple(found))
                plan = reconcile(job, observed, now, self.settings)
            await self.executor.execute(job, plan)
            # Read whole and acted on: not read again until it changes.
            self.jobs.remember_verified(key, verified)
        except StatusConflict:
            self.metrics.reconciles.labels(result="conflict").inc()
            self.queue.add_after(key, 0.2)
            return None
        except ApiException as exc:
            self.api.error("reconcile", KIND, exc)
            self.metrics.reconciles.labels(result="error").inc()
            delay = self.queue.add_rate_limited(key)
            log.warning(
                "reconciling %s/%s failed (HTTP %s %s); retrying in %.0fs",
                namespace,
                name,
                exc.status,
                exc.reason,
                delay,
            )
            return None
        finally:
            self.metrics.reconcile_seconds.observe(time.perf_counter() - started)
        self.metrics.reconciles.labels(result="success").inc()
        self.queue.forget(key)
        self.jobs.remember_phase(key, plan.phase)
        self.jobs.remember_showback(key, plan.showback)
        if plan.requeue_after is not None:
            self.queue.add_after(key, plan.requeue_after)
        return plan
