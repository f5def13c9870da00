"""Rank 0's learning-health diagnosis: one reason per step, judged over a sliding window of its own figures.

The reasons, their thresholds and the words users read are in grpo_operator.api.learning_health (one
table for the trainer, the operator, the plugin and the docs). This module only decides which reason
holds, from the figures every step already has: rewards and their spread, tied groups (and the reward
they tied at), truncation and its masking, metric errors, masked importance ratios, KL, entropy, format
failures, validation and the vanishing-updates verdict (update_health.py).

Order matters when several hold: a cause comes before its symptoms. No gradient at all (completions
truncated and masked, groups tied) stills the updates too and explains everything else; then updates that
vanish for another reason (16-bit weights, a learning rate too small) and a metric that errors; then the
drift signs (masked ratios, KL, entropy), then reward hacking (validation, format failures), and last a
flat reward with signal in the groups.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import fmean
from typing import Any

from grpo_operator.api.learning_health import (
    FIGURE_LIMIT,
    REASONS,
    LearningReason,
    LearningStatus,
    Thresholds,
    describe,
)
from grpo_operator.api.status import UpdateCause

log = logging.getLogger("grpo_trainer.learning_health")

# Rewards closer than this (relative to the larger magnitude, at least absolute 1e-6) count as the same: a
# group "tied at the best reward" ties at the best value seen up to float noise.
SAME_REWARD = 1e-6
# Solved rather than NoSignal when at least this share of the window's tied groups sat at the best reward.
SOLVED_SHARE = 0.5
# EntropyCollapse also needs the entropy below this share of the first window's.
ENTROPY_COLLAPSE_SHARE = 0.1


@dataclass(frozen=True)
class StepFigures:
    """What one step measured (rank 0's view; global over ranks)."""

    step: int
    reward_mean: float | None
    reward_std: float | None
    reward_max: float | None
    reward_min: float | None
    tied_ratio: float
    tied_values: tuple[float, ...] = ()  # the common reward of each tied group
    truncated_ratio: float | None = None
    mask_truncated: bool = False
    metric_error_ratio: float = 0.0
    masked_ratio: float | None = None  # vLLM importance-sampling ratios masked
    kl: float | None = None
    entropy: float | None = None
    format_failure_ratio: float = 0.0
    validation_mean: float | None = None  # set on the steps that validated
    vanishing_cause: UpdateCause | None = None  # set while update_health judges the updates vanishing
    learning_rate: float | None = None
    updated_fraction: float | None = None


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= SAME_REWARD * max(1.0, abs(a), abs(b))


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None and math.isfinite(v)]
    return fmean(present) if present else None


@dataclass(frozen=True)
class Diagnosis:
    reason: LearningReason
    figures: dict[str, float] = field(default_factory=dict)
    update_cause: UpdateCause | None = None

    @property
    def healthy(self) -> bool:
        return REASONS[self.reason].healthy


@dataclass
class LearningMonitor:
    """Keeps the run's figures and judges each new step."""

    thresholds: Thresholds = field(default_factory=Thresholds)
    history: list[StepFigures] = field(default_factory=list)
    # (step, validation mean, training reward averaged over the window at that step)
    validations: list[tuple[int, float, float | None]] = field(default_factory=list)
    best_reward: float | None = None
    worst_reward: float | None = None
    current: Diagnosis | None = None
    since_step: int | None = None
    # Judged steps in a row with an unhealthy reason (for stopWhenUnhealthy).
    unhealthy_steps: int = 0

    # -- the run's scale -------------------------------------------------------------------------------

    def _spread(self) -> float | None:
        """The run's mean within-step reward standard deviation: the unit of reward changes."""
        return _mean([f.reward_std for f in self.history])

    def _window(self) -> list[StepFigures]:
        return self.history[-self.thresholds.window_steps :]

    def _reward_window_mean(self, end: int | None = None) -> float | None:
        stop = len(self.history) if end is None else end
        start = max(0, stop - self.thresholds.window_steps)
        return _mean([f.reward_mean for f in self.history[start:stop]])

    # -- judging ---------------------------------------------------------------------------------------

    def observe(self, figures: StepFigures) -> Diagnosis:
        self.history.append(figures)
        for value in (figures.reward_max, figures.reward_min):
            if value is not None and math.isfinite(value):
                self.best_reward = value if self.best_reward is None else max(self.best_reward, value)
                self.worst_reward = value if self.worst_reward is None else min(self.worst_reward, value)
        if figures.validation_mean is not None and math.isfinite(figures.validation_mean):
            self.validations.append((figures.step, figures.validation_mean, self._reward_window_mean()))
        diagnosis = self._diagnose()
        if self.current is None or diagnosis.reason != self.current.reason:
            self.since_step = figures.step
            self._log_change(diagnosis, figures.step)
        self.current = diagnosis
        self.unhealthy_steps = 0 if diagnosis.healthy else self.unhealthy_steps + 1
        return diagnosis

    def should_stop(self) -> bool:
        """stopWhenUnhealthy: an unhealthy reason held for windowSteps judged steps in a row."""
        return self.thresholds.stop_when_unhealthy and self.unhealthy_steps >= self.thresholds.window_steps

    def _diagnose(self) -> Diagnosis:
        t = self.thresholds
        window = self._window()
        full = len(self.history) >= t.window_steps
        # No gradient at all (completions masked, groups tied) also stills the updates: name the cause.
        for check in (self._truncated, self._tied) if full else ():
            found = check(window)
            if found is not None:
                return found
        last = window[-1]
        if last.vanishing_cause in ("Precision", "LearningRate"):
            return Diagnosis(
                "UpdatesVanishing",
                _figures(updatedFraction=last.updated_fraction, learningRate=last.learning_rate),
                update_cause=last.vanishing_cause,  # type: ignore[arg-type]
            )
        if not full:
            return self._healthy(window)
        for check in (
            self._metric_errors,
            self._ratios_masked,
            self._kl,
            self._entropy,
            self._validation,
            self._format_failures,
            self._flat,
        ):
            found = check(window)
            if found is not None:
                return found
        return self._healthy(window)

    def _healthy(self, window: Sequence[StepFigures]) -> Diagnosis:
        return Diagnosis(
            "Healthy",
            _figures(
                rewardMean=_mean([f.reward_mean for f in window]),
                tiedGroupRatio=_mean([f.tied_ratio for f in window]),
            ),
        )

    def _metric_errors(self, window: Sequence[StepFigures]) -> Diagnosis | None:
        ratio = fmean(f.metric_error_ratio for f in window)
        if ratio >= self.thresholds.metric_error_ratio:
            return Diagnosis("MetricErrors", _figures(metricErrorRatio=ratio))
        return None

    def _truncated(self, window: Sequence[StepFigures]) -> Diagnosis | None:
        if not all(f.mask_truncated for f in window):
            return None
        ratio = _mean([f.truncated_ratio for f in window])
        if ratio is not None and ratio >= self.thresholds.truncated_ratio:
            return Diagnosis("CompletionsTruncated", _figures(truncatedRatio=ratio))
        return None

    def _tied(self, window: Sequence[StepFigures]) -> Diagnosis | None:
        ratio = fmean(f.tied_ratio for f in window)
        if ratio < self.thresholds.tied_group_ratio:
            return None
        values = [v for f in window for v in f.tied_values if math.isfinite(v)]
        best, worst = self.best_reward, self.worst_reward
        varied = best is not None and worst is not None and not _same(best, worst)
        at_best = [v for v in values if best is not None and _same(v, best)]
        tied_reward = fmean(values) if values else None
        if varied and values and len(at_best) >= SOLVED_SHARE * len(values):
            return Diagnosis(
                "Solved", _figures(tiedGroupRatio=ratio, bestReward=best, tiedReward=tied_reward)
            )
        return Diagnosis("NoSignal", _figures(tiedGroupRatio=ratio, tiedReward=tied_reward, bestReward=best))

    def _ratios_masked(self, window: Sequence[StepFigures]) -> Diagnosis | None:
        ratio = _mean([f.masked_ratio for f in window])
        if ratio is not None and ratio >= self.thresholds.masked_ratio:
            return Diagnosis("RatiosMasked", _figures(maskedRatio=ratio))
        return None

    def _kl(self, window: Sequence[StepFigures]) -> Diagnosis | None:
        kl = _mean([f.kl for f in window])
        if kl is not None and kl > self.thresholds.kl_ceiling:
            return Diagnosis("KLRunaway", _figures(kl=kl))
        return None

    def _reward_rise(self) -> tuple[float | None, float | None, float | None]:
        """(window mean now, window mean one window earlier, the rise in reward spreads) or Nones."""
        now = self._reward_window_mean()
        before = self._reward_window_mean(len(self.history) - self.thresholds.window_steps)
        spread = self._spread()
        if now is None or before is None or not spread:
            return now, before, None
        return now, before, (now - before) / spread

    def _entropy(self, window: Sequence[StepFigures]) -> Diagnosis | None:
        t = self.thresholds
        if len(self.history) < 2 * t.window_steps:
            return None
        entropy = _mean([f.entropy for f in window])
        start = _mean([f.entropy for f in self.history[: t.window_steps]])
        if entropy is None or start is None:
            return None
        if entropy >= t.entropy_floor or entropy >= ENTROPY_COLLAPSE_SHARE * start:
            return None
        now, _, rise = self._reward_rise()
        if rise is not None and rise >= t.flat_gain:
            return None
        return Diagnosis("EntropyCollapse", _figures(entropy=entropy, entropyStart=start, rewardMean=now))

    def _validation(self, window: Sequence[StepFigures]) -> Diagnosis | None:
        if len(self.validations) < 2:
            return None
        *earlier, (_, last_mean, reward_now) = self.validations
        best_step, best_mean, reward_then = max(earlier, key=lambda v: v[1])
        spread = self._spread()
        if not spread or reward_now is None or reward_then is None:
            return None
        drop = self.thresholds.validation_drop * spread
        if best_mean - last_mean >= drop and reward_now - reward_then >= drop:
            return Diagnosis(
                "ValidationFalling",
                _figures(
                    validationLast=last_mean,
                    validationBest=best_mean,
                    validationBestStep=best_step,
                    rewardAtValidationBest=reward_then,
                    rewardMean=reward_now,
                ),
            )
        return None

    def _format_failures(self, window: Sequence[StepFigures]) -> Diagnosis | None:
        t = self.thresholds
        if len(self.history) < 2 * t.window_steps:
            return None
        now = fmean(f.format_failure_ratio for f in window)
        start = fmean(f.format_failure_ratio for f in self.history[: t.window_steps])
        if now - start >= t.format_failure_rise:
            return Diagnosis(
                "FormatFailuresRising", _figures(formatFailureRatio=now, formatFailureStart=start)
            )
        return None

    def _flat(self, window: Sequence[StepFigures]) -> Diagnosis | None:
        t = self.thresholds
        if len(self.history) < max(t.flat_steps, t.window_steps) + t.window_steps:
            return None
        spread = self._spread()
        if not spread:
            return None
        now = self._reward_window_mean()
        # The best window mean over the flat span: a rise that came and went is not learning either.
        end = len(self.history)
        before = self._reward_window_mean(end - t.flat_steps)
        means = [self._reward_window_mean(stop) for stop in range(end - t.flat_steps + 1, end + 1)]
        peak = max((m for m in means if m is not None), default=None)
        if now is None or before is None or peak is None:
            return None
        if (peak - before) / spread < t.flat_gain:
            return Diagnosis("RewardFlat", _figures(rewardMean=now, rewardBefore=before, rewardStd=spread))
        return None

    # -- reporting -------------------------------------------------------------------------------------

    def status(self, step: int) -> dict[str, Any]:
        """status.learning for the last judgement, validated as the operator reads it."""
        assert self.current is not None
        model = self.status_model(step)
        return model.model_dump(by_alias=True, exclude_none=True, mode="json")

    def status_model(self, step: int) -> LearningStatus:
        assert self.current is not None
        return LearningStatus.model_validate(
            {
                "reason": self.current.reason,
                "healthy": self.current.healthy,
                "sinceStep": self.since_step,
                "checkedStep": step,
                "windowSteps": min(len(self.history), self.thresholds.window_steps),
                "figures": self.current.figures or None,
                "updateCause": self.current.update_cause,
            }
        )

    def _log_change(self, diagnosis: Diagnosis, step: int) -> None:
        previous = self.current.reason if self.current is not None else None
        if diagnosis.healthy and previous in (None, "Healthy", "Solved") and diagnosis.reason == "Healthy":
            return
        self.current, keep = diagnosis, self.current
        self.since_step = step
        line = describe(self.status_model(step))
        self.current = keep
        if diagnosis.healthy:
            log.info("step %d: learning health: %s", step, line)
        else:
            log.warning("step %d: learning health: %s", step, line)


def _figures(**values: float | None) -> dict[str, float]:
    """The figures that are numbers, rounded for the status object and bounded as it requires."""
    kept: dict[str, float] = {}
    for name, value in values.items():
        if value is None or not math.isfinite(value):
            continue
        kept[name] = max(-FIGURE_LIMIT, min(FIGURE_LIMIT, float(f"{value:.4g}")))
    return kept
