"""``spec.budget``: the GPU-hours a job may spend before the operator suspends it (reconcile/budget.py).

What is counted is what trainer rank 0 reports in ``status.cost`` (api/status.py ``CostStatus``): the
GPU-seconds of generation and of training, over every gang attempt. The same sum is read here, by the
operator, and documented in docs/platform.md ("Budgets").
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import Field, model_validator

from grpo_operator.api.base import ApiModel, CelRule, CelRules
from grpo_operator.api.field_types import K8sInt

DEFAULT_WARN_AT_PERCENT = 80
# status.cost's GPU-second counters that a budget counts (wire names).
COUNTED_COST_FIELDS = ("generationGpuSeconds", "trainingGpuSeconds")


class BudgetSpec(ApiModel):
    """What the job may spend; crossing it suspends the job (never a failure)."""

    class Rules(CelRules):
        sets_a_limit = CelRule(
            "has(self.gpuHours)",
            "spec.budget sets no limit: set spec.budget.gpuHours (the GPU-hours the job may spend before the "
            "operator suspends it), or remove spec.budget",
            ".gpuHours",
        )

    gpu_hours: float | None = Field(
        default=None,
        gt=0,
        description="GPU-hours the job may spend: status.cost's generation and training GPU-seconds together, "
        "over every gang attempt, divided by 3600. Once they reach it the operator suspends the job as "
        "spec.suspend does (pods stopped after a checkpoint; volume and status kept), with phase Suspended "
        "and reason BudgetExhausted; raising it above what was spent, or removing spec.budget, resumes the "
        "job from its last checkpoint. May be changed at any time.",
    )
    warn_at_percent: K8sInt = Field(
        default=DEFAULT_WARN_AT_PERCENT,
        ge=1,
        le=100,
        description="A Warning event (BudgetNearlySpent) once the job has spent this share of gpuHours.",
    )

    @model_validator(mode="after")
    def _sets_a_limit(self) -> BudgetSpec:
        if self.gpu_hours is None:
            raise self.Rules.sets_a_limit.violation()
        return self


def finite_count(value: Any) -> float | None:
    """``value`` as a float when it is a finite non-negative number (not a bool), else None; an int too large
    for a float is None too (the trainer writes the status: no value may crash a reader)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


def spent_gpu_hours(cost: Any) -> float | None:
    """GPU-hours spent so far according to ``status.cost`` (the trainer's report, read defensively: an entry
    that is not a finite non-negative number counts as 0); None when the trainer reported no GPU time yet."""
    if not isinstance(cost, dict):
        return None
    numbers = [number for key in COUNTED_COST_FIELDS if (number := finite_count(cost.get(key))) is not None]
    if not numbers:
        return None
    return sum(numbers) / 3600.0


def format_gpu_hours(hours: float) -> str:
    """GPU-hours as messages show them: 2 decimals (3 significant digits below 1), no trailing zeros."""
    text = f"{hours:.3g}" if 0 < hours < 1 else f"{hours:.2f}"
    if "e" not in text and "." in text:
        text = text.rstrip("0").rstrip(".")
    return text
