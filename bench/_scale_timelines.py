"""bench/scale.py's timeline: the way of each job to Running, stage by stage, from the API server's own
timestamps."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from _bench import BenchCluster, Obj, median, percentile
from grpo_operator.builders.child_kinds import CHILD_KINDS as CHILD_KIND_RECORDS
from grpo_operator.builders.common import LABEL_ROLE

# The way of one schedulable job to Running, from the API server's own records (second resolution: every
# timestamp below is a metav1.Time). Each stage is the moment the last object of that stage got there.
STAGES: tuple[tuple[str, str], ...] = (
    ("applied", "the GRPOJob's creationTimestamp"),
    ("first reconcile", "status.startTime: when the first reconcile decided to start the job"),
    ("first child created", "the earliest creationTimestamp of the job's children"),
    ("infrastructure created", "the last non-pod child's creationTimestamp"),
    ("gang pods created", "the last vLLM/trainer pod's creationTimestamp"),
    ("volume provisioned", "the checkpoint claim's PersistentVolume's creationTimestamp (side stage)"),
    ("claim bound", "the PV controller's last write of the claim, from its managedFields (side stage)"),
    ("gang pods bound", "the last gang pod's PodScheduled condition"),
    ("gang pods Running", "the last gang pod's Ready condition (vLLM must answer /health)"),
    ("status Running", "the job's Running condition, written by the operator"),
)
# Not a step on the way but a precondition beside it: the stage alone is measured from the infrastructure.
SIDE_STAGES = {"volume provisioned": "infrastructure created", "claim bound": "infrastructure created"}
CHILD_KINDS = ",".join(k.kubectl_name for k in CHILD_KIND_RECORDS)


def _ts(value: Any) -> float | None:
    if not value:
        return None
    return datetime.strptime(str(value), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def _condition_time(obj: Obj, kind: str) -> float | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return _ts(cond.get("lastTransitionTime"))
    return None


def _bound_time(claim: Obj) -> float | None:
    """When the PV controller (in kube-controller-manager) last wrote the claim: binding it to its volume."""
    times = [
        _ts(entry.get("time"))
        for entry in (claim.get("metadata") or {}).get("managedFields") or []
        if entry.get("manager") == "kube-controller-manager"
    ]
    return max((t for t in times if t is not None), default=None)


def job_timelines(jobs: list[Obj], children: list[Obj], volumes: list[Obj]) -> list[dict[str, float]]:
    """Per job that reached Running: each stage of STAGES as seconds since the job's creationTimestamp."""
    by_job: dict[tuple[str, str], list[Obj]] = {}
    for child in children:
        meta = child["metadata"]
        by_job.setdefault((meta["namespace"], meta["labels"]["grpo.dev/job"]), []).append(child)
    pv_created = {v["metadata"]["name"]: _ts(v["metadata"].get("creationTimestamp")) for v in volumes}
    out = []
    for job in jobs:
        meta = job["metadata"]
        status = job.get("status") or {}
        running = _condition_time(job, "Running")
        applied = _ts(meta.get("creationTimestamp"))
        kids = by_job.get((meta["namespace"], meta["name"]), [])
        gang = [c for c in kids if c["kind"] == "Pod" and c["metadata"]["labels"].get(LABEL_ROLE) != "metric"]
        infra = [c for c in kids if c["kind"] != "Pod"]
        if status.get("phase") != "Running" or running is None or applied is None or not gang or not infra:
            continue
        created = [_ts(c["metadata"]["creationTimestamp"]) or 0.0 for c in kids if c in gang or c in infra]
        bound = [_condition_time(p, "PodScheduled") for p in gang]
        ready = [_condition_time(p, "Ready") for p in gang]
        claims = [c for c in infra if c["kind"] == "PersistentVolumeClaim"]
        provisioned = [pv_created.get(str((c.get("spec") or {}).get("volumeName"))) for c in claims]
        claim_bound = [_bound_time(c) for c in claims]
        if None in bound or None in ready or not claims or None in provisioned or None in claim_bound:
            continue
        moments = {
            "applied": applied,
            "first reconcile": _ts(status.get("startTime")) or applied,
            "first child created": min(created),
            "infrastructure created": max(_ts(c["metadata"]["creationTimestamp"]) or 0.0 for c in infra),
            "gang pods created": max(_ts(c["metadata"]["creationTimestamp"]) or 0.0 for c in gang),
            "volume provisioned": max(t for t in provisioned if t is not None),
            "claim bound": max(t for t in claim_bound if t is not None),
            "gang pods bound": max(t for t in bound if t is not None),
            "gang pods Running": max(t for t in ready if t is not None),
            "status Running": running,
        }
        out.append({stage: moments[stage] - applied for stage, _ in STAGES})
    return out


def summarize_timelines(timelines: list[dict[str, float]]) -> dict[str, tuple[float, float, float, float]]:
    summary: dict[str, tuple[float, float, float, float]] = {}
    previous: str | None = None
    for stage, _ in STAGES:
        since_apply = [t[stage] for t in timelines]
        before = SIDE_STAGES.get(stage, previous)
        alone = [t[stage] - t[before] for t in timelines] if before else since_apply
        if since_apply:
            summary[stage] = (
                median(since_apply),
                percentile(since_apply, 95),
                median(alone),
                percentile(alone, 95),
            )
        if stage not in SIDE_STAGES:
            previous = stage
    return summary


def read_timelines(cluster: BenchCluster, namespaces: list[str]) -> list[dict[str, float]]:
    jobs: list[Obj] = []
    children: list[Obj] = []
    for namespace in namespaces:
        jobs += cluster.get_list("grpojobs", namespace)
        children += cluster.get_list(CHILD_KINDS, namespace, selector="grpo.dev/job", managed_fields=True)
    return job_timelines(jobs, children, cluster.get_list("persistentvolumes"))
