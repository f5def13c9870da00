"""Events on GRPOJobs, posted in the background with a dedupe window (client-go's event recorder)."""

from __future__ import annotations

import asyncio
import time

from kubernetes.client.exceptions import ApiException

from grpo_operator.api.resource import API_VERSION, KIND
from grpo_operator.reconcile.conditions import format_time
from grpo_operator.runtime.controller_state import ControllerState, log
from grpo_operator.runtime.kube_client import Obj

EVENT_DEDUPE_SECONDS = 600.0
# Events are posted in the background, as client-go's event recorder does: the worker that decided them goes on
# to the next job instead of waiting for the round trip. With 300 jobs arriving at once that wait was a third of
# a new job's first reconcile and half of the one that says Running, and jobs whose pods were Ready queued
# behind it. Beyond this many events in flight a reconcile posts its own and waits for them, so an API server
# that cannot keep up slows the reconciles down instead of growing the operator's memory.
MAX_EVENTS_IN_FLIGHT = 1000


class EventRecorder(ControllerState):
    """Posts Events on GRPOJobs in the background, each (job, reason, message) once per dedupe window."""

    async def emit_events(self, job: Obj, events: list[tuple[str, str, str]]) -> None:
        """Post ``events`` (type, reason, message) about ``job`` in the background (see MAX_EVENTS_IN_FLIGHT)."""
        if not events:
            return
        meta = job["metadata"]
        about = {"metadata": {k: meta.get(k) for k in ("namespace", "name", "uid")}}
        if len(self._events_in_flight) + len(events) > MAX_EVENTS_IN_FLIGHT:
            await asyncio.gather(*(self.post_event(about, *e) for e in events))
            return
        for event in events:
            task = asyncio.create_task(self.post_event(about, *event), name="grpo-event")
            self._events_in_flight.add(task)
            task.add_done_callback(self._events_in_flight.discard)

    async def flush_events(self, timeout: float | None = None) -> None:
        """Wait for the events in flight (at most ``timeout`` seconds; what is left then is dropped)."""
        pending = set(self._events_in_flight)
        if not pending:
            return
        _, late = await asyncio.wait(pending, timeout=timeout)
        for task in late:
            task.cancel()
        if late:
            log.warning("dropped %d events still being posted at shutdown", len(late))

    async def post_event(self, job: Obj, type_: str, reason: str, message: str) -> None:
        meta = job["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        now = time.monotonic()
        dedupe = ((namespace, name), reason, message)
        if now - self._recent_events.get(dedupe, -1e9) < EVENT_DEDUPE_SECONDS:
            return
        self._recent_events[dedupe] = now
        if len(self._recent_events) > 10_000:
            cutoff = now - EVENT_DEDUPE_SECONDS
            self._recent_events = {k: t for k, t in self._recent_events.items() if t >= cutoff}
        stamp = format_time(self.clock())
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
            "source": {"component": self.settings.component},
            "reportingComponent": self.settings.component,
            "reportingInstance": self._instance,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        self.metrics.events.labels(type=type_, reason=reason).inc()
        try:
            await self._call(self.kube.create, event)
        except ApiException as exc:  # events are best effort; the status says the same
            self._api_error("create", "Event", exc)
            log.warning("could not post event %s on %s/%s: HTTP %s", reason, namespace, name, exc.status)
        except Exception as exc:  # a lost connection; posted in the background, so nobody else would catch it
            self.metrics.api_errors.labels(verb="create", kind="Event", code="0").inc()
            log.warning("could not post event %s on %s/%s: %s", reason, namespace, name, exc)
