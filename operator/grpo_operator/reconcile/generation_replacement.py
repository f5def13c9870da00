"""GenerationReplaced: a failed or evicted vLLM pod replaced alone while the trainers keep running, and
the wait for the replacement to get Ready. With several vLLM servers (spec.generation.replicas) each
replica is replaced, counted and waited for on its own."""

from __future__ import annotations

from datetime import timedelta

from grpo_operator.api import event_reasons
from grpo_operator.builders import Job
from grpo_operator.builders.common import generation_pod_name, generation_replicas
from grpo_operator.builders.gang import generation_pod
from grpo_operator.reconcile.children import generation_pod_position
from grpo_operator.reconcile.gang_restart import restart_or_fail
from grpo_operator.reconcile.gang_startup import duration_text
from grpo_operator.reconcile.observed import Observed, PodView
from grpo_operator.reconcile.reconcile_pass import ReconcilePass
from grpo_operator.reconcile.restart_policy import (
    GENERATION_REPLACED,
    GENERATION_REPLACEMENTS_PER_ATTEMPT,
    GENERATION_STARTUP_TIMEOUT,
    OOM_KILLED,
)

# The status reason while a replaced vLLM pod gets Ready: the restart table's row.
REPLACING_GENERATION = GENERATION_REPLACED.reason


def generation_indices(job: Job, current: dict[str, PodView]) -> dict[int, int]:
    """Which vLLM pod of each replica is the live one: the highest n of ``<job>-gen[-r<r>]-<attempt>-<n>``
    by replica (n counts the replica's replacements in the attempt; the replaced pods are kept, for their
    logs, until the attempt ends). A replica without a pod yet is at 0; a name that is not one the operator
    gives vLLM pods counts for none."""
    indices = {replica: 0 for replica in generation_replicas(job)}
    for pod in current.values():
        position = generation_pod_position(job.name, pod.name) if pod.role == "generation" else None
        if position is not None and position[0] in indices:
            indices[position[0]] = max(indices[position[0]], position[2])
    return indices


def replica_of(job: Job, pod: PodView) -> int:
    """The replica a vLLM pod of the job serves (by its name)."""
    position = generation_pod_position(job.name, pod.name)
    return position[0] if position is not None else 0


def replica_text(job: Job, replica: int) -> str:
    """How messages name a vLLM server: "vLLM" for a job with one, "vLLM replica <r>" with several."""
    return "vLLM" if job.spec.generation.replica_count() == 1 else f"vLLM replica {replica}"


def _replaceable(
    rp: ReconcilePass, job: Job, observed: Observed, pod: PodView, replica: int, index: int
) -> bool:
    # Under Kueue the replacement joins the gang's pod group: Kueue counts only the group's pods that have
    # not failed, so it takes the failed pod's place in the quota the group holds and is ungated at once.
    if index >= GENERATION_REPLACEMENTS_PER_ATTEMPT:
        return False
    term = pod.termination()
    if term is not None and term.reason == OOM_KILLED.reason:
        return False  # the same memory limit would kill the replacement: OOMKilled says what to raise
    replacement = generation_pod_name(job, rp.generation_attempt, index + 1, replica)
    if ("Pod", replacement) in rp.foreign or rp.conflict is not None:
        return False  # a same-name pod that is not the job's is never used: the gang restarts instead
    # The API server refused it (quota, admission): a new gang reports why it waits.
    return not any(r.kind == "Pod" and r.name == replacement for r in observed.refusals)


def replace_generation(
    rp: ReconcilePass,
    job: Job,
    observed: Observed,
    current: dict[str, PodView],
    trainers: list[str],
    stopped: list[tuple[PodView, str]],
    indices: dict[int, int],
) -> bool:
    """GenerationReplaced: a new vLLM pod for each stopped one (with what stopped it), for the running
    trainers, the gang left as it is. False when the restart policy says the gang restarts instead (see the
    rule's cause): then nothing is replaced."""
    if any(t is None or t.phase != "Running" or t.terminating for t in (current.get(n) for n in trainers)):
        return False
    replicas = [(pod, what, replica_of(job, pod)) for pod, what in stopped]
    if len({replica for _, _, replica in replicas}) != len(replicas):
        return False
    if not all(
        _replaceable(rp, job, observed, pod, replica, indices.get(replica, 0)) for pod, _, replica in replicas
    ):
        return False
    messages = []
    for _, what, replica in replicas:
        index = indices.get(replica, 0)
        replacement = generation_pod_name(job, rp.generation_attempt, index + 1, replica)
        if job.spec.generation.replica_count() == 1:
            message = (
                f"{what}; replaced by vLLM pod {replacement} (replacement {index + 1} of "
                f"{GENERATION_REPLACEMENTS_PER_ATTEMPT} in gang attempt {rp.attempt}, not counted against "
                "backoffLimit); the trainers keep running and wait for it"
            )
        else:
            message = (
                f"vLLM replica {replica}: {what}; replaced by vLLM pod {replacement} (replacement {index + 1} "
                f"of {GENERATION_REPLACEMENTS_PER_ATTEMPT} of replica {replica} in gang attempt {rp.attempt}, "
                "not counted against backoffLimit); the trainers keep running, the other replicas serve them"
            )
        rp.plan.creates.append(generation_pod(job, rp.settings, rp.generation_attempt, index + 1, replica))
        rp.event(event_reasons.GENERATION_REPLACED, message)
        messages.append(message)
    rp.set_phase("Running", REPLACING_GENERATION, "; ".join(messages))
    return True


def awaiting_replacement(
    rp: ReconcilePass,
    job: Job,
    observed: Observed,
    current: dict[str, PodView],
    indices: dict[int, int],
) -> bool:
    """While a replaced vLLM pod is not Ready yet: the job stays Running (its trainers run and wait), the
    message says how long the new pod has had of generation.startupTimeoutSeconds, and past that budget
    the gang restarts (GenerationStartupTimeout, counted), as when a first vLLM pod never gets Ready. Each
    replica's replacement has a clock of its own."""
    budget = job.spec.generation.startup_timeout_seconds
    messages = []
    # The replacement's own message (what failed, the new pod, not counted) stays for the first minute, so
    # the pass right after the replacement changes nothing; then the minutes waited take its place.
    replaced_message = (
        str(rp.old.get("message") or "") if rp.old.get("reason") == REPLACING_GENERATION else ""
    )
    keep = bool(replaced_message)
    for replica, index in sorted(indices.items()):
        pod = (
            current.get(generation_pod_name(job, rp.generation_attempt, index, replica))
            if index > 0
            else None
        )
        if pod is None or pod.ready:
            continue
        since = pod.created or rp.now
        elapsed = (rp.now - since).total_seconds()
        if elapsed >= budget:
            restart_or_fail(
                rp,
                job,
                observed,
                GENERATION_STARTUP_TIMEOUT,
                f"{replica_text(job, replica)} pod {pod.name}, which replaced a failed one, did not become Ready "
                f"within spec.generation.startupTimeoutSeconds ({budget}s): see its log (kubectl logs {pod.name})",
            )
            return True
        keep = keep and elapsed < 60 and f"replaced by vLLM pod {pod.name}" in replaced_message
        failed = current.get(generation_pod_name(job, rp.generation_attempt, index - 1, replica))
        cause = (
            f" after {failed.failure_summary()}" if failed is not None and failed.phase == "Failed" else ""
        )
        waits = (
            "the trainers wait for it"
            if job.spec.generation.replica_count() == 1
            else "the trainers keep running on the other replicas"
        )
        messages.append(
            f"{replica_text(job, replica)} pod {pod.name} replaces a failed one{cause}; {waits} "
            f"({duration_text(elapsed)} of {duration_text(budget)})"
        )
        rp.requeue_at(since + timedelta(seconds=budget))
    if not messages:
        return False
    rp.set_phase("Running", REPLACING_GENERATION, replaced_message if keep else "; ".join(messages))
    rp.requeue_at(rp.now + timedelta(seconds=60))  # the elapsed minutes in the message
    return True
