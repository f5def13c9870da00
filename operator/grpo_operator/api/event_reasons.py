"""Every reason of the Kubernetes Events the operator posts on a GRPOJob, with its type and meaning.

Reconcile posts only these constants (``ReconcilePass.event`` takes an ``EventReason``, and
tests/unit/test_event_reasons.py fails on a reason written as a literal); ``kubectl grpo status`` lists
the ones marked ``restart_or_failure`` as the job's restarts; ``make generate`` renders the catalog into
docs/operations.md ("Events"). Reasons are part of the interface: alerts and scripts select events by
them, so a reason is renamed only with a note in the changelog.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True)
class EventReason:
    reason: str
    type: EventType
    # When the event is posted and what its message says, in the words of the docs' table.
    when: str
    # The event tells of a gang restart or of the job failing (`kubectl grpo status` lists these).
    restart_or_failure: bool = False


CREATED = EventReason("Created", "Normal", "The job's children and its first gang were created.")
UNSCHEDULABLE = EventReason(
    "Unschedulable",
    "Warning",
    "A pod cannot be scheduled; the message is the scheduler's. Posted when the job enters this state, not "
    "on every retry.",
)
WAITING_FOR_ADMISSION = EventReason("WaitingForAdmission", "Warning", "Pods wait for Kueue to admit them.")
PREEMPTED = EventReason(
    "Preempted",
    "Warning",
    "The gang that replaced a gang Kueue preempted waits to be admitted again; the message is Kueue's.",
    restart_or_failure=True,
)
RUNNING = EventReason("Running", "Normal", "Every pod of a gang attempt runs.")
METRIC_NOT_READY = EventReason(
    "MetricNotReady",
    "Warning",
    "The metric service has no ready pod for a reason that waiting will not fix (pods refused by the API "
    "server, unschedulable, image cannot be pulled, crash loop); posted once per cause.",
)
ENVIRONMENT_NOT_READY = EventReason(
    "EnvironmentNotReady", "Warning", "The same for the environment server of a job with `spec.environment`."
)
GATEWAY_NOT_READY = EventReason(
    "GatewayNotReady", "Warning", "The same for a client-rollout job's rollout gateway."
)
RESTARTING = EventReason(
    "Restarting",
    "Warning",
    "The gang is restarted; the message has the cause (failed pod and its exit code and message, "
    "disruption, stall, spec change), whether it counts (`restart 1/3`) or not, and the resume point.",
    restart_or_failure=True,
)
GENERATION_REPLACED = EventReason(
    "GenerationReplaced",
    "Warning",
    "A vLLM pod failed or was stopped while the trainers ran, and only it is replaced (not counted against "
    "`backoffLimit`); the message names the failed pod (and its replica, with several), vLLM's last words "
    "and the new pod.",
    restart_or_failure=True,
)
RESUMED_FROM_CHECKPOINT = EventReason(
    "ResumedFromCheckpoint", "Normal", "A new gang resumes from `status.checkpoint.path`."
)
NON_FINITE_TRAINING = EventReason(
    "NonFiniteTraining",
    "Warning",
    "A trainer exited 5: a step's loss, gradient norm or weights were NaN or infinite; the message names "
    "the step. Followed by `Restarting` (counted) or `Failed`.",
    restart_or_failure=True,
)
OUT_OF_MEMORY = EventReason(
    "OutOfMemory",
    "Warning",
    "A trainer exited 6: CUDA ran out of GPU memory; the message quotes the failed allocation and what to "
    "change. Followed by `Failed`.",
    restart_or_failure=True,
)
MEMORY_PLAN_EXCEEDED = EventReason(
    "MemoryPlanExceeded",
    "Warning",
    "A trainer exited 8: the memory it planned at start does not fit its GPU; the message gives the need "
    "per GPU and the settings that would fit. Followed by `Failed`.",
    restart_or_failure=True,
)
OOM_KILLED = EventReason(
    "OOMKilled",
    "Warning",
    "The kernel killed a trainer or vLLM container for exceeding its memory limit (host memory). Followed "
    "by `Restarting` (counted) or `Failed`.",
    restart_or_failure=True,
)
CHECKPOINT_MISMATCH = EventReason(
    "CheckpointMismatch",
    "Warning",
    "A trainer exited 4: the checkpoint on the volume belongs to another job or holds another model/LoRA "
    "setting; the message names both. Followed by `Failed`.",
    restart_or_failure=True,
)
CANCELLED_BY_CLIENT = EventReason(
    "CancelledByClient",
    "Warning",
    "Trainer rank 0 of a client-rollout job exited 7: its client cancelled the run. Followed by `Failed`.",
    restart_or_failure=True,
)
DRIVER_TOO_OLD = EventReason(
    "DriverTooOld",
    "Warning",
    "The NVIDIA container runtime refused to start a trainer or vLLM container because the node's driver "
    "is older than the CUDA version its image requires; the message names the pod, the node, the CUDA "
    "version and the driver needed. Followed by `Failed`.",
    restart_or_failure=True,
)
CHILD_DRIFTED = EventReason(
    "ChildDrifted",
    "Warning",
    "A child was changed outside the operator (`kubectl edit`, `kubectl set image`, a relabelled pod); "
    "the message names the fields. A child is restored or recreated as built; a changed gang pod "
    "replaces the gang (not counted). Also when the platform changed the default trainer or vLLM image "
    "(`jobDefaults.images`) of a job that names none: the message then says so, from which image to which.",
)
SERVED_MODEL_DRIFT = EventReason(
    "ServedModelDrift",
    "Warning",
    "Trainer rank 0 found, after a weight sync, that vLLM's log-probabilities of its probe text differ from "
    "the trained model's (`status.servedModel`): vLLM serves other weights than the ones being trained. "
    "Posted when the `ServedModelInSync` condition turns False.",
)
UPDATES_VANISHING = EventReason(
    "UpdatesVanishing",
    "Warning",
    "Trainer rank 0 found that its optimizer steps change almost none of its weights (`status.updates`: "
    "under 1 % of a fixed sample of weight elements changed in 3 steps in a row): the run computes "
    "gradients and learns nothing. The message names the likely cause (weights in bfloat16/float16 with a "
    "small learning rate, a learning rate too small, every group tied, every completion truncated and "
    "masked) and the fix. Posted when the `UpdatesEffective` condition turns False.",
)
NOT_LEARNING = EventReason(
    "NotLearning",
    "Warning",
    "Trainer rank 0 diagnosed, over its last steps, why the job is not learning (`status.learning`): the "
    "message names the diagnosis (NoSignal, CompletionsTruncated, UpdatesVanishing, ...), what was seen over "
    "which steps and the setting to change. Posted once per change of diagnosis, when the `LearningHealthy` "
    "condition turns False or changes reason; with `grpo.learningHealth.stopWhenUnhealthy` the trainer then "
    "exits 9 and the job fails.",
    restart_or_failure=False,
)
LEARNING_SOLVED = EventReason(
    "LearningSolved",
    "Normal",
    "Most groups tie at the best reward seen: the task is learned (condition `LearningHealthy`, reason "
    "Solved). Stopping early or a harder dataset saves GPU time.",
)
LEARNING_RECOVERED = EventReason(
    "LearningRecovered",
    "Normal",
    "The learning-health diagnosis is Healthy again after a NotLearning warning.",
)
SUSPENDED = EventReason("Suspended", "Normal", "`spec.suspend` was set to true.")
BUDGET_NEARLY_SPENT = EventReason(
    "BudgetNearlySpent",
    "Warning",
    "The job has spent `spec.budget.warnAtPercent` (default 80 %) of `spec.budget.gpuHours`; the message "
    "gives the GPU-hours spent and the budget. Posted once, when the `WithinBudget` condition turns to reason "
    "BudgetNearlySpent.",
)
BUDGET_EXHAUSTED = EventReason(
    "BudgetExhausted",
    "Warning",
    "The job has spent `spec.budget.gpuHours`: it is suspended as `spec.suspend` would (pods stopped after a "
    "checkpoint, volume and status kept; phase `Suspended`, reason `BudgetExhausted`), never failed. The "
    "message gives the GPU-hours spent and the budget; raising the budget above them resumes the job.",
)
RESUMED = EventReason(
    "Resumed",
    "Normal",
    "`spec.suspend` was set back to false, or a job suspended by its budget got a larger one (or none).",
)
SUCCEEDED = EventReason("Succeeded", "Normal", "Training finished.")
FAILED = EventReason(
    "Failed", "Warning", "The job failed; the message is the reason.", restart_or_failure=True
)
INVALID_SPEC = EventReason(
    "InvalidSpec",
    "Warning",
    "The stored spec does not validate (only possible with a CRD older than the operator); the job fails.",
    restart_or_failure=True,
)
POLICY_VIOLATION = EventReason(
    "PolicyViolation",
    "Warning",
    "The spec breaks a platform limit; posted when the violation first appears or changes.",
)
CHILD_REJECTED = EventReason(
    "ChildRejected",
    "Warning",
    "The API server refused to create or update a child (quota, Pod Security, admission policy): the "
    "message is the server's. The job's status says the same (`Pending`/`ChildRejected`) from the next "
    "reconcile on.",
)
CHILD_CONFLICT = EventReason(
    "ChildConflict",
    "Warning",
    "An object with a child's name is not this job's (see [Same-name objects](#same-name-objects-conflicts)); "
    "posted once per conflict.",
)

EVENT_REASONS: tuple[EventReason, ...] = (
    CREATED,
    UNSCHEDULABLE,
    WAITING_FOR_ADMISSION,
    PREEMPTED,
    RUNNING,
    METRIC_NOT_READY,
    ENVIRONMENT_NOT_READY,
    GATEWAY_NOT_READY,
    RESTARTING,
    GENERATION_REPLACED,
    RESUMED_FROM_CHECKPOINT,
    NON_FINITE_TRAINING,
    OUT_OF_MEMORY,
    MEMORY_PLAN_EXCEEDED,
    OOM_KILLED,
    CHECKPOINT_MISMATCH,
    CANCELLED_BY_CLIENT,
    DRIVER_TOO_OLD,
    CHILD_DRIFTED,
    SERVED_MODEL_DRIFT,
    UPDATES_VANISHING,
    NOT_LEARNING,
    LEARNING_SOLVED,
    LEARNING_RECOVERED,
    SUSPENDED,
    BUDGET_NEARLY_SPENT,
    BUDGET_EXHAUSTED,
    RESUMED,
    SUCCEEDED,
    FAILED,
    INVALID_SPEC,
    POLICY_VIOLATION,
    CHILD_REJECTED,
    CHILD_CONFLICT,
)

BY_REASON: dict[str, EventReason] = {r.reason: r for r in EVENT_REASONS}
# What `kubectl grpo status` lists as the job's restarts and failure.
RESTART_OR_FAILURE_REASONS: tuple[str, ...] = tuple(r.reason for r in EVENT_REASONS if r.restart_or_failure)
