"""The one reconcile function: (job, observed children, now, settings) -> Plan. Pure and level-based.

It never remembers anything between calls: every decision is derived from the job object (spec and
the operator's own status fields) and the children as they are now. Running it again on the result
of its own plan yields an empty plan, and an operator killed half-way through executing a plan
reaches the same decisions after a restart, so children are never duplicated (deterministic names).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import PurePosixPath
from typing import Any

from pydantic import ValidationError

from grpo_operator.api.resource import compute_rollouts
from grpo_operator.api.status import TERMINAL_PHASES
from grpo_operator.api.trainer_config import ROLLOUTS_PORT
from grpo_operator.builders import Job, Manifest, gang_hash, gang_pods, infrastructure, job_from_object
from grpo_operator.builders.children import metric_workload
from grpo_operator.builders.common import (
    ANNOTATION_HASH,
    KUEUE_GROUP_LABEL,
    KUEUE_RETRIABLE_ANNOTATION,
    client_rollouts,
    generation_pod_name,
    metric_name,
    rollouts_name,
    trainer_pod_name,
)
from grpo_operator.reconcile import ownership
from grpo_operator.reconcile.conditions import (
    CONFLICT,
    FAILED,
    GATEWAY_READY,
    METRIC_READY,
    RUNNING,
    SCHEDULED,
    SUCCEEDED,
    SUSPENDED,
    format_time,
    get_condition,
    set_condition,
    truncate,
)
from grpo_operator.reconcile.observed import Observed, PodView, parse_time
from grpo_operator.reconcile.plan import ChildPatch, ChildRef, Event, Plan, Restart
from grpo_operator.reconcile.policy import PLATFORM_POLICY, platform_violations
from grpo_operator.reconcile.record import read_record, sanitize_status, trusted_fields
from grpo_operator.settings import OperatorSettings

# Status fields the operator owns. The trainer owns progress, rewards and checkpoint; the operator
# reads them but never writes them (its status patch never names them).
OWNED_STATUS_FIELDS = (
    "phase",
    "reason",
    "message",
    "conditions",
    "restarts",
    "trainerAttempt",
    "rollouts",
    "startTime",
    "completionTime",
    "observedGeneration",
)

GANG_ROLES = ("trainer", "generation")

# Trainer exit codes with a reason of their own (the trainer's ExitCode, docs/trainer.md "Exit codes"):
# 4 = the checkpoint found is another job's or for other weights (permanent), 5 = a non-finite step
# (a counted restart from the last good checkpoint).
TRAINER_EXIT_REASONS = {
    4: "CheckpointMismatch",
    5: "NonFiniteTraining",
    6: "OutOfMemory",
    7: "CancelledByClient",
}
# What a permanent trainer exit means, for status.message; codes not listed mean an invalid configuration.
_PERMANENT_MEANINGS = {
    "CheckpointMismatch": "the checkpoint on the volume cannot be resumed by this job",
    "OutOfMemory": "the training does not fit in GPU memory",
}
# A container the kernel killed for exceeding its memory limit (host memory, not GPU memory).
_OOM_KILLED = "OOMKilled"

# DisruptionTarget / pod status reasons -> the restart reason the operator reports.
_DISRUPTION_REASONS = {
    "EvictionByEvictionAPI": "Evicted",
    "Evicted": "Evicted",
    "PreemptionByScheduler": "Preempted",
    "PreemptionByKubeScheduler": "Preempted",
    "Preempted": "Preempted",
    "Preempting": "Preempted",
    "DeletionByTaintManager": "NodeLost",
    "DeletionByPodGC": "NodeLost",
    "NodeLost": "NodeLost",
    "TerminationByKubelet": "NodeShutdown",
    "Shutdown": "NodeShutdown",
    "NodeShutdown": "NodeShutdown",
    "Terminated": "NodeShutdown",
    "PodDeleted": "PodDeleted",
}

_MIN_REQUEUE = 1.0
_SCHEDULING = "waiting for the scheduler to place the pods"


@dataclass
class _Step:
    """Mutable working state of one reconcile: the job's status as it was and as it will be."""

    obj: dict[str, Any]
    now: datetime
    settings: OperatorSettings
    # The status the operator decides from: the job's status with the fields the operator owns taken from
    # its own record (the trainer can write the status; see record.py), and ``actual``, the status as stored.
    old: dict[str, Any]
    new: dict[str, Any]
    actual: dict[str, Any] = field(default_factory=dict)
    record: dict[str, Any] | None = None
    plan: Plan = field(default_factory=Plan)
    requeue: list[float] = field(default_factory=list)
    # Objects found under a child's name that are not this job's (see ownership.py): never written.
    foreign: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    # Set when such an object blocks the job: the message, and no pod is created while it is set.
    conflict: str | None = None

    @property
    def generation(self) -> int | None:
        value = (self.obj.get("metadata") or {}).get("generation")
        return int(value) if value is not None else None

    @property
    def old_phase(self) -> str | None:
        phase = self.old.get("phase")
        return str(phase) if phase else None

    @property
    def attempt(self) -> int:
        return int(self.new.get("trainerAttempt") or 0)

    @property
    def restarts(self) -> int:
        return int(self.new.get("restarts") or 0)

    @property
    def checkpoint_path(self) -> str:
        path = (self.old.get("checkpoint") or {}).get("path")
        return path if isinstance(path, str) else ""

    @property
    def checkpoint_step(self) -> int | None:
        step = (self.old.get("checkpoint") or {}).get("lastStep")
        return step if isinstance(step, int) and not isinstance(step, bool) else None

    def condition(self, type_: str, status: str, reason: str, message: str) -> None:
        conditions = list(self.new.get("conditions") or [])
        self.new["conditions"] = set_condition(
            conditions, type_, status, reason, message, self.now, self.generation
        )

    def drop_condition(self, type_: str) -> None:
        conditions = [c for c in self.new.get("conditions") or [] if c.get("type") != type_]
        self.new["conditions"] = conditions

    def set_phase(self, phase: str, reason: str, message: str) -> None:
        self.new["phase"] = phase
        self.new["reason"] = reason
        self.new["message"] = truncate(message)

    def event(self, type_: str, reason: str, message: str) -> None:
        assert type_ in ("Normal", "Warning")
        self.plan.events.append(Event(type_, reason, truncate(message, 1024)))  # type: ignore[arg-type]

    def requeue_at(self, moment: datetime) -> None:
        self.requeue.append(max(_MIN_REQUEUE, (moment - self.now).total_seconds()))

    def finish(self) -> Plan:
        # Compared with the status as stored, so a field someone else overwrote is written back.
        patch = {k: self.new.get(k) for k in OWNED_STATUS_FIELDS if self.new.get(k) != self.actual.get(k)}
        self.plan.status = patch or None
        record = trusted_fields(self.new)
        if record != self.record:
            self.plan.record = record
        self.plan.phase = self.new.get("phase")
        if self.requeue:
            self.plan.requeue_after = min(self.requeue)
        return self.plan


def reconcile(job_obj: dict[str, Any], observed: Observed, now: datetime, settings: OperatorSettings) -> Plan:
    """Decide what to do for one GRPOJob. ``now`` is timezone-aware."""
    raw = job_obj.get("status")
    actual = dict(raw) if isinstance(raw, dict) else {}
    record = read_record(job_obj)
    old = sanitize_status(actual, record)
    new = {k: old[k] for k in OWNED_STATUS_FIELDS if k in old}
    meta = job_obj.get("metadata") or {}
    parts = ownership.split(observed, meta)
    observed = parts.mine
    step = _Step(
        obj=job_obj,
        now=now,
        settings=settings,
        old=old,
        new=new,
        actual=actual,
        record=record,
        foreign=parts.foreign,
    )
    if meta.get("deletionTimestamp"):
        # No finalizer: the garbage collector removes the children through their owner references.
        step.plan.phase = step.old_phase
        return step.plan

    try:
        job = job_from_object(job_obj)
    except ValidationError as exc:
        return _invalid_spec(step, exc)

    step.new["observedGeneration"] = step.generation
    step.new["rollouts"] = compute_rollouts(job.spec)

    if step.old_phase in TERMINAL_PHASES:
        _clean_up_finished(step, job, observed)
        _ttl(step, job)
        return step.finish()

    violations = platform_violations(job.spec, settings)
    if violations:
        return _policy_violation(step, violations)
    if get_condition(list(step.old.get("conditions") or []), PLATFORM_POLICY) is not None:
        step.condition(PLATFORM_POLICY, "True", "Allowed", "the job meets the platform's limits")

    desired = infrastructure(job, settings)
    if not job.spec.suspend:
        desired += metric_workload(job, settings)
    _check_conflicts(step, job, desired)
    _ensure(step, observed, infrastructure(job, settings))

    if job.spec.suspend:
        _suspend(step, job, observed)
        return step.finish()

    _ensure(step, observed, metric_workload(job, settings))
    if client_rollouts(job):
        _gateway_readiness(step, job, observed)
    else:
        _metric_readiness(step, job, observed)

    if step.conflict is not None and step.attempt == 0:
        # Nothing has started: no gang, no Created event, until the name is free.
        step.set_phase("Pending", "ChildConflict", step.conflict)
        return step.finish()
    if step.old_phase == "Suspended":
        _resume(step, job)
    elif step.attempt == 0:
        _start(step, job)

    if _active_deadline(step, job, observed):
        return step.finish()
    _run_gang(step, job, observed)
    return step.finish()


# --- lifecycle steps --------------------------------------------------------------------------------------


def _invalid_spec(step: _Step, exc: ValidationError) -> Plan:
    errors = "; ".join(
        f"spec.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" if err["loc"] else err["msg"]
        for err in exc.errors()
    )
    message = (
        f"the spec is invalid and cannot be run: {errors}. Fix the spec (kubectl edit) or recreate the job."
    )
    if step.old_phase != "Failed":
        step.set_phase("Failed", "InvalidSpec", message)
        step.new["completionTime"] = format_time(step.now)
        step.condition(FAILED, "True", "InvalidSpec", message)
        step.event("Warning", "InvalidSpec", message)
    return step.finish()


def _policy_violation(step: _Step, violations: list[str]) -> Plan:
    """Nothing is created or replaced for a job that breaks a platform limit; pods already running
    (a limit tightened after the job started) are left alone. Fixing the spec lets it carry on."""
    message = (
        "the job breaks the platform's limits, so the operator creates no pods for it until the spec "
        "is changed to fit: " + "; ".join(violations)
    )
    previous = get_condition(list(step.old.get("conditions") or []), PLATFORM_POLICY)
    step.condition(PLATFORM_POLICY, "False", "PolicyViolation", message)
    if previous is None or previous.get("status") != "False" or previous.get("message") != truncate(message):
        step.event("Warning", "PolicyViolation", message)
    if step.attempt == 0:
        step.set_phase("Pending", "PolicyViolation", message)
    return step.finish()


def _start(step: _Step, job: Job) -> None:
    step.new["trainerAttempt"] = 1
    step.new.setdefault("restarts", 0)
    step.new["startTime"] = format_time(step.now)
    trainers = job.spec.trainer.nodes
    step.set_phase("Pending", "Creating", "creating the job's children and its first gang of pods")
    step.event(
        "Normal",
        "Created",
        f"created the job's children and gang attempt 1: 1 vLLM pod ({job.spec.generation.gpus} GPU) and "
        f"{trainers} trainer pod{'s' if trainers > 1 else ''} ({job.spec.trainer.gpus_per_node} GPU each)",
    )


def _suspend(step: _Step, job: Job, observed: Observed) -> None:
    _delete_pods(step, observed, lambda pod: pod.role in GANG_ROLES)
    _delete_metric_workload(step, job, observed)
    if step.old_phase != "Suspended":
        message = (
            "spec.suspend is true: all pods are stopped; the volume and status are kept. "
            "Set spec.suspend to false to resume from the last checkpoint."
        )
        step.set_phase("Suspended", "Suspended", message)
        step.condition(SUSPENDED, "True", "Suspended", message)
        step.condition(RUNNING, "False", "Suspended", "the job is suspended")
        step.drop_condition(SCHEDULED)
        step.drop_condition(METRIC_READY)
        step.event("Normal", "Suspended", message)


def _resume(step: _Step, job: Job) -> None:
    attempt = step.attempt + 1
    step.new["trainerAttempt"] = attempt
    step.new.setdefault("restarts", 0)
    # Like a Kubernetes Job: the active deadline counts from the last resume.
    step.new["startTime"] = format_time(step.now)
    where = _resume_point(step)
    step.set_phase("Pending", "Resumed", f"resumed with gang attempt {attempt}, {where}")
    step.condition(SUSPENDED, "False", "Resumed", f"resumed, {where}")
    step.event("Normal", "Resumed", f"spec.suspend is false: starting gang attempt {attempt}, {where}")
    if step.checkpoint_path:
        step.event("Normal", "ResumedFromCheckpoint", f"gang attempt {attempt} {where}")


def _resume_point(step: _Step) -> str:
    if step.checkpoint_path:
        at = f" (step {step.checkpoint_step})" if step.checkpoint_step is not None else ""
        return f"resuming from checkpoint {step.checkpoint_path}{at}"
    return "starting from scratch (no checkpoint yet)"


def _active_deadline(step: _Step, job: Job, observed: Observed) -> bool:
    limit = job.spec.run_policy.active_deadline_seconds
    started = parse_time(step.new.get("startTime"))
    if limit is None or started is None:
        return False
    deadline = started + timedelta(seconds=limit)
    if step.now < deadline:
        step.requeue_at(deadline)
        return False
    _fail(
        step,
        job,
        observed,
        "DeadlineExceeded",
        f"the job ran longer than spec.runPolicy.activeDeadlineSeconds ({limit}s)",
    )
    return True


def _telling_failure(pod: PodView, settings: OperatorSettings) -> bool:
    """A failure that names its cause: a trainer's permanent or specific exit code, or an OOM kill."""
    term = pod.termination()
    if term is None:
        return False
    if term.reason == _OOM_KILLED:
        return True
    return (
        pod.role == "trainer"
        and term.exit_code is not None
        and (term.exit_code in settings.permanent_exit_codes or term.exit_code in TRAINER_EXIT_REASONS)
    )


def _run_gang(step: _Step, job: Job, observed: Observed) -> None:
    """The gang of the current attempt: detect success, failures, disruptions, stalls and drift;
    otherwise create what is missing and report how far the pods got."""
    attempt = step.attempt
    nodes = observed.nodes
    gang = [p for p in observed.pods() if p.role in GANG_ROLES]
    current = {p.name: p for p in gang if p.attempt == attempt}
    expected = [generation_pod_name(job, attempt, 0)] + [
        trainer_pod_name(job, attempt, rank) for rank in range(job.spec.trainer.nodes)
    ]
    was_running = step.old_phase == "Running"

    rank0 = current.get(trainer_pod_name(job, attempt, 0))
    if rank0 is not None and rank0.phase == "Succeeded" and rank0.disruption(nodes) is None:
        _succeed(step, job, observed)
        return

    failures: list[PodView] = []
    disruptions: list[tuple[str, str]] = []  # (reason, message)
    for name in expected:
        pod = current.get(name)
        if pod is None:
            if was_running:
                disruptions.append(("PodDeleted", f"pod {name} disappeared while the gang was running"))
            continue
        why = pod.disruption(nodes)
        if why is not None:
            reason = _DISRUPTION_REASONS.get(why, why)
            disruptions.append((reason, f"{pod.role} pod {name} was stopped from outside the job ({why})"))
        elif pod.phase == "Failed" or (pod.phase == "Succeeded" and pod.role == "generation"):
            failures.append(pod)

    if failures:
        # One rank running out of memory makes the others fail too (NCCL timeouts, exit 1): report the
        # failure that says what went wrong, not whichever pod comes first.
        first = next((p for p in failures if _telling_failure(p, step.settings)), failures[0])
        summary = first.failure_summary()
        reason = "TrainerFailed" if first.role == "trainer" else "GenerationFailed"
        term = first.termination()
        if term is not None and term.reason == _OOM_KILLED:
            reason = _OOM_KILLED
            summary = (
                f"{summary} (the container exceeded its memory limit: host memory, not GPU memory; raise "
                f"spec.{'trainer' if first.role == 'trainer' else 'generation'}.resources memory requests "
                "and limits, or lower the batch size)"
            )
            step.event("Warning", _OOM_KILLED, summary)
        special = (
            TRAINER_EXIT_REASONS.get(term.exit_code)
            if first.role == "trainer" and term and term.exit_code is not None
            else None
        )
        if special is not None:
            reason = special
            step.event("Warning", special, summary)
        if special == "CancelledByClient":
            _fail(step, job, observed, special, _cancelled_message(step))
            return
        if first.role == "trainer" and term and term.exit_code in step.settings.permanent_exit_codes:
            meaning = _PERMANENT_MEANINGS.get(special or "", "the configuration is invalid")
            _fail(
                step,
                job,
                observed,
                special or "PermanentFailure",
                f"{summary} (exit code {term.exit_code} means {meaning}; retrying cannot "
                "help: fix the spec and recreate the job)",
            )
            return
        _restart_or_fail(step, job, observed, reason, summary, counted=True)
        return
    if disruptions:
        reason, message = disruptions[0]
        _restart_or_fail(step, job, observed, reason, message, counted=False)
        return

    desired_hash = gang_hash(job)
    drifted = [p.name for p in current.values() if p.spec_hash != desired_hash]
    if drifted:
        _restart_or_fail(
            step,
            job,
            observed,
            "SpecChanged",
            f"the spec changed; pods {', '.join(sorted(drifted))} no longer match it",
            counted=False,
        )
        return

    # Steady state: remove pods of earlier attempts, create missing pods, report progress.
    _delete_pods(step, observed, lambda pod: pod.role in GANG_ROLES and pod.attempt != attempt)
    resume_from = next(
        (p.resume_from for p in current.values() if p.role == "trainer" and p.resume_from is not None),
        _resume_from(job, step),
    )
    missing = [
        m for m in gang_pods(job, step.settings, attempt, resume_from) if m["metadata"]["name"] not in current
    ]
    if missing:
        earlier = sorted(p.name for p in gang if p.attempt != attempt)
        if earlier:
            _wait_for_earlier_pods(step, earlier)
            return
        if step.conflict is not None:
            step.set_phase("Pending", "ChildConflict", step.conflict)
            step.condition(RUNNING, "False", "Pending", step.conflict)
            return
        step.plan.creates.extend(missing)

    present = [current[name] for name in expected if name in current]
    all_running = len(present) == len(expected) and all(p.phase == "Running" for p in present)
    if not was_running:
        # A new gang runs only once vLLM answers /health: until then the trainers merely wait for it, and
        # neither the Running phase nor the progress clock may start.
        all_running = all_running and all(p.ready for p in present if p.role == "generation")
    if all_running:
        if _stalled(step, job, observed):
            return
        step.condition(SCHEDULED, "True", "AllPodsScheduled", f"all {len(expected)} pods are scheduled")
        step.condition(
            RUNNING, "True", "AllPodsRunning", f"all {len(expected)} pods of attempt {attempt} run"
        )
        _not_suspended(step)
        if step.old_phase != "Running":
            message = (
                f"gang attempt {attempt} is running: 1 vLLM pod and {job.spec.trainer.nodes} trainer pod(s)"
            )
            step.set_phase("Running", "AllPodsRunning", message)
            step.event("Normal", "Running", message)
        return

    _waiting(step, job, observed, expected, present)


def _resume_from(job: Job, step: _Step) -> str:
    """RESUME_FROM of a new gang. Under Kueue the new attempt's pods wait at the gate until the queue
    admits them again, which can be after the old attempt wrote its SIGTERM checkpoint (a preemption's
    grace period) and before the status shows it: name the checkpoint root, whose latest.json points at
    the newest checkpoint this job published, instead of the one known now."""
    queued = job.spec.scheduling.queue_name or step.settings.default_queue_name
    if queued and step.checkpoint_path:
        return str(PurePosixPath(step.checkpoint_path).parent)
    return step.checkpoint_path


def _wait_for_earlier_pods(step: _Step, names: list[str]) -> None:
    """Fencing, as a JobSet does: attempt n+1 starts only once attempt n's pods are gone from the API, not
    merely terminating, because an old trainer rank 0 may still be writing its SIGTERM checkpoint (it has
    terminationGracePeriodSeconds for that) to the volume the new gang resumes from."""
    reason = (
        str(step.new.get("reason") or "Restarting")
        if step.new.get("phase") == "Restarting"
        else "PodsTerminating"
    )
    message = (
        f"gang attempt {step.attempt} starts once the pods of the previous attempt are gone (a trainer may "
        f"still be writing its checkpoint); still terminating: {', '.join(names)}"
    )
    step.set_phase("Restarting", reason, message)
    step.condition(RUNNING, "False", "Restarting", message)


def _waiting(step: _Step, job: Job, observed: Observed, expected: list[str], present: list[PodView]) -> None:
    """Pods exist (or are being created) but not all run: Pending, Initializing or Restarting."""
    attempt = step.attempt
    blocked = next(((p, p.unschedulable()) for p in present if p.unschedulable() is not None), None)
    refused = _refusal(observed, expected, present)
    if refused is not None:
        # The ChildRejected event with the same words comes from the write that was refused.
        step.condition(SCHEDULED, "False", "ChildRejected", refused)
        step.condition(RUNNING, "False", "Pending", refused)
        step.set_phase("Pending", "ChildRejected", refused)
    elif blocked is not None:
        pod, (why, detail) = blocked[0], blocked[1]  # type: ignore[misc]
        if why == "SchedulingGated":
            reason = "WaitingForAdmission"
            message = f"pod {pod.name} is not yet admitted by its queue: {detail}"
            group = pod.labels.get(KUEUE_GROUP_LABEL)
            kueue_says = observed.kueue_wait(group) if group else None
            if kueue_says:
                message = f"Kueue has not admitted workload {group}: {kueue_says}"
            if step.new.get("reason") == "Preempted" and step.old_phase in ("Restarting", "Pending"):
                # Keep saying why the job left Running until Kueue admits it again.
                reason = "Preempted"
                message = f"preempted by Kueue; waiting to be admitted again. {message}"
        else:
            reason = "Unschedulable"
            message = f"pod {pod.name} cannot be scheduled: {detail}"
        step.condition(SCHEDULED, "False", reason, message)
        step.condition(RUNNING, "False", "Pending", message)
        if step.new.get("reason") != reason or step.old_phase != "Pending":
            step.event("Warning", reason, message)
        step.set_phase("Pending", reason, message)
    else:
        all_scheduled = len(present) == len(expected) and all(p.scheduled for p in present)
        if all_scheduled:
            step.condition(SCHEDULED, "True", "AllPodsScheduled", f"all {len(expected)} pods are scheduled")
        else:
            step.condition(SCHEDULED, "False", "Scheduling", _SCHEDULING)
        waiting = next(((p, p.waiting()) for p in present if p.waiting() is not None), None)
        if step.old_phase == "Restarting":
            phase, reason = "Restarting", str(step.new.get("reason") or "Restarting")
            message = f"gang attempt {attempt} replaces the previous one ({reason}); its pods are starting"
        elif all_scheduled:
            phase, reason = "Initializing", "ContainersStarting"
            message = f"all pods of gang attempt {attempt} are scheduled; containers are starting"
            generation = _starting_generation(present)
            if generation is not None:
                reason = "WaitingForGeneration"
                message = _generation_wait(step, job, generation)
            if waiting is not None:
                pod, (why, detail) = waiting[0], waiting[1]  # type: ignore[misc]
                reason = why
                blocked_on = f"pod {pod.name} is waiting: {why}{': ' + detail if detail else ''}"
                message = f"{message}; {blocked_on}" if generation is not None else blocked_on
        else:
            phase, reason = "Pending", "Scheduling"
            message = f"gang attempt {attempt}: waiting for {len(expected)} pods to be created and scheduled"
        step.condition(RUNNING, "False", phase, message)
        step.set_phase(phase, reason, message)
    _not_suspended(step)
    _startup_deadline(step, job, observed, present)


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


def _not_suspended(step: _Step) -> None:
    suspended = get_condition(list(step.new.get("conditions") or []), SUSPENDED)
    if suspended is not None and suspended.get("status") == "True":
        step.condition(SUSPENDED, "False", "Resumed", "the job was resumed")


def _starting_generation(present: list[PodView]) -> PodView | None:
    """The attempt's vLLM pod while it has started (kubelet accepted it) but is not Ready yet."""
    return next(
        (p for p in present if p.role == "generation" and p.started is not None and not p.ready), None
    )


def _generation_wait(step: _Step, job: Job, pod: PodView) -> str:
    budget = job.spec.generation.startup_timeout_seconds
    elapsed = (step.now - pod.started).total_seconds() if pod.started is not None else 0.0
    return (
        f"waiting for vLLM pod {pod.name} to become Ready ({_duration(elapsed)} of {_duration(budget)}: "
        "image pull, model download, CUDA graph capture)"
    )


def _duration(seconds: float) -> str:
    """Whole minutes past the first one (the status is not rewritten more than once a minute)."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return "<1m"
    hours, minutes = divmod(seconds // 60, 60)
    return f"{hours}h{minutes}m" if hours and minutes else f"{hours}h" if hours else f"{minutes}m"


def _startup_deadline(step: _Step, job: Job, observed: Observed, present: list[PodView]) -> None:
    """Three clocks, so that a slow vLLM start-up never spends the startup deadline:

    * while pods wait for the scheduler (or Kueue) and vLLM has not started: runPolicy.startupDeadlineSeconds
      from the attempt's pods being created; on expiry the job fails;
    * while vLLM starts (its pod accepted by a node, not Ready yet, every pod scheduled):
      generation.startupTimeoutSeconds from the vLLM pod's start; on expiry a counted restart, as when the
      trainers give up waiting for it;
    * once vLLM is Ready: runPolicy.startupDeadlineSeconds from then, for the trainers to run.
    """
    created = [p.created for p in present if p.created is not None]
    if not created:
        return
    limit = job.spec.run_policy.startup_deadline_seconds
    generation = next((p for p in present if p.role == "generation"), None)
    all_scheduled = all(p.scheduled for p in present)
    ready_since = generation.ready_since if generation is not None else None
    if ready_since is not None:
        deadline = max(min(created), ready_since) + timedelta(seconds=limit)
    elif generation is not None and generation.started is not None and all_scheduled:
        budget = job.spec.generation.startup_timeout_seconds
        deadline = generation.started + timedelta(seconds=budget)
        if step.now < deadline:
            step.requeue_at(deadline)
            # The status shows the elapsed time in minutes: come back to update it.
            step.requeue_at(step.now + timedelta(seconds=60))
            return
        step.plan.events = [e for e in step.plan.events if e.type == "Normal"]
        _restart_or_fail(
            step,
            job,
            observed,
            "GenerationStartupTimeout",
            f"vLLM pod {generation.name} did not become Ready within spec.generation.startupTimeoutSeconds "
            f"({budget}s) of starting: see its log (kubectl logs {generation.name}); raise "
            "startupTimeoutSeconds if the download only needs longer",
            counted=True,
        )
        return
    else:
        deadline = min(created) + timedelta(seconds=limit)
    if step.now < deadline:
        step.requeue_at(deadline)
        return
    why = str(step.new.get("message") or "")
    # The Failed event says it all; a Pending/Unschedulable event from this same reconcile would repeat it.
    step.plan.events = [e for e in step.plan.events if e.type == "Normal"]
    _fail(
        step,
        job,
        observed,
        "StartupDeadlineExceeded",
        f"gang attempt {step.attempt} was not running within spec.runPolicy.startupDeadlineSeconds "
        f"({limit}s): {why}",
    )


def _stalled(step: _Step, job: Job, observed: Observed) -> bool:
    """Running, but no step advance for runPolicy.progressDeadlineSeconds: a stall (counted restart)."""
    limit = job.spec.run_policy.progress_deadline_seconds
    running = get_condition(list(step.old.get("conditions") or []), RUNNING)
    since = (
        parse_time(running.get("lastTransitionTime"))
        if running is not None and running.get("status") == "True" and step.old_phase == "Running"
        else None
    )
    if since is None:
        since = step.now  # the gang becomes Running with this reconcile: the clock starts now
    last_step = parse_time((step.old.get("progress") or {}).get("lastStepTime"))
    base = max(since, last_step) if last_step is not None else since
    if _waiting_for_client(step, base):
        # A client-rollout trainer waiting for the client's next groups is not stalled: the client decides
        # when its rollouts are done (DSPy may be validating). Look again within the deadline.
        step.requeue_at(step.now + timedelta(seconds=limit))
        return False
    deadline = base + timedelta(seconds=limit)
    if step.now < deadline:
        step.requeue_at(deadline)
        return False
    step_no = (step.old.get("progress") or {}).get("step")
    at = f" (last step {step_no})" if step_no is not None else " (no step completed yet)"
    _restart_or_fail(
        step,
        job,
        observed,
        "ProgressDeadlineExceeded",
        f"no training step completed for {limit}s{at}: the gang is considered stalled",
        counted=True,
    )
    return True


def _waiting_for_client(step: _Step, base: datetime) -> bool:
    """Trainer rank 0 of the running gang reports (status.progress.waitingForClientSince) that it waits for
    the client's groups: set since the gang runs and since its last step (an older value is stale: a
    trainer that died waiting, or one that got its groups and did not clear it)."""
    waiting = parse_time((step.old.get("progress") or {}).get("waitingForClientSince"))
    return waiting is not None and waiting >= base


def _cancelled_message(step: _Step) -> str:
    steps = (step.old.get("progress") or {}).get("step")
    at = f" after step {steps}" if steps is not None else ""
    return (
        f"the client cancelled the run (Arbor's cancel route): trainer rank 0 stopped{at} without training "
        "further and exited with code 7; the checkpoints written so far stay on the volume"
    )


def _restart_or_fail(
    step: _Step, job: Job, observed: Observed, reason: str, message: str, *, counted: bool
) -> None:
    limit = job.spec.run_policy.backoff_limit
    if counted and step.restarts >= limit:
        _fail(
            step,
            job,
            observed,
            "BackoffLimitExceeded",
            f"{message}; spec.runPolicy.backoffLimit ({limit}) is exhausted after {step.restarts} restart(s)",
        )
        return
    _restart(step, job, observed, reason, message, counted=counted)


def _restart(step: _Step, job: Job, observed: Observed, reason: str, message: str, *, counted: bool) -> None:
    """Replace the whole gang by a new attempt that resumes from the last verified checkpoint."""
    attempt = step.attempt + 1
    restarts = step.restarts + (1 if counted else 0)
    limit = job.spec.run_policy.backoff_limit
    budget = f"restart {restarts}/{limit}" if counted else "not counted against backoffLimit"
    where = _resume_point(step)
    step.new["trainerAttempt"] = attempt
    step.new["restarts"] = restarts
    full = f"{message}; restarting the gang as attempt {attempt} ({budget}), {where}"
    step.set_phase("Restarting", reason, full)
    step.condition(RUNNING, "False", "Restarting", full)
    # The new gang's pods exist once this plan is carried out, but nothing has placed them yet.
    step.condition(SCHEDULED, "False", "Scheduling", _SCHEDULING)
    step.event("Warning", "Restarting", full)
    if step.checkpoint_path:
        step.event("Normal", "ResumedFromCheckpoint", f"gang attempt {attempt} {where}")
    step.plan.restart = Restart(reason=reason, counted=counted, message=message)
    # The new gang is created by a later reconcile, once every pod of this one is gone (see _run_gang).
    _delete_pods(step, observed, lambda pod: pod.role in GANG_ROLES)


def _fail(step: _Step, job: Job, observed: Observed, reason: str, message: str) -> None:
    step.set_phase("Failed", reason, message)
    step.new["completionTime"] = format_time(step.now)
    step.condition(FAILED, "True", reason, message)
    step.condition(RUNNING, "False", "Failed", message)
    step.event("Warning", "Failed", message)
    _clean_up_finished(step, job, observed)
    _ttl(step, job)


def _succeed(step: _Step, job: Job, observed: Observed) -> None:
    progress = step.old.get("progress") or {}
    steps = progress.get("step")
    done = f" after {steps}/{job.spec.grpo.steps} steps" if steps is not None else ""
    message = f"training finished{done}: trainer rank 0 exited successfully"
    step.set_phase("Succeeded", "Completed", message)
    step.new["completionTime"] = format_time(step.now)
    step.condition(SUCCEEDED, "True", "Completed", message)
    step.condition(RUNNING, "False", "Succeeded", message)
    step.event("Normal", "Succeeded", message)
    _clean_up_finished(step, job, observed)
    _ttl(step, job)


def _clean_up_finished(step: _Step, job: Job, observed: Observed) -> None:
    """A finished job keeps its config, volume, Services and terminated trainer pods (for logs); the vLLM
    server, still-running pods and the metric service are stopped."""
    _delete_pods(
        step,
        observed,
        lambda pod: pod.role == "generation" or (pod.role == "trainer" and not pod.finished),
    )
    _delete_metric_workload(step, job, observed)
    step.drop_condition(METRIC_READY)
    if step.new.get("phase") == "Failed":
        # A failed job's client must not wait on a gateway whose trainer never comes back: without the
        # gateway its next call fails at once. After success the gateway stays, answering status and
        # terminate (DSPy calls terminate after its last step), until the job is deleted.
        deployment = observed.get("Deployment", rollouts_name(job))
        if deployment is not None:
            ref = ChildRef("apps/v1", "Deployment", rollouts_name(job), _uid(deployment))
            if ref not in step.plan.deletes:
                step.plan.deletes.append(ref)
        step.drop_condition(GATEWAY_READY)


def _ttl(step: _Step, job: Job) -> None:
    ttl = job.spec.run_policy.ttl_seconds_after_finished
    finished = parse_time(step.new.get("completionTime"))
    if ttl is None or finished is None:
        return
    expiry = finished + timedelta(seconds=ttl)
    if step.now >= expiry:
        step.plan.delete_job = True
    else:
        step.requeue_at(expiry)


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


def _metric_readiness(step: _Step, job: Job, observed: Observed) -> None:
    """Condition MetricReady: whether the metric service has a ready pod, and if not, why.

    Trainers wait for the metric service before their first step and give up after a while, which
    costs a counted gang restart; a metric pod that cannot be scheduled or pulled would otherwise
    show only as repeated restarts. The condition (and a Warning event when it gets stuck) names the
    pod and the cause. It never changes the phase: the gang may be fine and only scoring is down.
    """
    assert job.spec.metric is not None, "only metric-service jobs have a metric Deployment"
    deployment = observed.get("Deployment", metric_name(job)) or {}
    available = int((deployment.get("status") or {}).get("availableReplicas") or 0)
    if available >= 1:
        status, reason = "True", "Available"
        message = (
            f"{available} of {job.spec.metric.replicas} metric pod(s) ready; "
            f"the service answers on {metric_name(job)}"
        )
    else:
        status = "False"
        reason, message = _metric_not_ready(job, observed)
    previous = get_condition(list(step.old.get("conditions") or []), METRIC_READY)
    step.condition(METRIC_READY, status, reason, message)
    stuck = status == "False" and reason in _METRIC_STUCK_REASONS
    if stuck and (previous is None or previous.get("reason") != reason):
        step.event("Warning", "MetricNotReady", message)


def _metric_not_ready(job: Job, observed: Observed) -> tuple[str, str]:
    # The ReplicaSet controller's refusals (quota, Pod Security, admission policies) reach the
    # Deployment as its ReplicaFailure condition; no pod exists to tell anything else.
    deployment = observed.get("Deployment", metric_name(job)) or {}
    for cond in (deployment.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "ReplicaFailure" and cond.get("status") == "True":
            detail = str(cond.get("message") or "").rstrip(". ")
            return str(cond.get("reason") or "FailedCreate"), (
                f"the API server refused the metric pods of Deployment {metric_name(job)}: {detail}. "
                "The namespace's ResourceQuota, Pod Security level or an admission policy does not admit "
                "them; the ReplicaSet retries until it does"
            )
    pods = [p for p in observed.pods() if p.role == "metric" and not p.terminating]
    for pod in pods:
        blocked = pod.unschedulable()
        if blocked is None:
            continue
        why, detail = blocked
        if why == "SchedulingGated":
            return why, f"metric pod {pod.name}: {detail}"
        return "Unschedulable", (
            f"metric pod {pod.name} cannot be scheduled: {detail.rstrip('. ')}. spec.scheduling.nodeSelector "
            "applies to the metric pod too; use spec.scheduling.gpuNodeSelector for labels only GPU nodes carry"
        )
    for pod in pods:
        waiting = pod.waiting()
        if waiting is not None:
            why, detail = waiting
            hint = f" (image {job.spec.metric.image})" if "Image" in why and job.spec.metric else ""
            return why, f"metric pod {pod.name} is waiting: {why}{hint}{': ' + detail if detail else ''}"
    # Being created, no pod yet, or pods starting: one state, so the status is not rewritten for each.
    return "Starting", "no metric pod is ready yet; the service answers once a pod's /healthz returns 200"


def _gateway_readiness(step: _Step, job: Job, observed: Observed) -> None:
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
    previous = get_condition(list(step.old.get("conditions") or []), GATEWAY_READY)
    step.condition(GATEWAY_READY, "True" if ready else "False", reason, message)
    stuck = not ready and reason in _METRIC_STUCK_REASONS
    if stuck and (previous is None or previous.get("reason") != reason):
        step.event("Warning", "GatewayNotReady", message)


# --- children -----------------------------------------------------------------------------------------------


def _ensure(step: _Step, observed: Observed, desired: list[Manifest]) -> None:
    """Create every desired child that is missing; update the job's own children that differ from the spec
    (by their spec-hash), naming the uid they were observed with. A same-name object that is not the
    job's is left alone (_check_conflicts reports it)."""
    for manifest in desired:
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        if (kind, name) in step.foreign:
            continue
        current = observed.get(kind, name)
        if current is None:
            step.plan.applies.append(manifest)
            continue
        want = manifest["metadata"].get("annotations", {}).get(ANNOTATION_HASH)
        have = ((current.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_HASH)
        if have != want or _scaled_by_hand(manifest, current):
            update = copy.deepcopy(manifest)
            update["metadata"]["uid"] = (current.get("metadata") or {}).get("uid")
            step.plan.applies.append(update)


def _check_conflicts(step: _Step, job: Job, desired: list[Manifest]) -> None:
    """Objects under a child's name that the operator did not create for this job: reported on the job
    (condition Conflict and an event) and never touched; while any exists, no pod is created."""
    wanted = [(m["kind"], m["metadata"]["name"]) for m in desired]
    if not job.spec.suspend:
        attempt = max(step.attempt, 1)
        wanted.append(("Pod", generation_pod_name(job, attempt, 0)))
        wanted += [("Pod", trainer_pod_name(job, attempt, rank)) for rank in range(job.spec.trainer.nodes)]
    found = [step.foreign[key] for key in wanted if key in step.foreign]
    previous = get_condition(list(step.old.get("conditions") or []), CONFLICT)
    if not found:
        if previous is not None:
            step.drop_condition(CONFLICT)
        return
    meta = step.obj.get("metadata") or {}
    message = ownership.conflict_message(found[0], meta)
    if len(found) > 1:
        others = ", ".join(f"{o.get('kind')} {(o.get('metadata') or {}).get('name')}" for o in found[1:])
        message += f". The same holds for {others}"
    step.conflict = truncate(message)
    step.condition(CONFLICT, "True", "ChildConflict", message)
    if previous is None or previous.get("message") != step.conflict:
        step.event("Warning", "ChildConflict", message)


def _scaled_by_hand(manifest: Manifest, current: Manifest) -> bool:
    # `kubectl scale deployment <job>-metric --replicas=0` keeps the spec-hash annotation but takes the
    # metric service away (found by bench/chaos.py metric-down); re-applying restores spec.metric.replicas.
    if manifest["kind"] != "Deployment":
        return False
    return bool((current.get("spec") or {}).get("replicas") != manifest["spec"].get("replicas"))


def _delete_pods(step: _Step, observed: Observed, which: Any) -> None:
    for pod in observed.pods():
        if which(pod) and not pod.terminating:
            ref = ChildRef("v1", "Pod", pod.name, _uid(pod.obj))
            if ref in step.plan.deletes:
                continue
            if KUEUE_GROUP_LABEL in pod.labels and pod.annotations.get(KUEUE_RETRIABLE_ANNOTATION) != "false":
                # Kueue keeps a pod group's quota reserved, waiting for replacement pods, until a member says
                # the group is not retriable. A restart is a new group (new attempt), so release the old one.
                patch = {"metadata": {"annotations": {KUEUE_RETRIABLE_ANNOTATION: "false"}}}
                step.plan.patches.append(ChildPatch(ref, patch))
            step.plan.deletes.append(ref)


def _delete_metric_workload(step: _Step, job: Job, observed: Observed) -> None:
    deployment = observed.get("Deployment", metric_name(job))
    if deployment is not None:
        ref = ChildRef("apps/v1", "Deployment", metric_name(job), _uid(deployment))
        if ref not in step.plan.deletes:
            step.plan.deletes.append(ref)


def _uid(obj: dict[str, Any]) -> str | None:
    value = (obj.get("metadata") or {}).get("uid")
    return str(value) if value else None
