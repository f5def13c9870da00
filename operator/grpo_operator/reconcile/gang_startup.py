"""A gang that does not run yet, or no longer advances: what it waits for (the status says it in the
scheduler's, Kueue's or the API server's words), the three start-up clocks, and the progress deadline."""

from __future__ import annotations

from datetime import datetime, timedelta

from grpo_operator.api import event_reasons
from grpo_operator.builders import Job
from grpo_operator.builders.common import KUEUE_GROUP_LABEL
from grpo_operator.reconcile.conditions import RUNNING, SCHEDULED, SUSPENDED, get_condition
from grpo_operator.reconcile.gang_restart import SCHEDULING_MESSAGE, restart_or_fail
from grpo_operator.reconcile.observed import Observed, PodView, parse_time
from grpo_operator.reconcile.reconcile_pass import ReconcilePass
from grpo_operator.reconcile.restart_policy import (
    GENERATION_STARTUP_TIMEOUT,
    PREEMPTED,
    PROGRESS_DEADLINE_EXCEEDED,
    STARTUP_DEADLINE_EXCEEDED,
)


def report_waiting(
    rp: ReconcilePass, job: Job, observed: Observed, expected: list[str], present: list[PodView]
) -> None:
    """Pods exist (or are being created) but not all run: Pending, Initializing or Restarting."""
    attempt = rp.attempt
    blocked = next(((p, p.unschedulable()) for p in present if p.unschedulable() is not None), None)
    refused = _refusal(observed, expected, present)
    if refused is not None:
        # The ChildRejected event with the same words comes from the write that was refused.
        rp.condition(SCHEDULED, "False", "ChildRejected", refused)
        rp.condition(RUNNING, "False", "Pending", refused)
        rp.set_phase("Pending", "ChildRejected", refused)
    elif blocked is not None:
        pod, (why, detail) = blocked[0], blocked[1]  # type: ignore[misc]
        if why == "SchedulingGated":
            wait = event_reasons.WAITING_FOR_ADMISSION
            message = f"pod {pod.name} is not yet admitted by its queue: {detail}"
            group = pod.labels.get(KUEUE_GROUP_LABEL)
            kueue_says = observed.kueue_wait(group) if group else None
            if kueue_says:
                message = f"Kueue has not admitted workload {group}: {kueue_says}"
            if rp.new.get("reason") == PREEMPTED.reason and rp.old_phase in ("Restarting", "Pending"):
                # Keep saying why the job left Running until Kueue admits it again.
                wait = event_reasons.PREEMPTED
                message = f"preempted by Kueue; waiting to be admitted again. {message}"
        else:
            wait = event_reasons.UNSCHEDULABLE
            message = f"pod {pod.name} cannot be scheduled: {detail}"
        rp.condition(SCHEDULED, "False", wait.reason, message)
        rp.condition(RUNNING, "False", "Pending", message)
        if rp.new.get("reason") != wait.reason or rp.old_phase != "Pending":
            rp.event(wait, message)
        rp.set_phase("Pending", wait.reason, message)
    else:
        all_scheduled = len(present) == len(expected) and all(p.scheduled for p in present)
        if all_scheduled:
            rp.condition(SCHEDULED, "True", "AllPodsScheduled", f"all {len(expected)} pods are scheduled")
        else:
            rp.condition(SCHEDULED, "False", "Scheduling", SCHEDULING_MESSAGE)
        waiting = next(((p, p.waiting()) for p in present if p.waiting() is not None), None)
        if rp.old_phase == "Restarting":
            phase, reason = "Restarting", str(rp.new.get("reason") or "Restarting")
            message = f"gang attempt {attempt} replaces the previous one ({reason}); its pods are starting"
        elif all_scheduled:
            phase, reason = "Initializing", "ContainersStarting"
            message = f"all pods of gang attempt {attempt} are scheduled; containers are starting"
            generation = _starting_generation(present)
            if generation is not None:
                reason = "WaitingForGeneration"
                message = _generation_wait(rp, job, generation)
            if waiting is not None:
                pod, (why, detail) = waiting[0], waiting[1]  # type: ignore[misc]
                reason = why
                blocked_on = f"pod {pod.name} is waiting: {why}{': ' + detail if detail else ''}"
                message = f"{message}; {blocked_on}" if generation is not None else blocked_on
        else:
            phase, reason = "Pending", "Scheduling"
            message = f"gang attempt {attempt}: waiting for {len(expected)} pods to be created and scheduled"
        rp.condition(RUNNING, "False", phase, message)
        rp.set_phase(phase, reason, message)
    mark_not_suspended(rp)
    _startup_deadline(rp, job, observed, present)


def _refusal(observed: Observed, expected: list[str], present: list[PodView]) -> str | None:
    """Why children are missing when the API server refused them (quota, Pod Security, admission
    policies), in the refusal's own words; None when nothing was refused. A refused pod of this attempt
    comes first: it is what keeps the gang from running."""
    missing = set(expected) - {p.name for p in present}
    # Sorted: concurrent writes are refused in any order, and the message must not change with it.
    ordered = sorted(observed.refusals, key=lambda r: (r.kind, r.name))
    pods = [r for r in ordered if r.kind == "Pod" and r.name in missing]
    refusals = pods or [r for r in ordered if r.kind != "Pod"]
    if not refusals:
        return None
    first = refusals[0]
    more = f" ({len(refusals) - 1} more refused)" if len(refusals) > 1 else ""
    return (
        f"the API server refused {first.kind} {first.name}{more}: {first.message.rstrip('. ')}. "
        "The namespace's ResourceQuota, Pod Security level or an admission policy does not admit it; "
        "the operator retries until it does"
    )


def mark_not_suspended(rp: ReconcilePass) -> None:
    suspended = get_condition(list(rp.new.get("conditions") or []), SUSPENDED)
    if suspended is not None and suspended.get("status") == "True":
        rp.condition(SUSPENDED, "False", "Resumed", "the job was resumed")


def _starting_generation(present: list[PodView]) -> PodView | None:
    """The attempt's vLLM pod while it has started (kubelet accepted it) but is not Ready yet."""
    return next(
        (p for p in present if p.role == "generation" and p.started is not None and not p.ready), None
    )


def _generation_wait(rp: ReconcilePass, job: Job, pod: PodView) -> str:
    budget = job.spec.generation.startup_timeout_seconds
    elapsed = (rp.now - pod.started).total_seconds() if pod.started is not None else 0.0
    return (
        f"waiting for vLLM pod {pod.name} to become Ready ({duration_text(elapsed)} of {duration_text(budget)}: "
        "image pull, model download, CUDA graph capture)"
    )


def duration_text(seconds: float) -> str:
    """Whole minutes past the first one (the status is not rewritten more than once a minute)."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return "<1m"
    hours, minutes = divmod(seconds // 60, 60)
    return f"{hours}h{minutes}m" if hours and minutes else f"{hours}h" if hours else f"{minutes}m"


def _startup_deadline(rp: ReconcilePass, job: Job, observed: Observed, present: list[PodView]) -> None:
    """Three clocks, so that a slow vLLM start-up never spends the startup deadline:

    * while pods wait for the scheduler (or Kueue) and vLLM has not started: runPolicy.startupDeadlineSeconds
      from the attempt's pods being created; on expiry the job fails;
    * while vLLM starts (its pod accepted by a node, not Ready yet, every pod scheduled):
      generation.startupTimeoutSeconds from the vLLM pod's start (each replica's); on expiry a counted
      restart, as when the trainers give up waiting for it;
    * once vLLM is Ready (every replica): runPolicy.startupDeadlineSeconds from then, for the trainers to
      run.
    """
    created = [p.created for p in present if p.created is not None]
    if not created:
        return
    limit = job.spec.run_policy.startup_deadline_seconds
    generations = [p for p in present if p.role == "generation"]
    all_scheduled = all(p.scheduled for p in present)
    ready = [p.ready_since for p in generations if p.ready_since is not None]
    # With several vLLM replicas, the one that started first and is not Ready yet has the nearest deadline.
    starting = sorted(
        (p for p in generations if p.ready_since is None and p.started is not None),
        key=lambda p: p.started or rp.now,
    )
    generation = starting[0] if starting else None
    if generations and len(ready) == len(generations):
        deadline = max(min(created), *ready) + timedelta(seconds=limit)
    elif generation is not None and generation.started is not None and all_scheduled:
        budget = job.spec.generation.startup_timeout_seconds
        deadline = generation.started + timedelta(seconds=budget)
        if rp.now < deadline:
            rp.requeue_at(deadline)
            # The status shows the elapsed time in minutes: come back to update it.
            rp.requeue_at(rp.now + timedelta(seconds=60))
            return
        rp.plan.events = [e for e in rp.plan.events if e.type == "Normal"]
        restart_or_fail(
            rp,
            job,
            observed,
            GENERATION_STARTUP_TIMEOUT,
            f"vLLM pod {generation.name} did not become Ready within spec.generation.startupTimeoutSeconds "
            f"({budget}s) of starting: see its log (kubectl logs {generation.name}); raise "
            "startupTimeoutSeconds if the download only needs longer",
        )
        return
    else:
        deadline = min(created) + timedelta(seconds=limit)
    if rp.now < deadline:
        rp.requeue_at(deadline)
        return
    why = str(rp.new.get("message") or "")
    # The Failed event says it all; a Pending/Unschedulable event from this same reconcile would repeat it.
    rp.plan.events = [e for e in rp.plan.events if e.type == "Normal"]
    restart_or_fail(
        rp,
        job,
        observed,
        STARTUP_DEADLINE_EXCEEDED,
        f"gang attempt {rp.attempt} was not running within spec.runPolicy.startupDeadlineSeconds "
        f"({limit}s): {why}",
    )


def stalled(rp: ReconcilePass, job: Job, observed: Observed, generation: PodView | None) -> bool:
    """Running, but no step advance for runPolicy.progressDeadlineSeconds: a stall (counted restart). The
    clock starts again when a replaced vLLM pod gets Ready: the trainers waited for it on its own clock."""
    limit = job.spec.run_policy.progress_deadline_seconds
    running = get_condition(list(rp.old.get("conditions") or []), RUNNING)
    since = (
        parse_time(running.get("lastTransitionTime"))
        if running is not None and running.get("status") == "True" and rp.old_phase == "Running"
        else None
    )
    if since is None:
        since = rp.now  # the gang becomes Running with this reconcile: the clock starts now
    if generation is not None and generation.ready_since is not None:
        since = max(since, generation.ready_since)
    last_step = parse_time((rp.old.get("progress") or {}).get("lastStepTime"))
    base = max(since, last_step) if last_step is not None else since
    if _waiting_for_client(rp, base):
        # A client-rollout trainer waiting for the client's next groups is not stalled: the client decides
        # when its rollouts are done (DSPy may be validating). Look again within the deadline.
        rp.requeue_at(rp.now + timedelta(seconds=limit))
        return False
    deadline = base + timedelta(seconds=limit)
    if rp.now < deadline:
        rp.requeue_at(deadline)
        return False
    step_no = (rp.old.get("progress") or {}).get("step")
    at = f" (last step {step_no})" if step_no is not None else " (no step completed yet)"
    restart_or_fail(
        rp,
        job,
        observed,
        PROGRESS_DEADLINE_EXCEEDED,
        f"no training step completed for {limit}s{at}: the gang is considered stalled",
    )
    return True


def _waiting_for_client(rp: ReconcilePass, base: datetime) -> bool:
    """Trainer rank 0 of the running gang reports (status.progress.waitingForClientSince) that it waits for
    the client's groups: set since the gang runs and since its last step (an older value is stale: a
    trainer that died waiting, or one that got its groups and did not clear it)."""
    waiting = parse_time((rp.old.get("progress") or {}).get("waitingForClientSince"))
    return waiting is not None and waiting >= base
