"""Conditions MetricReady, EnvironmentReady and GatewayReady: whether the job's metric service, its
environment server (spec.environment) or, for a client-rollout job, its rollout gateway has a ready pod, and
if not, why."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from grpo_operator.api import event_reasons
from grpo_operator.api.event_reasons import EventReason
from grpo_operator.api.trainer_config import ROLLOUTS_PORT
from grpo_operator.builders import Job
from grpo_operator.builders.common import environment_name, metric_name, rollouts_name
from grpo_operator.reconcile.conditions import ENVIRONMENT_READY, GATEWAY_READY, METRIC_READY, get_condition
from grpo_operator.reconcile.observed import Observed, parse_time
from grpo_operator.reconcile.reconcile_pass import ReconcilePass

# Metric pod states that do not go away by waiting: worth a Warning event, not just a condition.
_METRIC_STUCK_REASONS = frozenset(
    {
        "Unschedulable",
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CrashLoopBackOff",
        "CreateContainerConfigError",
        "FailedCreate",
        "CreateContainerError",
        "RunContainerError",
    }
)

# A new job's MetricReady (and EnvironmentReady) is first said with its Running status, at once when the metric pods are stuck, or with
# another change of the job's status once the metric Deployment is this many seconds old (see
# withhold_first_metric_report).
FIRST_METRIC_REPORT_AFTER_SECONDS = 30.0
# The (phase, reason) of a job whose gang is on its way with nothing in the way: pods being created and
# scheduled, containers starting, vLLM loading the model.
_BRINGING_UP = frozenset(
    {
        ("Pending", "Creating"),
        ("Pending", "Scheduling"),
        ("Initializing", "ContainersStarting"),
        ("Initializing", "WaitingForGeneration"),
    }
)


@dataclass(frozen=True)
class _Service:
    """A Deployment the trainers talk to while they run (the metric service, the environment server) and the
    condition that says whether it has a ready pod."""

    condition: str
    event: EventReason
    name: str  # the Deployment's (and Service's) name
    what: str  # its pods' role label, and what the messages call it
    image: str
    replicas: int
    probe: str  # the readiness probe's path


def _services(job: Job) -> list[_Service]:
    """The job's services whose readiness is a condition: the metric service and the environment server,
    those of the two the spec has."""
    out: list[_Service] = []
    if job.spec.metric is not None:
        spec = job.spec.metric
        out.append(
            _Service(
                METRIC_READY,
                event_reasons.METRIC_NOT_READY,
                metric_name(job),
                "metric",
                spec.image,
                spec.replicas,
                "/healthz",
            )
        )
    if job.spec.environment is not None:
        env = job.spec.environment
        out.append(
            _Service(
                ENVIRONMENT_READY,
                event_reasons.ENVIRONMENT_NOT_READY,
                environment_name(job),
                "environment",
                env.image,
                env.replicas,
                "/health",
            )
        )
    return out


def metric_readiness(rp: ReconcilePass, job: Job, observed: Observed) -> None:
    """Conditions MetricReady and EnvironmentReady: whether the metric service (and the environment server)
    has a ready pod, and if not, why.

    Trainers wait for the metric service (and the environment server) before their first step and give up
    after a while, which costs a counted gang restart; a pod that cannot be scheduled or pulled would
    otherwise show only as repeated restarts. The condition (and a Warning event when it gets stuck) names
    the pod and the cause. It never changes the phase: the gang may be fine and only scoring is down.
    """
    for service in _services(job):
        _readiness(rp, observed, service)


def _readiness(rp: ReconcilePass, observed: Observed, service: _Service) -> None:
    deployment = observed.get("Deployment", service.name) or {}
    available = int((deployment.get("status") or {}).get("availableReplicas") or 0)
    if available >= 1:
        status, reason = "True", "Available"
        message = f"{available} of {service.replicas} {service.what} pod(s) ready; the service answers on {service.name}"
    else:
        status = "False"
        reason, message = _not_ready(service, observed)
    previous = get_condition(list(rp.old.get("conditions") or []), service.condition)
    rp.condition(service.condition, status, reason, message)
    stuck = status == "False" and reason in _METRIC_STUCK_REASONS
    if stuck and (previous is None or previous.get("reason") != reason):
        rp.event(service.event, message)


def withhold_first_metric_report(rp: ReconcilePass, job: Job, observed: Observed) -> None:
    """Leaves MetricReady (and EnvironmentReady) out of a new job's status while its first gang is being
    brought up: it is first written with the status that says Running, or with any other change to the
    status once its Deployment is FIRST_METRIC_REPORT_AFTER_SECONDS old, never in a write of its own.

    The metric service usually comes up a few seconds before the gang, and a status write of its own to say
    so (after the write that said it was starting) was one of a new job's three status writes on its way to
    Running. On a busy cluster the bring-up takes minutes, and a write at a fixed age was still one patch
    per job. While the gang is on its way the metric service holds nothing up (trainers wait for it only
    once they run), so "not said yet" costs the user nothing; a slow bring-up still shows the condition with
    its next phase change (containers starting, vLLM loading). A job that waits for anything else
    (unschedulable, a queue, a volume, a refusal) and metric pods that are stuck (image pull, crash loop,
    unschedulable, refused) are reported at once: that is when a user reads the conditions to find out why.
    Once reported, every change is written as it happens. The environment server's condition is held back
    the same way."""
    for service in _services(job):
        _withhold_first_report(rp, observed, service)


def _withhold_first_report(rp: ReconcilePass, observed: Observed, service: _Service) -> None:
    if get_condition(list(rp.old.get("conditions") or []), service.condition) is not None:
        return
    condition = get_condition(list(rp.new.get("conditions") or []), service.condition)
    if condition is None or (rp.new.get("phase"), rp.new.get("reason")) not in _BRINGING_UP:
        return
    if condition.get("status") == "False" and condition.get("reason") in _METRIC_STUCK_REASONS:
        return
    deployment = observed.get("Deployment", service.name) or {}
    created = parse_time((deployment.get("metadata") or {}).get("creationTimestamp"))
    # No wake-up at that age: with nothing else to write, there is nothing to write then either.
    old_enough = created is not None and rp.now >= created + timedelta(
        seconds=FIRST_METRIC_REPORT_AFTER_SECONDS
    )
    with_it = rp.new.get("conditions")
    rp.drop_condition(service.condition)
    if old_enough and rp.status_changes():
        rp.new["conditions"] = with_it


def _not_ready(service: _Service, observed: Observed) -> tuple[str, str]:
    # The ReplicaSet controller's refusals (quota, Pod Security, admission policies) reach the
    # Deployment as its ReplicaFailure condition; no pod exists to tell anything else.
    what, name = service.what, service.name
    deployment = observed.get("Deployment", name) or {}
    for cond in (deployment.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "ReplicaFailure" and cond.get("status") == "True":
            detail = str(cond.get("message") or "").rstrip(". ")
            return str(cond.get("reason") or "FailedCreate"), (
                f"the API server refused the {what} pods of Deployment {name}: {detail}. "
                "The namespace's ResourceQuota, Pod Security level or an admission policy does not admit "
                "them; the ReplicaSet retries until it does"
            )
    pods = [p for p in observed.pods() if p.role == what and not p.terminating]
    for pod in pods:
        blocked = pod.unschedulable()
        if blocked is None:
            continue
        why, detail = blocked
        if why == "SchedulingGated":
            return why, f"{what} pod {pod.name}: {detail}"
        return "Unschedulable", (
            f"{what} pod {pod.name} cannot be scheduled: {detail.rstrip('. ')}. spec.scheduling.nodeSelector "
            f"applies to the {what} pod too; use spec.scheduling.gpuNodeSelector for labels only GPU nodes carry"
        )
    for pod in pods:
        waiting = pod.waiting()
        if waiting is not None:
            why, detail = waiting
            hint = f" (image {service.image})" if "Image" in why else ""
            return why, f"{what} pod {pod.name} is waiting: {why}{hint}{': ' + detail if detail else ''}"
    # Being created, no pod yet, or pods starting: one state, so the status is not rewritten for each.
    return "Starting", (
        f"no {what} pod is ready yet; the service answers once a pod's {service.probe} returns 200"
    )


def gateway_readiness(rp: ReconcilePass, job: Job, observed: Observed) -> None:
    """Condition GatewayReady: whether the rollout gateway of a client-rollout job has a ready pod, and if
    not, why. Like MetricReady it never changes the phase: the client sees the gateway's absence itself."""
    name = rollouts_name(job)
    deployment = observed.get("Deployment", name) or {}
    ready = int((deployment.get("status") or {}).get("availableReplicas") or 0) >= 1
    reason, message = "Available", f"the rollout gateway answers on Service {name}, port {ROLLOUTS_PORT}"
    if not ready:
        reason, message = "Starting", f"the rollout gateway {name} has no ready pod yet"
        for cond in (deployment.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "ReplicaFailure" and cond.get("status") == "True":
                reason = str(cond.get("reason") or "FailedCreate")
                message = f"the API server refused the pods of Deployment {name}: {cond.get('message')}"
        for pod in (p for p in observed.pods() if p.role == "rollouts" and not p.terminating):
            blocked = pod.unschedulable() or pod.waiting()
            if blocked is not None:
                reason, detail = blocked
                message = f"rollout gateway pod {pod.name}: {reason}{': ' + detail if detail else ''}"
                break
    previous = get_condition(list(rp.old.get("conditions") or []), GATEWAY_READY)
    rp.condition(GATEWAY_READY, "True" if ready else "False", reason, message)
    stuck = not ready and reason in _METRIC_STUCK_REASONS
    if stuck and (previous is None or previous.get("reason") != reason):
        rp.event(event_reasons.GATEWAY_NOT_READY, message)
