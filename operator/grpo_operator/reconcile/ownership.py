"""Which observed objects the operator created for this job, and which only share a name with a child.

Same name is not ownership. An object is the job's when it carries the job's controller reference
(ownerReference with ``controller: true`` and the job's uid). The one child without an owner reference,
a checkpoint claim kept by ``retention: Retain``, is the job's when it carries the operator's marks:
the labels the operator sets and the annotation that records the job's uid. Anything else with a
child's name is a conflict: the operator never changes, owns, mounts or deletes it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from grpo_operator.api.resource import KIND
from grpo_operator.builders.common import DEPLOYMENT_ROLES, LABEL_JOB, LABEL_MANAGED_BY, LABEL_ROLE, PART_OF
from grpo_operator.builders.storage import ANNOTATION_JOB_UID
from grpo_operator.reconcile.observed import Observed

Obj = dict[str, Any]


def _meta(obj: Obj) -> Obj:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _mapping(value: Any) -> Obj:
    return value if isinstance(value, dict) else {}


def controlled_by(obj: Obj, uid: str) -> bool:
    """True when ``obj`` has an ownerReference with controller=true to the GRPOJob with ``uid``."""
    refs = _meta(obj).get("ownerReferences")
    if not isinstance(refs, list) or not uid:
        return False
    return any(
        isinstance(ref, dict)
        and ref.get("controller") is True
        and ref.get("uid") == uid
        and ref.get("kind") == KIND
        for ref in refs
    )


def _claim_of(obj: Obj, job_meta: Obj) -> bool:
    """A retained checkpoint claim the operator created for this job (it has no owner reference)."""
    meta = _meta(obj)
    labels = _mapping(meta.get("labels"))
    annotations = _mapping(meta.get("annotations"))
    if labels.get(LABEL_MANAGED_BY) != PART_OF or labels.get(LABEL_JOB) != job_meta.get("name"):
        return False
    recorded = annotations.get(ANNOTATION_JOB_UID)
    if recorded is not None:
        return bool(job_meta.get("uid")) and recorded == job_meta.get("uid")
    # Claims made before the operator recorded the uid: the job's own only if made after the job was
    # (RFC 3339 UTC timestamps with second precision compare correctly as strings). A claim retained by an
    # earlier job of the same name is older than this job.
    created, job_created = meta.get("creationTimestamp"), job_meta.get("creationTimestamp")
    return bool(created and job_created and str(created) >= str(job_created))


def recorded_uid(obj: Obj) -> str | None:
    """The job uid a claim's marks record, if any."""
    annotations = _meta(obj).get("annotations")
    value = annotations.get(ANNOTATION_JOB_UID) if isinstance(annotations, dict) else None
    return str(value) if value else None


def is_mine(obj: Obj, job_meta: Obj) -> bool:
    uid = str(job_meta.get("uid") or "")
    if controlled_by(obj, uid):
        return True
    kind = obj.get("kind")
    if kind == "PersistentVolumeClaim" and not _meta(obj).get("ownerReferences"):
        return _claim_of(obj, job_meta)
    if kind == "Pod":
        # Metric pods belong to the job's Deployment's ReplicaSet; they are read for readiness messages only
        # and never written (the runtime keeps only those created since the job was).
        labels = _meta(obj).get("labels")
        return (
            isinstance(labels, dict)
            and labels.get(LABEL_ROLE) in DEPLOYMENT_ROLES
            and not controlled_by_other(obj)
        )
    return False


def controlled_by_other(obj: Obj) -> bool:
    """True when another GRPOJob (of any uid) is the object's controller."""
    refs = _meta(obj).get("ownerReferences")
    return isinstance(refs, list) and any(
        isinstance(ref, dict) and ref.get("controller") is True and ref.get("kind") == KIND for ref in refs
    )


# Kinds the operator observes but never creates, changes or deletes.
READ_ONLY_KINDS = frozenset({"Workload"})


@dataclass(frozen=True)
class Split:
    """The observed objects divided into the job's own and everything else found under a child's name."""

    mine: Observed
    foreign: dict[tuple[str, str], Obj]

    def conflict(self, kind: str, name: str) -> Obj | None:
        return self.foreign.get((kind, name))


def split(observed: Observed, job_meta: Obj) -> Split:
    mine: list[Obj] = []
    foreign: dict[tuple[str, str], Obj] = {}
    for obj in observed.objects:
        # Kueue's Workloads of the job's pod groups are read for their conditions only, never written: they
        # belong to Kueue (owned by the pods), so ownership does not apply to them.
        if obj.get("kind") in READ_ONLY_KINDS or is_mine(obj, job_meta):
            mine.append(obj)
        else:
            foreign[(str(obj.get("kind")), str(_meta(obj).get("name")))] = obj
    return Split(mine=dataclasses.replace(observed, objects=tuple(mine)), foreign=foreign)


def conflict_message(obj: Obj, job_meta: Obj) -> str:
    """What the conflict is and what the user can do about it."""
    kind, name = str(obj.get("kind")), str(_meta(obj).get("name"))
    job = str(job_meta.get("name"))
    if kind == "PersistentVolumeClaim":
        previous = recorded_uid(obj)
        labels = _meta(obj).get("labels") or {}
        if previous and isinstance(labels, dict) and labels.get(LABEL_JOB) == job:
            return (
                f"PersistentVolumeClaim {name} holds the checkpoints of an earlier GRPOJob named {job} "
                f"(uid {previous}) and is not this job's; the operator leaves it untouched. To resume from it, "
                f"set spec.checkpoints.volume.existingClaim: {name}; to start afresh, delete it "
                f"(kubectl delete pvc {name}) or rename the job"
            )
    if controlled_by_other(obj) and _meta(obj).get("deletionTimestamp"):
        return (
            f"{kind} {name} belongs to an earlier GRPOJob of this name and is still being deleted; the job "
            "carries on once it is gone"
        )
    return (
        f"{kind} {name} already exists and was not created by the operator for this GRPOJob (it has no "
        f"controller reference to {job}); the operator leaves it untouched and starts no pods. Delete or "
        f"rename the {kind}, or recreate the job under another name"
    )
