"""Learning health: why a running job is not learning, in one reason with the setting to change.

Trainer rank 0 judges a sliding window of its own per-step figures (grpo_trainer/learning_health.py) and
writes the verdict to ``status.learning``; the operator turns it into the condition LearningHealthy and
one event per change of reason; ``kubectl grpo status`` prints it first; Prometheus gets
``grpo_learning_health{reason}``. REASONS below is the one table all of them (and the docs section
"When a job does not learn" in docs/concepts.md) are built from.

``status.learning`` is written by the tenant's trainer image, so every message here is built from its typed
fields (a reason from a fixed list, numbers under named keys), never from text the trainer wrote.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Literal, get_args

from pydantic import Field

from grpo_operator.api.base import ApiModel
from grpo_operator.api.field_types import INTEGRAL_FLOAT

LearningReason = Literal[
    "Healthy",
    "Solved",
    "UpdatesVanishing",
    "MetricErrors",
    "CompletionsTruncated",
    "NoSignal",
    "RatiosMasked",
    "KLRunaway",
    "EntropyCollapse",
    "ValidationFalling",
    "FormatFailuresRising",
    "RewardFlat",
]
LEARNING_REASONS: tuple[LearningReason, ...] = get_args(LearningReason)

# A figure's magnitude is capped where it is written: rewards are bounded by the metric contract far below.
FIGURE_LIMIT = 1e12


class LearningHealthSpec(ApiModel):
    """Thresholds and windows of the learning-health diagnosis (status.learning, condition LearningHealthy).
    Every field left unset takes the platform's default (Helm value jobDefaults.learningHealth), else the
    built-in one given here. A diagnosis only reports; it stops a job only with stopWhenUnhealthy."""

    window_steps: Annotated[int, Field(ge=2, le=1000), INTEGRAL_FLOAT] | None = Field(
        default=None,
        description="Steps each diagnosis averages over; no diagnosis before this many steps. Unset: 5.",
    )
    tied_group_ratio: float | None = Field(
        default=None,
        gt=0.0,
        le=1.0,
        description="NoSignal (or Solved, when the tied groups sit at the best reward seen) once this share "
        "of groups, averaged over the window, tied (every completion of the group scored the same, so "
        "every advantage is 0). Unset: 0.8.",
    )
    truncated_ratio: float | None = Field(
        default=None,
        gt=0.0,
        le=1.0,
        description="CompletionsTruncated once this share of completions, averaged over the window, hit "
        "maxCompletionLength while maskTruncatedCompletions leaves them out of the loss. Unset: 0.95.",
    )
    metric_error_ratio: float | None = Field(
        default=None,
        gt=0.0,
        le=1.0,
        description="MetricErrors once this share of rollouts, averaged over the window, got no score from "
        "the metric service. Unset: 0.02.",
    )
    masked_ratio: float | None = Field(
        default=None,
        gt=0.0,
        le=1.0,
        description="RatiosMasked once this share of tokens, averaged over the window, had its vLLM "
        "importance-sampling ratio masked (sampled by weights too far from the trained ones). Unset: 0.5.",
    )
    kl_ceiling: float | None = Field(
        default=None,
        gt=0.0,
        le=1e6,
        description="KLRunaway once the mean per-token KL to the reference model (beta > 0), averaged over "
        "the window, exceeds this many nats. Unset: 1.0.",
    )
    entropy_floor: float | None = Field(
        default=None,
        gt=0.0,
        le=100.0,
        description="EntropyCollapse once the mean token entropy, averaged over the window, is below this "
        "many nats and below a tenth of the first window's, while the reward stays flat. Unset: 0.03.",
    )
    format_failure_rise: float | None = Field(
        default=None,
        gt=0.0,
        le=1.0,
        description="FormatFailuresRising once the share of format failures, averaged over the window, is "
        "this much above the first window's. Unset: 0.2.",
    )
    validation_drop: float | None = Field(
        default=None,
        gt=0.0,
        le=100.0,
        description="ValidationFalling once the last validation mean is this many reward standard deviations "
        "(the run's mean within-step spread) below the best one while the training reward rose as much "
        "since. Unset: 0.5.",
    )
    flat_steps: Annotated[int, Field(ge=2, le=100_000), INTEGRAL_FLOAT] | None = Field(
        default=None,
        description="RewardFlat once the reward averaged over the window has not risen by flatGain standard "
        "deviations in this many steps although groups carry signal. Unset: 20.",
    )
    flat_gain: float | None = Field(
        default=None,
        gt=0.0,
        le=100.0,
        description="The rise in reward standard deviations that counts as learning for RewardFlat. "
        "Unset: 0.1.",
    )
    stop_when_unhealthy: bool | None = Field(
        default=None,
        description="Stop the job (Failed, reason NotLearning, after a checkpoint) when a diagnosis other "
        "than Healthy or Solved holds for windowSteps steps in a row. Unset: false (the job keeps running "
        "and only reports).",
    )

    def merged_over(self, defaults: Mapping[str, object]) -> LearningHealthSpec:
        """This spec with each unset field taken from ``defaults`` (camelCase or Python names)."""
        values = self.model_dump(by_alias=False, exclude_none=True)
        fallback = LearningHealthSpec.model_validate(dict(defaults)).model_dump(
            by_alias=False, exclude_none=True
        )
        return LearningHealthSpec.model_validate({**fallback, **values})


@dataclass(frozen=True)
class Thresholds:
    """A LearningHealthSpec with every default filled in (what the trainer judges with)."""

    window_steps: int = 5
    tied_group_ratio: float = 0.8
    truncated_ratio: float = 0.95
    metric_error_ratio: float = 0.02
    masked_ratio: float = 0.5
    kl_ceiling: float = 1.0
    entropy_floor: float = 0.03
    format_failure_rise: float = 0.2
    validation_drop: float = 0.5
    flat_steps: int = 20
    flat_gain: float = 0.1
    stop_when_unhealthy: bool = False

    @classmethod
    def of(cls, spec: LearningHealthSpec | None) -> Thresholds:
        if spec is None:
            return cls()
        return cls(**{k: v for k, v in spec.model_dump(by_alias=False, exclude_none=True).items()})


DEFAULT_THRESHOLDS = Thresholds()


_Step = Annotated[int, Field(ge=0, le=10_000_000), INTEGRAL_FLOAT]
_Figure = Annotated[float, Field(ge=-FIGURE_LIMIT, le=FIGURE_LIMIT, allow_inf_nan=False)] | None


class LearningFigures(ApiModel):
    """The numbers a diagnosis rests on (each reason sends those its message names)."""

    reward_mean: _Figure = Field(default=None, description="Training reward averaged over the window.")
    reward_before: _Figure = Field(default=None, description="RewardFlat: the same, flatSteps steps earlier.")
    reward_std: _Figure = Field(default=None, description="The run's mean within-step reward spread.")
    tied_group_ratio: _Figure = Field(default=None, description="Share of groups tied, over the window.")
    tied_reward: _Figure = Field(default=None, description="Mean reward the tied groups tied at.")
    best_reward: _Figure = Field(default=None, description="Best single reward seen in the run.")
    truncated_ratio: _Figure = Field(default=None, description="Share of completions truncated.")
    metric_error_ratio: _Figure = Field(default=None, description="Share of rollouts the metric failed.")
    masked_ratio: _Figure = Field(default=None, description="Share of importance ratios masked.")
    kl: _Figure = Field(default=None, description="Mean per-token KL to the reference model.")
    entropy: _Figure = Field(default=None, description="Mean token entropy over the window.")
    entropy_start: _Figure = Field(default=None, description="Mean token entropy of the first window.")
    format_failure_start: _Figure = Field(default=None, description="Format failures in the first window.")
    format_failure_ratio: _Figure = Field(default=None, description="Format failures over the window.")
    validation_best: _Figure = Field(default=None, description="Best validation mean.")
    validation_best_step: _Figure = Field(default=None, description="Step of the best validation mean.")
    validation_last: _Figure = Field(default=None, description="Last validation mean.")
    reward_at_validation_best: _Figure = Field(
        default=None, description="Training reward (window mean) at the best validation."
    )
    updated_fraction: _Figure = Field(default=None, description="Share of sampled weights the step changed.")
    learning_rate: _Figure = Field(default=None, description="Learning rate of the last step.")

    def named(self) -> dict[str, float]:
        """The figures sent, by their camelCase names."""
        return self.model_dump(by_alias=True, exclude_none=True)


class LearningStatus(ApiModel):
    """status.learning: trainer rank 0's learning-health verdict over its last window of steps."""

    reason: LearningReason = Field(
        description="The diagnosis (docs/concepts.md, 'When a job does not learn')."
    )
    healthy: bool = Field(
        description="False for a diagnosis that needs a change; Healthy and Solved are true."
    )
    since_step: _Step | None = Field(
        default=None, description="First step the current reason was reported at."
    )
    checked_step: _Step | None = Field(default=None, description="Step of the last judgement.")
    window_steps: Annotated[int, Field(ge=1, le=1000), INTEGRAL_FLOAT] | None = Field(
        default=None, description="Steps the judgement averaged over."
    )
    figures: LearningFigures | None = Field(default=None, description="The numbers the diagnosis rests on.")
    update_cause: Literal["Precision", "LearningRate"] | None = Field(
        default=None,
        description="UpdatesVanishing: whether held precision or the learning rate is the cause.",
    )


@dataclass(frozen=True)
class ReasonInfo:
    """One row of the diagnosis table."""

    reason: LearningReason
    healthy: bool
    # What the trainer saw, as a template over figures (str.format with the figure names).
    seen: str
    # The setting to change, or what to do.
    fix: str
    # How to read the signal yourself (docs).
    read: str
    # The Prometheus alert that fires on it, if it is serious enough for one.
    alert: str | None = None


REASONS: dict[LearningReason, ReasonInfo] = {
    info.reason: info
    for info in (
        ReasonInfo(
            "Healthy",
            True,
            "no diagnosis over the last {window} steps (reward {rewardMean:.4g}, {tiedGroupRatio:.0%} of "
            "groups tied)",
            "nothing to change",
            "The reward should trend up over tens of steps; `kubectl grpo rewards` shows it per step.",
        ),
        ReasonInfo(
            "Solved",
            True,
            "{tiedGroupRatio:.0%} of groups tied at the best reward seen ({bestReward:.4g}): the model answers "
            "these prompts as well as the metric can score",
            "the task is learned: stop early (kubectl delete grpojob, or let it finish), or train on a harder "
            "dataset; more steps add little",
            "Groups tied at the top reward give no gradient because there is nothing left to prefer; "
            "status.rewards.mean sits at the metric's maximum.",
        ),
        ReasonInfo(
            "UpdatesVanishing",
            False,
            "each optimizer step changed only {updatedFraction:.2%} of a fixed sample of the weights at "
            "learning rate {learningRate:.2g}: the run computes gradients and the weights barely move",
            "held in 16 bits (updateCause Precision): use the default trainer image (fp32 master weights) or "
            "set spec.model.dtype: float32; otherwise (LearningRate) raise spec.grpo.learningRate",
            "status.updates and grpo_updated_parameter_fraction: under 1 % of sampled elements changing per "
            "step means the updates are lost to rounding or too small (docs/trainer.md, Vanishing updates).",
            "GRPOJobUpdatesVanishing",
        ),
        ReasonInfo(
            "MetricErrors",
            False,
            "the metric service gave no score to {metricErrorRatio:.1%} of rollouts (averaged over the "
            "window): those completions teach nothing and the job fails once spec.metric.errorBudget is spent",
            "read the metric pod's log (kubectl grpo logs --role metric) and fix the metric; raise "
            "spec.metric.timeoutSeconds or spec.metric.concurrency if it times out",
            "status.rewards.metricErrorRatio and grpo_metric_errors_total: errors, timeouts and refused "
            "answers of the metric service, not low rewards.",
            "GRPOJobMetricErrors",
        ),
        ReasonInfo(
            "CompletionsTruncated",
            False,
            "{truncatedRatio:.0%} of completions hit spec.grpo.maxCompletionLength and "
            "maskTruncatedCompletions leaves them out of the loss: almost no completion carries a gradient",
            "raise spec.grpo.maxCompletionLength, ask the prompts for shorter answers, or set "
            "spec.grpo.maskTruncatedCompletions: false (the dapo preset turns it on)",
            "truncated_ratio in metrics.jsonl (TRL's completions/clipped_ratio) near 1 with the dapo preset "
            "or maskTruncatedCompletions: true.",
            "GRPOJobCompletionsTruncated",
        ),
        ReasonInfo(
            "NoSignal",
            False,
            "{tiedGroupRatio:.0%} of groups tied (every completion of a group scored the same, mostly "
            "{tiedReward:.4g}), so their advantages are 0 and the steps have almost no gradient",
            "make the reward graded (partial credit), raise spec.grpo.groupSize or spec.grpo.temperature, "
            "set spec.grpo.dynamicSampling: true, or pick prompts of the right difficulty; a metric that "
            "answers a constant is broken",
            "status.rewards.zeroStdGroupRatio and grpo_zero_std_group_ratio near 1 at a reward below the "
            "best: the prompts are all too hard (or all too easy) for the model, or the metric is constant.",
            "GRPOJobNoLearningSignal",
        ),
        ReasonInfo(
            "RatiosMasked",
            False,
            "{maskedRatio:.0%} of tokens had their vLLM importance-sampling ratio masked: they were sampled "
            "by weights too far from the ones being trained, and the loss drops them",
            "lower spec.grpo.maxStaleness, raise spec.grpo.vllmImportanceSamplingCap, or check that vLLM "
            "serves the trained weights (condition ServedModelInSync)",
            "importance_sampling_masked_ratio in metrics.jsonl: the share of tokens whose ratio of trainer "
            "to vLLM probability left the trusted range.",
            "GRPOJobNotLearning",
        ),
        ReasonInfo(
            "KLRunaway",
            False,
            "the mean per-token KL to the reference model is {kl:.3g} nats (averaged over the window): the "
            "policy is drifting far from where it started, usually toward a reward hack",
            "lower spec.grpo.learningRate, raise spec.grpo.beta, and read recent completions "
            "(kubectl grpo samples) for degenerate text",
            "kl in metrics.jsonl and grpo_kl (only with beta > 0); a steady climb past ~1 nat per token "
            "rarely ends well.",
            "GRPOJobKLRunaway",
        ),
        ReasonInfo(
            "EntropyCollapse",
            False,
            "the mean token entropy fell to {entropy:.3g} nats from {entropyStart:.3g} at the start while "
            "the reward stayed at {rewardMean:.4g}: the policy samples (nearly) the same completion every "
            "time and stopped exploring",
            "raise spec.grpo.temperature, lower spec.grpo.learningRate, or use clip-higher "
            "(spec.grpo.epsilonHigh, the dapo preset)",
            "entropy in metrics.jsonl falling toward 0 without the reward rising; groups then tie.",
            "GRPOJobNotLearning",
        ),
        ReasonInfo(
            "ValidationFalling",
            False,
            "validation fell to {validationLast:.4g} from its best {validationBest:.4g} (step "
            "{validationBestStep:.0f}) while the training reward rose from {rewardAtValidationBest:.4g} to "
            "{rewardMean:.4g}: the model is learning what the metric rewards on the training prompts, not "
            "the task (reward hacking or overfitting)",
            "read validation samples (kubectl grpo samples --split validation), tighten the metric, add "
            "training prompts, or keep the checkpoint of the best validation step",
            "validation_mean in metrics.jsonl against reward_mean: they should rise together.",
            "GRPOJobValidationFalling",
        ),
        ReasonInfo(
            "FormatFailuresRising",
            False,
            "format failures rose to {formatFailureRatio:.0%} of completions from {formatFailureStart:.0%} "
            "in the first steps: the model is drifting away from the answer format the metric parses",
            "read recent completions (kubectl grpo samples); make the format explicit in the prompt or "
            "chat template, punish it harder (spec.grpo.formatFailureScore further below failureScore), or "
            "lower the learning rate",
            "status.rewards.formatFailureRatio and grpo_format_failures_total: a rising share is the "
            "classic sign of reward hacking or collapse.",
            "GRPOJobFormatFailureRatioHigh",
        ),
        ReasonInfo(
            "RewardFlat",
            False,
            "the reward averaged over the window stayed at {rewardMean:.4g} (from {rewardBefore:.4g}) "
            "although groups carry signal (reward spread {rewardStd:.3g} within a step)",
            "raise spec.grpo.learningRate (the default 1e-6 is for large models), check the metric rewards "
            "what you want, or train longer; a few hundred steps are common",
            "reward_mean in metrics.jsonl against reward_std: signal in the groups but no trend.",
            "GRPOJobNotLearning",
        ),
    )
}
assert tuple(REASONS) == LEARNING_REASONS, "REASONS must list every LearningReason in its order"


class _Missing:
    """A figure the trainer did not send: prints as n/a under any number format."""

    def __format__(self, spec: str) -> str:
        return "n/a"


class _Figures(dict[str, object]):
    def __missing__(self, key: str) -> object:
        return _Missing()


def _formatted(template: str, figures: Mapping[str, float], window: int | None) -> str:
    values = _Figures({name: value for name, value in figures.items() if math.isfinite(value)})
    values["window"] = window if window is not None else "several"
    return template.format_map(values)


def describe(status: LearningStatus) -> str:
    """One line: since when, what was seen, what to change."""
    info = REASONS[status.reason]
    seen = _formatted(info.seen, status.figures.named() if status.figures else {}, status.window_steps)
    if status.reason == "Healthy":
        return seen
    since = f"since step {status.since_step}: " if status.since_step is not None else ""
    fix = info.fix
    if status.reason == "UpdatesVanishing" and status.update_cause == "LearningRate":
        fix = "raise spec.grpo.learningRate: the weights are held in float32 and the steps are too small to move them"
    elif status.reason == "UpdatesVanishing" and status.update_cause == "Precision":
        fix = (
            "the weights are held in 16 bits, which round such small updates away: use the default trainer "
            "image (fp32 master weights), set spec.model.dtype: float32, or raise spec.grpo.learningRate"
        )
    lead = "Solved" if status.reason == "Solved" else "Not learning"
    return f"{lead} ({status.reason}) {since}{seen}. Change: {fix}"
