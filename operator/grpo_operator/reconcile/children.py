"""Upkeep of the job's children: create what is missing, update what drifted, report same-name objects
that are not the job's, and delete pods and the metric service (and environment server)."""

from __future__ import annotations

import copy
import dataclasses
import re
from typing import Any

from grpo_operator.api import event_reasons
from grpo_operator.api.status import GATEWAY_TOKEN_SECRET_FIELD
from grpo_operator.builders import Job, Manifest
from grpo_operator.builders.common import (
    ANNOTATION_HASH,
    KUEUE_GROUP_LABEL,
    KUEUE_RETRIABLE_ANNOTATION,
    LABEL_ATTEMPT,
    LABEL_GENERATION_REPLICA,
    LABEL_JOB,
    LABEL_MANAGED_BY,
    LABEL_NODE_RANK,
    LABEL_ROLE,
    PART_OF,
    environment_name,
    generation_pod_name,
    generation_replicas,
    metric_name,
    rollouts_name,
    trainer_pod_name,
)
from grpo_operator.reconcile import ownership
from grpo_operator.reconcile.conditions import CONFLICT, get_condition, truncate
from grpo_operator.reconcile.drift import Drift, describe, drifted_fields
from grpo_operator.reconcile.observed import Observed, PodView
from grpo_operator.reconcile.plan import ChildPatch, ChildRef, SecretCreate
from grpo_operator.reconcile.reconcile_pass import ReconcilePass

# The Warning event of a child someone else changed (the operator puts it back).


def ensure(rp: ReconcilePass, observed: Observed, desired: list[Manifest]) -> None:
    """Create every desired child that is missing; update the job's own children that differ from the spec
    (by their spec-hash) or from what the operator builds (drift, see drift.py), naming the uid they were
    observed with. A same-name object that is not the job's is left alone (check_conflicts reports it)."""
    for manifest in desired:
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        if (kind, name) in rp.foreign:
            continue
        current = observed.get(kind, name)
        if current is None:
            rp.plan.applies.append(manifest)
            continue
        want = manifest["metadata"].get("annotations", {}).get(ANNOTATION_HASH)
        have = ((current.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_HASH)
        if have != want or _scaled_by_hand(manifest, current):
            rp.plan.applies.append(_update(manifest, current))
            continue
        drifts = _drift(manifest, current, observed)
        if not drifts:
            continue
        fields = describe(drifts)
        if any(d.extra for d in drifts):
            # What another field manager added stays through a forced apply: recreate the child instead.
            rp.plan.deletes.append(ChildRef(manifest["apiVersion"], kind, name, _uid(current)))
            done = "deleting it to create it again as built"
        else:
            rp.plan.applies.append(_update(manifest, current))
            done = "restoring it"
        rp.event(
            event_reasons.CHILD_DRIFTED,
            f"{kind} {name} was changed outside the operator ({fields}); {done}. Change the GRPOJob's spec "
            "instead: the operator keeps its children as the spec builds them",
        )


def ensure_secrets(rp: ReconcilePass, secrets: list[tuple[Manifest, str]]) -> None:
    """Create each generated Secret whose name the job has not recorded (the runtime generates its value
    and records the name). One recorded is never read or updated: the gateway and trainer rank 0 read the
    value at start, and a new one would lock rank 0 out of the running gateway."""
    for manifest, key in secrets:
        rp.plan.secrets.append(SecretCreate(manifest, key, GATEWAY_TOKEN_SECRET_FIELD))


def _update(manifest: Manifest, current: Manifest) -> Manifest:
    update = copy.deepcopy(manifest)
    update["metadata"]["uid"] = (current.get("metadata") or {}).get("uid")
    return update


def _drift(manifest: Manifest, current: Manifest, observed: Observed) -> list[Drift]:
    if (manifest["kind"], manifest["metadata"]["name"]) in observed.metadata_only:
        # Only the metadata was read (ConfigMaps are watched metadata-only): compare what there is.
        return drifted_fields({"metadata": manifest["metadata"]}, current)
    return drifted_fields(manifest, current)


def check_conflicts(rp: ReconcilePass, job: Job, desired: list[Manifest], *, suspended: bool) -> None:
    """Objects under a child's name that the operator did not create for this job: reported on the job
    (condition Conflict and an event) and never touched; while any exists, no pod is created. A suspended
    job (spec.suspend, or its budget spent) wants no pods."""
    wanted = [(m["kind"], m["metadata"]["name"]) for m in desired]
    if not suspended:
        attempt = max(rp.attempt, 1)
        served_by = max(rp.generation_attempt, 1)
        wanted += [("Pod", generation_pod_name(job, served_by, 0, r)) for r in generation_replicas(job)]
        wanted += [("Pod", trainer_pod_name(job, attempt, rank)) for rank in range(job.spec.trainer.nodes)]
    found = [rp.foreign[key] for key in wanted if key in rp.foreign]
    previous = get_condition(list(rp.old.get("conditions") or []), CONFLICT)
    if not found:
        if previous is not None:
            rp.drop_condition(CONFLICT)
        return
    meta = rp.obj.get("metadata") or {}
    message = ownership.conflict_message(found[0], meta)
    if len(found) > 1:
        others = ", ".join(f"{o.get('kind')} {(o.get('metadata') or {}).get('name')}" for o in found[1:])
        message += f". The same holds for {others}"
    rp.conflict = truncate(message)
    rp.condition(CONFLICT, "True", "ChildConflict", message)
    if previous is None or previous.get("message") != rp.conflict:
        rp.event(event_reasons.CHILD_CONFLICT, message)


def _scaled_by_hand(manifest: Manifest, current: Manifest) -> bool:
    # `kubectl scale deployment <job>-metric --replicas=0` keeps the spec-hash annotation but takes the
    # metric service away (found by bench/chaos.py metric-down); re-applying restores spec.metric.replicas.
    if manifest["kind"] != "Deployment":
        return False
    return bool((current.get("spec") or {}).get("replicas") != manifest["spec"].get("replicas"))


def delete_pods(rp: ReconcilePass, observed: Observed, which: Any) -> None:
    for pod in observed.pods():
        if which(pod) and not pod.terminating:
            ref = ChildRef("v1", "Pod", pod.name, _uid(pod.obj))
            if ref in rp.plan.deletes:
                continue
            if KUEUE_GROUP_LABEL in pod.labels and pod.annotations.get(KUEUE_RETRIABLE_ANNOTATION) != "false":
                # Kueue keeps a pod group's quota reserved, waiting for replacement pods, until a member says
                # the group is not retriable. A restart is a new group (new attempt), so release the old one.
                patch = {"metadata": {"annotations": {KUEUE_RETRIABLE_ANNOTATION: "false"}}}
                rp.plan.patches.append(ChildPatch(ref, patch))
            rp.plan.deletes.append(ref)


def delete_metric_workload(rp: ReconcilePass, job: Job, observed: Observed) -> None:
    """Stop the metric service and the environment server (whichever of them runs)."""
    _delete_deployment(rp, observed, metric_name(job))
    _delete_deployment(rp, observed, environment_name(job))


def delete_gateway(rp: ReconcilePass, job: Job, observed: Observed) -> None:
    """Stop a client-rollout job's rollout gateway."""
    _delete_deployment(rp, observed, rollouts_name(job))


def _delete_deployment(rp: ReconcilePass, observed: Observed, name: str) -> None:
    deployment = observed.get("Deployment", name)
    if deployment is not None:
        ref = ChildRef("apps/v1", "Deployment", name, _uid(deployment))
        if ref not in rp.plan.deletes:
            rp.plan.deletes.append(ref)


def _uid(obj: dict[str, Any]) -> str | None:
    value = (obj.get("metadata") or {}).get("uid")
    return str(value) if value else None


def gang_pod_labels(job_name: str, pod_name: str) -> dict[str, str] | None:
    """The labels the operator gives the gang pod named ``pod_name`` (the name says its role, attempt and
    rank, or its replica), or None when the name is not one of a gang pod of the job."""
    match = _GANG_NAME.match(pod_name[len(job_name) :]) if pod_name.startswith(job_name) else None
    if match is None:
        return None
    trainer, replica, attempt, number = match.groups()
    role = "trainer" if trainer else "generation"
    out = {LABEL_MANAGED_BY: PART_OF, LABEL_JOB: job_name, LABEL_ROLE: role, LABEL_ATTEMPT: attempt}
    if trainer:
        out[LABEL_NODE_RANK] = number
    else:
        out[LABEL_GENERATION_REPLICA] = replica or "0"
    return out


def generation_pod_position(job_name: str, pod_name: str) -> tuple[int, int, int] | None:
    """(replica, attempt, n) of the vLLM pod named ``pod_name`` (``<job>-gen-<attempt>-<n>`` for replica 0,
    ``<job>-gen-r<r>-<attempt>-<n>`` for replica r), or None when the name is not one of the job's vLLM pods."""
    match = _GANG_NAME.match(pod_name[len(job_name) :]) if pod_name.startswith(job_name) else None
    if match is None or match.group(1):
        return None
    return int(match.group(2) or 0), int(match.group(3)), int(match.group(4))


# -trainer-<attempt>-<rank>, -gen-<attempt>-<n> (replica 0) or -gen-r<r>-<attempt>-<n> (replica r >= 1).
_GANG_NAME = re.compile(r"^-(?:(trainer)|gen(?:-r([1-9][0-9]*))?)-([0-9]+)-([0-9]+)$")


def _wrong_labels(want: dict[str, str], labels: dict[str, str]) -> list[str]:
    """The labels of ``want`` that ``labels`` holds otherwise. A vLLM pod of replica 0 made by an operator
    from before spec.generation.replicas has no replica label: that is not a changed label."""
    return sorted(
        k
        for k, v in want.items()
        if labels.get(k) != v and not (k == LABEL_GENERATION_REPLICA and v == "0" and k not in labels)
    )


def split_strays(observed: Observed, job_meta: dict[str, Any]) -> tuple[Observed, list[tuple[PodView, str]]]:
    """The job's pods whose labels no longer say what the operator made them (a tenant removed or changed
    grpo.dev/job, grpo.dev/role, the attempt or the rank) taken out of ``observed``, each with what is
    wrong. Labels are what Services, NetworkPolicies and the operator's own watch select on: such a pod
    is not counted as the job's, and as it carries the job's controller reference it is the operator's
    own pod, altered, which is deleted (a new one is made as built) rather than left to run beside it."""
    uid, name = str(job_meta.get("uid") or ""), str(job_meta.get("name") or "")
    kept: list[dict[str, Any]] = []
    strays: list[tuple[PodView, str]] = []
    for obj in observed.objects:
        if obj.get("kind") != "Pod" or not ownership.controlled_by(obj, uid):
            kept.append(obj)
            continue
        pod = PodView(obj)
        want = gang_pod_labels(name, pod.name)
        if want is None:
            strays.append((pod, "its name is not one the operator gives pods"))
            continue
        wrong = _wrong_labels(want, pod.labels)
        if wrong:
            strays.append((pod, f"its label{'s' if len(wrong) > 1 else ''} {', '.join(wrong)} changed"))
        else:
            kept.append(obj)
    return dataclasses.replace(observed, objects=tuple(kept)), strays


def delete_strays(rp: ReconcilePass, strays: list[tuple[PodView, str]]) -> None:
    """Delete the job's pods whose labels were changed (see split_strays), with a ChildDrifted event."""
    for pod, why in strays:
        if pod.terminating:
            continue
        rp.plan.deletes.append(ChildRef("v1", "Pod", pod.name, _uid(pod.obj)))
        rp.event(
            event_reasons.CHILD_DRIFTED,
            f"Pod {pod.name} was changed outside the operator ({why}); it is no longer counted as the job's "
            "and is deleted. Do not relabel the job's pods",
        )
