"""The trainer's Prometheus catalog (docs/metrics.md). Prefix grpo_, base units, counters end in _total,
labels grpojob and namespace on every series. Served by rank 0 only."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from grpo_operator.api.learning_health import LEARNING_REASONS, REASONS
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from grpo_trainer.trl_adapter import LOG_KEYS, PROJECT_LOG_KEYS

LABELS = ("grpojob", "namespace")
# Staleness of trained groups, in optimizer steps (spec.grpo.maxStaleness is at most 8).
STALENESS_BUCKETS = (0, 1, 2, 3, 4, 6, 8)
# Why groups sampled ahead were dropped (label reason of grpo_rollout_groups_dropped_total).
DROP_REASONS = ("stale", "request_failed", "other_prompts")
# How episodes ended (label outcome of grpo_episodes_total; episodes.py).
EPISODE_OUTCOMES = ("done", "truncated", "format_failure", "environment_error")
# Where an episode's tokens came from (label source of grpo_episode_tokens_total).
EPISODE_TOKEN_SOURCES = ("model", "environment")
ENVIRONMENT_STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
STEP_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)


@dataclass
class TrainerMetrics:
    registry: CollectorRegistry
    step: Gauge
    total_steps: Gauge
    reward_mean: Gauge
    reward_std: Gauge
    format_failures: Counter
    metric_errors: Counter
    zero_std_groups: Counter
    groups: Counter
    zero_std_group_ratio: Gauge
    rollouts: Counter
    tokens: Counter
    step_duration: Histogram
    completion_length: Gauge
    kl: Gauge
    clip_ratio: Gauge
    loss: Gauge
    validation_reward: Gauge
    last_checkpoint_step: Gauge
    last_checkpoint_timestamp: Gauge
    last_step_timestamp: Gauge
    metric_score_seconds: Counter
    non_finite_steps: Counter
    groups_skipped: Counter
    client_completions_unmatched: Counter
    weight_sync_seconds: Gauge
    served_logprob_diff: Gauge
    served_model_drifts: Counter
    clip_ratio_low: Gauge
    clip_ratio_high: Gauge
    entropy: Gauge
    truncated_completion_ratio: Gauge
    importance_sampling_ratio_mean: Gauge
    importance_sampling_ratio_min: Gauge
    importance_sampling_ratio_max: Gauge
    importance_sampling_masked_ratio: Gauge
    rollout_staleness: Histogram
    rollout_groups_dropped: Counter
    rollout_wait_seconds: Counter
    generation_overlap_ratio: Gauge
    update_to_weight_ratio: Gauge
    updated_parameter_fraction: Gauge
    # Environment jobs (spec.environment): labelled by outcome and by source as well.
    episodes: Counter
    episode_turns: Counter
    episode_tokens: Counter
    environment_step_seconds: Histogram
    # Labelled by component as well: set through set_component().
    reward_component_mean: Gauge
    # Labelled by reason as well (every reason of the table, 1 for the current one): set_learning_health().
    learning_health: Gauge
    job_labels: dict[str, str]

    def set_learning_health(self, current: str) -> None:
        for reason in LEARNING_REASONS:
            self.learning_health.labels(
                **self.job_labels, reason=reason, healthy=str(REASONS[reason].healthy).lower()
            ).set(1 if reason == current else 0)

    def groups_dropped(self, reason: str) -> Counter:
        return self.rollout_groups_dropped.labels(**self.job_labels, reason=reason)

    def set_component(self, name: str, mean: float) -> None:
        """One reward component's mean; the trainer passes at most MAX_REPORTED_COMPONENTS names a job."""
        self.reward_component_mean.labels(**self.job_labels, component=name).set(mean)

    @staticmethod
    def create(job: str, namespace: str, registry: CollectorRegistry | None = None) -> TrainerMetrics:
        reg = registry or CollectorRegistry()
        values = {"grpojob": job, "namespace": namespace}

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, LABELS, registry=reg).labels(**values)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, LABELS, registry=reg).labels(**values)

        dropped = Counter(
            "grpo_rollout_groups_dropped_total",
            "Groups sampled ahead and dropped, then sampled again for their step (label reason: stale, "
            "request_failed, other_prompts); asynchronous jobs only.",
            (*LABELS, "reason"),
            registry=reg,
        )
        for reason in DROP_REASONS:
            dropped.labels(**values, reason=reason)  # every reason reads 0 from the start, for rate()
        episodes = Counter(
            "grpo_episodes_total",
            "Environment jobs: episodes run, with the label outcome: done (the environment ended it), truncated "
            "(maxTurns or the token budget ran out), format_failure (a tool call the model malformed), "
            "environment_error (the environment failed: unscored, advantage 0).",
            (*LABELS, "outcome"),
            registry=reg,
        )
        for outcome in EPISODE_OUTCOMES:
            episodes.labels(**values, outcome=outcome)
        episode_tokens = Counter(
            "grpo_episode_tokens_total",
            "Environment jobs: tokens of the trained episodes, with the label source: model (sampled, in the "
            "loss) or environment (observations and template glue, masked out).",
            (*LABELS, "source"),
            registry=reg,
        )
        for source in EPISODE_TOKEN_SOURCES:
            episode_tokens.labels(**values, source=source)
        return TrainerMetrics(
            registry=reg,
            step=gauge("grpo_step", "Last completed optimizer step."),
            total_steps=gauge("grpo_total_steps", "S: optimizer steps the run will take."),
            reward_mean=gauge("grpo_reward_mean", "Mean training reward of the last step (errors excluded)."),
            reward_std=gauge("grpo_reward_std", "Population std of the last step's training rewards."),
            format_failures=counter(
                "grpo_format_failures_total",
                "Completions the metric could not parse (scored formatFailureScore).",
            ),
            metric_errors=counter(
                "grpo_metric_errors_total", "Completions the metric service failed to score (advantage 0)."
            ),
            zero_std_groups=counter(
                "grpo_zero_std_groups_total", "Groups whose rewards were all equal (no learning signal)."
            ),
            groups=counter("grpo_groups_total", "Groups (prompts x G answers) scored for training."),
            zero_std_group_ratio=gauge(
                "grpo_zero_std_group_ratio", "Fraction of the last step's groups with all-equal rewards."
            ),
            rollouts=counter("grpo_rollouts_total", "Completions generated and scored for training."),
            tokens=counter("grpo_tokens_total", "Prompt plus completion tokens processed in training."),
            step_duration=Histogram(
                "grpo_step_duration_seconds",
                "Wall time of one optimizer step, generation and scoring included.",
                LABELS,
                registry=reg,
                buckets=STEP_BUCKETS,
            ).labels(**values),
            completion_length=gauge(
                "grpo_completion_length_tokens", "Mean completion length of the last step."
            ),
            kl=gauge("grpo_kl", "Mean KL divergence to the reference model (only when beta > 0)."),
            clip_ratio=gauge("grpo_clip_ratio", "Fraction of tokens whose importance ratio was clipped."),
            loss=gauge(
                "grpo_loss", "Training loss of the last step (often ~0 in GRPO; not a progress signal)."
            ),
            validation_reward=gauge("grpo_validation_reward_mean", "Mean reward on the validation set."),
            last_checkpoint_step=gauge(
                "grpo_last_checkpoint_step",
                "Step of the newest published checkpoint (after a restart: the one resumed from).",
            ),
            last_checkpoint_timestamp=gauge(
                "grpo_last_checkpoint_timestamp_seconds",
                "Unix time the newest checkpoint was published (after a restart: the one resumed from).",
            ),
            last_step_timestamp=gauge(
                "grpo_last_step_timestamp_seconds", "Unix time of the last completed step (alert when stale)."
            ),
            metric_score_seconds=counter(
                "grpo_metric_score_seconds_total", "Wall time spent waiting for the metric service."
            ),
            non_finite_steps=counter(
                "grpo_non_finite_steps_total",
                "Steps refused because the loss, gradient norm or weights were not finite (the trainer then "
                "exits 5; the operator counts the restart as NonFiniteTraining).",
            ),
            groups_skipped=counter(
                "grpo_groups_skipped_total",
                "Groups left out of training because of their data: a reward beyond the reward bound (the "
                "group gets advantage 0; the run goes on).",
            ),
            client_completions_unmatched=counter(
                "grpo_client_completions_unmatched_total",
                "Client-rollout jobs: completions the client sent that the policy server never sampled "
                "(rewritten text), trained on their text's tokens without importance-sampling correction.",
            ),
            weight_sync_seconds=gauge(
                "grpo_weight_sync_seconds",
                "Wall time of the last weight sync to the vLLM server (spec.generation.weightSync).",
            ),
            served_logprob_diff=gauge(
                "grpo_served_logprob_diff",
                "Mean |served - trained| log-probability of a fixed probe text after the last weight sync; "
                "above 0.2 vLLM serves other weights than the trainer trains.",
            ),
            served_model_drifts=counter(
                "grpo_served_model_drifts_total",
                "Weight syncs after which the served model's log-probabilities did not match the trainer's.",
            ),
            clip_ratio_low=gauge(
                "grpo_clip_ratio_low",
                "Fraction of tokens with a negative advantage whose ratio was clipped at 1 - epsilon.",
            ),
            clip_ratio_high=gauge(
                "grpo_clip_ratio_high",
                "Fraction of tokens with a positive advantage whose ratio was clipped at 1 + epsilonHigh.",
            ),
            entropy=gauge(
                "grpo_entropy", "Mean per-token entropy of the policy on the last step's completions."
            ),
            truncated_completion_ratio=gauge(
                "grpo_truncated_completion_ratio",
                "Fraction of the last step's completions cut off at maxCompletionLength (no end token).",
            ),
            importance_sampling_ratio_mean=gauge(
                "grpo_importance_sampling_ratio_mean",
                "Mean trainer/vLLM importance ratio of the last step's tokens (vLLM correction on).",
            ),
            importance_sampling_ratio_min=gauge(
                "grpo_importance_sampling_ratio_min",
                "Smallest trainer/vLLM importance ratio of the last step (vLLM correction on).",
            ),
            importance_sampling_ratio_max=gauge(
                "grpo_importance_sampling_ratio_max",
                "Largest trainer/vLLM importance ratio of the last step (vLLM correction on).",
            ),
            importance_sampling_masked_ratio=gauge(
                "grpo_importance_sampling_masked_ratio",
                "Fraction of the last step's completion tokens whose importance weight was masked to 0 "
                "(vLLM correction in a mask mode).",
            ),
            rollout_staleness=Histogram(
                "grpo_rollout_staleness_steps",
                "Staleness of each trained group: optimizer steps between the weights that sampled it and the "
                "weights it trained (0 in synchronous jobs, at most spec.grpo.maxStaleness).",
                LABELS,
                registry=reg,
                buckets=STALENESS_BUCKETS,
            ).labels(**values),
            rollout_groups_dropped=dropped,
            episodes=episodes,
            episode_turns=counter(
                "grpo_episode_turns_total",
                "Environment jobs: model turns of all episodes (over grpo_episodes_total: turns per episode).",
            ),
            episode_tokens=episode_tokens,
            environment_step_seconds=Histogram(
                "grpo_environment_step_seconds",
                "Environment jobs: latency of each step of the environment, as the trainer measured it.",
                LABELS,
                registry=reg,
                buckets=ENVIRONMENT_STEP_BUCKETS,
            ).labels(**values),
            rollout_wait_seconds=counter(
                "grpo_rollout_wait_seconds_total",
                "Seconds the trainer waited for groups sampled ahead, or for a request in flight before a "
                "weight push (asynchronous jobs only).",
            ),
            generation_overlap_ratio=gauge(
                "grpo_generation_overlap_ratio",
                "Fraction of the last step's wall time in which vLLM sampled later steps' groups while the "
                "trainer trained (asynchronous jobs only).",
            ),
            update_to_weight_ratio=gauge(
                "grpo_update_to_weight_ratio",
                "||w_after - w_before|| / ||w_after|| of a fixed sample of the trainable weights in the last "
                "optimizer step (update_health.py).",
            ),
            updated_parameter_fraction=gauge(
                "grpo_updated_parameter_fraction",
                "Fraction of the sampled trainable weight elements the last optimizer step changed at all; "
                "near 0 the updates vanish (a learning rate too small, no gradient, or 16-bit weights).",
            ),
            reward_component_mean=Gauge(
                "grpo_reward_component_mean",
                "Mean of one named reward component (label component) over the last step's scored "
                "completions; the reward is their sum, or their weighted sum under spec.metric.rewardWeights.",
                (*LABELS, "component"),
                registry=reg,
            ),
            learning_health=Gauge(
                "grpo_learning_health",
                "1 for the current learning-health diagnosis (label reason, with healthy true or false), 0 for "
                "every other reason: why the job is or is not learning (status.learning, docs/concepts.md).",
                (*LABELS, "reason", "healthy"),
                registry=reg,
            ),
            job_labels=values,
        )

    def serve(self, port: int) -> None:
        start_http_server(port, registry=self.registry)


def finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


@dataclass(frozen=True)
class LoggedSignal:
    """A per-step number the trainer's logs carry, and where it is exported."""

    field: str  # its key in metrics.jsonl
    log_key: str  # its key in the logs TRL hands to callbacks
    gauge: str | None  # the TrainerMetrics gauge it sets; None: metrics.jsonl only


def _trl(field: str, gauge: str | None = None) -> LoggedSignal:
    return LoggedSignal(field, LOG_KEYS[field], gauge)


# Every step's logged number, in metrics.jsonl's order; a key absent from a step's logs (TRL logs kl only
# with beta > 0, the importance-sampling figures only with the vLLM correction) is null there and leaves
# its gauge as it was.
LOGGED_SIGNALS: tuple[LoggedSignal, ...] = (
    _trl("loss", "loss"),
    _trl("kl", "kl"),
    _trl("clip_ratio", "clip_ratio"),
    _trl("completion_length", "completion_length"),
    _trl("learning_rate"),
    _trl("clip_ratio_low", "clip_ratio_low"),
    _trl("clip_ratio_high", "clip_ratio_high"),
    _trl("entropy", "entropy"),
    _trl("truncated_ratio", "truncated_completion_ratio"),
    _trl("importance_sampling_ratio_mean", "importance_sampling_ratio_mean"),
    _trl("importance_sampling_ratio_min", "importance_sampling_ratio_min"),
    _trl("importance_sampling_ratio_max", "importance_sampling_ratio_max"),
    LoggedSignal(
        "importance_sampling_masked_ratio",
        PROJECT_LOG_KEYS["importance_sampling_masked_ratio"],
        "importance_sampling_masked_ratio",
    ),
)


def logged_fields(logs: Mapping[str, Any]) -> dict[str, float | None]:
    """The metrics.jsonl fields of one step's logs (non-finite values as null)."""
    return {signal.field: finite(logs.get(signal.log_key)) for signal in LOGGED_SIGNALS}


def set_logged_gauges(metrics: TrainerMetrics, logs: Mapping[str, Any]) -> None:
    """Set the gauge of each signal the step logged a finite value for."""
    for signal in LOGGED_SIGNALS:
        number = finite(logs.get(signal.log_key))
        if signal.gauge is not None and number is not None:
            getattr(metrics, signal.gauge).set(number)
