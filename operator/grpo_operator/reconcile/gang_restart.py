"""Restarting the gang, or failing the job, as the restart policy says for a rule."""

from __future__ import annotations

from grpo_operator.api import event_reasons
from grpo_operator.builders import Job
from grpo_operator.reconcile.children import delete_pods
from grpo_operator.reconcile.conditions import RUNNING, SCHEDULED
from grpo_operator.reconcile.finished import fail
from grpo_operator.reconcile.observed import Observed
from grpo_operator.reconcile.plan import Restart
from grpo_operator.reconcile.reconcile_pass import GANG_ROLES, ReconcilePass, resume_point
from grpo_operator.reconcile.restart_policy import BACKOFF_LIMIT_EXCEEDED, RestartRule

SCHEDULING_MESSAGE = "waiting for the scheduler to place the pods"


def restart_or_fail(
    rp: ReconcilePass,
    job: Job,
    observed: Observed,
    rule: RestartRule,
    message: str,
    *,
    keep_generation: bool = False,
) -> None:
    """What the restart policy says for ``rule``: fail the job at once, fail it because the counted
    restarts are spent, or restart the gang (the trainers alone, keeping the running vLLM pods, with
    ``keep_generation``: gang.py decides when that is safe)."""
    if rule.permanent:
        fail(rp, job, observed, rule.reason, message)
        return
    limit = job.spec.run_policy.backoff_limit
    if rule.counted and rp.restarts >= limit:
        fail(
            rp,
            job,
            observed,
            BACKOFF_LIMIT_EXCEEDED.reason,
            f"{message}; spec.runPolicy.backoffLimit ({limit}) is exhausted after {rp.restarts} restart(s)",
        )
        return
    _restart(rp, job, observed, rule, message, keep_generation)


def _restart(
    rp: ReconcilePass, job: Job, observed: Observed, rule: RestartRule, message: str, keep_generation: bool
) -> None:
    """Replace the gang (or its trainers alone) by a new attempt that resumes from the last verified
    checkpoint."""
    attempt = rp.attempt + 1
    served_by = rp.generation_attempt
    restarts = rp.restarts + (1 if rule.counted else 0)
    limit = job.spec.run_policy.backoff_limit
    budget = f"restart {restarts}/{limit}" if rule.counted else "not counted against backoffLimit"
    where = resume_point(rp)
    rp.new["trainerAttempt"] = attempt
    rp.new["restarts"] = restarts
    if keep_generation:
        rp.new["generationAttempt"] = served_by
        step = (rp.old.get("progress") or {}).get("step")
        rp.new["generationKeptAtStep"] = step if isinstance(step, int) and step >= 0 else 0
        full = (
            f"{message}; restarting the trainers as attempt {attempt} ({budget}), {where}, beside the running "
            f"vLLM pods of attempt {served_by}"
        )
    else:
        rp.new["generationAttempt"] = attempt
        rp.new["generationKeptAtStep"] = None
        full = f"{message}; restarting the gang as attempt {attempt} ({budget}), {where}"
    rp.set_phase("Restarting", rule.reason, full)
    rp.condition(RUNNING, "False", "Restarting", full)
    # The new gang's pods exist once this plan is carried out, but nothing has placed them yet.
    rp.condition(SCHEDULED, "False", "Scheduling", SCHEDULING_MESSAGE)
    rp.event(event_reasons.RESTARTING, full)
    if rp.checkpoint_path:
        rp.event(event_reasons.RESUMED_FROM_CHECKPOINT, f"gang attempt {attempt} {where}")
    rp.plan.restart = Restart(reason=rule.reason, counted=rule.counted, message=message)
    # The new gang is created by a later reconcile, once every pod of this one is gone (see run_gang).
    roles = ("trainer",) if keep_generation else GANG_ROLES
    delete_pods(rp, observed, lambda pod: pod.role in roles)
