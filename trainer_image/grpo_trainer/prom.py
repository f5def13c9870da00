"""The trainer's Prometheus catalog (docs/metrics.md). Prefix grpo_, base units, counters end in _total,
labels grpojob and namespace on every series. Served by rank 0 only."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

LABELS = ("grpojob", "namespace")
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

    @staticmethod
    def create(job: str, namespace: str, registry: CollectorRegistry | None = None) -> TrainerMetrics:
        reg = registry or CollectorRegistry()
        values = {"grpojob": job, "namespace": namespace}

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, LABELS, registry=reg).labels(**values)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, LABELS, registry=reg).labels(**values)

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
        )

    def serve(self, port: int) -> None:
        start_http_server(port, registry=self.registry)
