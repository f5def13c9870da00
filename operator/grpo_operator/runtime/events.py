"""Events on GRPOJobs, posted in the background with a dedupe window (client-go's event recorder).

The EventRecorder is made by the Controller (runtime/controller.py) and used by the PlanExecutor
(apply_plan.py), which hands it each plan's events and the API server's refusals; the Controller waits for
the events in flight when it stops (``flush``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable
from datetime import datetime

from kubernetes.client.exceptions import ApiException

from grpo_operator.api.resource import API_VERSION, KIND
from grpo_operator.observability import OperatorMetrics
from grpo_operator.reconcile.conditions import format_time
from grpo_operator.runtime.api_calls import ApiCalls
from grpo_operator.runtime.job_memory import Key
from grpo_operator.runtime.kube_client import Obj

log = logging.getLogger("grpo_operator")

EVENT_DEDUPE_SECONDS = 600.0
# Events are posted in the background, as client-go's event recorder does: the worker that decided them goes on
# to the next job instead of waiting for the round trip. With 300 jobs arriving at once that wait was a third of
# a new job's first reconcile and half of the one that says Running, and jobs whose pods were Ready queued
# behind it. Beyond this many events in flight a reconcile posts its own and waits for them, so an API server
# that cannot keep up slows the reconciles down instead of growing the operator's memory.
MAX_EVENTS_IN_FLIGHT = 1000


class EventRecorder:
    """Posts Events on GRPOJobs in the background, each (job, reason, message) once per dedupe window."""

    def __init__(
        self, api: ApiCalls, metrics: OperatorMetrics, component: str, clock: Callable[[], datetime]
    ) -> None:
        self._api = api
        self._metrics = metrics
        self._component = component
        self._clock = clock
        self._instance = os.environ.get("POD_NAME") or socket.gethostname()
        # When each (job, reason, message) was last posted. Not part of the job's memory (job_memory.py): the
        # window outlives the job's record (an Event posted in the background after the job is forgotten, a job
        # deleted and made again under its name within the window) and is trimmed by age, not by job.
        self._recent: dict[tuple[Key, str, str], float] = {}
        self._in_flight: set[asyncio.Task[None]] = set()

    async def emit(self, job: Obj, events: list[tuple[str, str, str]]) -> None:
        """Post ``events`` (type, reason, message) about ``job`` in the background (see MAX_EVENTS_IN_FLIGHT)."""
        if not events:
            return
        meta = job["metadata"]
        about = {"metadata": {k: meta.get(k) for k in ("namespace", "name", "uid")}}
        if len(self._in_flight) + len(events) > MAX_EVENTS_IN_FLIGHT:
            await asyncio.gather(*(self.post(about, *e) for e in events))
            return
        for event in events:
            task = asyncio.create_task(self.post(about, *event), name="grpo-event")
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)

    async def flush(self, timeout: float | None = None) -> None:
        """Wait for the events in flight (at most ``timeout`` seconds; what is left then is dropped)."""
        pending = set(self._in_flight)
        if not pending:
            return
        _, late = await asyncio.wait(pending, timeout=timeout)
        for task in late:
            task.cancel()
        if late:
            log.warning("dropped %d events still being posted at shutdown", len(late))

    async def post(self, job: Obj, type_: str, reason: str, message: str) -> None:
        meta = job["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        now = time.monotonic()
        dedupe = ((namespace, name), reason, message)
        if now - self._recent.get(dedupe, -1e9) < EVENT_DEDUPE_SECONDS:
            return
        self._recent[dedupe] = now
        if len(self._recent) > 10_000:
            cutoff = now - EVENT_DEDUPE_SECONDS
            self._recent = {k: t for k, t in self._recent.items() if t >= cutoff}
        stamp = format_time(self._clock())
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": name,
                "namespace": namespace,
                "uid": meta.get("uid"),
            },
            "type": type_,
            "reason": reason,
            "message": message,
            "source": {"component": self._component},
            "reportingComponent": self._component,
            "reportingInstance": self._instance,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        self._metrics.events.labels(type=type_, reason=reason).inc()
        try:
            await self._api.call(self._api.kube.create, event)
        except ApiException as exc:  # events are best effort; the status says the same
            self._api.error("create", "Event", exc)
            log.warning("could not post event %s on %s/%s: HTTP %s", reason, namespace, name, exc.status)
        except Exception as exc:  # a lost connection; posted in the background, so nobody else would catch it
            self._metrics.api_errors.labels(verb="create", kind="Event", code="0").inc()
            log.warning("could not post event %s on %s/%s: %s", reason, namespace, name, exc)
