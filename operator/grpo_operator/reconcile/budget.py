"""A job's budget: its GPU-hours and amount against the limits it has (spec.budget, the platform's per-namespace
default and maxima), and the suspension once one is reached.

The GPU-hours are what trainer rank 0 reports in status.cost (generation and training GPU-seconds, every gang
attempt's), read on every pass like the rest of the status; the amount is that use priced by the platform
(reconcile/spend.py). Once either reaches its limit the job is suspended through the same path as spec.suspend
(reconcile_job.suspend): the pods are deleted, so the trainer checkpoints on SIGTERM, and the volume and status
are kept. Raising the limit above the spend, or removing it, resumes the job as spec.suspend: false does. The
condition WithinBudget says where the job stands; its reason turning BudgetNearlySpent is what posts the one
Warning event at warnAtPercent, so the warning is not repeated on every pass. Its messages name no figure
that moves with every step, so a job with a budget costs no status write per step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from grpo_operator.api import event_reasons
from grpo_operator.api.budget import DEFAULT_WARN_AT_PERCENT, BudgetSpec, format_gpu_hours, spent_gpu_hours
from grpo_operator.api.pricing import Charges
from grpo_operator.builders import Job
from grpo_operator.reconcile.conditions import WITHIN_BUDGET, get_condition
from grpo_operator.reconcile.reconcile_pass import ReconcilePass

UNDER_BUDGET = "UnderBudget"
NEARLY_SPENT = event_reasons.BUDGET_NEARLY_SPENT.reason
EXHAUSTED = event_reasons.BUDGET_EXHAUSTED.reason
GPU_HOURS = "GPU-hours"


@dataclass(frozen=True)
class Limit:
    """One limit on the job's spend: ``value`` ``unit`` (GPU-hours or the currency), set by ``source``."""

    value: float
    spent: float
    unit: str
    source: str  # "spec.budget.gpuHours", or the platform setting it comes from
    # What raises it: a field of the job ("spec.budget.gpuHours"), or "" when only the platform team can.
    raised_by: str

    @property
    def share(self) -> float:
        return self.spent / self.value

    def figures(self) -> str:
        """ "12.5 of its 10 GPU-hours (spec.budget.gpuHours)"."""
        return f"{format_gpu_hours(self.spent)} of its {format_gpu_hours(self.value)} {self.unit} ({self.source})"

    def what_to_do(self) -> str:
        spent = format_gpu_hours(self.spent)
        if not self.raised_by:
            return f"Only the platform team can raise {self.source} above {spent}."
        if self.raised_by == self.source:  # the job's own spec.budget field
            return f"Raise {self.raised_by} above {spent} (or remove spec.budget) to resume from the last checkpoint."
        return f"Set {self.raised_by} above {spent} to resume from the last checkpoint."


@dataclass(frozen=True)
class Budget:
    """Every limit the job has, against what it spent."""

    limits: tuple[Limit, ...]
    warn_at_percent: int

    @property
    def binding(self) -> Limit:
        """The limit nearest to (or furthest past) being reached."""
        return max(self.limits, key=lambda limit: limit.share)

    @property
    def exhausted(self) -> bool:
        return self.binding.spent >= self.binding.value

    @property
    def nearly_spent(self) -> bool:
        return self.binding.spent * 100 >= self.binding.value * self.warn_at_percent

    def figures(self) -> str:
        return self.binding.figures()

    def exhausted_message(self) -> str:
        what = (
            "counted from status.cost (generation and training GPU-seconds)"
            if self.binding.unit == GPU_HOURS
            else "priced from status.cost and the checkpoint claim (status.spend)"
        )
        return (
            f"the job has spent {self.figures()}, {what}: all pods are stopped, the trainers after writing a "
            f"checkpoint; the volume and status are kept. {self.binding.what_to_do()}"
        )


def _limits(
    spec_budget: BudgetSpec | None,
    namespace: str,
    rp: ReconcilePass,
    spent_hours: float,
    spent_amount: float | None,
) -> Budget | None:
    platform = rp.settings.namespace_budget(namespace)
    setting = f"Helm budgets.namespaces for namespace {namespace}"
    budget, own = spec_budget, True
    if budget is None and platform is not None and platform.default is not None:
        budget, own = platform.default, False
    currency = rp.settings.price_table.currency if rp.settings.price_table is not None else ""
    limits: list[Limit] = []
    kinds = (
        ("gpuHours", GPU_HOURS, spent_hours, "gpu_hours", "max_gpu_hours", "maxGpuHours"),
        ("amount", currency, spent_amount, "amount", "max_amount", "maxAmount"),
    )
    for field, unit, spent, attr, max_attr, max_key in kinds:
        if spent is None:
            continue  # an amount without prices: refused by the platform policy before this
        value = getattr(budget, attr) if budget is not None else None
        source = (
            f"spec.budget.{field}" if own else f"the platform's default budget, {setting} default.{field}"
        )
        ceiling = getattr(platform, max_attr) if platform is not None else None
        if ceiling is not None and (value is None or ceiling < value):
            value, source, raised_by = ceiling, f"the platform's maximum, {setting} {max_key}", ""
        else:
            raised_by = f"spec.budget.{field}"
        if value is not None:
            limits.append(Limit(value, spent, unit, source, raised_by))
    if not limits:
        return None
    warn = budget.warn_at_percent if budget is not None else DEFAULT_WARN_AT_PERCENT
    return Budget(tuple(limits), warn)


def read_budget(rp: ReconcilePass, job: Job, charges: Charges | None) -> Budget | None:
    """The job's limits and its spend; None when it has none (no spec.budget and no platform budget)."""
    spent = spent_gpu_hours(rp.old.get("cost")) or 0.0
    amount = charges.total if charges is not None else None
    return _limits(job.spec.budget, job.namespace, rp, spent, amount)


def budget_condition(rp: ReconcilePass, budget: Budget | None) -> None:
    """WithinBudget, and the one warning when the job passes warnAtPercent (or is found past it)."""
    if budget is None:
        if get_condition(list(rp.old.get("conditions") or []), WITHIN_BUDGET) is not None:
            rp.drop_condition(WITHIN_BUDGET)
        return
    binding = budget.binding
    limit = f"{format_gpu_hours(binding.value)} {binding.unit}"
    if budget.exhausted:
        rp.condition(
            WITHIN_BUDGET,
            "False",
            EXHAUSTED,
            f"the job has spent its {limit} ({binding.source}) and is suspended until the limit is raised above "
            "what it spent, or removed",
        )
        return
    if not budget.nearly_spent:
        every = " and ".join(f"{format_gpu_hours(x.value)} {x.unit} of {x.source}" for x in budget.limits)
        rp.condition(
            WITHIN_BUDGET, "True", UNDER_BUDGET, f"under {budget.warn_at_percent} % of the {every} spent"
        )
        return
    previous = get_condition(list(rp.old.get("conditions") or []), WITHIN_BUDGET)
    rp.condition(
        WITHIN_BUDGET,
        "True",
        NEARLY_SPENT,
        f"{budget.warn_at_percent} % or more of the {limit} of {binding.source} spent: the job is suspended once "
        f"it has spent {limit}",
    )
    if previous is None or previous.get("reason") != NEARLY_SPENT:
        share = int(binding.share * 100)
        rp.event(
            event_reasons.BUDGET_NEARLY_SPENT,
            f"the job has spent {budget.figures()}, {share} %, past its warning share ({budget.warn_at_percent} %, "
            f"spec.budget.warnAtPercent): it will be suspended, with a checkpoint, at {limit}. "
            + (
                f"Raise {binding.raised_by} to let it run to its end."
                if binding.raised_by
                else "Only the platform team can raise this limit."
            ),
        )


def showback_limits(rp: ReconcilePass, budget: Budget | None) -> None:
    """The limits that apply, for the showback metrics (the budget gauges)."""
    if rp.plan.showback is None or budget is None:
        return
    hours = [x.value for x in budget.limits if x.unit == GPU_HOURS]
    amount = [x.value for x in budget.limits if x.unit != GPU_HOURS]
    rp.plan.showback = replace(
        rp.plan.showback,
        budget_gpu_hours=hours[0] if hours else None,
        budget_amount=amount[0] if amount else None,
    )


def resumed_cause(rp: ReconcilePass, budget: Budget | None) -> str:
    """Why a suspended job resumes, in the words of its Resumed event."""
    if rp.old.get("reason") != EXHAUSTED:
        return "spec.suspend is false"
    if budget is None:
        return "spec.budget was removed"
    binding = budget.binding
    return (
        f"{binding.source} ({format_gpu_hours(binding.value)}) is above the "
        f"{format_gpu_hours(binding.spent)} {binding.unit} spent"
    )
