"""The reconcile loop: observe a job's children, call reconcile(), carry out the plan.

The runtime's own informers (informer.py) watch GRPOJobs, every child kind and nodes; their events only
put the job's key into a work queue (kopf watches none of these: it runs the process's lifecycle). A small pool of workers takes keys off
the queue — one job is never reconciled by two workers at once — and a resync loop re-queues every job periodically, because deadlines are time-based and
a missed watch event must not leave a job unattended. The loop holds no state that matters: an
operator restarted at any point re-derives everything from the cluster.

The controller is one class assembled from mixins, one per concern and each in its own module: what wakes
a job (wakeups.py), observing it (observe.py), carrying out its plan (apply_plan.py), its Events (events.py).
They share the settings, the API client, the queue and the caches through controller_state.py, and what the
operator remembers of each job between reconciles is one record per job (job_memory.py, ``self.jobs``);
this module holds the workers that run one reconcile after another.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time

from kubernetes.client.exceptions import ApiException

from grpo_operator.api.resource import KIND
from grpo_operator.reconcile import Plan, reconcile
from grpo_operator.runtime.apply_plan import PlanExecution, StatusConflict
from grpo_operator.runtime.controller_state import log
from grpo_operator.runtime.job_memory import Key
from grpo_operator.runtime.observe import Observation
from grpo_operator.runtime.wakeups import Wakeups


class Controller(Wakeups, Observation, PlanExecution):
    """Workers that take jobs off the queue and reconcile them: observe (runtime/observe.py), decide
    (``reconcile``), carry out the plan (runtime/apply_plan.py); the informers and the resync queue the
    jobs (runtime/wakeups.py)."""

    def start(self, watch: bool = True) -> None:
        if watch:
            self.watch()
        self.health.workers_alive = self._workers_alive
        for i in range(self.settings.workers):
            self._tasks.append(asyncio.create_task(self._worker(), name=f"grpo-reconcile-{i}"))
        self._tasks.append(asyncio.create_task(self._resync_loop(), name="grpo-resync"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        await self.flush_events(timeout=5.0)
        if self.cache is not None:
            await self.cache.informers.stop()
        self.queue.close()
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._job_writes.shutdown(wait=False, cancel_futures=True)

    def _workers_alive(self) -> bool:
        watching = self.cache is None or self.cache.informers.alive()
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
                job = await self._get_job(namespace, name)
            except ApiException as exc:
                if exc.status == 404:
                    self.jobs.forget(key)
                    self.queue.discard(key)
                    self.metrics.reconciles.labels(result="gone").inc()
                    return None
                raise
            observed, verified = await self.observe(job)
            now = self.clock()
            plan = reconcile(job, observed, now, self.settings)
            found = await self._probe(job, observed, plan)
            if found:
                # Objects already exist under names the plan would create: decide again knowing them
                # (the job's own, not yet in the cache, or someone else's: a conflict).
                observed = dataclasses.replace(observed, objects=observed.objects + tuple(found))
                plan = reconcile(job, observed, now, self.settings)
            await self.execute(job, plan)
            # Read whole and acted on: not read again until it changes.
            self.jobs.know(key).verified.update(verified)
        except StatusConflict:
            self.metrics.reconciles.labels(result="conflict").inc()
            self.queue.add_after(key, 0.2)
            return None
        except ApiException as exc:
            self._api_error("reconcile", KIND, exc)
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
        self.jobs.know(key).phase = plan.phase
        if plan.requeue_after is not None:
            self.queue.add_after(key, plan.requeue_after)
        return plan
