"""The gang of the current attempt: success, failures, disruptions, drift, the startup clocks, stalls,
and the decision to restart it or fail the job."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import PurePosixPath
from typing import Any

from grpo_operator.api import event_reasons
from grpo_operator.builders import Job, gang_hash, gang_pods
from grpo_operator.builders.common import (
    KUEUE_GROUP_LABEL,
    LABEL_ATTEMPT,
    created_pvc_name,
    generation_pod_name,
    trainer_pod_name,
)
from grpo_operator.builders.gang import generation_pod
from grpo_operator.reconcile.children import delete_pods, gang_pod_labels
from grpo_operator.reconcile.conditions import RUNNING, SCHEDULED, SUSPENDED, get_condition
from grpo_operator.reconcile.drift import describe, pod_drift
from grpo_operator.reconcile.finished import fail, succeed
from grpo_operator.reconcile.observed import Observed, PodView, parse_time
from grpo_operator.reconcile.plan import Restart
from grpo_operator.reconcile.reconcile_pass import GANG_ROLES, ReconcilePass, resume_point
from grpo_operator.reconcile.restart_policy import (
    BACKOFF_LIMIT_EXCEEDED,
    CANCELLED_BY_CLIENT,
    CHILD_DRIFTED,
    GENERATION_FAILED,
    GENERATION_REPLACED,
    GENERATION_REPLACEMENTS_PER_ATTEMPT,
    GENERATION_STARTUP_TIMEOUT,
    OOM_KILLED,
    POD_DELETED,
    PREEMPTED,
    PROGRESS_DEADLINE_EXCEEDED,
    SPEC_CHANGED,
    STARTUP_DEADLINE_EXCEEDED,
    TRAINER_FAILED,
    RestartRule,
    disruption,
    trainer_exit,
)
from grpo_operator.settings import OperatorSettings

_SCHEDULING = "waiting for the scheduler to place the pods"


def _exit_rule(pod: PodView, settings: OperatorSettings) -> RestartRule | None:
    """The restart-policy row of a trainer's exit code, when the code has one or is permanent."""
    term = pod.termination()
    if pod.role != "trainer" or term is None or term.exit_code is None:
        return None
    return trainer_exit(term.exit_code, settings.permanent_exit_codes)


def _telling_failure(pod: PodView, settings: OperatorSettings) -> bool:
    """A failure that names its cause: a trainer's permanent or specific exit code, or an OOM kill."""
    term = pod.termination()
    if term is None:
        return False
    if term.reason == OOM_KILLED.reason:
        return True
    return _exit_rule(pod, settings) is not None


def run_gang(rp: ReconcilePass, job: Job, observed: Observed) -> None:
    """The gang of the current attempt: detect success, failures, disruptions, stalls and drift;
    otherwise create what is missing and report how far the pods got."""
    attempt = rp.attempt
    nodes = observed.nodes
    gang = [p for p in observed.pods() if p.role in GANG_ROLES]
    current = {p.name: p for p in gang if p.attempt == attempt}
    generation_index = _generation_index(current)
    expected = [generation_pod_name(job, attempt, generation_index)] + [
        trainer_pod_name(job, attempt, rank) for rank in range(job.spec.trainer.nodes)
    ]
    was_running = rp.old_phase == "Running"

    rank0 = current.get(trainer_pod_name(job, attempt, 0))
    if rank0 is not None and rank0.phase == "Succeeded" and rank0.disruption(nodes) is None:
        succeed(rp, job, observed)
        return

    altered = [(pod, why) for pod, why in rp.strays if _attempt_of(job, pod.name) == attempt]
    if altered and not any(pod.terminating for pod, _ in altered):
        pod, why = altered[0]
        restart_or_fail(
            rp, job, observed, CHILD_DRIFTED, f"pod {pod.name} was changed outside the operator ({why})"
        )
        return

    failures: list[PodView] = []
    disruptions: list[tuple[RestartRule, str]] = []
    disrupted: list[PodView] = []
    for name in expected:
        pod = current.get(name)
        if pod is None:
            if was_running or current:
                # Gone from the watch is not gone: a pod whose labels were removed still runs. Look it up.
                rp.plan.verify.append(("Pod", name))
            if was_running:
                disruptions.append((POD_DELETED, f"pod {name} disappeared while the gang was running"))
            continue
        why = pod.disruption(nodes)
        if why is not None:
            message = f"{pod.role} pod {name} was stopped from outside the job ({why})"
            disruptions.append((disruption(why), message))
            disrupted.append(pod)
        elif pod.phase == "Failed" or (pod.phase == "Succeeded" and pod.role == "generation"):
            failures.append(pod)

    stopped = failures + disrupted
    if (
        was_running
        and len(stopped) == 1
        and stopped[0].role == "generation"
        and len(failures) + len(disruptions) == 1
        and _replace_generation(
            rp,
            job,
            observed,
            current,
            expected,
            stopped[0],
            disruptions[0][1] if disruptions else stopped[0].failure_summary(),
            generation_index,
        )
    ):
        return
    if failures:
        # One rank running out of memory makes the others fail too (NCCL timeouts, exit 1): report the
        # failure that says what went wrong, not whichever pod comes first.
        first = next((p for p in failures if _telling_failure(p, rp.settings)), failures[0])
        summary = first.failure_summary()
        rule = TRAINER_FAILED if first.role == "trainer" else GENERATION_FAILED
        term = first.termination()
        if term is not None and term.reason == OOM_KILLED.reason:
            rule = OOM_KILLED
            summary = (
                f"{summary} (the container exceeded its memory limit: host memory, not GPU memory; raise "
                f"spec.{'trainer' if first.role == 'trainer' else 'generation'}.resources memory requests "
                "and limits, or lower the batch size)"
            )
            if rule.event is not None:
                rp.event(rule.event, summary)
        exit_rule = _exit_rule(first, rp.settings)
        if exit_rule is not None:
            rule = exit_rule
            if rule.event is not None:
                rp.event(rule.event, summary)
        if rule.reason == CANCELLED_BY_CLIENT.reason and rule.permanent:
            fail(rp, job, observed, rule.reason, _cancelled_message(rp, rule))
            return
        if rule.permanent:
            summary = (
                f"{summary} (exit code {rule.exit_code} means {rule.meaning}; retrying cannot "
                "help: fix the spec and recreate the job)"
            )
        restart_or_fail(rp, job, observed, rule, summary)
        return
    if disruptions:
        rule, message = disruptions[0]
        restart_or_fail(rp, job, observed, rule, message)
        return

    desired_hash = gang_hash(job)
    drifted = [p.name for p in current.values() if p.spec_hash != desired_hash]
    if drifted:
        restart_or_fail(
            rp,
            job,
            observed,
            SPEC_CHANGED,
            f"the spec changed; pods {', '.join(sorted(drifted))} no longer match it",
        )
        return

    resume_from = next(
        (p.resume_from for p in current.values() if p.role == "trainer" and p.resume_from is not None),
        _resume_from(job, rp),
    )
    built = gang_pods(job, rp.settings, attempt, resume_from, generation_index)
    if _pods_drifted(rp, job, observed, built, current):
        return

    # Steady state: remove pods of earlier attempts, create missing pods, report progress.
    delete_pods(rp, observed, lambda pod: pod.role in GANG_ROLES and pod.attempt != attempt)
    missing = [m for m in built if m["metadata"]["name"] not in current]
    if missing:
        earlier = sorted({p.name for p in gang if p.attempt != attempt} | {pod.name for pod, _ in rp.strays})
        if not current and attempt > 1:
            # Before a new gang starts, the previous one must be gone, and a pod of it that lost its labels
            # is not in the watch: look its names up (fencing, see _wait_for_earlier_pods).
            seen = {p.name for p in gang} | {pod.name for pod, _ in rp.strays}
            previous = [generation_pod_name(job, attempt - 1, 0)] + [
                trainer_pod_name(job, attempt - 1, rank) for rank in range(job.spec.trainer.nodes)
            ]
            rp.plan.verify += [("Pod", name) for name in previous if name not in seen]
        if earlier:
            _wait_for_earlier_pods(rp, earlier)
            if rp.strays:
                # A pod that lost its labels is not watched: no event says when it is gone.
                rp.requeue_at(rp.now + timedelta(seconds=5))
            return
        if rp.conflict is not None:
            rp.set_phase("Pending", "ChildConflict", rp.conflict)
            rp.condition(RUNNING, "False", "Pending", rp.conflict)
            return
        claim = None if current else _unbound_claim(job, observed)
        if claim is None:
            rp.plan.creates.extend(missing)
        elif _wait_for_volume(rp, job, observed, claim):
            return
        # else the claim is new: reported as pods still to be created (which they are) for a few seconds

    present = [current[name] for name in expected if name in current]
    if was_running and generation_index > 0 and _awaiting_replacement(rp, job, observed, current, expected):
        return
    all_running = len(present) == len(expected) and all(p.phase == "Running" for p in present)
    if not was_running:
        # A new gang runs only once vLLM answers /health: until then the trainers merely wait for it, and
        # neither the Running phase nor the progress clock may start.
        all_running = all_running and all(p.ready for p in present if p.role == "generation")
    if all_running:
        if _stalled(rp, job, observed, current.get(expected[0])):
            return
        rp.condition(SCHEDULED, "True", "AllPodsScheduled", f"all {len(expected)} pods are scheduled")
        rp.condition(RUNNING, "True", "AllPodsRunning", f"all {len(expected)} pods of attempt {attempt} run")
        _not_suspended(rp)
        if rp.old_phase != "Running" or rp.new.get("reason") == REPLACING_GENERATION:
            message = (
                f"gang attempt {attempt} is running: 1 vLLM pod and {job.spec.trainer.nodes} trainer pod(s)"
            )
            if generation_index > 0:
                message += f" (vLLM pod {expected[0]} replaced a failed one)"
            rp.set_phase("Running", "AllPodsRunning", message)
            rp.event(event_reasons.RUNNING, message)
        return

    _waiting(rp, job, observed, expected, present)


# The status reason while a replaced vLLM pod gets Ready: the restart table's row.
REPLACING_GENERATION = GENERATION_REPLACED.reason


def _generation_index(current: dict[str, PodView]) -> int:
    """Which vLLM pod of the attempt is the live one: the highest n of ``<job>-gen-<attempt>-<n>`` (n counts
    the attempt's replacements; the replaced pods are kept, for their logs, until the attempt ends)."""
    indices = [int(p.name.rsplit("-", 1)[1]) for p in current.values() if p.role == "generation"]
    return max(indices, default=0)


def _replace_generation(
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


def _awaiting_replacement(
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
        f"({_duration(elapsed)} of {_duration(budget)})"
    )
    rp.set_phase("Running", REPLACING_GENERATION, message)
    rp.requeue_at(since + timedelta(seconds=budget))
    rp.requeue_at(rp.now + timedelta(seconds=60))  # the elapsed minutes in the message
    return True


def _attempt_of(job: Job, pod_name: str) -> int | None:
    labels = gang_pod_labels(job.name, pod_name)
    return int(labels[LABEL_ATTEMPT]) if labels is not None else None


def _pods_drifted(
    rp: ReconcilePass, job: Job, observed: Observed, built: list[dict[str, Any]], current: dict[str, PodView]
) -> bool:
    """A pod of the gang whose image, resources or deadline is no longer what the operator built (see
    drift.pod_drift) is replaced with the whole gang, not counted against backoffLimit. When the pods of a
    gang started because of drift drift too before it ran, it is the cluster that changes them as they
    are created (a mutating admission webhook): replacing them again would never end, so the job fails."""
    for manifest in built:
        pod = current.get(manifest["metadata"]["name"])
        drifts = pod_drift(manifest, pod.obj) if pod is not None and not pod.terminating else []
        if pod is None or not drifts:
            continue
        fields = describe(drifts)
        rp.event(
            event_reasons.CHILD_DRIFTED,
            f"Pod {pod.name} was changed outside the operator ({fields}); the gang is replaced by pods as built",
        )
        message = f"pod {pod.name} differs from what the operator built ({fields})"
        if rp.old_phase == "Restarting" and rp.new.get("reason") == CHILD_DRIFTED.reason:
            fail(
                rp,
                job,
                observed,
                CHILD_DRIFTED.reason,
                f"{message}, and so did the pods that replaced the last changed gang before they ran: something in "
                "the cluster changes the job's pods as they are created (a mutating admission webhook rewriting "
                "images or resources?). Exempt the job's namespace from it, or ask the platform team",
            )
        else:
            restart_or_fail(rp, job, observed, CHILD_DRIFTED, message)
        return True
    return False


def _resume_from(job: Job, rp: ReconcilePass) -> str:
    """RESUME_FROM of a new gang. Under Kueue the new attempt's pods wait at the gate until the queue
    admits them again, which can be after the old attempt wrote its SIGTERM checkpoint (a preemption's
    grace period) and before the status shows it: name the checkpoint root, whose latest.json points at
    the newest checkpoint this job published, instead of the one known now."""
    queued = job.spec.scheduling.queue_name or rp.settings.default_queue_name
    if queued and rp.checkpoint_path:
        return str(PurePosixPath(rp.checkpoint_path).parent)
    return rp.checkpoint_path


def _unbound_claim(job: Job, observed: Observed) -> dict[str, Any] | None:
    """The claim a new gang waits for ({} while it is being created), or None when the pods are due now.

    A new gang is created once its claim is bound when the claim's StorageClass binds immediately. The
    scheduler turns away a pod whose claim is not bound yet ("pod has unbound immediate
    PersistentVolumeClaims") and retries it with a growing back-off: created before the binding, the pods
    start later than created after it, and the job reports a passing Unschedulable with a Warning. A class
    that binds for a claim's first pod (WaitForFirstConsumer), or one the operator cannot see, never waits:
    there the pods are what gets the claim bound. Nor does a claim the user brought (existingClaim): the
    operator does not watch claims it did not create."""
    volume = job.spec.checkpoints.volume
    name = created_pvc_name(job)
    if volume.existing_claim or not observed.waits_for_binding(name, volume.storage_class_name):
        return None
    return observed.get("PersistentVolumeClaim", name) or {}


def _wait_for_volume(rp: ReconcilePass, job: Job, observed: Observed, claim: dict[str, Any]) -> bool:
    """Says that the gang waits for its volume, once the claim is settings.volume_wait_reported_seconds
    old: most claims are bound within seconds, and two status writes for each such wait (to say it, and to
    say it is over) would be writes for nothing (until then the job reads "waiting for the pods to be
    created", which is true). False while it says nothing yet."""
    name = created_pvc_name(job)
    created = parse_time((claim.get("metadata") or {}).get("creationTimestamp"))
    if created is None:
        return False  # created by this reconcile
    limit = job.spec.run_policy.startup_deadline_seconds
    # Both moments are scheduled: a startup deadline shorter than the report delay still fails the job on time.
    expired = rp.due(created + timedelta(seconds=limit))
    if not rp.due(created + timedelta(seconds=rp.settings.volume_wait_reported_seconds)) and not expired:
        return False
    message = (
        f"gang attempt {rp.attempt}: its pods are created once PersistentVolumeClaim {name} is bound (its "
        "StorageClass binds volumes immediately, and the scheduler turns away pods whose claim is not bound)"
    )
    rp.condition(SCHEDULED, "False", "WaitingForVolume", message)
    rp.condition(RUNNING, "False", "Pending", message)
    rp.set_phase("Pending", "WaitingForVolume", message)
    _not_suspended(rp)
    if not expired:
        return True
    restart_or_fail(
        rp,
        job,
        observed,
        STARTUP_DEADLINE_EXCEEDED,
        f"PersistentVolumeClaim {name} was not bound within spec.runPolicy.startupDeadlineSeconds ({limit}s) "
        f"of its creation, so gang attempt {rp.attempt} never started: kubectl describe pvc {name} says "
        "why (no provisioner for its StorageClass, a failing one, a storage quota)",
    )
    return True


def _wait_for_earlier_pods(rp: ReconcilePass, names: list[str]) -> None:
    """Fencing, as a JobSet does: attempt n+1 starts only once attempt n's pods are gone from the API, not
    merely terminating, because an old trainer rank 0 may still be writing its SIGTERM checkpoint (it has
    terminationGracePeriodSeconds for that) to the volume the new gang resumes from."""
    reason = (
        str(rp.new.get("reason") or "Restarting")
        if rp.new.get("phase") == "Restarting"
        else "PodsTerminating"
    )
    message = (
        f"gang attempt {rp.attempt} starts once the pods of the previous attempt are gone (a trainer may "
        f"still be writing its checkpoint); still terminating: {', '.join(names)}"
    )
    rp.set_phase("Restarting", reason, message)
    rp.condition(RUNNING, "False", "Restarting", message)


def _waiting(
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
            rp.condition(SCHEDULED, "False", "Scheduling", _SCHEDULING)
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
    _not_suspended(rp)
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


def _not_suspended(rp: ReconcilePass) -> None:
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


def _startup_deadline(rp: ReconcilePass, job: Job, observed: Observed, present: list[PodView]) -> None:
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


def _stalled(rp: ReconcilePass, job: Job, observed: Observed, generation: PodView | None) -> bool:
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


def _cancelled_message(rp: ReconcilePass, rule: RestartRule) -> str:
    steps = (rp.old.get("progress") or {}).get("step")
    at = f" after step {steps}" if steps is not None else ""
    return (
        f"exit code {rule.exit_code} means {rule.meaning} (Arbor's cancel route): trainer rank 0 stopped{at} "
        "without training further; the checkpoints written so far stay on the volume"
    )


def restart_or_fail(rp: ReconcilePass, job: Job, observed: Observed, rule: RestartRule, message: str) -> None:
    """What the restart policy says for ``rule``: fail the job at once, fail it because the counted
    restarts are spent, or restart the gang."""
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
    _restart(rp, job, observed, rule, message)


def _restart(rp: ReconcilePass, job: Job, observed: Observed, rule: RestartRule, message: str) -> None:
    """Replace the whole gang by a new attempt that resumes from the last verified checkpoint."""
    attempt = rp.attempt + 1
    restarts = rp.restarts + (1 if rule.counted else 0)
    limit = job.spec.run_policy.backoff_limit
    budget = f"restart {restarts}/{limit}" if rule.counted else "not counted against backoffLimit"
    where = resume_point(rp)
    rp.new["trainerAttempt"] = attempt
    rp.new["restarts"] = restarts
    full = f"{message}; restarting the gang as attempt {attempt} ({budget}), {where}"
    rp.set_phase("Restarting", rule.reason, full)
    rp.condition(RUNNING, "False", "Restarting", full)
    # The new gang's pods exist once this plan is carried out, but nothing has placed them yet.
    rp.condition(SCHEDULED, "False", "Scheduling", _SCHEDULING)
    rp.event(event_reasons.RESTARTING, full)
    if rp.checkpoint_path:
        rp.event(event_reasons.RESUMED_FROM_CHECKPOINT, f"gang attempt {attempt} {where}")
    rp.plan.restart = Restart(reason=rule.reason, counted=rule.counted, message=message)
    # The new gang is created by a later reconcile, once every pod of this one is gone (see run_gang).
    delete_pods(rp, observed, lambda pod: pod.role in GANG_ROLES)
