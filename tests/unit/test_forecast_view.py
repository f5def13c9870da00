"""`kubectl grpo status`'s GPU-hours line: spent against projected and the budget, from a status the
tenant's trainer can write, so every figure is hostile: NaN, negative, huge, text, wrong types."""

from __future__ import annotations

from typing import Any

import pytest
from grpo_operator.kubectl_plugin import render
from grpo_operator.kubectl_plugin.forecast_view import budget_of, gpu_hours_lines, hours, spend_lines

MEASURED = {
    "basis": "Measured",
    "gpus": 5,
    "trainingGpus": 4,
    "generationGpus": 1,
    "steps": 500,
    "gpuHours": 20,
    "gpuHoursLow": 19.3,
    "gpuHoursHigh": 20.7,
    "fromSteps": 50,
}
COST = {"generationGpuSeconds": 3600.0, "trainingGpuSeconds": 3600.0}


def text(status: dict[str, Any], budget: Any = None) -> str:
    report: dict[str, Any] = {"name": "j", "namespace": "ns", "status": status}
    if budget is not None:
        report["budgetGpuHours"] = budget
    return render.status_text(report)


def test_status_shows_spent_against_projected_and_the_budget() -> None:
    out = text({"cost": COST, "forecast": MEASURED}, budget=25)
    assert (
        "GPU-hours       2 spent of 20 projected (19.3-20.7, from 50 steps run); budget 25 (8 % spent)" in out
    )
    assert "WARNING" not in out


def test_a_projection_above_the_budget_is_a_warning() -> None:
    lines = gpu_hours_lines({"cost": COST, "forecast": MEASURED}, 10)
    assert lines[1].strip().startswith("WARNING: projected above the budget: the job will be suspended at 10")


def test_before_the_first_steps_it_says_when_the_projection_comes() -> None:
    forecast = {"basis": "Spec", "gpus": 5, "trainingGpus": 4, "generationGpus": 1, "steps": 500}
    assert gpu_hours_lines({"forecast": forecast}) == [
        "GPU-hours       none spent yet, projected once the first steps have run; 5 GPUs counted "
        "(4 training + 1 generation)"
    ]
    assert gpu_hours_lines({}) == [], "an older operator's job without a forecast or a spend: no line"


@pytest.mark.parametrize(
    "hostile",
    [
        float("nan"),
        float("inf"),
        -3,
        1e300,
        "20\x1b[2J",
        True,
        None,
        ["x"],
        {"a": 1},
        10**400,
    ],
)
def test_hostile_figures_render_as_a_dash_or_in_three_digits_and_never_crash(hostile: Any) -> None:
    forecast = {key: hostile for key in MEASURED} | {"basis": "Measured"}
    cost = {"generationGpuSeconds": hostile, "trainingGpuSeconds": hostile}
    for status in ({"cost": cost, "forecast": forecast}, {"cost": hostile, "forecast": hostile}):
        out = text(status, budget=hostile)
        for line in out.splitlines():
            assert "\x1b" not in line and len(line) < 300
    assert len(hours(hostile)) <= 9


def test_budget_of_reads_the_spec_defensively() -> None:
    assert budget_of({"spec": {"budget": {"gpuHours": 12.5}}}) == 12.5
    for spec in (
        {},
        {"budget": None},
        {"budget": "x"},
        {"budget": {"gpuHours": "12"}},
        {"budget": {"gpuHours": -1}},
    ):
        assert budget_of({"spec": spec}) is None


def test_the_cost_line_shows_spent_projected_and_the_budget_in_the_platforms_currency() -> None:
    status = {
        "spend": {"currency": "USD", "amount": 131.62, "prices": "2.5 USD a GPU-hour (nvidia.com/gpu)"},
        "forecast": {"amount": 1320, "currency": "USD"},
    }
    assert spend_lines(status, 500) == [
        "Cost            131.62 USD spent of 1,320.00 USD projected; budget 500.00 USD (26 % spent)",
        "                at 2.5 USD a GPU-hour (nvidia.com/gpu)",
    ]
    assert spend_lines({}) == [], "no prices: no cost line"
    hostile = {"spend": {"currency": "\x1b[31mUSD", "amount": 5}}
    assert spend_lines(hostile) == [], "a currency that is not a plain name is not printed"
    forged = {"spend": {"currency": "USD", "amount": "lots", "prices": "x\x1b[2J"}}
    assert spend_lines(forged) == []
    odd = {"spend": {"currency": "USD", "amount": 1, "prices": "x\x1b[2J"}}
    assert spend_lines(odd) == ["Cost            1.00 USD spent"]
