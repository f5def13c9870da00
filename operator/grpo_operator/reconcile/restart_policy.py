"""The restart policy: every reason the operator restarts a job's gang or fails the job because of what
its pods did, in one table.

Each row says what triggers the reason, whether a restart for it counts against
spec.runPolicy.backoffLimit, and whether it fails the job at once instead of restarting. Reconcile reads
the table (gang.py's failures and disruptions, gang_startup.py's clocks, generation_replacement.py,
reconcile_job.py's active deadline);
`make generate` renders it into docs/operations.md ("Failures and restarts"), and
tests/unit/test_restart_policy.py drives reconcile through every row.

Exit codes and event reasons come from their catalogs in ``api`` (api/exit_codes.py,
api/event_reasons.py): a row that posts an event names the catalog's reason, and an exit-code row is
permanent when the catalog says so. The operator setting ``permanent_exit_codes``
(GRPO_OPERATOR_PERMANENT_EXIT_CODES) decides which trainer exit codes are permanent; its default is
``DEFAULT_PERMANENT_EXIT_CODES``, the catalog's permanent codes, which are the exit-code rows marked
permanent here. A code taken out of it becomes a counted restart under its row's reason; a code added
to it that has no row fails the job with the reason "PermanentFailure".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum

from grpo_operator.api import event_reasons
from grpo_operator.api.event_reasons import EventReason
from grpo_operator.api.exit_codes import BY_CODE, PERMANENT_EXIT_CODES, ExitCode


class Trigger(StrEnum):
    """What the operator sees that gives the reason."""

    EXIT_CODE = "trainer exit code"
    POD_FAILURE = "pod failure"
    DISRUPTION = "pod stopped from outside"
    OPERATOR = "operator decision"


@dataclass(frozen=True)
class RestartRule:
    """One reason: what triggers it and what the operator does about it."""

    reason: str
    trigger: Trigger
    # When it happens, in the words of the docs' table.
    cause: str
    # A restart for this reason counts against spec.runPolicy.backoffLimit (and fails the job with
    # BackoffLimitExceeded once the limit is spent). Meaningless for a permanent rule.
    counted: bool
    # The job fails at once: a restart would fail the same way.
    permanent: bool
    # What the reason means for the user; for a permanent exit code it completes "exit code N means ...".
    meaning: str
    # A trainer exit code (api/exit_codes.py); the operator setting may make any code permanent.
    exit_code: int | None = None
    # For disruptions: the reasons of a pod's DisruptionTarget condition, and the pod status reasons,
    # that the operator reports as this reason.
    condition_reasons: tuple[str, ...] = ()
    status_reasons: tuple[str, ...] = ()
    # The Warning event posted when the failure is seen, besides Restarting or Failed; its reason is
    # the row's.
    event: EventReason | None = None
    # False: the row replaces one pod and leaves the gang running (no new attempt); "counted" then says
    # whether that replacement counts against backoffLimit.
    replaces_gang: bool = True

    def __post_init__(self) -> None:
        if self.event is not None and self.event.reason != self.reason:
            raise ValueError(
                f"restart rule {self.reason!r} posts event {self.event.reason!r}: a row's event must carry "
                "the row's reason; name the event_reasons constant of the same reason"
            )


PERMANENT_FAILURE = RestartRule(
    "PermanentFailure",
    Trigger.EXIT_CODE,
    f"A trainer exits {ExitCode.CONFIG_INVALID:d} (configuration invalid, e.g. a dataset column that does not exist), or with any "
    "other code added to the permanent exit codes",
    counted=True,
    permanent=BY_CODE[ExitCode.CONFIG_INVALID].permanent,
    meaning="the configuration is invalid",
    exit_code=ExitCode.CONFIG_INVALID,
)
CHECKPOINT_MISMATCH = RestartRule(
    event_reasons.CHECKPOINT_MISMATCH.reason,
    Trigger.EXIT_CODE,
    f"A trainer exits {ExitCode.CHECKPOINT_MISMATCH:d}: the checkpoint on the volume belongs to another GRPOJob, or holds another model "
    "or LoRA setting",
    counted=True,
    permanent=BY_CODE[ExitCode.CHECKPOINT_MISMATCH].permanent,
    meaning="the checkpoint on the volume cannot be resumed by this job",
    exit_code=ExitCode.CHECKPOINT_MISMATCH,
    event=event_reasons.CHECKPOINT_MISMATCH,
)
NON_FINITE_TRAINING = RestartRule(
    event_reasons.NON_FINITE_TRAINING.reason,
    Trigger.EXIT_CODE,
    f"A trainer exits {ExitCode.NON_FINITE:d}: non-finite loss, gradient norm or weights; nothing of that step was published",
    counted=True,
    permanent=BY_CODE[ExitCode.NON_FINITE].permanent,
    meaning="a training step was not finite; the restart resumes from the last good checkpoint",
    exit_code=ExitCode.NON_FINITE,
    event=event_reasons.NON_FINITE_TRAINING,
)
OUT_OF_MEMORY = RestartRule(
    event_reasons.OUT_OF_MEMORY.reason,
    Trigger.EXIT_CODE,
    f"A trainer exits {ExitCode.OUT_OF_MEMORY:d}: CUDA out of memory",
    counted=True,
    permanent=BY_CODE[ExitCode.OUT_OF_MEMORY].permanent,
    meaning="the training does not fit in GPU memory",
    exit_code=ExitCode.OUT_OF_MEMORY,
    event=event_reasons.OUT_OF_MEMORY,
)
MEMORY_PLAN_EXCEEDED = RestartRule(
    event_reasons.MEMORY_PLAN_EXCEEDED.reason,
    Trigger.EXIT_CODE,
    f"A trainer exits {ExitCode.MEMORY_PLAN_EXCEEDED:d}: the memory planned at start does not fit the GPU",
    counted=True,
    permanent=BY_CODE[ExitCode.MEMORY_PLAN_EXCEEDED].permanent,
    meaning="the training as set up does not fit in GPU memory",
    exit_code=ExitCode.MEMORY_PLAN_EXCEEDED,
    event=event_reasons.MEMORY_PLAN_EXCEEDED,
)
NOT_LEARNING = RestartRule(
    event_reasons.NOT_LEARNING.reason,
    Trigger.EXIT_CODE,
    f"Trainer rank 0 exits {ExitCode.NOT_LEARNING:d}: `grpo.learningHealth.stopWhenUnhealthy` and a diagnosis held",
    counted=True,
    permanent=BY_CODE[ExitCode.NOT_LEARNING].permanent,
    meaning="the job was not learning and was asked to stop when so; the message names the diagnosis",
    exit_code=ExitCode.NOT_LEARNING,
)
CANCELLED_BY_CLIENT = RestartRule(
    event_reasons.CANCELLED_BY_CLIENT.reason,
    Trigger.EXIT_CODE,
    f"Trainer rank 0 exits {ExitCode.CANCELLED:d}: the client of a client-rollout job cancelled the run (Arbor's cancel route)",
    counted=False,
    permanent=BY_CODE[ExitCode.CANCELLED].permanent,
    meaning="the client cancelled the run",
    exit_code=ExitCode.CANCELLED,
    event=event_reasons.CANCELLED_BY_CLIENT,
)
TRAINER_FAILED = RestartRule(
    "TrainerFailed",
    Trigger.POD_FAILURE,
    "A trainer pod fails with any other non-zero exit code",
    counted=True,
    permanent=False,
    meaning="a crash, an NCCL or I/O error: transient; the restart resumes from the last checkpoint",
)
OOM_KILLED = RestartRule(
    event_reasons.OOM_KILLED.reason,
    Trigger.POD_FAILURE,
    "A trainer or vLLM container is killed for exceeding its memory limit (container reason `OOMKilled`)",
    counted=True,
    permanent=False,
    meaning="host memory, not GPU memory: raise the pod's memory request and limit",
    event=event_reasons.OOM_KILLED,
)
# Permanent and uncounted. The driver belongs to the node, not to the job: a new gang lands in the same pool
# (often on the same node, whose GPUs the failed pod just freed) and is refused the same way, so a restart
# would only spend backoffLimit, one gang at a time, while the job's other pods hold their GPUs idle. Waiting
# cannot help either: the pods never restart (restartPolicy Never) and their affinity is fixed at creation.
# The job fails at once, within a reconcile of the refusal, naming the driver needed and the two fixes
# (keep GPU pods off such nodes, or a newer driver), both outside the job.
DRIVER_TOO_OLD = RestartRule(
    event_reasons.DRIVER_TOO_OLD.reason,
    Trigger.POD_FAILURE,
    "The NVIDIA container runtime refuses to start a trainer or vLLM container (`nvidia-container-cli: "
    "requirement error: unsatisfied condition: cuda>=X`, as a waiting `RunContainerError`/"
    "`CreateContainerError` or a terminated `StartError`): the node's driver is older than the image's CUDA",
    counted=False,
    permanent=True,
    meaning="the node's NVIDIA driver is too old for the image; the message names the driver needed. Keep "
    "GPU pods off such nodes (`jobDefaults.gpuNodeAffinity`) or upgrade the driver, then recreate the job",
    event=event_reasons.DRIVER_TOO_OLD,
)
# How many times one gang attempt may replace the vLLM pod of one replica alone (GenerationReplaced) before a
# failure of that replica restarts the gang (GenerationFailed): a server that keeps dying is not a hiccup.
GENERATION_REPLACEMENTS_PER_ATTEMPT = 3
GENERATION_REPLACED = RestartRule(
    event_reasons.GENERATION_REPLACED.reason,
    Trigger.POD_FAILURE,
    "A vLLM pod fails, exits or is stopped from outside while every trainer pod runs, and the attempt has "
    f"replaced that replica's pod fewer than {GENERATION_REPLACEMENTS_PER_ATTEMPT} times (counted per replica "
    "of `generation.replicas`); under Kueue the replacement joins the gang's pod group",
    counted=False,
    permanent=False,
    meaning="only that vLLM pod is replaced (`<job>-gen-<attempt>-<n>`, `<job>-gen-r<r>-<attempt>-<n>` for "
    "replica r, n counting up); the trainers keep running, wait for it within "
    "`generation.startupTimeoutSeconds`, and push their current weights into it before they generate on it "
    "again. The failed pod is kept, for its log, until the attempt ends",
    event=event_reasons.GENERATION_REPLACED,
    replaces_gang=False,
)
GENERATION_FAILED = RestartRule(
    "GenerationFailed",
    Trigger.POD_FAILURE,
    "A vLLM pod fails or exits before the gang runs, while a trainer pod is not running, or after "
    f"{GENERATION_REPLACEMENTS_PER_ATTEMPT} replacements of its replica in one attempt",
    counted=True,
    permanent=False,
    meaning="the vLLM server stopped and replacing it alone is not the answer; the gang restarts",
)
EVICTED = RestartRule(
    "Evicted",
    Trigger.DISRUPTION,
    "Eviction (Eviction API, kubelet node pressure)",
    counted=False,
    permanent=False,
    meaning="not the job's fault",
    condition_reasons=("EvictionByEvictionAPI",),
    status_reasons=("Evicted",),
)
PREEMPTED = RestartRule(
    event_reasons.PREEMPTED.reason,
    Trigger.DISRUPTION,
    "Preemption by the scheduler, or by Kueue (its `TerminationTarget` condition names a preemption)",
    counted=False,
    permanent=False,
    meaning="not the job's fault; under Kueue the new gang waits to be admitted again",
    condition_reasons=("PreemptionByScheduler", "PreemptionByKubeScheduler"),
    status_reasons=("Preempted", "Preempting"),
)
EVICTED_BY_KUEUE = RestartRule(
    "EvictedByKueue",
    Trigger.DISRUPTION,
    "Kueue evicts the workload for another cause (pods-ready timeout, deactivation)",
    counted=False,
    permanent=False,
    meaning="not the job's fault; the new gang waits to be admitted again",
)
NODE_LOST = RestartRule(
    "NodeLost",
    Trigger.DISRUPTION,
    "The node is gone, unreachable or deleted (taint manager, pod garbage collection)",
    counted=False,
    permanent=False,
    meaning="not the job's fault",
    condition_reasons=("DeletionByTaintManager", "DeletionByPodGC"),
    status_reasons=("NodeLost",),
)
NODE_SHUTDOWN = RestartRule(
    "NodeShutdown",
    Trigger.DISRUPTION,
    "Graceful node shutdown",
    counted=False,
    permanent=False,
    meaning="not the job's fault",
    condition_reasons=("TerminationByKubelet",),
    status_reasons=("Shutdown", "NodeShutdown", "Terminated"),
)
POD_DELETED = RestartRule(
    "PodDeleted",
    Trigger.DISRUPTION,
    "A gang pod deleted, or gone, while the gang was running, by anyone but the operator",
    counted=False,
    permanent=False,
    meaning="not the job's fault",
)
OTHER_DISRUPTION = RestartRule(
    "DisruptionTarget",
    Trigger.DISRUPTION,
    "A `DisruptionTarget` condition with a reason not listed above: reported under that reason",
    counted=False,
    permanent=False,
    meaning="not the job's fault",
)
SPEC_CHANGED = RestartRule(
    "SpecChanged",
    Trigger.OPERATOR,
    "A spec change that shapes the pods (images, GPUs, config, scheduling)",
    counted=False,
    permanent=False,
    meaning="the new gang runs the new spec, from the last checkpoint",
)
CHILD_DRIFTED = RestartRule(
    event_reasons.CHILD_DRIFTED.reason,
    Trigger.OPERATOR,
    "A gang pod changed outside the operator: a container's image or resources, or its deadline, differ "
    "from the pod the operator built (`kubectl set image`), or it lost the job's labels; or the platform "
    "changed the default image (`jobDefaults.images`) a job that names none runs",
    counted=False,
    permanent=False,
    meaning="not the job's failure; the new gang runs the pods as built. If the new gang's pods drift "
    "too before it runs, the job fails: something in the cluster changes pods as they are created",
    event=event_reasons.CHILD_DRIFTED,
)
GENERATION_STARTUP_TIMEOUT = RestartRule(
    "GenerationStartupTimeout",
    Trigger.OPERATOR,
    "A vLLM pod (any replica) is not Ready within `generation.startupTimeoutSeconds` of starting",
    counted=True,
    permanent=False,
    meaning="see the vLLM pod's log; raise startupTimeoutSeconds if the download only needs longer",
)
PROGRESS_DEADLINE_EXCEEDED = RestartRule(
    "ProgressDeadlineExceeded",
    Trigger.OPERATOR,
    "No step advance for `runPolicy.progressDeadlineSeconds` while Running",
    counted=True,
    permanent=False,
    meaning="the gang is considered stalled",
)
STARTUP_DEADLINE_EXCEEDED = RestartRule(
    "StartupDeadlineExceeded",
    Trigger.OPERATOR,
    "A gang attempt is not running within `runPolicy.startupDeadlineSeconds` (see Deadlines)",
    counted=False,
    permanent=True,
    meaning="the message says what the gang was waiting for (its volume, scheduler, Kueue, image pull)",
)
DEADLINE_EXCEEDED = RestartRule(
    "DeadlineExceeded",
    Trigger.OPERATOR,
    "The job runs longer than `runPolicy.activeDeadlineSeconds`",
    counted=False,
    permanent=True,
    meaning="the time the job was given is spent",
)
BACKOFF_LIMIT_EXCEEDED = RestartRule(
    "BackoffLimitExceeded",
    Trigger.OPERATOR,
    "A counted reason after `runPolicy.backoffLimit` counted restarts",
    counted=False,
    permanent=True,
    meaning="the message names the last failure, its exit code and termination message",
)

RULES: tuple[RestartRule, ...] = (
    PERMANENT_FAILURE,
    CHECKPOINT_MISMATCH,
    NON_FINITE_TRAINING,
    OUT_OF_MEMORY,
    MEMORY_PLAN_EXCEEDED,
    NOT_LEARNING,
    CANCELLED_BY_CLIENT,
    TRAINER_FAILED,
    OOM_KILLED,
    DRIVER_TOO_OLD,
    GENERATION_REPLACED,
    GENERATION_FAILED,
    GENERATION_STARTUP_TIMEOUT,
    PROGRESS_DEADLINE_EXCEEDED,
    EVICTED,
    PREEMPTED,
    EVICTED_BY_KUEUE,
    NODE_LOST,
    NODE_SHUTDOWN,
    POD_DELETED,
    OTHER_DISRUPTION,
    SPEC_CHANGED,
    CHILD_DRIFTED,
    STARTUP_DEADLINE_EXCEEDED,
    DEADLINE_EXCEEDED,
    BACKOFF_LIMIT_EXCEEDED,
)

_BY_EXIT_CODE = {rule.exit_code: rule for rule in RULES if rule.exit_code is not None}
DEFAULT_PERMANENT_EXIT_CODES: tuple[int, ...] = PERMANENT_EXIT_CODES
# Trainer exit codes with a reason of their own (the trainer's ExitCode).
TRAINER_EXIT_REASONS = {
    code: rule.reason for code, rule in _BY_EXIT_CODE.items() if rule is not PERMANENT_FAILURE
}

_DISRUPTIONS = [rule for rule in RULES if rule.trigger is Trigger.DISRUPTION and rule is not OTHER_DISRUPTION]
_BY_DISRUPTION = {
    name: rule
    for rule in _DISRUPTIONS
    for name in (rule.reason, *rule.condition_reasons, *rule.status_reasons)
}
# Pod status reasons (status.reason) that mean the platform stopped the pod.
DISRUPTION_STATUS_REASONS = frozenset(name for rule in _DISRUPTIONS for name in rule.status_reasons)


def trainer_exit(code: int, permanent_codes: tuple[int, ...]) -> RestartRule | None:
    """The rule for a trainer that exited with ``code``, with the operator's permanent codes deciding
    permanence; None for a code that is neither permanent nor has a reason of its own."""
    rule = _BY_EXIT_CODE.get(code)
    permanent = code in permanent_codes
    if rule is None or rule is PERMANENT_FAILURE:
        return dataclasses.replace(PERMANENT_FAILURE, exit_code=code) if permanent else None
    return dataclasses.replace(rule, permanent=permanent)


def disruption(why: str) -> RestartRule:
    """The rule for a pod stopped from outside, from the cause PodView.disruption gives; a cause the
    table does not list is reported under its own name."""
    rule = _BY_DISRUPTION.get(why)
    return rule if rule is not None else dataclasses.replace(OTHER_DISRUPTION, reason=why)
