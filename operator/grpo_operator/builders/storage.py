"""The checkpoint and model-cache volume."""

from __future__ import annotations

from grpo_operator.builders.common import Job, Manifest, created_pvc_name, metadata, with_hash

ANNOTATION_RETENTION = "grpo.dev/retention"
# The uid of the job the operator created the claim for. A retained claim has no owner reference, so this
# mark (with the operator's labels) is how the operator tells its own claim from a same-name one.
ANNOTATION_JOB_UID = "grpo.dev/job-uid"
# Set by the PV controller on a claim once it is bound to a volume; it stays while the claim exists.
ANNOTATION_BIND_COMPLETED = "pv.kubernetes.io/bind-completed"


def checkpoint_pvc(job: Job) -> Manifest | None:
    """The PVC `<job>-ckpt`, or None when the spec names an existing claim (never created or deleted).

    Retention is expressed with the owner reference alone: with `Delete` the job owns the claim and
    Kubernetes' garbage collector removes it with the job; with `Retain` the claim has no owner and
    outlives the job. No finalizer is involved, so deleting a job never waits for the operator.
    """
    volume = job.spec.checkpoints.volume
    if volume.existing_claim:
        return None
    retention = job.spec.checkpoints.retention
    meta = metadata(job, created_pvc_name(job), "trainer", owned=retention == "Delete")
    meta["annotations"] = {ANNOTATION_RETENTION: retention, ANNOTATION_JOB_UID: job.uid}
    spec: dict[str, object] = {
        "accessModes": [volume.access_mode],
        "resources": {"requests": {"storage": volume.size}},
    }
    if volume.storage_class_name:
        spec["storageClassName"] = volume.storage_class_name
    return with_hash({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta, "spec": spec})
