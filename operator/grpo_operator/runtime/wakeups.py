"""What the controller watches, and how a change wakes a job: the informers' wiring (from the child kinds'
records, builders/child_kinds.py), the GRPOJob and child events that queue a job, and the periodic resync.

Events only put the job's key into the work queue; the Controller's workers (runtime/controller.py) take it
from there. A resync re-queues every job periodically, because deadlines are time-based and a missed watch
event must not leave a job unattended. Wakeups adds a job's record to the operator's memory of jobs
(job_memory.py) when it first sees the job and drops it when the job is gone.

The watch caches the informers fill are kept in a ``WatchCaches`` the Controller makes and hands to the
parts that read or update them (Wakeups, Observer in observe.py, PlanExecutor in apply_plan.py).
"""

from __future__ import annotations

import asyncio
import logging

from kubernetes.client.exceptions import ApiException

from grpo_operator.api.resource import KIND
from grpo_operator.builders.child_kinds import Cache, Wake, child_view, kinds_where
from grpo_operator.builders.common import DEPLOYMENT_ROLES, LABEL_JOB, LABEL_MANAGED_BY, LABEL_ROLE, PART_OF
from grpo_operator.builders.storage import ANNOTATION_JOB_UID
from grpo_operator.observability import HealthState, OperatorMetrics
from grpo_operator.runtime.api_calls import ApiCalls
from grpo_operator.runtime.informer import ClusterCache
from grpo_operator.runtime.job_memory import JobMemories, Key
from grpo_operator.runtime.kube_client import CHILD_RESOURCES, GRPOJOB, NODE, STORAGE_CLASS, Obj
from grpo_operator.runtime.workqueue import WorkQueue
from grpo_operator.settings import OperatorSettings

log = logging.getLogger("grpo_operator")

# Children whose changes come in bursts wake the job batched (settings.child_event_batch_seconds).
BATCHED_KINDS = kinds_where(lambda k: k.wake is Wake.BATCHED)

# What the child caches hold (memory under tenant load): the API server sends only objects carrying the
# labels the operator sets, and of those the caches keep only what the operator manages (managed_child).
CHILD_SELECTOR = f"{LABEL_MANAGED_BY}={PART_OF},{LABEL_JOB}"
# Kinds reconcile reads only the metadata of: watched metadata-only, so no ConfigMap data or claim body is
# ever sent or kept. The other kinds are small and watched whole, so reconcile can compare them with what
# it builds.
METADATA_ONLY_KINDS = kinds_where(lambda k: k.cache in (Cache.METADATA, Cache.METADATA_READ_ON_CHANGE))
# Metadata-only kinds whose body reconcile compares: read once per change (runtime/observe.py).
READ_ON_CHANGE_KINDS = kinds_where(lambda k: k.cache is Cache.METADATA_READ_ON_CHANGE)


class WatchCaches:
    """The watch-backed caches, once started: ``cluster`` is None until the Controller starts watching (or
    forever, for a controller that does not watch), and until a kind's cache is complete, and for kinds the
    operator may not watch, the parts read from the API server instead."""

    def __init__(self) -> None:
        self.cluster: ClusterCache | None = None


class Wakeups:
    """Queues jobs: on their own and their children's watch events, and all of them on every resync."""

    def __init__(
        self,
        settings: OperatorSettings,
        api: ApiCalls,
        jobs: JobMemories,
        queue: WorkQueue[Key],
        caches: WatchCaches,
        metrics: OperatorMetrics,
        health: HealthState,
    ) -> None:
        self._settings = settings
        self._api = api
        self._jobs = jobs
        self._queue = queue
        self._caches = caches
        self._metrics = metrics
        self._health = health

    def job_event(
        self, event_type: str | None, namespace: str, name: str, resource_version: str | None
    ) -> None:
        key = (namespace, name)
        if event_type == "DELETED":
            self._jobs.forget(key)
            self._queue.discard(key)
            return
        if resource_version is not None and self._jobs.is_own_write(key, resource_version):
            return  # the echo of our own status patch: nothing new to decide
        self._queue.add(key)
        self._metrics.queue_depth.set(len(self._queue))

    def child_event(self, namespace: str, job: str, kind: str) -> None:
        if kind in BATCHED_KINDS:
            # The steps of one pod's start, and the gang's pods, arrive within moments of each other.
            self._queue.add_batched((namespace, job), self._settings.child_event_batch_seconds)
        else:
            # Rare and each worth acting on at once: a claim bound (the gang waits for it), a child deleted.
            self._queue.add((namespace, job))
        self._metrics.queue_depth.set(len(self._queue))

    def watch(self) -> ClusterCache:
        """Starts the informers (GRPOJobs, every child kind, nodes and StorageClasses), whose events call
        ``job_event`` and ``child_event``; returns their caches."""
        namespaces: list[str | None] = (
            list(self._settings.namespaces) if not self._settings.clusterwide else [None]
        )
        cache = ClusterCache(
            self._api.kube.watch_client(len(namespaces) * (len(CHILD_RESOURCES) + 1) + 1),
            namespaces,
            job_resource=GRPOJOB,
            child_resources=CHILD_RESOURCES,
            node_resource=NODE,
            job_label=LABEL_JOB,
            on_job=self.job_event,
            on_child=self.child_event,
            timeout=self._settings.api_timeout_seconds,
            child_selector=CHILD_SELECTOR,
            keep_child=managed_child,
            metadata_only=METADATA_ONLY_KINDS,
            child_view=child_view,
            storage_class_resource=STORAGE_CLASS,
        )
        cache.informers.start()
        return cache

    async def resync_loop(self) -> None:
        while True:
            try:
                await self.resync()
                self._health.ready = True
            except ApiException as exc:
                self._api.error("list", KIND, exc)
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
            await asyncio.sleep(self._settings.resync_seconds)

    async def resync(self) -> None:
        namespaces: list[str | None] = (
            list(self._settings.namespaces) if not self._settings.clusterwide else [None]
        )
        seen: set[Key] = set()
        cache = self._caches.cluster
        cached = cache.job_keys() if cache is not None else None
        if cached is not None:
            # Watched: the cache is the cluster's state; re-queueing re-runs time-based decisions
            # (deadlines, stalls) and reads nothing from the API server.
            for key in cached:
                seen.add(key)
                self._jobs.know(key)
                self._queue.add(key)
            namespaces = []
        for namespace in namespaces:
            for job in await self._api.call(self._api.kube.list, GRPOJOB, namespace):
                meta = job.get("metadata") or {}
                key = (str(meta.get("namespace")), str(meta.get("name")))
                seen.add(key)
                self._jobs.know(key, (job.get("status") or {}).get("phase"))
                self._queue.add(key)
        for key in self._jobs.keys() - seen:
            self._jobs.forget(key)
        self._metrics.queue_depth.set(len(self._queue))


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
