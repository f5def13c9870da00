"""What a job has used so far, beside what it plans to use: status.cost, written by trainer rank 0.

"So far" spans gang attempts: a new attempt reads the totals the previous one reported (the job's status)
and adds to them, so work a restart redid is counted, as it was paid for. The GPU counts come from the job
itself: the trainer's from its world size, generation's from spec.generation.gpus times its replicas (read with the status;
trainer.json does not carry it)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from grpo_operator.api.resource import planned_rollouts, planned_validation_calls
from grpo_operator.api.status import CostStatus
from grpo_operator.api.trainer_config import TrainerConfig

from grpo_trainer.status import StatusReporter

log = logging.getLogger("grpo_trainer.cost")


@dataclass
class CostLedger:
    trainer_gpus: int
    generation_gpus: int
    rollouts_planned: int
    metric_calls_planned: int
    rollouts: int = 0
    metric_calls: int = 0
    generation_gpu_seconds: float = 0.0
    training_gpu_seconds: float = 0.0
    steps: int = 0
    # GPU-seconds of each step of this attempt (the forecast's spread: api/forecast.py), running sums.
    attempt_steps: int = 0
    _step_sum: float = 0.0
    _step_squares: float = 0.0

    @staticmethod
    def plan(
        config: TrainerConfig, world_size: int, validation_prompts: int, job: dict[str, Any] | None
    ) -> CostLedger:
        """The ledger of this attempt: the plan from the config, the totals so far from ``job`` (the job as
        read from the API server; None when it could not be read: then counting starts from 0)."""
        rollouts = planned_rollouts(config.grpo)
        metric_calls = (
            rollouts + planned_validation_calls(config.grpo, validation_prompts) if config.metric else 0
        )
        in_process = (
            config.generation.backend in ("transformers", "vllm-colocate") or config.rollouts is not None
        )
        generation_gpus = world_size if in_process else _generation_gpus(job)
        ledger = CostLedger(world_size, generation_gpus, rollouts, metric_calls)
        ledger.resume((job or {}).get("status", {}).get("cost"))
        return ledger

    def resume(self, previous: Any) -> None:
        """Continue from the totals an earlier attempt reported (malformed entries are ignored)."""
        if not isinstance(previous, dict):
            return
        self.rollouts = _count(previous.get("rollouts"))
        self.metric_calls = _count(previous.get("metricCalls"))
        self.generation_gpu_seconds = _seconds(previous.get("generationGpuSeconds"))
        self.training_gpu_seconds = _seconds(previous.get("trainingGpuSeconds"))
        self.steps = _count(previous.get("steps"))

    def add_step(
        self, rollouts: int, metric_calls: int, generation_seconds: float, other_seconds: float
    ) -> None:
        """One step's use: ``other_seconds`` is its time outside generation and scoring (training)."""
        self.rollouts += max(0, rollouts)
        self.metric_calls += max(0, metric_calls)
        generation = max(0.0, generation_seconds) * self.generation_gpus
        training = max(0.0, other_seconds) * self.trainer_gpus
        self.generation_gpu_seconds += generation
        self.training_gpu_seconds += training
        self.steps += 1
        self.attempt_steps += 1
        if self.attempt_steps > 1:  # the attempt's first step carries its warm-up: not a typical step
            self._step_sum += generation + training
            self._step_squares += (generation + training) ** 2

    def step_std(self) -> float | None:
        """Standard deviation of this attempt's GPU-seconds per step (its first step left out); None before
        two such steps."""
        n = self.attempt_steps - 1
        if n < 2:
            return None
        mean = self._step_sum / n
        return math.sqrt(max(0.0, (self._step_squares - n * mean * mean) / (n - 1)))

    def add_validation(self, metric_calls: int, generation_seconds: float) -> None:
        self.metric_calls += max(0, metric_calls)
        self.generation_gpu_seconds += max(0.0, generation_seconds) * self.generation_gpus

    def status(self) -> dict[str, Any]:
        cost = CostStatus(
            rollouts=self.rollouts,
            rollouts_planned=self.rollouts_planned,
            metric_calls=self.metric_calls,
            metric_calls_planned=self.metric_calls_planned,
            generation_gpu_seconds=round(self.generation_gpu_seconds, 1),
            training_gpu_seconds=round(self.training_gpu_seconds, 1),
            steps=self.steps,
            step_gpu_seconds_std=_rounded(self.step_std()),
        )
        return {"cost": cost.model_dump(by_alias=True, exclude_none=True, mode="json")}


def _rounded(value: float | None) -> float | None:
    return round(value, 2) if value is not None and math.isfinite(value) else None


def _generation_gpus(job: dict[str, Any] | None) -> int:
    """spec.generation.gpus times spec.generation.replicas: every replica generates the whole time."""
    generation = ((job or {}).get("spec") or {}).get("generation") or {}
    return _positive(generation.get("gpus")) * _positive(generation.get("replicas"))


def _positive(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 1


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    number = float(value)
    return number if math.isfinite(number) and number >= 0 else 0.0


def attempt_ledger(
    config: TrainerConfig, world_size: int, validation_prompts: int, status: StatusReporter | None
) -> CostLedger | None:
    """Rank 0's ledger, continuing the job's reported totals; None without a status to report to."""
    if status is None:
        return None
    return CostLedger.plan(config, world_size, validation_prompts, status.read())
