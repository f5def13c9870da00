"""Upkeep of the job's children: create what is missing, update what drifted, report same-name objects
that are not the job's, and delete pods and the metric service."""

from __future__ import annotations

import copy
from typing import Any

from grpo_operator.builders import Job, Manifest
from grpo_operator.builders.common import (
    ANNOTATION_HASH,
    KUEUE_GROUP_LABEL,
    KUEUE_RETRIABLE_ANNOTATION,
    generation_pod_name,
    metric_name,
    rollouts_name,
    trainer_pod_name,
)
from grpo_operator.reconcile import ownership
from grpo_operator.reconcile.conditions import CONFLICT, get_condition, truncate
from grpo_operator.reconcile.observed import Observed
from grpo_operator.reconcile.plan import ChildPatch, ChildRef
from grpo_operator.reconcile.step import Step


def ensure(step: Step, observed: Observed, desired: list[Manifest]) -> None:
    """Create every desired child that is missing; update the job's own children that differ from the spec
    (by their spec-hash), naming the uid they were observed with. A same-name object that is not the
    job's is left alone (check_conflicts reports it)."""
    for manifest in desired:
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        if (kind, name) in step.foreign:
            continue
        current = observed.get(kind, name)
        if current is None:
            step.plan.applies.append(manifest)
            continue
        want = manifest["metadata"].get("annotations", {}).get(ANNOTATION_HASH)
        have = ((current.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_HASH)
        if have != want or _scaled_by_hand(manifest, current):
            update = copy.deepcopy(manifest)
            update["metadata"]["uid"] = (current.get("metadata") or {}).get("uid")
            step.plan.applies.append(update)


def check_conflicts(step: Step, job: Job, desired: list[Manifest]) -> None:
    """Objects under a child's name that the operator did not create for this job: reported on the job
    (condition Conflict and an event) and never touched; while any exists, no pod is created."""
    wanted = [(m["kind"], m["metadata"]["name"]) for m in desired]
    if not job.spec.suspend:
        attempt = max(step.attempt, 1)
        wanted.append(("Pod", generation_pod_name(job, attempt, 0)))
        wanted += [("Pod", trainer_pod_name(job, attempt, rank)) for rank in range(job.spec.trainer.nodes)]
    found = [step.foreign[key] for key in wanted if key in step.foreign]
    previous = get_condition(list(step.old.get("conditions") or []), CONFLICT)
    if not found:
        if previous is not None:
            step.drop_condition(CONFLICT)
        return
    meta = step.obj.get("metadata") or {}
    message = ownership.conflict_message(found[0], meta)
    if len(found) > 1:
        others = ", ".join(f"{o.get('kind')} {(o.get('metadata') or {}).get('name')}" for o in found[1:])
        message += f". The same holds for {others}"
    step.conflict = truncate(message)
    step.condition(CONFLICT, "True", "ChildConflict", message)
    if previous is None or previous.get("message") != step.conflict:
        step.event("Warning", "ChildConflict", message)


def _scaled_by_hand(manifest: Manifest, current: Manifest) -> bool:
    # `kubectl scale deployment <job>-metric --replicas=0` keeps the spec-hash annotation but takes the
    # metric service away (found by bench/chaos.py metric-down); re-applying restores spec.metric.replicas.
    if manifest["kind"] != "Deployment":
        return False
    return bool((current.get("spec") or {}).get("replicas") != manifest["spec"].get("replicas"))


def delete_pods(step: Step, observed: Observed, which: Any) -> None:
    for pod in observed.pods():
        if which(pod) and not pod.terminating:
            ref = ChildRef("v1", "Pod", pod.name, _uid(pod.obj))
            if ref in step.plan.deletes:
                continue
            if KUEUE_GROUP_LABEL in pod.labels and pod.annotations.get(KUEUE_RETRIABLE_ANNOTATION) != "false":
                # Kueue keeps a pod group's quota reserved, waiting for replacement pods, until a member says
                # the group is not retriable. A restart is a new group (new attempt), so release the old one.
                patch = {"metadata": {"annotations": {KUEUE_RETRIABLE_ANNOTATION: "false"}}}
                step.plan.patches.append(ChildPatch(ref, patch))
            step.plan.deletes.append(ref)


def delete_metric_workload(step: Step, job: Job, observed: Observed) -> None:
    _delete_deployment(step, observed, metric_name(job))


def delete_gateway(step: Step, job: Job, observed: Observed) -> None:
    """Stop a client-rollout job's rollout gateway."""
    _delete_deployment(step, observed, rollouts_name(job))


def _delete_deployment(step: Step, observed: Observed, name: str) -> None:
    deployment = observed.get("Deployment", name)
    if deployment is not None:
        ref = ChildRef("apps/v1", "Deployment", name, _uid(deployment))
        if ref not in step.plan.deletes:
            step.plan.deletes.append(ref)


def _uid(obj: dict[str, Any]) -> str | None:
    value = (obj.get("metadata") or {}).get("uid")
    return str(value) if value else None
