"""``spec.budget``: the GPU-hours and the amount a job may spend before the operator suspends it
(reconcile/budget.py), and the budgets a platform sets per namespace (``NamespaceBudget``, Helm
``budgets.namespaces``).

The GPU-hours counted are what trainer rank 0 reports in ``status.cost`` (api/status.py ``CostStatus``):
the GPU-seconds of generation and of training, over every gang attempt. The amount is that use priced by
the platform's price table (api/pricing.py), written by the operator to ``status.spend``. Both are
documented in docs/platform.md ("Budgets").
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
            "has(self.gpuHours) || has(self.amount)",
            "spec.budget sets no limit: set spec.budget.gpuHours (the GPU-hours the job may spend before the "
            "operator suspends it) or spec.budget.amount (the most it may cost), or remove spec.budget",
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
    amount: float | None = Field(
        default=None,
        gt=0,
        description="The most the job may cost, in the platform's currency (status.spend.currency): its "
        "GPU-hours, metric calls, episodes and checkpoint storage priced by the platform's price table (Helm "
        "pricing). Reaching it suspends the job as gpuHours does. A job with an amount on a platform that "
        "sets no prices is held with the PlatformPolicy condition: nothing could count it.",
    )
    warn_at_percent: K8sInt = Field(
        default=DEFAULT_WARN_AT_PERCENT,
        ge=1,
        le=100,
        description="A Warning event (BudgetNearlySpent) once the job has spent this share of a limit.",
    )

    @model_validator(mode="after")
    def _sets_a_limit(self) -> BudgetSpec:
        if self.gpu_hours is None and self.amount is None:
            raise self.Rules.sets_a_limit.violation()
        return self


class NamespaceBudget(ApiModel):
    """What the platform sets for the jobs of one namespace (Helm budgets.namespaces.<namespace>, "*" for
    every namespace not named): a default for jobs without spec.budget, and maxima no job's budget can
    pass. Not part of the CRD: tenants cannot change it."""

    default: BudgetSpec | None = Field(default=None, description="The budget of jobs without spec.budget.")
    max_gpu_hours: float | None = Field(
        default=None, gt=0, description="No job spends more GPU-hours, whatever its spec.budget says."
    )
    max_amount: float | None = Field(
        default=None, gt=0, description="No job costs more (pricing.currency), whatever its spec.budget says."
    )


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
