"""The reconcile loop: observe a job's children, call reconcile(), carry out the plan.

The runtime's own informers (informer.py) watch GRPOJobs, every child kind and nodes; their events only
put the job's key into a work queue (kopf watches none of these: it runs the process's lifecycle). A small pool of workers takes keys off the queue — one job is never reconciled by two workers
at once — and a resync loop re-queues every job periodically, because deadlines are time-based and
a missed watch event must not leave a job unattended. The loop holds no state that matters: an
operator restarted at any point re-derives everything from the cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import functools
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, TypeVar

from kubernetes.client.exceptions import ApiException

from grpo_operator.api.resource import API_VERSION, GROUP, KIND
from grpo_operator.builders.common import (
    DEPLOYMENT_ROLES,
    KUEUE_GROUP_LABEL,
    LABEL_JOB,
    LABEL_MANAGED_BY,
    LABEL_ROLE,
    PART_OF,
)
from grpo_operator.builders.storage import ANNOTATION_JOB_UID
from grpo_operator.observability import HealthState, OperatorMetrics
from grpo_operator.reconcile import Observed, Plan, Refusal, reconcile
from grpo_operator.reconcile.conditions import format_time
from grpo_operator.reconcile.observed import ANNOTATION_BIND_COMPLETED, StorageClasses
from grpo_operator.reconcile.record import ANNOTATION_RECORD, record_annotation
from grpo_operator.runtime.informer import ClusterCache
from grpo_operator.runtime.kube import (
    CHILD_RESOURCES,
    GRPOJOB,
    KUEUE_WORKLOAD,
    NODE,
    STORAGE_CLASS,
    Kube,
    Obj,
    resource_for,
)
from grpo_operator.runtime.workqueue import WorkQueue
from grpo_operator.settings import OperatorSettings

log = logging.getLogger("grpo_operator")
Key = tuple[str, str]
T = TypeVar("T")

NODE_CACHE_SECONDS = 15.0
# Children whose changes come in bursts (a pod's start is several status updates; the metric Deployment's
# counters follow its pods): their changes wake the job batched (settings.child_event_batch_seconds).
BATCHED_KINDS = frozenset({"Pod", "Deployment"})
EVENT_DEDUPE_SECONDS = 600.0
# Events are posted in the background, as client-go's event recorder does: the worker that decided them goes on
# to the next job instead of waiting for the round trip. With 300 jobs arriving at once that wait was a third of
# a new job's first reconcile and half of the one that says Running, and jobs whose pods were Ready queued
# behind it. Beyond this many events in flight a reconcile posts its own and waits for them, so an API server
# that cannot keep up slows the reconciles down instead of growing the operator's memory.
MAX_EVENTS_IN_FLIGHT = 1000

# What the child caches hold (memory under tenant load): the API server sends only objects carrying the
# labels the operator sets, and of those the caches keep only what the operator manages (managed_child).
CHILD_SELECTOR = f"{LABEL_MANAGED_BY}={PART_OF},{LABEL_JOB}"
# Kinds reconcile reads only the metadata of (labels, annotations with the spec-hash, owner references,
# uid): watched metadata-only, so no ConfigMap data or claim body is ever sent or kept. A ConfigMap's data
# is read (one GET) only when the ConfigMap changed since the operator last wrote or read it, to find data
# someone else changed (drift, see reconcile/drift.py). The other kinds are small and watched whole, so
# reconcile can compare them with what it builds.
METADATA_ONLY_KINDS = frozenset({"ConfigMap", "PersistentVolumeClaim"})
# Metadata-only kinds whose body reconcile compares: read once per change.
READ_ON_CHANGE_KINDS = frozenset({"ConfigMap"})


class StatusConflict(Exception):
    """The job changed between reading it and patching its status; decide again from the new state."""


class Controller:
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
        self.phases: dict[Key, str | None] = {}
        self.metrics = metrics or OperatorMetrics(lambda: self.phases)
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
        self._written_rv: dict[Key, str] = {}
        # What the API server refused in each job's last executed plan. The next reconcile reads it:
        # a refused child does not exist, so only the refusal says why it is missing. Lost on restart
        # and rebuilt by the next attempt to create the child.
        self._refusals: dict[Key, tuple[Refusal, ...]] = {}
        # Names whose create the API server refused with 409 (taken) in each job's last executed plan. The
        # caches hold only what the operator manages, so the next reconcile reads these names (a same-name
        # object someone else made is found only this way) before deciding again.
        self._taken: dict[Key, set[tuple[str, str]]] = {}
        # Per job: the resourceVersion each ConfigMap of it had when the operator last wrote or read it whole.
        # A ConfigMap whose cached metadata shows another is read again (READ_ON_CHANGE_KINDS).
        self._verified: dict[Key, dict[tuple[str, str], str]] = {}
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

    # --- wiring from the informers ----------------------------------------------------------------------------------

    def job_event(
        self, event_type: str | None, namespace: str, name: str, resource_version: str | None
    ) -> None:
        key = (namespace, name)
        if event_type == "DELETED":
            self.phases.pop(key, None)
            self._written_rv.pop(key, None)
            self._refusals.pop(key, None)
            self._taken.pop(key, None)
            self._verified.pop(key, None)
            self.queue.discard(key)
            return
        self.phases.setdefault(key, None)
        if resource_version is not None and self._written_rv.get(key) == resource_version:
            return  # the echo of our own status patch: nothing new to decide
        self.queue.add(key)
        self.metrics.queue_depth.set(len(self.queue))

    def child_event(self, namespace: str, job: str, kind: str) -> None:
        if kind in BATCHED_KINDS:
            # The steps of one pod's start, and the gang's pods, arrive within moments of each other.
            self.queue.add_batched((namespace, job), self.settings.child_event_batch_seconds)
        else:
            # Rare and each worth acting on at once: a claim bound (the gang waits for it), a child deleted.
            self.queue.add((namespace, job))
        self.metrics.queue_depth.set(len(self.queue))

    # --- lifecycle ---------------------------------------------------------------------------------------------

    def start(self, watch: bool = True) -> None:
        if watch:
            namespaces: list[str | None] = (
                list(self.settings.namespaces) if not self.settings.clusterwide else [None]
            )
            self.cache = ClusterCache(
                self.kube.watch_client(len(namespaces) * (len(CHILD_RESOURCES) + 1) + 1),
                namespaces,
                job_resource=GRPOJOB,
                child_resources=CHILD_RESOURCES,
                node_resource=NODE,
                job_label=LABEL_JOB,
                on_job=self.job_event,
                on_child=self.child_event,
                timeout=self.settings.api_timeout_seconds,
                child_selector=CHILD_SELECTOR,
                keep_child=managed_child,
                metadata_only=METADATA_ONLY_KINDS,
                child_view=child_view,
                storage_class_resource=STORAGE_CLASS,
            )
            self.cache.informers.start()
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

    # --- resync ------------------------------------------------------------------------------------------------

    async def _resync_loop(self) -> None:
        while True:
            try:
                await self.resync()
                self.health.ready = True
            except ApiException as exc:
                self._api_error("list", KIND, exc)
                if exc.status == 404:
                    log.warning(
                        "the GRPOJob CRD is not installed: kubectl apply -f crds/ (or install the Helm chart)"
                    )
                elif exc.status == 403:
                    log.warning(
                        "not allowed to list GRPOJobs (HTTP 403): check the operator's RBAC (Helm chart)"
                    )
                else:
                    log.warning("listing GRPOJobs failed (HTTP %s): %s", exc.status, exc.reason)
            except Exception:  # keep resyncing whatever happens; the next round may succeed
                log.exception("listing GRPOJobs failed")
            await asyncio.sleep(self.settings.resync_seconds)

    async def resync(self) -> None:
        namespaces: list[str | None] = (
            list(self.settings.namespaces) if not self.settings.clusterwide else [None]
        )
        seen: set[Key] = set()
        cached = self.cache.job_keys() if self.cache is not None else None
        if cached is not None:
            # Watched: the cache is the cluster's state; re-queueing re-runs time-based decisions
            # (deadlines, stalls) and reads nothing from the API server.
            for key in cached:
                seen.add(key)
                self.phases.setdefault(key, None)
                self.queue.add(key)
            namespaces = []
        for namespace in namespaces:
            for job in await self._call(self.kube.list, GRPOJOB, namespace):
                meta = job.get("metadata") or {}
                key = (str(meta.get("namespace")), str(meta.get("name")))
                seen.add(key)
                self.phases.setdefault(key, (job.get("status") or {}).get("phase"))
                self.queue.add(key)
        for key in set(self.phases) - seen:
            self.phases.pop(key, None)
            self._refusals.pop(key, None)
            self._taken.pop(key, None)
            self._verified.pop(key, None)
        self.metrics.queue_depth.set(len(self.queue))

    # --- workers -----------------------------------------------------------------------------------------------

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
                    self.phases.pop(key, None)
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
            self._verified.setdefault(key, {}).update(verified)
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
        self.phases[key] = plan.phase
        if plan.requeue_after is not None:
            self.queue.add_after(key, plan.requeue_after)
        return plan

    async def _get_job(self, namespace: str, name: str) -> Obj:
        if self.cache is not None:
            usable, job = self.cache.job(namespace, name)
            if usable:
                if job is None:
                    raise ApiException(status=404, reason="Not Found (not in the watch cache)")
                # reconcile must not see the cache change under it, nor change the cache
                return copy.deepcopy(job)
        return await self._call(self.kube.get, GRPOJOB, namespace, name)

    async def observe(self, job: Obj) -> tuple[Observed, dict[tuple[str, str], str]]:
        """The job's children, and the resourceVersions of the metadata-only ones this call read whole."""
        meta = job["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta.get("uid")
        selector = f"{LABEL_JOB}={name}"
        resources = CHILD_RESOURCES
        lists: list[list[Obj]] = []
        partial: set[tuple[str, str]] = set()
        verified: dict[tuple[str, str], str] = {}
        if self.cache is not None:
            cached, missing = self.cache.children_of(namespace, name)
            # the cache replaces objects, never changes them in place
            cached, partial, verified = await self._read_changed(namespace, name, cached)
            lists.append(cached)
            resources = tuple(r for r in CHILD_RESOURCES if r.kind in missing)
        lists += await asyncio.gather(
            *(self._call(self.kube.list, resource, namespace, selector) for resource in resources)
        )
        objects: list[Obj] = []
        for items in lists:
            for obj in items:
                if obj["kind"] == "Pod" and not _pod_of_this_job(obj, uid, meta.get("creationTimestamp")):
                    continue  # a pod of an earlier job with the same name, on its way out
                objects.append(obj)
        objects += await self._kueue_workloads(namespace, objects)
        classes = self.cache.storage_class_modes() if self.cache is not None else None
        observed = Observed(
            objects=tuple(objects),
            nodes=await self._node_names(),
            refusals=self._refusals.get((namespace, name), ()),
            storage_classes=StorageClasses(*classes) if classes is not None else None,
            metadata_only=frozenset(partial),
        )
        return observed, verified

    async def _read_changed(
        self, namespace: str, job: str, cached: list[Obj]
    ) -> tuple[list[Obj], set[tuple[str, str]], dict[tuple[str, str], str]]:
        """The cached children with each metadata-only one of READ_ON_CHANGE_KINDS that changed since the
        operator last wrote or read it replaced by the whole object (one GET); the (kind, name) of those
        still known by their metadata only; the resourceVersions read."""
        known = self._verified.get((namespace, job), {})
        out: list[Obj] = []
        partial: set[tuple[str, str]] = set()
        verified: dict[tuple[str, str], str] = {}
        for obj in cached:
            kind, meta = str(obj.get("kind")), obj.get("metadata") or {}
            ref = (kind, str(meta.get("name")))
            if kind not in METADATA_ONLY_KINDS:
                out.append(obj)
                continue
            rv = str(meta.get("resourceVersion"))
            if kind not in READ_ON_CHANGE_KINDS or known.get(ref) == rv:
                out.append(obj)
                partial.add(ref)
                continue
            try:
                whole = await self._call(self.kube.get, resource_for(kind), namespace, ref[1])
            except ApiException as exc:
                if exc.status != 404:
                    raise
                continue  # gone since the cache saw it: the watch tells the cache next
            whole["kind"], whole["apiVersion"] = kind, obj.get("apiVersion")
            verified[ref] = str((whole.get("metadata") or {}).get("resourceVersion"))
            out.append(whole)
        return out, partial, verified

    async def _probe(self, job: Obj, observed: Observed, plan: Plan) -> list[Obj]:
        """Reads every object the plan would create that the caches do not show and whose name a create
        found taken before. The caches hold only what the operator manages, so a same-name object someone
        else made is found only this way. Names never refused are not read: a create is a POST, which fails
        with 409 rather than touch an existing object, and execute() creates no pod while any of the job's
        other children was refused as taken, so a same-name object is never used before it is found."""
        meta = job["metadata"]
        namespace = meta["namespace"]
        taken = self._taken.get((namespace, meta["name"])) or set()
        if not taken and not plan.verify:
            return []
        seen = {(o.get("kind"), (o.get("metadata") or {}).get("name")) for o in observed.objects}
        wanted = [
            (m["kind"], m["metadata"]["name"])
            for m in (*plan.applies, *plan.creates)
            if not (m.get("metadata") or {}).get("uid")
        ]
        wanted = [key for key in dict.fromkeys(wanted) if key not in seen and key in taken]
        # Names reconcile took for gone and asked to be read (pods that left the watch with their labels).
        wanted += [key for key in dict.fromkeys(plan.verify) if key not in seen and key not in wanted]

        async def read(kind: str, name: str) -> Obj | None:
            # A list by name needs only the list permission the operator has for every child kind anyway.
            items = await self._call(
                self.kube.list, resource_for(kind), namespace, field_selector=f"metadata.name={name}"
            )
            return items[0] if items else None

        found = await asyncio.gather(*(read(kind, name) for kind, name in wanted))
        return [obj for obj in found if obj is not None]

    async def _kueue_workloads(self, namespace: str, objects: list[Obj]) -> list[Obj]:
        """Kueue's Workload of each pod group whose pods wait for admission (one GET each, only while they
        wait), so the job's status can say why Kueue has not admitted it. Kueue names the Workload of a
        pod group after the group."""
        if self._workloads_forbidden:
            return []
        groups = sorted(
            {
                str(obj["metadata"]["labels"][KUEUE_GROUP_LABEL])
                for obj in objects
                if obj.get("kind") == "Pod"
                and (obj.get("spec") or {}).get("schedulingGates")
                and KUEUE_GROUP_LABEL in ((obj.get("metadata") or {}).get("labels") or {})
            }
        )
        found: list[Obj] = []
        for group in groups:
            try:
                workload = await self._call(self.kube.get, KUEUE_WORKLOAD, namespace, group)
            except ApiException as exc:
                if exc.status == 403:
                    log.warning(
                        "no permission to get Kueue Workloads (HTTP 403): queued jobs show Kueue's scheduling "
                        "gate but not Kueue's reason; grant get on workloads.kueue.x-k8s.io (Helm: kueue.enabled)"
                    )
                    self._workloads_forbidden = True
                    return []
                if exc.status == 404:
                    continue  # Kueue has not created it yet (or Kueue is not installed)
                raise
            workload["kind"] = "Workload"
            found.append(workload)
        return found

    async def _node_names(self) -> frozenset[str] | None:
        watched = self.cache.node_names() if self.cache is not None else None
        if watched is not None:
            return watched
        if self._nodes_forbidden:
            return None
        fetched, names = self._nodes
        if time.monotonic() - fetched < NODE_CACHE_SECONDS:
            return names
        try:
            nodes = await self._call(self.kube.list, NODE, None)
        except ApiException as exc:
            if exc.status == 403:
                log.warning(
                    "no permission to list nodes: pods on deleted nodes are detected by their pod status only"
                )
                self._nodes_forbidden = True
                return None
            raise
        names = frozenset(str((n.get("metadata") or {}).get("name")) for n in nodes)
        self._nodes = (time.monotonic(), names)
        return names

    # --- carrying out a plan -----------------------------------------------------------------------------------

    async def execute(self, job: Obj, plan: Plan) -> None:
        meta = job["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        key = (namespace, name)
        failures: list[Refusal] = []
        taken: list[tuple[str, str]] = []
        # The job's infrastructure (ConfigMap, volume, RBAC, Services, metric Deployment) does not depend on
        # the status: with nothing to patch or delete first, it is written while the record and status are,
        # which saves a new job two round trips before its first child. Pods always wait for the status.
        early = bool(plan.applies) and not plan.patches and not plan.deletes
        if early:
            outcomes = await asyncio.gather(
                self._write_status(job, plan),
                self._write_all(plan.applies, failures, taken),
                return_exceptions=True,
            )
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    raise outcome
        else:
            await self._write_status(job, plan)
        for child_patch in plan.patches:
            ref = child_patch.ref
            patch = child_patch.patch
            if ref.uid:
                # A uid in a patch is a precondition: it never reaches a newer object of the same name.
                patch = {**patch, "metadata": {**patch.get("metadata", {}), "uid": ref.uid}}
            try:
                await self._call(self.kube.merge_patch, resource_for(ref.kind), namespace, ref.name, patch)
            except ApiException as exc:
                if exc.status not in (404, 409):
                    self._api_error("patch", ref.kind, exc)
                    raise
        for ref in plan.deletes:
            try:
                await self._call(self.kube.delete, resource_for(ref.kind), namespace, ref.name, uid=ref.uid)
                log.info("%s/%s: deleted %s %s", namespace, name, ref.kind, ref.name)
            except ApiException as exc:
                if exc.status == 409:
                    # The uid precondition failed: the name belongs to a newer object now, which stays.
                    log.info(
                        "%s/%s: %s %s was replaced meanwhile; not deleted",
                        namespace,
                        name,
                        ref.kind,
                        ref.name,
                    )
                elif exc.status != 404:
                    self._api_error("delete", ref.kind, exc)
                    raise
        # Children within one group do not depend on each other: send them concurrently. The groups
        # stay in order, so pods are created only after their ConfigMap, PVC and ServiceAccount exist.
        if not early:
            await self._write_all(plan.applies, failures, taken)
        if taken:
            # A name the job's children need belongs to an object the operator did not create (or its own
            # object changed since the decision): no pod may start next to it, and the plan's events would
            # describe children that do not exist. The next reconcile reads the names and decides again.
            log.info(
                "%s/%s: %s taken; no pods created until the names are read", namespace, name, _names(taken)
            )
        else:
            await asyncio.gather(*(self._write("create", m, failures, taken) for m in plan.creates))
            await self.emit_events(job, [(e.type, e.reason, e.message) for e in plan.events])
        self._refusals[key] = tuple(failures)
        if taken:
            self._taken[key] = set(taken)
        else:
            self._taken.pop(key, None)
        # Quota, admission webhooks and policy engines refuse children with 4xx: tell the user why.
        await self.emit_events(
            job,
            [
                ("Warning", "ChildRejected", f"the API server refused {f.kind} {f.name}: {f.message}")
                for f in failures
            ],
        )
        if plan.restart is not None:
            self.metrics.restarts.labels(
                namespace=namespace,
                grpojob=name,
                reason=plan.restart.reason,
                counted=str(plan.restart.counted).lower(),
            ).inc()
        if plan.delete_job:
            try:
                await self._call(self.kube.delete, GRPOJOB, namespace, name, uid=meta.get("uid"))
                log.info("%s/%s: deleted after ttlSecondsAfterFinished", namespace, name)
            except ApiException as exc:
                if exc.status == 409:
                    log.info("%s/%s: a newer job of this name exists; not deleted", namespace, name)
                elif exc.status != 404:
                    self._api_error("delete", KIND, exc)
                    raise
        if failures:
            self.queue.add_rate_limited(key, base=5.0)
        elif taken:
            # A create found the name taken, or an update found the object replaced, since the decision:
            # decide again (the next reconcile reads the object and reports a conflict if it is not the job's).
            log.info(
                "%s/%s: %s changed while this reconcile ran; reconciling again",
                namespace,
                name,
                _names(taken),
            )
            self.queue.add_rate_limited(key)

    async def _write_all(
        self, manifests: list[Obj], failures: list[Refusal], taken: list[tuple[str, str]]
    ) -> None:
        await asyncio.gather(*(self._write(_apply_verb(m), m, failures, taken) for m in manifests))

    async def _write_status(self, job: Obj, plan: Plan) -> None:
        """The record annotation, then the status (conditional on the record's resourceVersion)."""
        meta = job["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        key = (namespace, name)
        resource_version = meta.get("resourceVersion")
        if plan.record is not None:
            # The operator's record first, so an operator stopped between the two writes decides from it.
            annotations = {ANNOTATION_RECORD: record_annotation(plan.record)}
            body = {"metadata": {"resourceVersion": resource_version, "annotations": annotations}}
            try:
                written = await self._call_in(
                    self._job_writes, self.kube.merge_patch, GRPOJOB, namespace, name, body
                )
            except ApiException as exc:
                if exc.status == 409:
                    raise StatusConflict from exc
                self._api_error("patch", KIND, exc)
                raise
            resource_version = (written.get("metadata") or {}).get("resourceVersion")
            if not plan.status:
                self._written_rv[key] = str(resource_version)
                if self.cache is not None:
                    self.cache.put_job(written)
        if plan.status:
            body = {"metadata": {"resourceVersion": resource_version}, "status": plan.status}
            try:
                updated = await self._call_in(
                    self._job_writes, self.kube.merge_patch, GRPOJOB, namespace, name, body, "status"
                )
            except ApiException as exc:
                if exc.status == 409:
                    raise StatusConflict from exc
                self._api_error("patch", "GRPOJob/status", exc)
                raise
            self._written_rv[key] = str((updated.get("metadata") or {}).get("resourceVersion"))
            if self.cache is not None:
                # Decide the next reconcile from at least what we just wrote, never from an older copy.
                self.cache.put_job(updated)
            if plan.status.get("phase"):
                log.info(
                    "%s/%s: phase %s (%s) %s",
                    namespace,
                    name,
                    plan.status["phase"],
                    plan.status.get("reason") or "",
                    plan.status.get("message") or "",
                )

    async def _write(
        self, verb: str, manifest: Obj, failures: list[Refusal], taken: list[tuple[str, str]]
    ) -> None:
        """Create one child (POST: never touches an existing object) or update one the job owns (server-side
        apply naming its uid). 409 means the name is taken or the object was replaced since the decision.
        Other 4xx (quota, admission policies) are collected for a ChildRejected event."""
        meta = manifest["metadata"]
        fn = {
            "apply": self.kube.apply,
            "create": self.kube.create,
            "create-for-apply": self.kube.create_for_apply,
        }[verb]
        try:
            written = await self._call(fn, manifest)
        except ApiException as exc:
            if exc.status == 409:
                taken.append((manifest["kind"], meta["name"]))
                return
            self._api_error("apply" if verb == "apply" else "create", manifest["kind"], exc)
            if exc.status is None or exc.status >= 500 or exc.status == 429:
                raise
            failures.append(Refusal(manifest["kind"], meta["name"], exc.status, _api_message(exc)))
            return
        if self.cache is not None:
            # The next reconcile must see what this one wrote, not decide from a cache the watch has not
            # caught up with yet (it would create the child again, get 409 and back off).
            written.setdefault("kind", manifest["kind"])
            written.setdefault("apiVersion", manifest["apiVersion"])
            if manifest["kind"] in READ_ON_CHANGE_KINDS:
                # What the operator just wrote is what it builds: no need to read it back.
                job_key = (str(meta["namespace"]), str((meta.get("labels") or {}).get(LABEL_JOB)))
                rv = str((written.get("metadata") or {}).get("resourceVersion"))
                self._verified.setdefault(job_key, {})[(manifest["kind"], meta["name"])] = rv
            self.cache.put_child(written)
        if verb != "apply":
            job = (meta.get("labels") or {}).get(LABEL_JOB, "?")
            log.info("%s/%s: created %s %s", meta["namespace"], job, manifest["kind"], meta["name"])

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


def _names(refs: list[tuple[str, str]]) -> str:
    return ", ".join(f"{kind} {name}" for kind, name in refs)


def managed_child(obj: Obj) -> bool:
    """Whether a watched child is one the operator manages: controlled by a GRPOJob, a retained checkpoint
    claim carrying the operator's job-uid mark, or a metric pod of a ReplicaSet (of a job's Deployment).
    Anything else that merely carries the labels is not kept (reconcile finds same-name objects by name)."""
    meta = obj.get("metadata") or {}
    refs = [r for r in meta.get("ownerReferences") or [] if isinstance(r, dict) and r.get("controller")]
    if any(r.get("kind") == KIND for r in refs):
        return True
    if obj.get("kind") == "PersistentVolumeClaim":
        return not refs and ANNOTATION_JOB_UID in (meta.get("annotations") or {})
    if obj.get("kind") == "Pod":
        role = (meta.get("labels") or {}).get(LABEL_ROLE)
        return role in DEPLOYMENT_ROLES and any(r.get("kind") == "ReplicaSet" for r in refs)
    return False


def child_view(obj: Obj) -> object:
    """What reconcile reads of a child; a change anywhere else does not wake its job. Pods: everything but
    the resourceVersion (phase, conditions, container states, node, Kueue's gates and marks). Every kind:
    uid, labels, owner references, deletion, the operator's own annotations and a claim's bind-completed
    mark. Deployments also: spec, available replicas and the ReplicaFailure condition. Left out, for
    example: the PV controller's and provisioner's other marks on a claim, a Deployment's other counters
    and its Progressing condition."""
    meta = obj.get("metadata") or {}
    if obj.get("kind") == "Pod":
        return (
            {k: v for k, v in meta.items() if k not in ("resourceVersion", "managedFields")},
            obj.get("spec"),
            obj.get("status"),
        )
    if obj.get("kind") in READ_ON_CHANGE_KINDS:
        # Its data is not cached: any change (a new resourceVersion) may be one to its data.
        return meta.get("resourceVersion")
    annotations = meta.get("annotations") or {}
    kept = {
        k: v for k, v in annotations.items() if k.startswith(f"{GROUP}/") or k == ANNOTATION_BIND_COMPLETED
    }
    view: dict[str, Any] = {
        "uid": meta.get("uid"),
        "labels": meta.get("labels"),
        "ownerReferences": meta.get("ownerReferences"),
        "deletionTimestamp": meta.get("deletionTimestamp"),
        "finalizers": meta.get("finalizers"),
        "annotations": kept,
    }
    # The body, which reconcile compares with what it builds (drift): spec, rules, subjects, roleRef.
    view.update({k: v for k, v in obj.items() if k not in ("metadata", "status")})
    if obj.get("kind") == "Deployment":
        status = obj.get("status") or {}
        view["availableReplicas"] = status.get("availableReplicas")
        view["replicaFailure"] = [
            (c.get("status"), c.get("reason"), c.get("message"))
            for c in status.get("conditions") or []
            if isinstance(c, dict) and c.get("type") == "ReplicaFailure"
        ]
    return view


def _apply_verb(manifest: Obj) -> str:
    """Update (server-side apply) a child the job owns, whose observed uid the manifest carries; create the rest."""
    return "apply" if (manifest.get("metadata") or {}).get("uid") else "create-for-apply"


def _pod_of_this_job(pod: Obj, uid: str | None, job_created: str | None) -> bool:
    """Gang pods are owned by the job itself. Metric pods are owned by a ReplicaSet of the job's
    Deployment, so for them "created no earlier than the job" tells them from an earlier namesake's."""
    if _owned_by(pod, uid):
        return True
    meta = pod.get("metadata") or {}
    if (meta.get("labels") or {}).get(LABEL_ROLE) not in DEPLOYMENT_ROLES:
        return False
    created = meta.get("creationTimestamp")
    # RFC 3339 UTC timestamps with second precision compare correctly as strings.
    return bool(created and job_created and str(created) >= str(job_created))


def _owned_by(obj: Obj, uid: str | None) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return uid is None or any(ref.get("uid") == uid for ref in refs)


def _api_message(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "{}")
        return str(body.get("message") or exc.reason)
    except ValueError:
        return str(exc.reason)
