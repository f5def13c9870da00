"""Observing a job: its children from the caches (or the API server where a cache is not usable), the
bodies of metadata-only children that changed, same-name objects a create found taken, Kueue's Workloads
and the node names. What this reads is what reconcile decides from (``Observed``).

The Controller's reconcile pass (runtime/controller.py) calls the Observer: ``get_job``, ``observe`` and,
once reconcile has a plan, ``probe``. Besides the API (api_calls.py) and the watch caches (wakeups.py), it
reads what the operator remembers of the job (job_memory.py): what the API server refused and which names
it found taken in the last plan, and the resourceVersions of the children it last wrote or read whole.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time

from kubernetes.client.exceptions import ApiException

from grpo_operator.builders.common import DEPLOYMENT_ROLES, KUEUE_GROUP_LABEL, LABEL_JOB, LABEL_ROLE
from grpo_operator.reconcile import Observed, Plan
from grpo_operator.reconcile.observed import StorageClasses
from grpo_operator.runtime.api_calls import ApiCalls
from grpo_operator.runtime.job_memory import JobMemories
from grpo_operator.runtime.kube_client import (
    CHILD_RESOURCES,
    GRPOJOB,
    KUEUE_WORKLOAD,
    NODE,
    Obj,
    resource_for,
)
from grpo_operator.runtime.wakeups import METADATA_ONLY_KINDS, READ_ON_CHANGE_KINDS, WatchCaches

log = logging.getLogger("grpo_operator")

# How long a listed set of node names is used when nodes are not watched (no RBAC to watch them).
NODE_CACHE_SECONDS = 15.0


class Observer:
    """Reads what reconcile decides from: the job, its children, Kueue's Workloads and the node names."""

    def __init__(self, api: ApiCalls, jobs: JobMemories, caches: WatchCaches) -> None:
        self._api = api
        self._kube = api.kube
        self._jobs = jobs
        self._caches = caches
        # The node names listed last, when nodes are not watched: (when, names).
        self._nodes: tuple[float, frozenset[str] | None] = (0.0, None)
        self._nodes_forbidden = False
        self._workloads_forbidden = False

    async def get_job(self, namespace: str, name: str) -> Obj:
        """The job, from the cache where it is usable (a copy), else from the API server."""
        cache = self._caches.cluster
        if cache is not None:
            usable, job = cache.job(namespace, name)
            if usable:
                if job is None:
                    raise ApiException(status=404, reason="Not Found (not in the watch cache)")
                # reconcile must not see the cache change under it, nor change the cache
                return copy.deepcopy(job)
        return await self._api.call(self._kube.get, GRPOJOB, namespace, name)

    async def observe(self, job: Obj) -> tuple[Observed, dict[tuple[str, str], str]]:
        """The job's children, and the resourceVersions of the metadata-only ones this call read whole."""
        meta = job["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta.get("uid")
        selector = f"{LABEL_JOB}={name}"
        resources = CHILD_RESOURCES
        lists: list[list[Obj]] = []
        partial: set[tuple[str, str]] = set()
        verified: dict[tuple[str, str], str] = {}
        cache = self._caches.cluster
        if cache is not None:
            cached, missing = cache.children_of(namespace, name)
            # the cache replaces objects, never changes them in place
            cached, partial, verified = await self._read_changed(namespace, name, cached)
            lists.append(cached)
            resources = tuple(r for r in CHILD_RESOURCES if r.kind in missing)
        lists += await asyncio.gather(
            *(self._api.call(self._kube.list, resource, namespace, selector) for resource in resources)
        )
        objects: list[Obj] = []
        for items in lists:
            for obj in items:
                if obj["kind"] == "Pod" and not _pod_of_this_job(obj, uid, meta.get("creationTimestamp")):
                    continue  # a pod of an earlier job with the same name, on its way out
                objects.append(obj)
        objects += await self._kueue_workloads(namespace, objects)
        classes = cache.storage_class_modes() if cache is not None else None
        observed = Observed(
            objects=tuple(objects),
            nodes=await self._node_names(),
            refusals=self._jobs.refusals((namespace, name)),
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
        known = self._jobs.verified((namespace, job))
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
                whole = await self._api.call(self._kube.get, resource_for(kind), namespace, ref[1])
            except ApiException as exc:
                if exc.status != 404:
                    raise
                continue  # gone since the cache saw it: the watch tells the cache next
            whole["kind"], whole["apiVersion"] = kind, obj.get("apiVersion")
            verified[ref] = str((whole.get("metadata") or {}).get("resourceVersion"))
            out.append(whole)
        return out, partial, verified

    async def probe(self, job: Obj, observed: Observed, plan: Plan) -> list[Obj]:
        """Reads every object the plan would create that the caches do not show and whose name a create
        found taken before. The caches hold only what the operator manages, so a same-name object someone
        else made is found only this way. Names never refused are not read: a create is a POST, which fails
        with 409 rather than touch an existing object, and PlanExecutor.execute creates no pod while any of
        the job's other children was refused as taken, so a same-name object is never used before it is
        found."""
        meta = job["metadata"]
        namespace = meta["namespace"]
        taken = self._jobs.taken((namespace, meta["name"]))
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
            items = await self._api.call(
                self._kube.list, resource_for(kind), namespace, field_selector=f"metadata.name={name}"
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
                workload = await self._api.call(self._kube.get, KUEUE_WORKLOAD, namespace, group)
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
        cache = self._caches.cluster
        watched = cache.node_names() if cache is not None else None
        if watched is not None:
            return watched
        if self._nodes_forbidden:
            return None
        fetched, names = self._nodes
        if time.monotonic() - fetched < NODE_CACHE_SECONDS:
            return names
        try:
            nodes = await self._api.call(self._kube.list, NODE, None)
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
