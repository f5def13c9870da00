"""Carrying out a plan: the job's record and status, child patches, deletes, applies and pod creates, in
the order a job's pods need, and what the API server refused (for the next reconcile and the user).

The Controller's reconcile pass (runtime/controller.py) hands each plan to ``PlanExecutor.execute``. What it
writes goes through the API (api_calls.py) and into the watch caches (wakeups.py), so the next reconcile
sees it; the plan's Events and the refusals go to the EventRecorder (events.py); what the next reconcile
needs to know (the job's own resourceVersion, refusals, taken names, children written whole) goes into the
job's record (job_memory.py); a job to decide again soon goes back into the work queue.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
from collections.abc import Callable
from secrets import token_urlsafe

from kubernetes.client.exceptions import ApiException

from grpo_operator.api.resource import KIND
from grpo_operator.builders.common import LABEL_JOB
from grpo_operator.observability import OperatorMetrics
from grpo_operator.reconcile import Plan, Refusal
from grpo_operator.reconcile.plan import SecretCreate
from grpo_operator.reconcile.record import ANNOTATION_RECORD, read_record, record_annotation
from grpo_operator.runtime.api_calls import ApiCalls
from grpo_operator.runtime.events import EventRecorder
from grpo_operator.runtime.job_memory import JobMemories, Key
from grpo_operator.runtime.kube_client import GRPOJOB, Obj, resource_for
from grpo_operator.runtime.wakeups import READ_ON_CHANGE_KINDS, WatchCaches
from grpo_operator.runtime.workqueue import WorkQueue

log = logging.getLogger("grpo_operator")

# Waits before trying a RoleBinding the API server answered 404 again (PlanExecutor._write_tolerating_role_cache):
# 1.7 s in all, well past the few milliseconds its cache of Roles lags behind a create.
ROLE_CACHE_RETRY_SECONDS = (0.2, 0.5, 1.0)


class StatusConflict(Exception):
    """The job changed between reading it and patching its status; decide again from the new state."""


class PlanExecutor:
    """Carries out a plan and remembers what the API server refused, for the next reconcile."""

    def __init__(
        self,
        api: ApiCalls,
        jobs: JobMemories,
        queue: WorkQueue[Key],
        caches: WatchCaches,
        events: EventRecorder,
        metrics: OperatorMetrics,
    ) -> None:
        self._api = api
        self._kube = api.kube
        self._jobs = jobs
        self._queue = queue
        self._caches = caches
        self._events = events
        self._metrics = metrics

    async def execute(self, job: Obj, plan: Plan) -> None:
        meta = job["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        key = (namespace, name)
        failures: list[Refusal] = []
        taken: list[tuple[str, str]] = []
        # The job's infrastructure (ConfigMap, volume, RBAC, Services, metric Deployment) does not depend on
        # the status: with nothing to patch or delete first, it is written while the record and status are,
        # which saves a new job two round trips before its first child. Pods always wait for the status.
        # The job's generated Secrets first: the names the API server gives them go into the record and
        # status of this same pass. Nothing in this plan reads them (reconcile builds the gateway and the
        # pods only from a recorded name), so nothing waits for them.
        recorded = await self._create_secrets(key, plan.secrets, failures)
        early = bool(plan.applies) and not plan.patches and not plan.deletes
        if early:
            outcomes = await asyncio.gather(
                self._write_status(job, plan, recorded),
                self._write_all(plan.applies, failures, taken),
                return_exceptions=True,
            )
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    raise outcome
        else:
            await self._write_status(job, plan, recorded)
        for child_patch in plan.patches:
            ref = child_patch.ref
            patch = child_patch.patch
            if ref.uid:
                # A uid in a patch is a precondition: it never reaches a newer object of the same name.
                patch = {**patch, "metadata": {**patch.get("metadata", {}), "uid": ref.uid}}
            try:
                await self._api.call(
                    self._kube.merge_patch, resource_for(ref.kind), namespace, ref.name, patch
                )
            except ApiException as exc:
                if exc.status not in (404, 409):
                    self._api.error("patch", ref.kind, exc)
                    raise
        for ref in plan.deletes:
            try:
                await self._api.call(
                    self._kube.delete, resource_for(ref.kind), namespace, ref.name, uid=ref.uid
                )
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
                    self._api.error("delete", ref.kind, exc)
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
            await self._events.emit(job, [(e.type, e.reason, e.message) for e in plan.events])
        self._jobs.remember_outcome(key, failures, taken)
        # Quota, admission webhooks and policy engines refuse children with 4xx: tell the user why.
        await self._events.emit(
            job,
            [
                ("Warning", "ChildRejected", f"the API server refused {f.kind} {f.name}: {f.message}")
                for f in failures
            ],
        )
        if plan.restart is not None:
            self._metrics.restarts.labels(
                namespace=namespace,
                grpojob=name,
                reason=plan.restart.reason,
                counted=str(plan.restart.counted).lower(),
            ).inc()
        if plan.delete_job:
            try:
                await self._api.call(self._kube.delete, GRPOJOB, namespace, name, uid=meta.get("uid"))
                log.info("%s/%s: deleted after ttlSecondsAfterFinished", namespace, name)
            except ApiException as exc:
                if exc.status == 409:
                    log.info("%s/%s: a newer job of this name exists; not deleted", namespace, name)
                elif exc.status != 404:
                    self._api.error("delete", KIND, exc)
                    raise
        if recorded:
            # The echo of the operator's own status write wakes nobody, but the names just recorded are what
            # the gateway and the gang wait for: decide again now.
            self._queue.add(key)
        if failures:
            self._queue.add_rate_limited(key, base=5.0)
        elif taken:
            # A create found the name taken, or an update found the object replaced, since the decision:
            # decide again (the next reconcile reads the object and reports a conflict if it is not the job's).
            log.info(
                "%s/%s: %s changed while this reconcile ran; reconciling again",
                namespace,
                name,
                _names(taken),
            )
            self._queue.add_rate_limited(key)

    async def _create_secrets(
        self, key: tuple[str, str], wanted: list[SecretCreate], failures: list[Refusal]
    ) -> dict[str, str]:
        """Creates each Secret with a value generated here and now, under a name the API server picks
        (generateName: never an object someone else made, so nothing is read first); returns {status field:
        name} for the record and status. The value is never logged, kept or sent again. Should the operator
        stop before the status names it, the Secret is left owned by the job (the garbage collector removes
        it with the job) and the next pass creates another."""
        recorded: dict[str, str] = {}
        for item in wanted:
            manifest = copy.deepcopy(item.manifest)
            manifest["stringData"] = {item.key: token_urlsafe(32)}
            kind, prefix = str(manifest["kind"]), str(manifest["metadata"]["generateName"])
            try:
                written = await self._api.call(self._kube.create, manifest)
            except ApiException as exc:
                self._api.error("create", kind, exc)
                # 409: a generated name collided (the API server retries those itself since 1.30): retry.
                if exc.status is None or exc.status >= 500 or exc.status in (409, 429):
                    raise
                failures.append(Refusal(kind, f"{prefix}*", exc.status, _api_message(exc)))
                continue
            name = str((written.get("metadata") or {}).get("name"))
            recorded[item.status_field] = name
            log.info("%s/%s: created %s %s", key[0], key[1], kind, name)
        return recorded

    async def _write_all(
        self, manifests: list[Obj], failures: list[Refusal], taken: list[tuple[str, str]]
    ) -> None:
        await asyncio.gather(*(self._write(_apply_verb(m), m, failures, taken) for m in manifests))

    async def _write_status(self, job: Obj, plan: Plan, recorded: dict[str, str]) -> None:
        """The record annotation, then the status (conditional on the record's resourceVersion), each with
        ``recorded`` (the names of the Secrets this pass created) added."""
        meta = job["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        key = (namespace, name)
        resource_version = meta.get("resourceVersion")
        record, status = plan.record, plan.status
        if recorded:
            record = {**(record if record is not None else read_record(job) or {}), **recorded}
            status = {**(status or {}), **recorded}
        if record is not None:
            # The operator's record first, so an operator stopped between the two writes decides from it.
            annotations = {ANNOTATION_RECORD: record_annotation(record)}
            body = {"metadata": {"resourceVersion": resource_version, "annotations": annotations}}
            try:
                written = await self._api.write_job(self._kube.merge_patch, GRPOJOB, namespace, name, body)
            except ApiException as exc:
                if exc.status == 409:
                    raise StatusConflict from exc
                self._api.error("patch", KIND, exc)
                raise
            resource_version = (written.get("metadata") or {}).get("resourceVersion")
            if not status:
                self._jobs.remember_write(key, str(resource_version))
                if (cache := self._caches.cluster) is not None:
                    cache.put_job(written)
        if status:
            body = {"metadata": {"resourceVersion": resource_version}, "status": status}
            try:
                updated = await self._api.write_job(
                    self._kube.merge_patch, GRPOJOB, namespace, name, body, "status"
                )
            except ApiException as exc:
                if exc.status == 409:
                    raise StatusConflict from exc
                self._api.error("patch", "GRPOJob/status", exc)
                raise
            self._jobs.remember_write(key, str((updated.get("metadata") or {}).get("resourceVersion")))
            if (cache := self._caches.cluster) is not None:
                # Decide the next reconcile from at least what we just wrote, never from an older copy.
                cache.put_job(updated)
            if status.get("phase"):
                log.info(
                    "%s/%s: phase %s (%s) %s",
                    namespace,
                    name,
                    status["phase"],
                    status.get("reason") or "",
                    status.get("message") or "",
                )
            elif status.get("reason"):
                log.info(
                    "%s/%s: reason %s: %s", namespace, name, status["reason"], status.get("message") or ""
                )
            elif plan.changed_conditions:
                log.info("%s/%s: conditions %s", namespace, name, "; ".join(plan.changed_conditions))
            elif status.get("message"):
                log.info("%s/%s: message %s", namespace, name, status["message"])

    async def _write(
        self, verb: str, manifest: Obj, failures: list[Refusal], taken: list[tuple[str, str]]
    ) -> None:
        """Create one child (POST: never touches an existing object) or update one the job owns (server-side
        apply naming its uid). 409 means the name is taken or the object was replaced since the decision.
        Other 4xx (quota, admission policies) are collected for a ChildRejected event."""
        meta = manifest["metadata"]
        fn = {
            "apply": self._kube.apply,
            "create": self._kube.create,
            "create-for-apply": self._kube.create_for_apply,
        }[verb]
        try:
            written = await self._write_tolerating_role_cache(fn, manifest)
        except ApiException as exc:
            if exc.status == 409:
                taken.append((manifest["kind"], meta["name"]))
                return
            self._api.error("apply" if verb == "apply" else "create", manifest["kind"], exc)
            if exc.status is None or exc.status >= 500 or exc.status == 429:
                raise
            failures.append(Refusal(manifest["kind"], meta["name"], exc.status, _api_message(exc)))
            return
        cache = self._caches.cluster
        if cache is not None:
            # The next reconcile must see what this one wrote, not decide from a cache the watch has not
            # caught up with yet (it would create the child again, get 409 and back off).
            written.setdefault("kind", manifest["kind"])
            written.setdefault("apiVersion", manifest["apiVersion"])
            if manifest["kind"] in READ_ON_CHANGE_KINDS:
                # What the operator just wrote is what it builds: no need to read it back.
                job_key = (str(meta["namespace"]), str((meta.get("labels") or {}).get(LABEL_JOB)))
                rv = str((written.get("metadata") or {}).get("resourceVersion"))
                self._jobs.remember_verified(job_key, {(manifest["kind"], meta["name"]): rv})
            cache.put_child(written)
        if verb != "apply":
            job = (meta.get("labels") or {}).get(LABEL_JOB, "?")
            log.info("%s/%s: created %s %s", meta["namespace"], job, manifest["kind"], meta["name"])

    async def _write_tolerating_role_cache(self, fn: Callable[[Obj], Obj], manifest: Obj) -> Obj:
        """One write; a RoleBinding refused with 404 is tried again a few times first.

        Creating a RoleBinding makes the API server check that the creator holds every permission of the
        Role it binds, and it looks the Role up in its own cache. A Role the same plan created a few
        milliseconds earlier may not be there yet: the create answers 404 (seen with the operator running
        as the chart's ServiceAccount). That is not a refusal to report to the user."""
        for delay in ROLE_CACHE_RETRY_SECONDS:
            try:
                return await self._api.call(fn, manifest)
            except ApiException as exc:
                if exc.status != 404 or manifest.get("kind") != "RoleBinding":
                    raise
                await asyncio.sleep(delay)
        return await self._api.call(fn, manifest)


def _names(refs: list[tuple[str, str]]) -> str:
    return ", ".join(f"{kind} {name}" for kind, name in refs)


def _apply_verb(manifest: Obj) -> str:
    """Update (server-side apply) a child the job owns, whose observed uid the manifest carries; create the rest."""
    return "apply" if (manifest.get("metadata") or {}).get("uid") else "create-for-apply"


def _api_message(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "{}")
        return str(body.get("message") or exc.reason)
    except ValueError:
        return str(exc.reason)
