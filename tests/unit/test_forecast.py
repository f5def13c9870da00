"""status.forecast (issue 49, the forecast in GPU-hours): from the spec before the first steps (GPU counts, no
time per step assumed), from the measured GPU-hours per step run after, with restarts' redone steps counted
as run; written only when it moves by more than 5 %; hostile status figures never crash it. The trainer's
side (status.cost.steps and stepGpuSecondsStd) is tested on CostLedger."""

from __future__ import annotations

import math
from typing import Any

import pytest
from grpo_operator.api.forecast import MEASURED, SPEC, ForecastStatus, forecast, settled, significant
from grpo_operator.builders import job_from_object
from grpo_trainer.cost import CostLedger

from tests.unit.reconcile_world import job_object, running_world

pytestmark = pytest.mark.unit


def spec(**changes: Any) -> Any:
    return job_from_object(job_object(**changes)).spec


def measured(
    step: int, spent_hours: float, steps_run: int | None = None, std: float | None = None
) -> dict[str, Any]:
    cost: dict[str, Any] = {
        "generationGpuSeconds": spent_hours * 1800,
        "trainingGpuSeconds": spent_hours * 1800,
    }
    if steps_run is not None:
        cost["steps"] = steps_run
    if std is not None:
        cost["stepGpuSecondsStd"] = std
    return {"progress": {"step": step, "totalSteps": 500}, "cost": cost}


def test_before_the_first_steps_the_forecast_gives_the_gpus_and_assumes_no_step_time() -> None:
    result = forecast(spec(), {})
    assert result.basis == SPEC and result.gpu_hours is None
    # 2 nodes x 2 GPUs train; one vLLM pod of 1 GPU generates.
    assert (result.gpus, result.training_gpus, result.generation_gpus, result.steps) == (5, 4, 1, 500)
    assert result.message is not None
    assert "projected once 2 steps have run" in result.message and "at most 4 GPU-hours" in result.message
    one_step = forecast(spec(), measured(step=1, spent_hours=0.1, steps_run=1))
    assert one_step.basis == SPEC, "one step carries the warm-up: not yet a measurement"


def test_colocated_generation_counts_the_trainer_gpus_only() -> None:
    result = forecast(spec(generation={"mode": "Colocate"}), {})
    assert (result.gpus, result.training_gpus, result.generation_gpus) == (4, 4, 0)


def test_after_steps_the_projection_is_spent_plus_the_cost_per_step_run_times_the_steps_left() -> None:
    result = forecast(spec(), measured(step=50, spent_hours=2.0, steps_run=50))
    assert result.basis == MEASURED and result.from_steps == 50 and result.at_step == 50
    assert result.gpu_hours == pytest.approx(2.0 + 0.04 * 450)  # 20
    assert result.gpu_hours_low is None and result.gpu_hours_high is None
    assert result.message is not None and "20 GPU-hours projected for 500 steps" in result.message
    assert "no spread" in result.message


def test_the_spread_comes_from_the_measured_variation_of_the_steps() -> None:
    # 0.04 GPU-hours = 144 GPU-seconds a step, sd 36 GPU-seconds; 450 steps left, 50 run.
    result = forecast(spec(), measured(step=50, spent_hours=2.0, steps_run=50, std=36))
    spread = 36 / 3600 * math.sqrt(450 + 450**2 / 50)
    assert result.gpu_hours_low == pytest.approx(significant(20 - spread))
    assert result.gpu_hours_high == pytest.approx(significant(20 + spread))
    assert (
        result.message is not None
        and "(19.33-20.67), from 50 steps run: 2 spent, 0.04 a step, 450 steps left" in result.message
    )
    few = forecast(spec(), measured(step=3, spent_hours=0.12, steps_run=3, std=36))
    assert few.gpu_hours_high is not None and few.gpu_hours is not None
    assert result.gpu_hours_high is not None
    assert few.gpu_hours_high - few.gpu_hours > 2 * (result.gpu_hours_high - 20), "fewer steps, less sure"


def test_restarts_that_redid_steps_count_them_as_run_not_as_dearer_steps() -> None:
    # 60 steps run in all, 10 of them redone after a restart from step 40's checkpoint: progress is at 50.
    redone = forecast(spec(), measured(step=50, spent_hours=2.4, steps_run=60))
    assert redone.gpu_hours == pytest.approx(2.4 + 0.04 * 450), "0.04 per step, as without the restart"
    # An older trainer that does not report cost.steps: progress.step stands in, and the steps look dearer.
    old_trainer = forecast(spec(), measured(step=50, spent_hours=2.4))
    assert old_trainer.gpu_hours == pytest.approx(2.4 + 0.048 * 450)
    assert old_trainer.gpu_hours > redone.gpu_hours  # type: ignore[operator]


def test_a_finished_run_projects_what_it_spent() -> None:
    result = forecast(spec(), measured(step=500, spent_hours=21.0, steps_run=510, std=40))
    assert result.gpu_hours == 21.0 and result.gpu_hours_low is None


@pytest.mark.parametrize(
    "cost, progress",
    [
        ({"generationGpuSeconds": float("nan"), "trainingGpuSeconds": -5, "steps": 10}, {"step": 10}),
        ({"generationGpuSeconds": "lots", "trainingGpuSeconds": True, "steps": "10"}, {"step": "x"}),
        ({"generationGpuSeconds": 1e308, "trainingGpuSeconds": 1e308, "steps": 2}, {"step": 2}),
        ({"generationGpuSeconds": 100, "trainingGpuSeconds": 100, "steps": -3}, {"step": -1}),
        ({"generationGpuSeconds": 100, "stepGpuSecondsStd": float("inf"), "steps": 9}, {"step": 10**30}),
        ("not a cost", ["not", "progress"]),
    ],
)
def test_hostile_status_figures_never_crash_and_never_make_a_non_finite_forecast(
    cost: Any, progress: Any
) -> None:
    result = forecast(spec(), {"cost": cost, "progress": progress})
    dumped = result.model_dump(by_alias=True, exclude_none=True, mode="json")
    for key in ("gpuHours", "gpuHoursLow", "gpuHoursHigh"):
        assert key not in dumped or (math.isfinite(dumped[key]) and dumped[key] >= 0)
    ForecastStatus.model_validate(dumped)


def test_settled_keeps_the_stored_forecast_while_it_moves_less_than_five_percent() -> None:
    first = settled(None, forecast(spec(), measured(step=50, spent_hours=2.0, steps_run=50)))
    nudged = forecast(spec(), measured(step=51, spent_hours=2.05, steps_run=51))  # 20.09: +0.5 %
    assert settled(first, nudged) is first
    moved = forecast(spec(), measured(step=60, spent_hours=2.7, steps_run=60))  # 22.95: +15 %
    assert settled(first, moved)["gpuHours"] == moved.gpu_hours
    last = forecast(spec(), measured(step=500, spent_hours=20.1, steps_run=500))
    assert settled(first, last)["gpuHours"] == 20.1, "the last step writes the final figure"
    spread = settled(None, forecast(spec(), measured(step=499, spent_hours=20.0, steps_run=499, std=30)))
    final = settled(spread, last)
    assert final["gpuHoursLow"] is None and final["gpuHoursHigh"] is None, (
        "null: the merge patch removes them"
    )
    assert settled({"basis": "Spec", "gpus": "five"}, nudged)["basis"] == MEASURED, "a forged one is replaced"
    before = settled(None, forecast(spec(), {}))
    assert settled(before, forecast(spec(), measured(step=1, spent_hours=0.1, steps_run=1))) is before


def test_the_operator_writes_the_forecast_at_apply_and_not_on_every_step() -> None:
    world = running_world()
    stored = world.status()["forecast"]
    assert stored["basis"] == "Spec" and stored["gpus"] == 5 and "gpuHours" not in stored
    world.job["status"].update(measured(step=50, spent_hours=2.0, steps_run=50))
    plan = world.step()
    assert plan.status is not None and plan.status["forecast"]["gpuHours"] == 20
    world.job["status"].update(measured(step=51, spent_hours=2.04, steps_run=51))
    assert world.reconcile().is_empty(), "a step that moves the forecast by 0.1 % writes nothing"


def test_the_ledger_counts_steps_over_attempts_and_their_spread_without_the_warm_up() -> None:
    ledger = CostLedger(trainer_gpus=2, generation_gpus=1, rollouts_planned=100, metric_calls_planned=100)
    ledger.add_step(8, 8, generation_seconds=100.0, other_seconds=100.0)  # warm-up: 300 GPU-seconds
    for generation in (10.0, 12.0, 14.0):
        ledger.add_step(8, 8, generation_seconds=generation, other_seconds=10.0)
    cost = ledger.status()["cost"]
    assert cost["steps"] == 4
    assert cost["stepGpuSecondsStd"] == pytest.approx(2.0)  # 30, 32, 34
    resumed = CostLedger(trainer_gpus=2, generation_gpus=1, rollouts_planned=100, metric_calls_planned=100)
    resumed.resume(cost)
    resumed.add_step(8, 8, generation_seconds=10.0, other_seconds=10.0)
    after = resumed.status()["cost"]
    assert after["steps"] == 5, "steps count over attempts, as the GPU-seconds do"
    assert "stepGpuSecondsStd" not in after, "the spread is the new attempt's own, from its third step"
