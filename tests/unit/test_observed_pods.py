"""Which pods labelled with a job's name count as that job's: the operator must see its metric pods
(owned by a ReplicaSet, not the job) but not the pods of an earlier job of the same name."""

from __future__ import annotations

from typing import Any

from grpo_operator.runtime.observe import _pod_of_this_job

JOB_UID = "uid-new"
JOB_CREATED = "2026-11-29T12:00:00Z"


def pod(role: str, owner_uid: str, created: str) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {
            "name": f"math-{role}",
            "labels": {"grpo.dev/job": "math", "grpo.dev/role": role},
            "ownerReferences": [{"uid": owner_uid}],
            "creationTimestamp": created,
        },
    }


def test_gang_pods_count_only_when_owned_by_this_job() -> None:
    assert _pod_of_this_job(pod("trainer", JOB_UID, JOB_CREATED), JOB_UID, JOB_CREATED)
    # A trainer of a deleted namesake still terminating: not this job's, whenever it was made.
    assert not _pod_of_this_job(pod("trainer", "uid-old", "2026-11-29T12:05:00Z"), JOB_UID, JOB_CREATED)


def test_metric_pods_count_when_created_since_the_job() -> None:
    replicaset = "uid-of-a-replicaset"
    assert _pod_of_this_job(pod("metric", replicaset, "2026-11-29T12:00:03Z"), JOB_UID, JOB_CREATED)
    assert not _pod_of_this_job(pod("metric", replicaset, "2026-11-29T11:40:00Z"), JOB_UID, JOB_CREATED)
