"""The gang of the current attempt (every vLLM replica's live pod, then the trainers): creating it, its
success, failures, disruptions and drift. Its start-up clocks and stalls are in gang_startup, a replaced
vLLM pod in generation_replacement, and the restart itself in gang_restart."""

from __future__ import annotations

from datetime import timedelta
from pathlib import PurePosixPath
from typing import Any

from grpo_operator.api import event_reasons
from grpo_operator.builders import Job, gang_hash, gang_pods
from grpo_operator.builders.common import (
    ANNOTATION_DEFAULT_IMAGE,
    LABEL_ATTEMPT,
    created_pvc_name,
    generation_pod_name,
    generation_replicas,
    trainer_pod_name,
)
from grpo_operator.reconcile.children import delete_pods, gang_pod_labels
from grpo_operator.reconcile.conditions import RUNNING, SCHEDULED
from grpo_operator.reconcile.drift import Drift, describe, pod_drift
from grpo_operator.reconcile.finished import fail, succeed
from grpo_operator.reconcile.gang_restart import restart_or_fail
from grpo_operator.reconcile.gang_startup import mark_not_suspended, report_waiting, stalled
from grpo_operator.reconcile.generation_replacement import (
    REPLACING_GENERATION,
    awaiting_replacement,
    generation_indices,
    replace_generation,
    replica_text,
)
from grpo_operator.reconcile.gpu_driver import cuda_refusal, driver_too_old_message
from grpo_operator.reconcile.observed import Observed, PodView, parse_time
from grpo_operator.reconcile.reconcile_pass import GANG_ROLES, ReconcilePass
from grpo_operator.reconcile.restart_policy import (
    CANCELLED_BY_CLIENT,
    CHILD_DRIFTED,
    DRIVER_TOO_OLD,
    GENERATION_FAILED,
    OOM_KILLED,
    POD_DELETED,
    SPEC_CHANGED,
    STARTUP_DEADLINE_EXCEEDED,
    TRAINER_FAILED,
    RestartRule,
    disruption,
    trainer_exit,
)
from grpo_operator.settings import OperatorSettings


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
    # The vLLM pods of this attempt, or of an earlier one kept when the trainers alone were restarted.
    served_by = rp.generation_attempt
    nodes = observed.nodes
    gang = [p for p in observed.pods() if p.role in GANG_ROLES]
    current = {p.name: p for p in gang if p.attempt == _attempt_for(p, attempt, served_by)}
    # The live vLLM pod of each replica, then the trainers.
    live_generation = generation_indices(job, current)
    generation_names = [generation_pod_name(job, served_by, n, r) for r, n in sorted(live_generation.items())]
    trainer_names = [trainer_pod_name(job, attempt, rank) for rank in range(job.spec.trainer.nodes)]
    expected = generation_names + trainer_names
    was_running = rp.old_phase == "Running"

    rank0 = current.get(trainer_pod_name(job, attempt, 0))
    if rank0 is not None and rank0.phase == "Succeeded" and rank0.disruption(nodes) is None:
        succeed(rp, job, observed)
        return

    altered = [(pod, why) for pod, why in rp.strays if _attempt_of(job, pod.name) in (attempt, served_by)]
    if altered and not any(pod.terminating for pod, _ in altered):
        pod, why = altered[0]
        restart_or_fail(
            rp, job, observed, CHILD_DRIFTED, f"pod {pod.name} was changed outside the operator ({why})"
        )
        return

    # Before failures: a refused container fails its pod as any crash would (StartError), and a waiting one
    # would otherwise sit until the start-up deadline. The restart policy's DriverTooOld row says why it
    # fails the job at once.
    for pod in current.values():
        refusal = None if pod.terminating else cuda_refusal(pod.status)
        if refusal is not None:
            message = driver_too_old_message(pod.role or "gang", pod.name, pod.node_name, refusal)
            rp.event(event_reasons.DRIVER_TOO_OLD, message)
            restart_or_fail(rp, job, observed, DRIVER_TOO_OLD, message)
            return

    failures: list[PodView] = []
    disruptions: list[tuple[RestartRule, str]] = []
    # Each pod that failed or was stopped from outside, with what happened to it.
    stopped: list[tuple[PodView, str]] = []
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
            stopped.append((pod, message))
        elif pod.phase == "Failed" or (pod.phase == "Succeeded" and pod.role == "generation"):
            failures.append(pod)
            stopped.append((pod, pod.failure_summary()))

    if (
        was_running
        and stopped
        and len(stopped) == len(failures) + len(disruptions)
        and all(pod.role == "generation" for pod, _ in stopped)
        and replace_generation(rp, job, observed, current, trainer_names, stopped, live_generation)
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
        restart_or_fail(
            rp, job, observed, rule, summary, keep_generation=_keep_generation(rp, job, current, stopped)
        )
        return
    if disruptions:
        rule, message = disruptions[0]
        restart_or_fail(
            rp, job, observed, rule, message, keep_generation=_keep_generation(rp, job, current, stopped)
        )
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
    built = gang_pods(job, rp.settings, attempt, resume_from, live_generation, served_by)
    if _pods_drifted(rp, job, observed, built, current):
        return

    # Steady state: remove pods of earlier attempts, create missing pods, report progress.
    delete_pods(
        rp,
        observed,
        lambda pod: pod.role in GANG_ROLES and pod.attempt != _attempt_for(pod, attempt, served_by),
    )
    missing = [m for m in built if m["metadata"]["name"] not in current]
    if missing:
        earlier = sorted(
            {p.name for p in gang if p.attempt != _attempt_for(p, attempt, served_by)}
            | {pod.name for pod, _ in rp.strays}
        )
        if not current and attempt > 1:
            # Before a new gang starts, the previous one must be gone, and a pod of it that lost its labels
            # is not in the watch: look its names up (fencing, see _wait_for_earlier_pods).
            seen = {p.name for p in gang} | {pod.name for pod, _ in rp.strays}
            previous = [generation_pod_name(job, attempt - 1, 0, r) for r in generation_replicas(job)] + [
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
    if (
        was_running
        and any(live_generation.values())
        and awaiting_replacement(rp, job, observed, current, live_generation)
    ):
        return
    all_running = len(present) == len(expected) and all(p.phase == "Running" for p in present)
    if not was_running:
        # A new gang runs only once vLLM answers /health (every replica's): until then the trainers merely
        # wait for it, and neither the Running phase nor the progress clock may start.
        all_running = all_running and all(p.ready for p in present if p.role == "generation")
    if all_running:
        # The progress clock starts again when a replaced vLLM pod gets Ready: the newest Ready one counts.
        generation = max(
            (current[name] for name in generation_names if current[name].ready_since is not None),
            key=lambda p: p.ready_since or rp.now,
            # A colocated job has no vLLM pod: the clock runs from the trainers alone.
            default=current.get(generation_names[0]) if generation_names else None,
        )
        if stalled(rp, job, observed, generation):
            return
        rp.condition(SCHEDULED, "True", "AllPodsScheduled", f"all {len(expected)} pods are scheduled")
        rp.condition(RUNNING, "True", "AllPodsRunning", f"all {len(expected)} pods of attempt {attempt} run")
        mark_not_suspended(rp)
        if rp.old_phase != "Running" or rp.new.get("reason") == REPLACING_GENERATION:
            servers = len(generation_names)
            trainers = f"{job.spec.trainer.nodes} trainer pod(s)"
            message = (
                f"gang attempt {attempt} is running: {servers} vLLM pod{'s' if servers > 1 else ''} and {trainers}"
                if servers
                else f"gang attempt {attempt} is running: {trainers}, generating with vLLM colocated in them"
            )
            replaced = [
                f"{replica_text(job, r)} pod {generation_pod_name(job, attempt, n, r)}"
                for r, n in sorted(live_generation.items())
                if n > 0
            ]
            if replaced:
                message += f" ({', '.join(replaced)} replaced a failed one)"
            if served_by != attempt and servers:
                message += f" (the vLLM pods of attempt {served_by}, kept: only the trainers were restarted)"
            rp.set_phase("Running", "AllPodsRunning", message)
            rp.event(event_reasons.RUNNING, message)
        return

    report_waiting(rp, job, observed, expected, present)


def _attempt_for(pod: PodView, attempt: int, served_by: int) -> int:
    """The attempt a gang pod of the current gang has: vLLM pods may be kept from an earlier one."""
    return served_by if pod.role == "generation" else attempt


def _keep_generation(
    rp: ReconcilePass, job: Job, current: dict[str, PodView], stopped: list[tuple[PodView, str]]
) -> bool:
    """Whether a restart may keep the running vLLM pods and replace the trainers alone: every pod that
    failed or was stopped is a trainer, every vLLM pod of the gang runs and answers /health, the weights
    reach vLLM through the volume or the Broadcast group (whose new rank 0 forms it again with the kept
    servers, which accept a second init), the job is not queued (under Kueue the gang is one pod group,
    admitted and released together), and the kept servers
    have served trainers that trained since: when the trainers restarted beside them fail again before a
    step, the servers may be the cause, and the next restart replaces them too. Reloading a large model
    takes minutes; the new trainers push their weights into the kept servers before their first step."""
    if not stopped or any(pod.role != "trainer" for pod, _ in stopped):
        return False
    if job.spec.scheduling.queue_name or rp.settings.default_queue_name or job.spec.generation.colocated():
        return False
    if job.spec.generation.weight_transport() not in ("Volume", "Broadcast"):
        # NCCL: new trainers would open a new TRL weight-transfer group with servers that still hold the
        # dead trainers' one, which no test here can exercise (NCCL needs two GPUs): the whole gang restarts.
        return False
    servers = [p for p in current.values() if p.role == "generation"]
    if not servers or any(p.terminating or p.phase != "Running" or not p.ready for p in servers):
        return False
    if rp.generation_attempt == rp.attempt:
        return True
    kept_at = rp.old.get("generationKeptAtStep")
    step = (rp.old.get("progress") or {}).get("step")
    return isinstance(step, int) and isinstance(kept_at, int) and step > kept_at


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
        changed = _default_image_change(pod, manifest, drifts)
        if changed:
            message = f"{changed}; pod {pod.name} runs the old one"
            rp.event(
                event_reasons.CHILD_DRIFTED,
                f"{message}: the gang is replaced by pods with the new image, from the last checkpoint (a job "
                "that must keep its image names it in its spec)",
            )
        else:
            rp.event(
                event_reasons.CHILD_DRIFTED,
                f"Pod {pod.name} was changed outside the operator ({fields}); the gang is replaced by pods as "
                "built",
            )
            message = f"pod {pod.name} differs from what the operator built ({fields})"
        # A default the platform changed again while the last one's gang restarts is no webhook's loop.
        if not changed and rp.old_phase == "Restarting" and rp.new.get("reason") == CHILD_DRIFTED.reason:
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


# The gang container that runs the platform's default image when the job leaves its own unset, by pod role:
# the container, the spec section that would name the image, and the Helm value that sets the default.
_DEFAULT_IMAGES = {
    "trainer": ("trainer", "trainer", "jobDefaults.images.trainer"),
    "generation": ("vllm", "generation", "jobDefaults.images.generation"),
}


def _default_image_change(pod: PodView, built: dict[str, Any], drifts: list[Drift]) -> str:
    """What changed, when a pod's one drift is its image and the pod runs the platform's default it was built
    with (ANNOTATION_DEFAULT_IMAGE) while the default now is another: the platform changed it (helm upgrade),
    and "changed outside the operator" would send the tenant looking for the wrong culprit. Empty otherwise:
    an image someone set by hand, or a mutating webhook's rewrite, is not the recorded default."""
    container, section, value = _DEFAULT_IMAGES.get(pod.role or "", ("", "", ""))
    if [(d.path, d.extra) for d in drifts] != [(f"spec.containers[{container}].image", False)]:
        return ""
    recorded = ((pod.obj.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_DEFAULT_IMAGE)
    new = ((built.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_DEFAULT_IMAGE)
    running = next(
        (
            c.get("image")
            for c in (pod.obj.get("spec") or {}).get("containers") or []
            if c.get("name") == container
        ),
        None,
    )
    if recorded is None or new is None or running != recorded:
        return ""
    role = "trainer" if section == "trainer" else "vLLM"
    return (
        f"the platform's default {role} image changed ({value}, which this job runs because it leaves "
        f"spec.{section}.image unset): {recorded} -> {new}"
    )


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
    mark_not_suspended(rp)
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


def _cancelled_message(rp: ReconcilePass, rule: RestartRule) -> str:
    steps = (rp.old.get("progress") or {}).get("step")
    at = f" after step {steps}" if steps is not None else ""
    return (
        f"exit code {rule.exit_code} means {rule.meaning} (Arbor's cancel route): trainer rank 0 stopped{at} "
        "without training further; the checkpoints written so far stay on the volume"
    )
