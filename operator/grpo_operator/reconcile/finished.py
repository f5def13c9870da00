"""The end of a job: success, failure, what a finished job keeps, and its time to live."""

from __future__ import annotations

from datetime import timedelta

from grpo_operator.api import event_reasons
from grpo_operator.builders import Job
from grpo_operator.reconcile.children import delete_gateway, delete_metric_workload, delete_pods
from grpo_operator.reconcile.conditions import (
    ENVIRONMENT_READY,
    FAILED,
    GATEWAY_READY,
    METRIC_READY,
    RUNNING,
    SUCCEEDED,
    format_time,
)
from grpo_operator.reconcile.observed import Observed, parse_time
from grpo_operator.reconcile.reconcile_pass import ReconcilePass


def fail(rp: ReconcilePass, job: Job, observed: Observed, reason: str, message: str) -> None:
    rp.set_phase("Failed", reason, message)
    rp.new["completionTime"] = format_time(rp.now)
    rp.condition(FAILED, "True", reason, message)
    rp.condition(RUNNING, "False", "Failed", message)
    rp.event(event_reasons.FAILED, message)
    clean_up_finished(rp, job, observed)
    ttl(rp, job)


def succeed(rp: ReconcilePass, job: Job, observed: Observed) -> None:
    progress = rp.old.get("progress") or {}
    steps = progress.get("step")
    done = f" after {steps}/{job.spec.grpo.steps} steps" if steps is not None else ""
    message = f"training finished{done}: trainer rank 0 exited successfully"
    rp.set_phase("Succeeded", "Completed", message)
    rp.new["completionTime"] = format_time(rp.now)
    rp.condition(SUCCEEDED, "True", "Completed", message)
    rp.condition(RUNNING, "False", "Succeeded", message)
    rp.event(event_reasons.SUCCEEDED, message)
    clean_up_finished(rp, job, observed)
    ttl(rp, job)


def clean_up_finished(rp: ReconcilePass, job: Job, observed: Observed) -> None:
    """A finished job keeps its config, volume, Services and terminated trainer pods (for logs); the vLLM
    server, still-running pods, the metric service and the environment server are stopped; a failed
    client-rollout job's gateway too."""
    delete_pods(
        rp,
        observed,
        lambda pod: pod.role == "generation" or (pod.role == "trainer" and not pod.finished),
    )
    delete_metric_workload(rp, job, observed)
    rp.drop_condition(METRIC_READY)
    rp.drop_condition(ENVIRONMENT_READY)
    if rp.new.get("phase") == "Failed":
        # A failed job's client must not wait on a gateway whose trainer never comes back: without the
        # gateway its next call fails at once. After success the gateway stays, answering status and
        # terminate (DSPy calls terminate after its last step), until the job is deleted.
        delete_gateway(rp, job, observed)
        rp.drop_condition(GATEWAY_READY)


def ttl(rp: ReconcilePass, job: Job) -> None:
    ttl = job.spec.run_policy.ttl_seconds_after_finished
    finished = parse_time(rp.new.get("completionTime"))
    if ttl is None or finished is None:
        return
    expiry = finished + timedelta(seconds=ttl)
    if rp.now >= expiry:
        rp.plan.delete_job = True
    else:
        rp.requeue_at(expiry)
