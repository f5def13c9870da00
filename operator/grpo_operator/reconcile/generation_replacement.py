"""GenerationReplaced: a failed or evicted vLLM pod replaced alone while the trainers keep running, and
the wait for the replacement to get Ready."""

from __future__ import annotations

from datetime import timedelta

from grpo_operator.api import event_reasons
from grpo_operator.builders import Job
from grpo_operator.builders.common import KUEUE_GROUP_LABEL, generation_pod_name
from grpo_operator.builders.gang import generation_pod
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


def generation_index(current: dict[str, PodView]) -> int:
    """Which vLLM pod of the attempt is the live one: the highest n of ``<job>-gen-<attempt>-<n>`` (n counts
    the attempt's replacements; the replaced pods are kept, for their logs, until the attempt ends)."""
    indices = [int(p.name.rsplit("-", 1)[1]) for p in current.values() if p.role == "generation"]
    return max(indices, default=0)


def replace_generation(
    rp: ReconcilePass,
    job: Job,
    observed: Observed,
    current: dict[str, PodView],
    expected: list[str],
    pod: PodView,
    what: str,
    index: int,
) -> bool:
    """GenerationReplaced: a new vLLM pod for the running trainers, the gang left as it is. False when the
    restart policy says the gang restarts instead (see the rule's cause)."""
    trainers = [current.get(name) for name in expected[1:]]
    if any(t is None or t.phase != "Running" or t.terminating for t in trainers):
        return False
    if KUEUE_GROUP_LABEL in pod.labels or index >= GENERATION_REPLACEMENTS_PER_ATTEMPT:
        return False
    term = pod.termination()
    if term is not None and term.reason == OOM_KILLED.reason:
        return False  # the same memory limit would kill the replacement: OOMKilled says what to raise
    replacement = generation_pod_name(job, rp.attempt, index + 1)
    if ("Pod", replacement) in rp.foreign or rp.conflict is not None:
        return False  # a same-name pod that is not the job's is never used: the gang restarts instead
    if any(r.kind == "Pod" and r.name == replacement for r in observed.refusals):
        return False  # the API server refused it (quota, admission): a new gang reports why it waits
    message = (
        f"{what}; replaced by vLLM pod {replacement} (replacement {index + 1} of "
        f"{GENERATION_REPLACEMENTS_PER_ATTEMPT} in gang attempt {rp.attempt}, not counted against backoffLimit); "
        "the trainers keep running and wait for it"
    )
    rp.plan.creates.append(generation_pod(job, rp.settings, rp.attempt, index + 1))
    rp.event(event_reasons.GENERATION_REPLACED, message)
    rp.set_phase("Running", REPLACING_GENERATION, message)
    return True


def awaiting_replacement(
    rp: ReconcilePass, job: Job, observed: Observed, current: dict[str, PodView], expected: list[str]
) -> bool:
    """While a replaced vLLM pod is not Ready yet: the job stays Running (its trainers run and wait), the
    message says how long the new pod has had of generation.startupTimeoutSeconds, and past that budget
    the gang restarts (GenerationStartupTimeout, counted), as when a first vLLM pod never gets Ready."""
    pod = current.get(expected[0])
    if pod is None or pod.ready:
        return False
    budget = job.spec.generation.startup_timeout_seconds
    since = pod.created or rp.now
    elapsed = (rp.now - since).total_seconds()
    if elapsed >= budget:
        restart_or_fail(
            rp,
            job,
            observed,
            GENERATION_STARTUP_TIMEOUT,
            f"vLLM pod {pod.name}, which replaced a failed one, did not become Ready within "
            f"spec.generation.startupTimeoutSeconds ({budget}s): see its log (kubectl logs {pod.name})",
        )
        return True
    failed = current.get(generation_pod_name(job, rp.attempt, int(pod.name.rsplit("-", 1)[1]) - 1))
    cause = f" after {failed.failure_summary()}" if failed is not None and failed.phase == "Failed" else ""
    message = (
        f"vLLM pod {pod.name} replaces a failed one{cause}; the trainers wait for it "
        f"({duration_text(elapsed)} of {duration_text(budget)})"
    )
    rp.set_phase("Running", REPLACING_GENERATION, message)
    rp.requeue_at(since + timedelta(seconds=budget))
    rp.requeue_at(rp.now + timedelta(seconds=60))  # the elapsed minutes in the message
    return True
