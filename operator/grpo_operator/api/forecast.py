"""``status.forecast``: the GPU-hours a job is projected to spend over its whole run (issue 49's forecast).

Written by the operator on reconcile (reconcile/forecast.py) from the spec and from what trainer rank 0
reports in ``status.cost`` and ``status.progress``; read by ``kubectl grpo status``. The GPU-hours counted
are the budget's (api/budget.py): generation and training GPU-seconds / 3600, every gang attempt's.

- Before the job has run ``MIN_MEASURED_STEPS`` steps (basis ``Spec``) no time per step is assumed: a
  step takes seconds for a tiny model and many minutes for a large one with long completions, and no
  figure from the spec alone is honest across that range. The forecast then gives the GPUs counted and
  the steps, and the most GPU-hours an hour of training can count.
- From then on (basis ``Measured``): spent + spent / stepsRun x stepsLeft. ``stepsRun`` is
  ``status.cost.steps``, the steps every attempt ran, redone ones included, so a restart that redid steps
  does not make the steps look dearer; a trainer that does not report it falls back on ``progress.step``
  (which makes the steps look dearer after a restart). The spread is one standard deviation of the sum of
  the remaining steps, if they vary as the measured ones did (``status.cost.stepGpuSecondsStd``) and the
  mean per step is known from ``stepsRun`` steps: sd x sqrt(left + left^2 / run).

The status is rewritten only when the projection moves by more than ``REWRITE_SHARE`` (or its basis, GPU
count or steps change, or the run ends), so the forecast adds no status write per step. Every figure read
from the status is type-checked: the tenant's trainer writes it.
"""

from __future__ import annotations

import math
from typing import Any, Final, Literal

from pydantic import ConfigDict, Field, ValidationError

from grpo_operator.api.base import ApiModel
from grpo_operator.api.budget import finite_count, format_gpu_hours, spent_gpu_hours
from grpo_operator.api.pricing import Charges, format_amount
from grpo_operator.api.rollouts import rollouts_source

MIN_MEASURED_STEPS = 2
REWRITE_SHARE = 0.05
Basis = Literal["Spec", "Measured"]
SPEC: Final[Basis] = "Spec"
MEASURED: Final[Basis] = "Measured"
# No control characters: `kubectl grpo status` prints the message (api/status.py NO_CONTROL_PATTERN).
_NO_CONTROL = r"^[^\x00-\x1f\x7f-\x9f]*$"


class ForecastStatus(ApiModel):
    """The GPU-hours projected for the whole run (written by the operator)."""

    model_config = ConfigDict(strict=False)

    basis: Basis = Field(
        description="Spec: before the first steps, GPU counts only (no time per step is assumed); Measured: "
        "from the GPU-hours spent per step run."
    )
    gpus: int = Field(ge=0, description="GPUs the budget counts: trainingGpus + generationGpus.")
    training_gpus: int = Field(ge=0, description="The trainer gang's GPUs (nodes x gpusPerNode).")
    generation_gpus: int = Field(
        ge=0,
        description="The vLLM pods' GPUs (spec.generation.gpus x replicas; 0 when generation runs in the "
        "trainer processes, whose GPUs then generate as well).",
    )
    steps: int = Field(ge=0, description="S, the steps of the whole run.")
    gpu_hours: float | None = Field(
        default=None, ge=0, description="Projected GPU-hours of the whole run (Measured only)."
    )
    gpu_hours_low: float | None = Field(
        default=None, ge=0, description="One standard deviation below gpuHours (never below what was spent)."
    )
    gpu_hours_high: float | None = Field(
        default=None, ge=0, description="One standard deviation above gpuHours."
    )
    from_steps: int | None = Field(
        default=None, ge=0, description="Steps run (every gang attempt's) when the figure was computed."
    )
    at_step: int | None = Field(
        default=None, ge=0, description="status.progress.step when the figure was computed."
    )
    amount: float | None = Field(
        default=None,
        ge=0,
        description="Projected cost of the whole run at the platform's prices (Measured, with prices only): the "
        "GPU and call charges scaled as gpuHours, plus the checkpoint storage charged so far.",
    )
    currency: str | None = Field(default=None, max_length=16, description="The currency of amount.")
    message: str | None = Field(
        default=None, max_length=1024, pattern=_NO_CONTROL, description="The forecast in words."
    )


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if value >= 0 else None


def _section(status: dict[str, Any], key: str) -> dict[str, Any]:
    value = status.get(key)
    return value if isinstance(value, dict) else {}


def significant(value: float, digits: int = 3) -> float:
    """``value`` rounded to ``digits`` significant digits (what the status stores)."""
    if value == 0 or not math.isfinite(value):
        return value
    return round(value, digits - 1 - math.floor(math.log10(abs(value))))


def counted_gpus(spec: Any) -> tuple[int, int]:
    """(training, generation) GPUs whose time status.cost counts; generation is 0 where the trainer
    processes generate (colocated vLLM, client rollouts): their time is counted on the trainer GPUs."""
    training = spec.trainer_world_size()
    in_process = spec.generation.colocated() or rollouts_source(spec) == "Client"
    return training, 0 if in_process else spec.generation.pod_gpus()


def forecast(spec: Any, status: dict[str, Any], bill: Charges | None = None) -> ForecastStatus:
    """The forecast of a job with ``spec`` (GRPOJobSpec) whose status is ``status`` (as stored); ``bill``:
    what its use so far costs, on a platform with prices."""
    training, generation = counted_gpus(spec)
    steps = int(spec.grpo.steps)
    base = {
        "gpus": training + generation,
        "training_gpus": training,
        "generation_gpus": generation,
        "steps": steps,
    }
    cost, progress = _section(status, "cost"), _section(status, "progress")
    spent = spent_gpu_hours(cost)
    done = _count(progress.get("step"))
    run = _count(cost.get("steps"))
    run = run if run is not None else done
    if spent is None or done is None or run is None or run < MIN_MEASURED_STEPS or not math.isfinite(spent):
        return _from_spec(base, training, generation, steps, run)
    left = max(0, steps - min(done, steps))
    per_step = spent / run
    projected = spent + per_step * left
    if not math.isfinite(projected):
        return _from_spec(base, training, generation, steps, run)
    sd = finite_count(cost.get("stepGpuSecondsStd"))
    low = high = None
    if sd is not None and left > 0:
        spread = sd / 3600.0 * math.sqrt(left + left * left / run)
        if math.isfinite(spread):
            low, high = max(spent, projected - spread), projected + spread
    text = f"{format_gpu_hours(projected)} GPU-hours projected for {steps} steps"
    if low is not None and high is not None:
        text += f" ({format_gpu_hours(low)}-{format_gpu_hours(high)})"
    text += (
        f", from {run} steps run: {format_gpu_hours(spent)} spent, {format_gpu_hours(per_step)} a step, "
        f"{left} steps left"
    )
    if left > 0 and low is None:
        text += " (no spread: the trainer has not reported how its steps vary)"
    amount = None
    if bill is not None and spent > 0:
        amount = bill.storage + (bill.gpu + bill.calls) * projected / spent
        text += f"; about {format_amount(amount, bill.currency)} at the platform's prices"
    return ForecastStatus(
        amount=significant(amount) if amount is not None else None,
        currency=bill.currency if amount is not None and bill is not None else None,
        basis=MEASURED,
        gpu_hours=significant(projected),
        gpu_hours_low=significant(low) if low is not None else None,
        gpu_hours_high=significant(high) if high is not None else None,
        from_steps=run,
        at_step=done,
        message=text,
        **base,
    )


def _from_spec(
    base: dict[str, Any], training: int, generation: int, steps: int, run: int | None
) -> ForecastStatus:
    counted = max(training, generation)
    text = (
        f"{training + generation} GPUs counted ({training} training + {generation} generation) for {steps} "
        f"steps; GPU-hours are projected once {MIN_MEASURED_STEPS} steps have run (no time per step is assumed "
        f"before: it ranges from seconds to many minutes). An hour of training counts at most {counted} "
        "GPU-hours (generation and training take turns)."
    )
    return ForecastStatus(basis=SPEC, from_steps=run or 0, message=text, **base)


def settled(old: Any, new: ForecastStatus) -> dict[str, Any]:
    """What status.forecast holds after this pass: ``old`` (as stored) while ``new`` says the same to within
    REWRITE_SHARE, so the forecast is not rewritten on every step; ``new`` otherwise."""
    fresh = new.model_dump(by_alias=True, exclude_none=True, mode="json")
    if not isinstance(old, dict):
        return fresh
    # The status is written as a JSON merge patch: a key the new forecast lacks (the spread at the last step)
    # is removed only by naming it with null.
    fresh.update({key: None for key in old if key not in fresh})
    try:
        previous = ForecastStatus.model_validate(old)
    except ValidationError:
        return fresh
    shape = ("basis", "gpus", "training_gpus", "generation_gpus", "steps", "currency")
    if any(getattr(previous, key) != getattr(new, key) for key in shape):
        return fresh
    if new.basis == SPEC:
        return old if previous.message == new.message else fresh
    if (previous.gpu_hours_low is None) != (new.gpu_hours_low is None):
        return fresh
    if new.at_step is not None and new.at_step >= new.steps and previous.at_step != new.at_step:
        return fresh  # the last step: the final figure, exactly
    before, now = previous.gpu_hours, new.gpu_hours
    if before is None or now is None or abs(now - before) > REWRITE_SHARE * max(before, 1e-9):
        return fresh
    return old
