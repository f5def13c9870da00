"""Pod-level settings every pod of a job shares: placement (the spec's scheduling passthrough, GPU node
selection), image pull secrets, Kueue labels."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from grpo_operator.builders.common import (
    KUEUE_GROUP_COUNT_ANNOTATION,
    KUEUE_GROUP_LABEL,
    KUEUE_QUEUE_LABEL,
    KUEUE_RETRIABLE_ANNOTATION,
    Job,
)
from grpo_operator.settings import OperatorSettings


def pod_placement(job: Job, settings: OperatorSettings, *, gpu: bool) -> dict[str, Any]:
    """nodeSelector, tolerations, affinity and priorityClassName for one pod spec.

    GPU pods also get the GPU node selector and toleration from the operator settings, then the spec's
    gpuNodeSelector; the spec's nodeSelector applies to every pod. A user entry for the same key wins
    over the operator's. GPU-only labels must not reach the metric pod: it has no GPU toleration, so a
    GPU product pinned on it would leave it unschedulable. The settings' GPU node-affinity requirements
    (a driver version) are added to the job's own affinity and cannot be undone by it.
    """
    sched = job.spec.scheduling
    node_selector: dict[str, str] = dict(settings.gpu_node_selector) if gpu else {}
    node_selector.update(sched.node_selector)
    if gpu:
        node_selector.update(sched.gpu_node_selector)
    tolerations: list[dict[str, Any]] = [dict(t) for t in settings.gpu_tolerations] if gpu else []
    for toleration in sched.tolerations:
        entry = toleration.to_dict()
        if entry not in tolerations:
            tolerations.append(entry)
    out: dict[str, Any] = {}
    if node_selector:
        out["nodeSelector"] = node_selector
    if tolerations:
        out["tolerations"] = tolerations
    affinity = sched.affinity.to_dict() if sched.affinity is not None else {}
    if gpu and settings.gpu_node_affinity:
        affinity = with_required_node_expressions(affinity, settings.gpu_node_affinity)
    if affinity:
        out["affinity"] = affinity
    if sched.priority_class_name:
        out["priorityClassName"] = sched.priority_class_name
    return out


def with_required_node_expressions(
    affinity: Mapping[str, Any], expressions: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """``affinity`` with ``expressions`` required of every node: added to each term of its required node
    affinity, or as the one term when it has none. The API server ORs nodeSelectorTerms and ANDs the
    expressions within a term, so a term left without them would admit any node; a term's matchFields
    stay as they are."""
    out = copy.deepcopy(dict(affinity))
    node = out.setdefault("nodeAffinity", {})
    required = node.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    added = [dict(e) for e in expressions]
    for term in terms:
        own = term.get("matchExpressions") or []
        term["matchExpressions"] = [*own, *(e for e in added if e not in own)]
    required["nodeSelectorTerms"] = terms
    return out


def image_pull_secrets(job: Job, settings: OperatorSettings) -> dict[str, Any]:
    """``imagePullSecrets`` for a pod spec: the operator's defaults, then the job's own, each once."""
    names = list(
        dict.fromkeys([*settings.image_pull_secrets, *(s.name for s in job.spec.image_pull_secrets)])
    )
    return {"imagePullSecrets": [{"name": n} for n in names]} if names else {}


def gang_size(job: Job) -> int:
    """Pods Kueue must admit together: every trainer pod plus every vLLM server (none when colocated)."""
    return job.spec.trainer.nodes + job.spec.generation.server_count()


def kueue_group_name(job: Job, attempt: int) -> str:
    # One Kueue workload per gang incarnation: a restarted gang is a new group, so Kueue never waits
    # for the deleted pods of the previous attempt to come back.
    return f"{job.name}-a{attempt}"


def kueue_labels(job: Job, attempt: int, settings: OperatorSettings) -> tuple[dict[str, str], dict[str, str]]:
    """(labels, annotations) that make Kueue admit the gang's pods as one pod group, or empty.

    A job that names no queue goes to the platform's default queue, when there is one (read here, not
    folded into the spec, so a changed default reaches the next gang without restarting running ones).

    A gang restart is a new group. Inside a group the operator replaces only a failed vLLM pod while the
    trainers run: Kueue counts the group's pods that have not failed, so the replacement takes the failed
    pod's place in the quota the group already holds. The group is marked not retriable from the start,
    which ends it once none of its pods is pending or running; otherwise Kueue keeps the quota and a
    finalizer on every pod of a group whose pods were deleted without the operator (the GRPOJob deleted,
    its pods garbage collected), waiting for replacements that never come."""
    queue = job.spec.scheduling.queue_name or settings.default_queue_name
    if not queue:
        return {}, {}
    return (
        {KUEUE_QUEUE_LABEL: queue, KUEUE_GROUP_LABEL: kueue_group_name(job, attempt)},
        {KUEUE_GROUP_COUNT_ANNOTATION: str(gang_size(job)), KUEUE_RETRIABLE_ANNOTATION: "false"},
    )
