"""What every part of the reconcile loop shares: the settings, the API client and its thread pools, the
work queue, the metrics, the watch caches and what the operator remembers per job between reconciles
(``jobs``, one record per job: job_memory.py).

The controller is one class assembled from mixins, one per concern (runtime/controller.py); each of them
extends this one, so they share this state and the way API calls are run off the event loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, TypeVar

from kubernetes.client.exceptions import ApiException

from grpo_operator.observability import HealthState, OperatorMetrics
from grpo_operator.runtime.informer import ClusterCache
from grpo_operator.runtime.job_memory import JobMemories, Key
from grpo_operator.runtime.kube_client import Kube
from grpo_operator.runtime.workqueue import WorkQueue
from grpo_operator.settings import OperatorSettings

log = logging.getLogger("grpo_operator")
T = TypeVar("T")


class ControllerState:
    """The state and API-call plumbing every part of the controller shares."""

    def __init__(
        self,
        settings: OperatorSettings,
        kube: Kube,
        metrics: OperatorMetrics | None = None,
        health: HealthState | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.settings = settings
        self.kube = kube
        # What the operator remembers of each job between reconciles (runtime/job_memory.py).
        self.jobs = JobMemories()
        self.metrics = metrics or OperatorMetrics(self.jobs.phases)
        requests = self.metrics.api_requests
        kube.count_requests(lambda verb, resource: requests.labels(verb=verb, resource=resource).inc())
        self.health = health or HealthState(stale_after=max(120.0, 4 * settings.resync_seconds))
        self.clock = clock
        self.queue: WorkQueue[Key] = WorkQueue()
        self._executor = ThreadPoolExecutor(max_workers=4 * settings.workers, thread_name_prefix="grpo-api")
        # The jobs' own writes (record and status) get threads of their own, one per worker: a job's pods wait
        # for its status write, which must not queue behind other jobs' child creates (at 100 jobs arriving
        # at once, several hundred of those are in flight).
        self._job_writes = ThreadPoolExecutor(max_workers=settings.workers, thread_name_prefix="grpo-status")
        self._tasks: list[asyncio.Task[None]] = []
        self._recent_events: dict[tuple[Key, str, str], float] = {}
        self._events_in_flight: set[asyncio.Task[None]] = set()
        self._nodes: tuple[float, frozenset[str] | None] = (0.0, None)
        self._nodes_forbidden = False
        self._workloads_forbidden = False
        self._instance = os.environ.get("POD_NAME") or socket.gethostname()
        # Watch-backed caches (started with the controller); until a kind's cache is complete, and for
        # kinds the operator may not watch, reconcile reads from the API server instead.
        self.cache: ClusterCache | None = None
        # Port of the /metrics server once started (the settings may ask for port 0 = any free port).
        self.http_port: int | None = None

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await self._call_in(self._executor, fn, *args, **kwargs)

    async def _call_in(
        self, executor: ThreadPoolExecutor, fn: Callable[..., T], *args: Any, **kwargs: Any
    ) -> T:
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(executor, functools.partial(fn, *args, **kwargs))
        self.health.api_ok()
        return result

    def _api_error(self, verb: str, kind: str, exc: ApiException) -> None:
        self.metrics.api_errors.labels(verb=verb, kind=kind, code=str(exc.status or 0)).inc()
