"""``GRPOJob.status``: written by the operator (phase, conditions, restarts, ...) and by trainer rank 0
(progress, rewards, checkpoint, servedModel, cost, staleness, updates, learning). Every field is optional; writers
merge-patch only their own fields.

Status models are not strict: timestamps arrive as RFC 3339 strings from the API server and become
``datetime`` objects here.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from grpo_operator.api.base import ApiModel
from grpo_operator.api.forecast import ForecastStatus
from grpo_operator.api.learning_health import LearningStatus
from grpo_operator.api.pricing import SpendStatus

Phase = Literal["Pending", "Initializing", "Running", "Restarting", "Suspended", "Succeeded", "Failed"]
PHASES: tuple[Phase, ...] = (
    "Pending",
    "Initializing",
    "Running",
    "Restarting",
    "Suspended",
    "Succeeded",
    "Failed",
)
TERMINAL_PHASES: frozenset[str] = frozenset({"Succeeded", "Failed"})

# metav1.Condition's reason format, so conditions look like the built-in ones.
CONDITION_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
# No control characters (C0, DEL, C1): `kubectl get grpo` prints the Step column as it is, and the
# trainer image that writes it is the tenant's code, so it must not carry terminal escape sequences.
# \xHH means the same code point to pydantic (Rust regex), Python and the API server (Go RE2).
NO_CONTROL_PATTERN = r"^[^\x00-\x1f\x7f-\x9f]*$"
# The status field naming a client-rollout job's gateway-token Secret (GRPOJobStatus.gateway_token_secret).
GATEWAY_TOKEN_SECRET_FIELD = "gatewayTokenSecret"
# A Secret's name (DNS-1123 subdomain), as the API server makes one from a generateName.
SECRET_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class _StatusModel(ApiModel):
    model_config = ConfigDict(strict=False)


class Condition(_StatusModel):
    """A condition in the style of metav1.Condition."""

    type: str = Field(min_length=1, max_length=316, description="Condition type, e.g. Ready, Progressing.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        pattern=CONDITION_REASON_PATTERN,
        description="CamelCase reason for the last transition.",
    )
    message: str | None = Field(default=None, max_length=32768, description="Human-readable details.")
    last_transition_time: datetime | None = Field(default=None, description="When status last changed.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the condition was computed from."
    )


def progress_display(step: int, total_steps: int | None) -> str:
    """The ``Step`` printer column text, e.g. ``12/500``."""
    return f"{step}/{total_steps}" if total_steps is not None else str(step)


class ProgressStatus(_StatusModel):
    """Training progress, written by trainer rank 0."""

    step: int | None = Field(default=None, ge=0, description="Optimisation steps completed.")
    total_steps: int | None = Field(default=None, ge=0, description="S, the steps the run will take.")
    display: str | None = Field(
        default=None,
        max_length=64,
        pattern=NO_CONTROL_PATTERN,
        description="step/totalSteps as text for the Step printer column (a column shows one field only).",
    )
    last_step_time: datetime | None = Field(default=None, description="When the last step finished.")
    step_duration_seconds: float | None = Field(default=None, ge=0, description="Duration of the last step.")
    waiting_for_client_since: datetime | None = Field(
        default=None,
        description="Client-rollout jobs: set by trainer rank 0 while it waits for the client's groups of its "
        "next step (when it began waiting), removed when they arrive. No stall is declared while it is "
        "set and no older than the running gang and its last step.",
    )

    @model_validator(mode="after")
    def _fill_display(self) -> ProgressStatus:
        # Writers that set step/totalSteps get the printer-column text for free, and it never disagrees.
        if self.step is not None:
            self.display = progress_display(self.step, self.total_steps)
        return self


class RewardsStatus(_StatusModel):
    """Reward statistics of the last step (and the last validation), written by trainer rank 0."""

    mean: float | None = Field(default=None, description="Mean reward of the last step's scored completions.")
    std: float | None = Field(default=None, ge=0, description="Std of those rewards.")
    format_failure_ratio: float | None = Field(
        default=None, ge=0, le=1, description="Fraction of the last step's completions that were unparseable."
    )
    zero_std_group_ratio: float | None = Field(
        default=None, ge=0, le=1, description="Fraction of groups whose rewards were all equal (no signal)."
    )
    metric_error_ratio: float | None = Field(
        default=None, ge=0, le=1, description="Fraction of completions the metric service failed to score."
    )
    validation_mean: float | None = Field(default=None, description="Mean reward of the last validation run.")
    validation_step: int | None = Field(default=None, ge=0, description="Step of the last validation run.")
    components: dict[str, float] | None = Field(
        default=None,
        max_length=16,
        description="Mean of each named reward component (a metric answer's components) over the last "
        "step's scored completions; the first 16 names the metric sent.",
    )


# The status sections trainer rank 0 writes (its merge patches name nothing else); the operator reads them
# and never writes them.
TRAINER_STATUS_FIELDS = (
    "progress",
    "rewards",
    "checkpoint",
    "servedModel",
    "cost",
    "staleness",
    "updates",
    "learning",
    "episodes",
)


class EpisodesStatus(_StatusModel):
    """Environment jobs (spec.environment): the last step's episodes, written by trainer rank 0."""

    count: int | None = Field(default=None, ge=0, description="Episodes the last step ran (B x G).")
    turns_mean: float | None = Field(default=None, ge=0, description="Model turns per episode, on average.")
    tokens_mean: float | None = Field(
        default=None, ge=0, description="Tokens per episode (model and environment), on average."
    )
    environment_error_ratio: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Fraction of the last step's episodes the environment failed (unscored, advantage 0).",
    )
    truncated_ratio: float | None = Field(
        default=None, ge=0, le=1, description="Fraction cut by maxTurns or the token budget."
    )
    format_failure_ratio: float | None = Field(
        default=None, ge=0, le=1, description="Fraction ended by a tool call the model malformed."
    )


class CostStatus(_StatusModel):
    """What the job has spent so far, beside what it plans to spend, written by trainer rank 0. "So far"
    counts every gang attempt's work, steps a restart redid included: it is what was used, not what the
    final model needed."""

    rollouts: int | None = Field(
        default=None,
        ge=0,
        description="Completions generated for training so far (dynamic sampling's refills included).",
    )
    rollouts_planned: int | None = Field(
        default=None, ge=0, description="R = ceil(S/numIterations)*B*G: completions the run generates."
    )
    metric_calls: int | None = Field(
        default=None,
        ge=0,
        description="Completions sent to the metric service so far, training and validation (0 for "
        "client-rollout jobs: the client scores).",
    )
    metric_calls_planned: int | None = Field(
        default=None, ge=0, description="R plus the validation answers of every validation run."
    )
    generation_gpu_seconds: float | None = Field(
        default=None,
        ge=0,
        description="GPU-seconds of generation for training and validation: the time the trainer waited for "
        "completions times the GPUs that generated them (spec.generation.gpus x replicas; the trainer's own "
        "GPUs when it generates in process, and for client-rollout jobs, where it is the time spent waiting for "
        "the client's groups, which the client samples from the trainer's policy server).",
    )
    training_gpu_seconds: float | None = Field(
        default=None,
        ge=0,
        description="GPU-seconds of training: the steps' time outside generation and scoring times the "
        "trainer gang's GPUs (nodes x gpusPerNode).",
    )
    steps: int | None = Field(
        default=None,
        ge=0,
        description="Optimisation steps run so far, every gang attempt's, steps a restart redid included: "
        "what the GPU-seconds above were spent on (the forecast's per-step figure).",
    )
    step_gpu_seconds_std: float | None = Field(
        default=None,
        ge=0,
        description="Standard deviation of the GPU-seconds per step over the current gang attempt's steps, its "
        "first (warm-up) step left out; from its third step on (the forecast's spread).",
    )


class CheckpointStatus(_StatusModel):
    """The newest complete checkpoint (named by latest.json); restarts resume from it."""

    last_step: int | None = Field(default=None, ge=0, description="Step of the checkpoint.")
    path: str | None = Field(default=None, max_length=4096, description="Checkpoint directory on the volume.")
    time: datetime | None = Field(default=None, description="When it was written.")


class ServedModelStatus(_StatusModel):
    """The vLLM server's model against the trainer's, checked by trainer rank 0 after weight syncs: the
    mean difference of their log-probabilities of a fixed probe text."""

    weight_sync: Literal["nccl", "volume", "broadcast", "colocate"] | None = Field(
        default=None,
        description="The weight transport (broadcast: one process group of trainer rank 0 and every vLLM "
        "server's workers; colocate: in memory, to the engine inside the trainer).",
    )
    last_sync_seconds: float | None = Field(default=None, ge=0, description="Duration of the last sync.")
    checked_step: int | None = Field(default=None, ge=0, description="Step of the last probe.")
    logprob_diff: float | None = Field(
        default=None, ge=0, description="Mean |served - trained| log-probability per probe token."
    )
    in_sync: bool | None = Field(default=None, description="Whether the difference is within tolerance.")
    message: str | None = Field(
        default=None,
        max_length=1024,
        pattern=NO_CONTROL_PATTERN,
        description="What differs and what it means, when not in sync.",
    )
    replicas: int | None = Field(
        default=None, ge=1, le=16, description="With several vLLM servers: spec.generation.replicas."
    )
    replicas_serving: int | None = Field(
        default=None,
        ge=0,
        le=16,
        description="With several vLLM servers: how many took the last sync and are sent work (the others "
        "were lost and rejoin once they answer again).",
    )


class StalenessStatus(_StatusModel):
    """Asynchronous jobs (spec.grpo.maxStaleness > 0): how stale the last step's groups were and how much
    sampling overlapped training, written by trainer rank 0."""

    max_staleness: int | None = Field(default=None, ge=0, description="spec.grpo.maxStaleness, eta.")
    last: int | None = Field(
        default=None,
        ge=0,
        description="Optimizer steps between the last step's sampling weights and its own.",
    )
    policy_version: int | None = Field(
        default=None,
        ge=0,
        description="Optimizer steps the weights that sampled the last step's groups held.",
    )
    overlap_ratio: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Fraction of the last step's wall time in which vLLM sampled later groups while it trained.",
    )
    groups_dropped: int | None = Field(
        default=None,
        ge=0,
        description="Groups sampled ahead and dropped (then sampled again) since the start.",
    )


# Why trainer rank 0 thinks a run's optimizer steps stopped changing its weights (UpdatesStatus.cause):
# Precision: the weights are held in bfloat16/float16 and the updates are below half their rounding step;
# LearningRate: fp32 weights and updates too small to matter; TiedGroups: every group's rewards were equal,
# so every advantage was 0; TruncatedCompletionsMasked: every completion was cut off at
# maxCompletionLength and maskTruncatedCompletions left it out of the loss.
UpdateCause = Literal["Precision", "LearningRate", "TiedGroups", "TruncatedCompletionsMasked"]
UPDATE_CAUSES: tuple[UpdateCause, ...] = (
    "Precision",
    "LearningRate",
    "TiedGroups",
    "TruncatedCompletionsMasked",
)
# The dtypes the sampled weights can be reported in (anything else is left out of the report).
WeightDtype = Literal["bfloat16", "float16", "float32", "float64"]


class UpdatesStatus(_StatusModel):
    """Whether the optimizer steps change the weights: trainer rank 0 compares a fixed sample of the trainable
    weights before and after each step and writes the last step's figures, and its diagnosis when the
    changes vanish for several steps in a row (docs/trainer.md, "Vanishing updates")."""

    checked_step: int | None = Field(default=None, ge=0, description="Step of the last measurement.")
    update_ratio: float | None = Field(
        default=None,
        ge=0,
        le=1e6,
        description="||w_after - w_before|| / ||w_after|| over the sampled weights in the last step.",
    )
    updated_fraction: float | None = Field(
        default=None, ge=0, le=1, description="Fraction of the sampled weight elements the last step changed."
    )
    weight_dtype: WeightDtype | None = Field(
        default=None, description="The dtype most sampled weight elements are held in."
    )
    learning_rate: float | None = Field(
        default=None, ge=0, le=1e3, description="The learning rate the last step applied."
    )
    vanishing: bool | None = Field(
        default=None,
        description="True once the last vanishingSteps measured steps (at least 3) all changed almost nothing.",
    )
    vanishing_steps: int | None = Field(
        default=None, ge=0, le=10_000_000, description="Measured steps in a row whose updates vanished."
    )
    cause: UpdateCause | None = Field(
        default=None,
        description="While vanishing: the likely cause (Precision, LearningRate, TiedGroups, "
        "TruncatedCompletionsMasked).",
    )


class GRPOJobStatus(_StatusModel):
    """Observed state of a GRPOJob."""

    phase: Phase | None = Field(default=None, description="Lifecycle phase.")
    conditions: list[Condition] | None = Field(
        default=None,
        max_length=32,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
        description="Conditions with reasons and messages.",
    )
    progress: ProgressStatus | None = Field(default=None, description="Training progress (trainer).")
    rewards: RewardsStatus | None = Field(default=None, description="Reward statistics (trainer).")
    checkpoint: CheckpointStatus | None = Field(
        default=None, description="Last complete checkpoint (trainer)."
    )
    served_model: ServedModelStatus | None = Field(
        default=None, description="The served model checked against the trained one (trainer)."
    )
    cost: CostStatus | None = Field(
        default=None, description="Rollouts, metric calls and GPU-seconds used so far and planned (trainer)."
    )
    staleness: StalenessStatus | None = Field(
        default=None, description="Asynchronous jobs: staleness of the groups and overlap (trainer)."
    )
    updates: UpdatesStatus | None = Field(
        default=None, description="Whether the optimizer steps change the weights (trainer)."
    )
    learning: LearningStatus | None = Field(
        default=None,
        description="Why the job is or is not learning: a diagnosis over the last steps with the setting to "
        "change (trainer).",
    )
    episodes: EpisodesStatus | None = Field(
        default=None, description="Environment jobs: the last step's episodes (trainer)."
    )
    forecast: ForecastStatus | None = Field(
        default=None,
        description="GPU-hours projected for the whole run, from the spec before the first steps and from "
        "the measured steps after (operator; docs/platform.md, Budgets).",
    )
    spend: SpendStatus | None = Field(
        default=None,
        description="What the job's use so far costs at the platform's prices; only on a platform with prices "
        "(operator; docs/platform.md, Prices).",
    )
    restarts: int | None = Field(
        default=None, ge=0, description="Trainer gang restarts counted against backoffLimit."
    )
    rollouts: int | None = Field(
        default=None,
        ge=0,
        description="R = S*B*G completions the run generates and scores (ceil(S/numIterations)*B*G with "
        "spec.grpo.numIterations).",
    )
    trainer_attempt: int | None = Field(
        default=None, ge=0, description="Current trainer gang incarnation; part of the pod names."
    )
    generation_attempt: int | None = Field(
        default=None,
        ge=0,
        description="The gang incarnation whose vLLM pods serve the current trainers (part of their names): "
        "trainerAttempt, unless a restart of the trainers alone kept the running vLLM pods.",
    )
    generation_kept_at_step: int | None = Field(
        default=None,
        ge=0,
        description="status.progress.step when the trainers alone were last restarted beside kept vLLM pods: "
        "if the new trainers fail again before passing it, the next restart replaces the vLLM pods too.",
    )
    start_time: datetime | None = Field(
        default=None,
        description="When the job last started running: set at start and reset on resume from suspend, so activeDeadlineSeconds counts from the last resume (as for a Kubernetes Job).",
    )
    completion_time: datetime | None = Field(default=None, description="When the job succeeded or failed.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the operator last acted on."
    )
    gateway_token_secret: str | None = Field(
        default=None,
        max_length=253,
        pattern=SECRET_NAME_PATTERN,
        description="Client-rollout jobs: the Secret holding the rollout gateway's internal-port token, "
        "created by the operator under a name the API server picked (<job>-gateway-token-xxxxx) and "
        "referenced by the gateway and trainer rank 0. The operator never reads it.",
    )
    reason: str | None = Field(default=None, max_length=1024, description="Short reason for the phase.")
    message: str | None = Field(default=None, max_length=32768, description="Details for the phase.")
