"""Rank 0's learning-health diagnosis (trainer_image/grpo_trainer/learning_health.py) over series of step
figures shaped like real runs: each reason appears when its signal holds for a window and not on healthy
training, causes win over their symptoms, and status.learning carries what the operator and the plugin
print."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from grpo_operator.api.learning_health import (
    REASONS,
    LearningHealthSpec,
    LearningStatus,
    Thresholds,
    describe,
)
from grpo_trainer.learning_health import LearningMonitor, StepFigures

W = Thresholds().window_steps


def learning_run(steps: int, *, seed: int = 0, start: float = 0.1, end: float = 0.9) -> Iterator[StepFigures]:
    """A run that learns: the reward rises with noise, groups carry signal, entropy falls gently."""
    rng = random.Random(seed)
    for step in range(1, steps + 1):
        progress = (step - 1) / max(1, steps - 1)
        mean = start + (end - start) * progress + rng.uniform(-0.03, 0.03)
        yield StepFigures(
            step=step,
            reward_mean=mean,
            reward_std=0.2,
            reward_max=min(1.0, mean + 0.4),
            reward_min=max(0.0, mean - 0.4),
            tied_ratio=rng.choice((0.0, 0.0, 0.25)),
            tied_values=(0.0,),
            truncated_ratio=0.3,
            entropy=1.2 - 0.5 * progress,
            kl=0.01 + 0.02 * progress,
            format_failure_ratio=0.05,
        )


def judge(series: list[StepFigures], thresholds: Thresholds | None = None) -> list[str]:
    monitor = LearningMonitor(thresholds or Thresholds())
    return [monitor.observe(figures).reason for figures in series]


def test_a_run_that_learns_is_healthy_at_every_step() -> None:
    for seed in range(5):
        assert set(judge(list(learning_run(60, seed=seed)))) == {"Healthy"}


def test_nothing_is_diagnosed_before_a_full_window() -> None:
    constant = [
        StepFigures(
            step=s,
            reward_mean=0.5,
            reward_std=0.0,
            reward_max=0.5,
            reward_min=0.5,
            tied_ratio=1.0,
            tied_values=(0.5,) * 4,
        )
        for s in range(1, W + 2)
    ]
    reasons = judge(constant)
    assert reasons[: W - 1] == ["Healthy"] * (W - 1)
    assert reasons[W - 1] == "NoSignal"


def test_groups_tied_at_the_best_reward_are_solved_and_tied_low_is_no_signal() -> None:
    learned = list(learning_run(20))
    solved = [
        StepFigures(
            step=s,
            reward_mean=1.0,
            reward_std=0.0,
            reward_max=1.0,
            reward_min=1.0,
            tied_ratio=1.0,
            tied_values=(1.0,) * 4,
            entropy=0.01,
        )
        for s in range(21, 21 + W)
    ]
    reasons = judge(learned + solved)
    assert reasons[-1] == "Solved" and REASONS["Solved"].healthy
    # A metric that answers a constant never had any spread: that is no signal, not a solved task.
    constant = [replace(f, reward_max=0.0, reward_min=0.0, tied_values=(0.0,) * 4) for f in solved]
    assert judge(constant)[-1] == "NoSignal"
    # Tied, but at a reward below the best seen (prompts too hard now): no signal.
    low = [
        replace(f, reward_mean=0.0, reward_max=0.0, reward_min=0.0, tied_values=(0.0,) * 4) for f in solved
    ]
    monitor = LearningMonitor()
    for figures in learned + low:
        diagnosis = monitor.observe(figures)
    assert diagnosis.reason == "NoSignal"
    assert diagnosis.figures["tiedReward"] == 0.0 and diagnosis.figures["bestReward"] > 0.9


def test_truncated_completions_are_a_diagnosis_only_when_masked() -> None:
    series = [replace(f, truncated_ratio=1.0) for f in learning_run(2 * W)]
    assert set(judge(series)) == {"Healthy"}  # truncated, but trained on: the metric may not mind
    masked = [replace(f, truncated_ratio=1.0, mask_truncated=True) for f in series]
    assert judge(masked)[-1] == "CompletionsTruncated"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"metric_error_ratio": 0.3}, "MetricErrors"),
        ({"masked_ratio": 0.8}, "RatiosMasked"),
        ({"kl": 3.0}, "KLRunaway"),
    ],
)
def test_each_windowed_signal_gives_its_reason(change: dict[str, Any], reason: str) -> None:
    series = list(learning_run(W)) + [replace(f, **change) for f in learning_run(2 * W)][W:]
    reasons = judge(series)
    assert reasons[W - 1] == "Healthy" and reasons[-1] == reason


def test_entropy_collapse_needs_a_flat_reward() -> None:
    start = list(learning_run(W, end=0.1))
    stuck = [
        replace(f, step=W + i + 1, reward_mean=start[-1].reward_mean, entropy=0.005)
        for i, f in enumerate(learning_run(W))
    ]
    assert judge(start + stuck)[-1] == "EntropyCollapse"
    # The same entropy while the reward still climbs is a policy getting sure of a good answer.
    rising = [replace(f, entropy=0.005) if f.step > W else f for f in learning_run(2 * W)]
    assert judge(rising)[-1] == "Healthy"


def test_validation_falling_while_training_rises_is_reward_hacking() -> None:
    series = list(learning_run(30))
    validations = {10: 0.6, 20: 0.45, 30: 0.3}
    hacked = [replace(f, validation_mean=validations.get(f.step)) for f in series]
    monitor = LearningMonitor()
    for figures in hacked:
        diagnosis = monitor.observe(figures)
    assert diagnosis.reason == "ValidationFalling"
    assert diagnosis.figures["validationBest"] == 0.6 and diagnosis.figures["validationLast"] == 0.3
    # Validation that follows the training reward up is healthy.
    honest = [replace(f, validation_mean={10: 0.3, 20: 0.5, 30: 0.7}.get(f.step)) for f in series]
    assert judge(honest)[-1] == "Healthy"


def test_format_failures_rising_from_the_start_window() -> None:
    series = [replace(f, format_failure_ratio=0.05 if f.step <= W else 0.5) for f in learning_run(2 * W)]
    assert judge(series)[-1] == "FormatFailuresRising"


def test_a_flat_reward_with_signal_in_the_groups_is_reward_flat() -> None:
    t = Thresholds()
    steps = t.flat_steps + 2 * t.window_steps
    flat = [replace(f, reward_mean=0.3 + (0.01 if f.step % 2 else -0.01)) for f in learning_run(steps)]
    reasons = judge(flat)
    assert reasons[t.flat_steps + t.window_steps - 2] == "Healthy"
    assert reasons[-1] == "RewardFlat"


def test_vanishing_updates_win_over_every_symptom_and_name_their_cause() -> None:
    series = [replace(f, metric_error_ratio=0.5, kl=4.0) for f in learning_run(2 * W)]
    series[-1] = replace(series[-1], vanishing_cause="Precision", updated_fraction=0.004, learning_rate=1e-6)
    monitor = LearningMonitor()
    for figures in series:
        diagnosis = monitor.observe(figures)
    assert diagnosis.reason == "UpdatesVanishing" and diagnosis.update_cause == "Precision"
    # Updates that vanish because the steps had no gradient name what took it: tied groups, masked
    # truncations (update_health.py's own cause may say LearningRate when a few completions were kept).
    tied = [replace(f, tied_ratio=1.0) for f in series]
    assert judge(tied)[-1] == "NoSignal"
    masked = [replace(f, truncated_ratio=0.97, mask_truncated=True) for f in series]
    assert judge(masked)[-1] == "CompletionsTruncated"


def test_the_status_says_since_when_and_validates_as_the_operator_reads_it() -> None:
    series = list(learning_run(W)) + [replace(f, kl=5.0) for f in learning_run(3 * W)][W:]
    monitor = LearningMonitor()
    first = None
    for figures in series:
        diagnosis = monitor.observe(figures)
        if diagnosis.reason == "KLRunaway" and first is None:
            first = figures.step
    body = monitor.status(series[-1].step)
    status = LearningStatus.model_validate(body)
    assert status.reason == "KLRunaway" and not status.healthy
    assert status.since_step == first and status.checked_step == series[-1].step
    text = describe(status)
    assert text.startswith(f"Not learning (KLRunaway) since step {first}: ")
    assert "5 nats" in text and "spec.grpo.beta" in text


def test_stop_when_unhealthy_waits_a_window_of_unhealthy_steps() -> None:
    thresholds = Thresholds(stop_when_unhealthy=True)
    monitor = LearningMonitor(thresholds)
    stops = []
    for figures in [replace(f, metric_error_ratio=0.5) for f in learning_run(3 * W)]:
        monitor.observe(figures)
        stops.append(monitor.should_stop())
    first_unhealthy = W  # diagnosed at the window's end, step W
    assert stops.index(True) == first_unhealthy - 1 + W - 1
    assert not LearningMonitor().should_stop()


def test_figures_are_finite_and_bounded_whatever_the_metric_sends() -> None:
    series = [
        replace(f, reward_mean=math.nan if f.step % 2 else 1e300, reward_std=math.inf, kl=math.nan)
        for f in learning_run(3 * W)
    ]
    monitor = LearningMonitor()
    for figures in series:
        monitor.observe(figures)
    LearningStatus.model_validate(monitor.status(3 * W))


def test_thresholds_are_the_jobs_then_the_platforms_then_the_built_in_ones() -> None:
    spec = LearningHealthSpec.model_validate({"windowSteps": 8, "stopWhenUnhealthy": True})
    merged = spec.merged_over({"windowSteps": 20, "flatSteps": 50})
    thresholds = Thresholds.of(merged)
    assert thresholds.window_steps == 8 and thresholds.flat_steps == 50 and thresholds.stop_when_unhealthy
    assert thresholds.tied_group_ratio == Thresholds().tied_group_ratio
    assert Thresholds.of(None) == Thresholds()
