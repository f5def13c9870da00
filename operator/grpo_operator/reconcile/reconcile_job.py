"""The one reconcile function: (job, observed children, now, settings) -> Plan. Pure and level-based.

It never remembers anything between calls: every decision is derived from the job object (spec and
the operator's own status fields) and the children as they are now. Running it again on the result
of its own plan yields an empty plan, and an operator killed half-way through executing a plan
reaches the same decisions after a restart, so children are never duplicated (deterministic names).

This module holds the entry and the job's lifecycle steps (invalid spec, platform limits, start,
suspend, resume, active deadline); the gang's own course is in gang.py, the end of a job in
finished.py, the metric service's (and environment server's) condition in metric_readiness.py and child upkeep
in children.py.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError

from grpo_operator.api import event_reasons
from grpo_operator.api.resource import compute_rollouts
from grpo_operator.api.status import GATEWAY_TOKEN_SECRET_FIELD, TERMINAL_PHASES
from grpo_operator.builders import Job, generated_secrets, infrastructure, job_from_object
from grpo_operator.builders.children import metric_workload
from grpo_operator.builders.common import client_rollouts
from grpo_operator.reconcile import ownership
from grpo_operator.reconcile.budget import (
    Budget,
    budget_condition,
    read_budget,
    resumed_cause,
    showback_limits,
)
from grpo_operator.reconcile.children import (
    check_conflicts,
    delete_metric_workload,
    delete_pods,
    delete_strays,
    ensure,
    ensure_secrets,
    split_strays,
)
from grpo_operator.reconcile.conditions import (
    ENVIRONMENT_READY,
    FAILED,
    METRIC_READY,
    RUNNING,
    SCHEDULED,
    SUSPENDED,
    format_time,
    get_condition,
    truncate,
)
from grpo_operator.reconcile.finished import clean_up_finished, ttl
from grpo_operator.reconcile.forecast import forecast_status
from grpo_operator.reconcile.gang import run_gang
from grpo_operator.reconcile.gang_restart import restart_or_fail
from grpo_operator.reconcile.learning_health import learning_condition
from grpo_operator.reconcile.metric_readiness import (
    gateway_readiness,
    metric_readiness,
    withhold_first_metric_report,
)
from grpo_operator.reconcile.observed import Observed, parse_time
from grpo_operator.reconcile.plan import Plan
from grpo_operator.reconcile.platform_policy import PLATFORM_POLICY, platform_violations
from grpo_operator.reconcile.reconcile_pass import (
    GANG_ROLES,
    OWNED_STATUS_FIELDS,
    ReconcilePass,
    resume_point,
)
from grpo_operator.reconcile.record import read_record, sanitize_status
from grpo_operator.reconcile.restart_policy import DEADLINE_EXCEEDED
from grpo_operator.reconcile.served_model import served_model_condition
from grpo_operator.reconcile.spend import job_charges
from grpo_operator.reconcile.update_health import updates_condition
from grpo_operator.settings import OperatorSettings


def reconcile(job_obj: dict[str, Any], observed: Observed, now: datetime, settings: OperatorSettings) -> Plan:
    """Decide what to do for one GRPOJob. ``now`` is timezone-aware."""
    # The settings of the job's namespace: its team's limits, images, placement and defaults (Helm teams).
    settings = settings.for_namespace(str((job_obj.get("metadata") or {}).get("namespace") or ""))
    raw = job_obj.get("status")
    actual = dict(raw) if isinstance(raw, dict) else {}
    record = read_record(job_obj)
    old = sanitize_status(actual, record)
    new = {k: old[k] for k in OWNED_STATUS_FIELDS if k in old}
    meta = job_obj.get("metadata") or {}
    parts = ownership.split(observed, meta)
    observed, strays = split_strays(parts.mine, meta)
    rp = ReconcilePass(
        obj=job_obj,
        now=now,
        settings=settings,
        old=old,
        new=new,
        actual=actual,
        record=record,
        foreign=parts.foreign,
        strays=strays,
    )
    if meta.get("deletionTimestamp"):
        # No finalizer: the garbage collector removes the children through their owner references.
        rp.plan.phase = rp.old_phase
        return rp.plan

    delete_strays(rp, strays)
    try:
        # The token Secret's name from the operator's own record: the trainer may write the status.
        job = job_from_object(job_obj, gateway_token_secret=old.get(GATEWAY_TOKEN_SECRET_FIELD))
    except ValidationError as exc:
        return invalid_spec(rp, exc)

    rp.new["observedGeneration"] = rp.generation
    rp.new["rollouts"] = compute_rollouts(job.spec)
    bill = job_charges(rp, job)
    forecast_status(rp, job, bill)

    if rp.old_phase in TERMINAL_PHASES:
        clean_up_finished(rp, job, observed)
        ttl(rp, job)
        return rp.finish()

    violations = platform_violations(job.spec, settings)
    if violations:
        return policy_violation(rp, violations)
    if get_condition(list(rp.old.get("conditions") or []), PLATFORM_POLICY) is not None:
        rp.condition(PLATFORM_POLICY, "True", "Allowed", "the job meets the platform's limits")

    budget = read_budget(rp, job, bill)
    budget_condition(rp, budget)
    showback_limits(rp, budget)
    suspended = job.spec.suspend or (budget is not None and budget.exhausted)
    desired = infrastructure(job, settings)
    if not suspended:
        desired += metric_workload(job, settings)
    check_conflicts(rp, job, desired, suspended=suspended)
    ensure_secrets(rp, generated_secrets(job))
    ensure(rp, observed, infrastructure(job, settings))

    if suspended:
        suspend(rp, job, observed, budget)
        return rp.finish()
    if rp.plan.secrets:
        return awaiting_secrets(rp)

    ensure(rp, observed, metric_workload(job, settings))
    if client_rollouts(job):
        gateway_readiness(rp, job, observed)
    else:
        metric_readiness(rp, job, observed)

    if rp.conflict is not None and rp.attempt == 0:
        # Nothing has started: no gang, no Created event, until the name is free.
        rp.set_phase("Pending", "ChildConflict", rp.conflict)
        return rp.finish()
    if rp.old_phase == "Suspended":
        resume(rp, resumed_cause(rp, budget))
    elif rp.attempt == 0:
        start(rp, job)

    if active_deadline(rp, job, observed):
        return rp.finish()
    run_gang(rp, job, observed)
    served_model_condition(rp)
    updates_condition(rp)
    learning_condition(rp)
    if not client_rollouts(job):
        withhold_first_metric_report(rp, job, observed)
    return rp.finish()


def awaiting_secrets(rp: ReconcilePass) -> Plan:
    """The gateway and trainer rank 0 read the token Secret this plan creates: they are built once the
    runtime has recorded its name, which wakes the job again. A running gang (its recorded name lost) is
    left as it is until then."""
    if rp.conflict is not None and rp.attempt == 0:
        rp.set_phase("Pending", "ChildConflict", rp.conflict)
    elif rp.attempt == 0:
        rp.set_phase("Pending", "Creating", "creating the rollout gateway's token Secret")
    return rp.finish()


def invalid_spec(rp: ReconcilePass, exc: ValidationError) -> Plan:
    errors = "; ".join(
        f"spec.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" if err["loc"] else err["msg"]
        for err in exc.errors()
    )
    message = (
        f"the spec is invalid and cannot be run: {errors}. Fix the spec (kubectl edit) or recreate the job."
    )
    if rp.old_phase != "Failed":
        rp.set_phase("Failed", "InvalidSpec", message)
        rp.new["completionTime"] = format_time(rp.now)
        rp.condition(FAILED, "True", "InvalidSpec", message)
        rp.event(event_reasons.INVALID_SPEC, message)
    return rp.finish()


def policy_violation(rp: ReconcilePass, violations: list[str]) -> Plan:
    """Nothing is created or replaced for a job that breaks a platform limit; pods already running
    (a limit tightened after the job started) are left alone. Fixing the spec lets it carry on."""
    message = (
        "the job breaks the platform's limits, so the operator creates no pods for it until the spec "
        "is changed to fit: " + "; ".join(violations)
    )
    previous = get_condition(list(rp.old.get("conditions") or []), PLATFORM_POLICY)
    rp.condition(PLATFORM_POLICY, "False", "PolicyViolation", message)
    if previous is None or previous.get("status") != "False" or previous.get("message") != truncate(message):
        rp.event(event_reasons.POLICY_VIOLATION, message)
    if rp.attempt == 0:
        rp.set_phase("Pending", "PolicyViolation", message)
    return rp.finish()


def start(rp: ReconcilePass, job: Job) -> None:
    rp.new["trainerAttempt"] = 1
    rp.new.setdefault("restarts", 0)
    rp.new["startTime"] = format_time(rp.now)
    trainers = job.spec.trainer.nodes
    rp.set_phase("Pending", "Creating", "creating the job's children and its first gang of pods")
    servers = job.spec.generation.server_count()
    if servers == 0:
        vllm = "no vLLM pod (generation colocated in the trainer processes)"
    elif servers == 1:
        vllm = f"1 vLLM pod ({job.spec.generation.gpus} GPU)"
    else:
        vllm = f"{servers} vLLM pods ({job.spec.generation.gpus} GPU each)"
    message = (
        f"created the job's children and gang attempt 1: {vllm} and "
        f"{trainers} trainer pod{'s' if trainers > 1 else ''} ({job.spec.trainer.gpus_per_node} GPU each)"
    )
    # The stored spec shows the preset, not what it set: say it where `kubectl describe` shows it.
    preset = job.spec.preset_summary()
    rp.event(event_reasons.CREATED, f"{message}; {preset}" if preset else message)


def suspend(rp: ReconcilePass, job: Job, observed: Observed, budget: Budget | None) -> None:
    """spec.suspend, or a spent budget (spec.suspend's words win when both hold): the same path for both."""
    delete_pods(rp, observed, lambda pod: pod.role in GANG_ROLES)
    delete_metric_workload(rp, job, observed)
    if job.spec.suspend:
        reason, event = "Suspended", event_reasons.SUSPENDED
        message = (
            "spec.suspend is true: all pods are stopped; the volume and status are kept. "
            "Set spec.suspend to false to resume from the last checkpoint."
        )
        if budget is not None and budget.exhausted:
            message += (
                f" The job has also spent {budget.figures()}: it resumes only once that limit is raised."
            )
    else:
        assert budget is not None, "suspended without spec.suspend: the budget is spent"
        event = event_reasons.BUDGET_EXHAUSTED
        reason, message = event.reason, budget.exhausted_message()
    entering = rp.old_phase != "Suspended" or rp.old.get("reason") != reason
    if entering or rp.old.get("message") != truncate(message):
        rp.set_phase("Suspended", reason, message)
        rp.condition(SUSPENDED, "True", reason, message)
    if entering:
        rp.condition(RUNNING, "False", "Suspended", "the job is suspended")
        rp.drop_condition(SCHEDULED)
        rp.drop_condition(METRIC_READY)
        rp.drop_condition(ENVIRONMENT_READY)
        rp.event(event, message)


def resume(rp: ReconcilePass, cause: str) -> None:
    attempt = rp.attempt + 1
    rp.new["trainerAttempt"] = attempt
    rp.new["generationAttempt"] = attempt
    rp.new.setdefault("restarts", 0)
    # Like a Kubernetes Job: the active deadline counts from the last resume.
    rp.new["startTime"] = format_time(rp.now)
    where = resume_point(rp)
    rp.set_phase("Pending", "Resumed", f"resumed with gang attempt {attempt}, {where}")
    rp.condition(SUSPENDED, "False", "Resumed", f"resumed, {where}")
    rp.event(event_reasons.RESUMED, f"{cause}: starting gang attempt {attempt}, {where}")
    if rp.checkpoint_path:
        rp.event(event_reasons.RESUMED_FROM_CHECKPOINT, f"gang attempt {attempt} {where}")


def active_deadline(rp: ReconcilePass, job: Job, observed: Observed) -> bool:
    limit = job.spec.run_policy.active_deadline_seconds
    started = parse_time(rp.new.get("startTime"))
    if limit is None or started is None:
        return False
    if not rp.due(started + timedelta(seconds=limit)):
        return False
    restart_or_fail(
        rp,
        job,
        observed,
        DEADLINE_EXCEEDED,
        f"the job ran longer than spec.runPolicy.activeDeadlineSeconds ({limit}s)",
    )
    return True
