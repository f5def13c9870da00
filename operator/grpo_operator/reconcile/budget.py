"""spec.budget: the job's GPU-hours against its cap (issue 49's cap; prices and forecasts are not built).

The spend is what trainer rank 0 reports in status.cost (generation and training GPU-seconds, every gang
attempt's), read on every pass like the rest of the status. Once it reaches spec.budget.gpuHours the job
is suspended through the same path as spec.suspend (reconcile_job.suspend): the pods are deleted, so the
trainer checkpoints on SIGTERM, and the volume and status are kept. Raising the budget above the spend, or
removing it, resumes the job as spec.suspend: false does. The condition WithinBudget says where the job
stands; its reason turning BudgetNearlySpent is what posts the one Warning event at warnAtPercent, so the
warning is not repeated on every pass. Its messages name no figure that moves with every step, so a job
with a budget costs no status write per step.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_operator.api import event_reasons
from grpo_operator.api.budget import format_gpu_hours, spent_gpu_hours
from grpo_operator.builders import Job
from grpo_operator.reconcile.conditions import WITHIN_BUDGET, get_condition
from grpo_operator.reconcile.reconcile_pass import ReconcilePass

UNDER_BUDGET = "UnderBudget"
NEARLY_SPENT = event_reasons.BUDGET_NEARLY_SPENT.reason
EXHAUSTED = event_reasons.BUDGET_EXHAUSTED.reason


@dataclass(frozen=True)
class Budget:
    """spec.budget.gpuHours against what status.cost says was spent."""

    limit: float
    warn_at_percent: int
    spent: float

    @property
    def exhausted(self) -> bool:
        return self.spent >= self.limit

    @property
    def nearly_spent(self) -> bool:
        return self.spent * 100 >= self.limit * self.warn_at_percent

    def figures(self) -> str:
        """ "12.5 of its 10 GPU-hours (spec.budget.gpuHours)"."""
        return f"{format_gpu_hours(self.spent)} of its {format_gpu_hours(self.limit)} GPU-hours (spec.budget.gpuHours)"

    def exhausted_message(self) -> str:
        return (
            f"the job has spent {self.figures()}, counted from status.cost (generation and training "
            "GPU-seconds): all pods are stopped, the trainers after writing a checkpoint; the volume and status "
            f"are kept. Raise spec.budget.gpuHours above {format_gpu_hours(self.spent)} (or remove spec.budget) "
            "to resume from the last checkpoint."
        )


def read_budget(rp: ReconcilePass, job: Job) -> Budget | None:
    """The job's budget and its spend; None when the job has none."""
    budget = job.spec.budget
    if budget is None or budget.gpu_hours is None:
        return None
    spent = spent_gpu_hours(rp.old.get("cost")) or 0.0
    return Budget(limit=budget.gpu_hours, warn_at_percent=budget.warn_at_percent, spent=spent)


def budget_condition(rp: ReconcilePass, budget: Budget | None) -> None:
    """WithinBudget, and the one warning when the job passes warnAtPercent (or is found past it)."""
    if budget is None:
        if get_condition(list(rp.old.get("conditions") or []), WITHIN_BUDGET) is not None:
            rp.drop_condition(WITHIN_BUDGET)
        return
    limit = format_gpu_hours(budget.limit)
    if budget.exhausted:
        rp.condition(
            WITHIN_BUDGET,
            "False",
            EXHAUSTED,
            f"the job has spent its {limit} GPU-hours (spec.budget.gpuHours) and is suspended until the budget "
            "is raised above what it spent, or removed",
        )
        return
    if not budget.nearly_spent:
        rp.condition(
            WITHIN_BUDGET,
            "True",
            UNDER_BUDGET,
            f"under {budget.warn_at_percent} % of the {limit} GPU-hours of spec.budget.gpuHours spent",
        )
        return
    previous = get_condition(list(rp.old.get("conditions") or []), WITHIN_BUDGET)
    rp.condition(
        WITHIN_BUDGET,
        "True",
        NEARLY_SPENT,
        f"{budget.warn_at_percent} % or more of the {limit} GPU-hours of spec.budget.gpuHours spent: the job is "
        f"suspended once it has spent {limit}",
    )
    if previous is None or previous.get("reason") != NEARLY_SPENT:
        share = int(budget.spent * 100 // budget.limit)
        rp.event(
            event_reasons.BUDGET_NEARLY_SPENT,
            f"the job has spent {budget.figures()}, {share} %, past spec.budget.warnAtPercent "
            f"({budget.warn_at_percent} %): it will be suspended, with a checkpoint, at {limit} GPU-hours. Raise "
            "spec.budget.gpuHours to let it run to its end.",
        )


def resumed_cause(rp: ReconcilePass, budget: Budget | None) -> str:
    """Why a suspended job resumes, in the words of its Resumed event."""
    if rp.old.get("reason") != EXHAUSTED:
        return "spec.suspend is false"
    if budget is None:
        return "spec.budget was removed"
    return (
        f"spec.budget.gpuHours ({format_gpu_hours(budget.limit)}) is above the "
        f"{format_gpu_hours(budget.spent)} GPU-hours spent"
    )
