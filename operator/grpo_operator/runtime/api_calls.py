"""How the controller's parts call the Kubernetes API: off the event loop, in thread pools, each success
marking the API reachable (readiness) and each refusal counted by verb, kind and code.

One ``ApiCalls`` is made by the Controller (runtime/controller.py) and handed to every part that calls the
API: the wake-ups' resync (wakeups.py), observing a job (observe.py), carrying out its plan (apply_plan.py)
and posting its Events (events.py).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from kubernetes.client.exceptions import ApiException

from grpo_operator.observability import HealthState, OperatorMetrics
from grpo_operator.runtime.kube_client import Kube

T = TypeVar("T")


class ApiCalls:
    """The API client and the thread pools its blocking calls run in."""

    def __init__(self, kube: Kube, metrics: OperatorMetrics, health: HealthState, workers: int) -> None:
        self.kube = kube
        self._metrics = metrics
        self._health = health
        requests = metrics.api_requests
        kube.count_requests(lambda verb, resource: requests.labels(verb=verb, resource=resource).inc())
        self._pool = ThreadPoolExecutor(max_workers=4 * workers, thread_name_prefix="grpo-api")
        # The jobs' own writes (record and status) get threads of their own, one per worker: a job's pods wait
        # for its status write, which must not queue behind other jobs' child creates (at 100 jobs arriving
        # at once, several hundred of those are in flight).
        self._job_writes = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grpo-status")

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` (a method of ``kube``) in the shared pool."""
        return await self._call_in(self._pool, fn, *args, **kwargs)

    async def write_job(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A write of the job itself (its record or status), in the pool kept for those."""
        return await self._call_in(self._job_writes, fn, *args, **kwargs)

    async def _call_in(
        self, executor: ThreadPoolExecutor, fn: Callable[..., T], *args: Any, **kwargs: Any
    ) -> T:
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(executor, functools.partial(fn, *args, **kwargs))
        self._health.api_ok()
        return result

    def error(self, verb: str, kind: str, exc: ApiException) -> None:
        """Count an API error (grpo_operator_api_errors_total)."""
        self._metrics.api_errors.labels(verb=verb, kind=kind, code=str(exc.status or 0)).inc()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._job_writes.shutdown(wait=False, cancel_futures=True)
