"""The end of a job: success, failure, what a finished job keeps, and its time to live."""

from __future__ import annotations

from datetime import timedelta

from grpo_operator.api import event_reasons
from grpo_operator.builders import Job
from grpo_operator.reconcile.children import delete_gateway, delete_metric_workload, delete_pods
from grpo_operator.reconcile.conditions import (
    FAILED,
    GATEWAY_READY,
    METRIC_READY,
    RUNNING,
    SUCCEEDED,
    format_time,
)
from grpo_operator.reconcile.observed import Observed, parse_time
from grpo_operator.reconcile.step import Step


def fail(step: Step, job: Job, observed: Observed, reason: str, message: str) -> None:
    step.set_phase("Failed", reason, message)
    step.new["completionTime"] = format_time(step.now)
    step.condition(FAILED, "True", reason, message)
    step.condition(RUNNING, "False", "Failed", message)
    step.event(event_reasons.FAILED, message)
    clean_up_finished(step, job, observed)
    ttl(step, job)


def succeed(step: Step, job: Job, observed: Observed) -> None:
    progress = step.old.get("progress") or {}
    steps = progress.get("step")
    done = f" after {steps}/{job.spec.grpo.steps} steps" if steps is not None else ""
    message = f"training finished{done}: trainer rank 0 exited successfully"
    step.set_phase("Succeeded", "Completed", message)
    step.new["completionTime"] = format_time(step.now)
    step.condition(SUCCEEDED, "True", "Completed", message)
    step.condition(RUNNING, "False", "Succeeded", message)
    step.event(event_reasons.SUCCEEDED, message)
    clean_up_finished(step, job, observed)
    ttl(step, job)


def clean_up_finished(step: Step, job: Job, observed: Observed) -> None:
    """A finished job keeps its config, volume, Services and terminated trainer pods (for logs); the vLLM
    server, still-running pods and the metric service are stopped; a failed client-rollout job's gateway too."""
    delete_pods(
        step,
        observed,
        lambda pod: pod.role == "generation" or (pod.role == "trainer" and not pod.finished),
    )
    delete_metric_workload(step, job, observed)
    step.drop_condition(METRIC_READY)
    if step.new.get("phase") == "Failed":
        # A failed job's client must not wait on a gateway whose trainer never comes back: without the
        # gateway its next call fails at once. After success the gateway stays, answering status and
        # terminate (DSPy calls terminate after its last step), until the job is deleted.
        delete_gateway(step, job, observed)
        step.drop_condition(GATEWAY_READY)


def ttl(step: Step, job: Job) -> None:
    ttl = job.spec.run_policy.ttl_seconds_after_finished
    finished = parse_time(step.new.get("completionTime"))
    if ttl is None or finished is None:
        return
    expiry = finished + timedelta(seconds=ttl)
    if step.now >= expiry:
        step.plan.delete_job = True
    else:
        step.requeue_at(expiry)
