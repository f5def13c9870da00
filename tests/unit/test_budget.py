"""spec.budget (issue 49, the cap): a job that has spent its GPU-hours is suspended, never failed, and raising the
budget resumes it from its last checkpoint; a Warning event once at warnAtPercent; spec.suspend keeps working
and its words win. The spend is what trainer rank 0 reports in status.cost, played here by writing it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from grpo_operator.api.budget import format_gpu_hours, spent_gpu_hours
from grpo_operator.builders import gang_hash, job_from_object
from grpo_operator.builders.trainer_configmap import trainer_config_text
from grpo_operator.settings import OperatorSettings

from tests.unit.manifests import with_changes
from tests.unit.reconcile_world import CKPT, World, env, events, job_object, running_world
from tests.unit.test_api_manifests import pydantic_errors

GANG = {"math-gen-1-0", "math-trainer-1-0", "math-trainer-1-1"}


def report_cost(world: World, generation_hours: float, training_hours: float) -> None:
    """What trainer rank 0 writes after a step: the GPU-seconds so far, by role."""
    world.job["status"]["cost"] = {
        "rollouts": 64,
        "generationGpuSeconds": generation_hours * 3600,
        "trainingGpuSeconds": training_hours * 3600,
    }


def budgeted(gpu_hours: float = 10, **budget: Any) -> World:
    world = running_world(budget={"gpuHours": gpu_hours, **budget})
    world.job["status"]["checkpoint"] = {"lastStep": 50, "path": CKPT}
    return world


def exhausted() -> World:
    world = budgeted(10)
    report_cost(world, 6, 4.5)
    world.step()
    assert world.status()["reason"] == "BudgetExhausted"
    return world


def test_spending_the_budget_suspends_the_job_with_the_figures_and_what_to_do() -> None:
    world = budgeted(10)
    report_cost(world, 6, 4.5)
    plan = world.step()
    status = world.status()
    assert status["phase"] == "Suspended" and status["reason"] == "BudgetExhausted"
    assert "spent 10.5 of its 10 GPU-hours (spec.budget.gpuHours)" in status["message"]
    assert "Raise spec.budget.gpuHours above 10.5 (or remove spec.budget)" in status["message"]
    assert world.condition("Suspended")["reason"] == "BudgetExhausted"
    assert world.condition("WithinBudget")["status"] == "False"
    assert {r.name for r in plan.deletes} == GANG | {"math-metric"}, "pods stopped, as spec.suspend does"
    assert ("PersistentVolumeClaim", "math-ckpt") in world.objects
    assert status["checkpoint"]["path"] == CKPT and status["restarts"] == 0
    assert "Failed" not in {c["type"] for c in status["conditions"]}
    exhausted_events = [e for e in plan.events if e.reason == "BudgetExhausted"]
    assert [e.type for e in exhausted_events] == ["Warning"]
    assert "10.5 of its 10 GPU-hours" in exhausted_events[0].message
    assert world.reconcile().is_empty(), "suspended once: no pass after it posts or writes again"


def test_under_the_warning_share_nothing_changes_and_a_new_cost_report_writes_nothing() -> None:
    world = budgeted(10)
    report_cost(world, 3, 2)
    plan = world.step()
    assert world.status()["phase"] == "Running"
    assert not plan.deletes and not plan.creates and plan.events == []
    assert world.condition("WithinBudget")["reason"] == "UnderBudget"
    report_cost(world, 4, 3.9)
    assert world.reconcile().is_empty(), "every step's cost report would otherwise cost a status write"


def test_the_warning_is_posted_once_when_the_spend_crosses_warn_at_percent() -> None:
    world = budgeted(10, warnAtPercent=75)
    report_cost(world, 4, 3.4)  # 74 %
    assert world.step().events == []
    report_cost(world, 4, 3.6)  # 76 %
    plan = world.step()
    assert events(plan) == [("Warning", "BudgetNearlySpent")]
    assert "spent 7.6 of its 10 GPU-hours (spec.budget.gpuHours), 76 %" in plan.events[0].message
    assert world.condition("WithinBudget")["reason"] == "BudgetNearlySpent"
    assert world.status()["phase"] == "Running", "a warning, not a suspension"
    for hours in (8, 9, 9.9):
        report_cost(world, hours, 0)
        assert world.step().events == [], "the warning is not repeated on later passes"


def test_the_cap_holds_for_any_spend_at_or_over_it() -> None:
    world = budgeted(2.5)
    report_cost(world, 2.5, 0)
    world.step()
    assert world.status()["reason"] == "BudgetExhausted"


@pytest.mark.parametrize("change", [{"gpuHours": 20}, None], ids=["raised", "removed"])
def test_raising_or_removing_the_budget_resumes_from_the_last_checkpoint(
    change: dict[str, Any] | None,
) -> None:
    world = exhausted()
    world.job["spec"]["budget"] = change
    if change is None:
        del world.job["spec"]["budget"]
    plan = world.step()
    status = world.status()
    assert status["phase"] == "Pending"
    assert status["trainerAttempt"] == 2 and status["restarts"] == 0, "a budget stop is not a failure"
    assert world.condition("Suspended")["reason"] == "Resumed"
    trainers = [m for m in plan.creates if "trainer" in m["metadata"]["name"]]
    assert [env(p)["RESUME_FROM"] for p in trainers] == [CKPT, CKPT]
    resumed = next(e for e in plan.events if e.reason == "Resumed")
    cause = (
        "spec.budget.gpuHours (20) is above the 10.5 GPU-hours spent" if change else "spec.budget was removed"
    )
    assert resumed.message.startswith(cause)
    assert ("Normal", "ResumedFromCheckpoint") in events(plan)
    if change is None:
        assert "WithinBudget" not in {c["type"] for c in status["conditions"]}
    world.run_all()
    world.settle()
    assert world.status()["phase"] == "Running"


def test_a_raise_that_stays_under_the_spend_keeps_the_job_suspended() -> None:
    world = exhausted()
    world.job["spec"]["budget"] = {"gpuHours": 10.4}
    plan = world.step()
    assert world.status()["phase"] == "Suspended" and not plan.creates
    assert "spent 10.5 of its 10.4 GPU-hours" in world.status()["message"]
    assert plan.events == [], "the same suspension, with its figures brought up to date"


def test_spec_suspend_keeps_working_and_its_words_win() -> None:
    world = exhausted()
    world.job["spec"]["suspend"] = True
    plan = world.step()
    status = world.status()
    assert status["phase"] == "Suspended" and status["reason"] == "Suspended"
    assert status["message"].startswith("spec.suspend is true")
    assert "also spent 10.5 of its 10 GPU-hours" in status["message"]
    assert events(plan) == [("Normal", "Suspended")]
    # spec.suspend back to false does not resume a job whose budget is spent: the budget says why.
    world.job["spec"]["suspend"] = False
    plan = world.step()
    assert world.status()["phase"] == "Suspended" and world.status()["reason"] == "BudgetExhausted"
    assert events(plan) == [("Warning", "BudgetExhausted")] and not plan.creates
    # A job the user suspended, then given a budget it has already spent, stays suspended by the user's words.
    world = running_world()
    world.job["spec"]["suspend"] = True
    world.step()
    report_cost(world, 1, 1)
    world.job["spec"]["budget"] = {"gpuHours": 1}
    plan = world.step()
    assert world.status()["reason"] == "Suspended" and "spec.budget.gpuHours" in world.status()["message"]
    assert events(plan) == []
    world.job["spec"]["budget"] = {"gpuHours": 3}
    world.job["spec"]["suspend"] = False
    plan = world.step()
    assert next(e for e in plan.events if e.reason == "Resumed").message.startswith("spec.suspend is false")


def test_changing_the_budget_of_a_running_job_restarts_nothing() -> None:
    base = job_from_object(job_object())
    job = job_from_object(job_object(budget={"gpuHours": 100, "warnAtPercent": 50}))
    assert gang_hash(job) == gang_hash(base)
    settings = OperatorSettings()
    assert trainer_config_text(job, settings) == trainer_config_text(base, settings)
    world = budgeted(10)
    world.job["spec"]["budget"] = {"gpuHours": 40}
    world.job["metadata"]["generation"] = 2
    plan = world.step()
    assert not plan.deletes and not plan.creates and world.status()["phase"] == "Running"


def test_the_spend_is_read_from_the_trainers_report_defensively() -> None:
    assert spent_gpu_hours({"generationGpuSeconds": 5400, "trainingGpuSeconds": 1800.0}) == 2.0
    assert spent_gpu_hours({"generationGpuSeconds": 3600, "trainingGpuSeconds": "lots"}) == 1.0
    assert spent_gpu_hours({"generationGpuSeconds": True, "trainingGpuSeconds": -7200}) is None
    assert spent_gpu_hours({"rollouts": 5}) is None and spent_gpu_hours("free") is None
    assert [format_gpu_hours(h) for h in (10.0, 10.5, 1234.567, 0.0125, 0)] == [
        "10",
        "10.5",
        "1234.57",
        "0.0125",
        "0",
    ]
    # Garbage in status.cost neither crashes a pass nor suspends the job.
    world = budgeted(1)
    world.job["status"]["cost"] = {"generationGpuSeconds": "1e9", "trainingGpuSeconds": None}
    world.step()
    assert world.status()["phase"] == "Running"


# --- apply-time validation ------------------------------------------------------------------------------------


def test_a_budget_without_a_limit_is_refused_with_what_to_set() -> None:
    errors = pydantic_errors(with_changes({"spec.budget": {"warnAtPercent": 90}}))
    assert errors == [
        "spec.budget.gpuHours: spec.budget sets no limit: set spec.budget.gpuHours (the GPU-hours the job may "
        "spend before the operator suspends it) or spec.budget.amount (the most it may cost), or remove "
        "spec.budget"
    ]


@pytest.mark.parametrize(
    ("budget", "field", "words"),
    [
        ({"gpuHours": 0}, "spec.budget.gpuHours", "greater than 0"),
        ({"gpuHours": 10, "warnAtPercent": 120}, "spec.budget.warnAtPercent", "less than or equal to 100"),
        ({"gpuHours": 10, "warnAtPercent": 0}, "spec.budget.warnAtPercent", "greater than or equal to 1"),
    ],
)
def test_budget_bounds_name_the_field_and_the_bound(budget: dict[str, Any], field: str, words: str) -> None:
    errors = pydantic_errors(with_changes({"spec.budget": budget}))
    assert len(errors) == 1 and errors[0].startswith(f"{field}: ") and words in errors[0], errors


def test_the_crd_documents_the_budget_and_defaults_the_warning() -> None:
    from grpo_operator.api.crd import build_crd

    spec = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    budget = spec["properties"]["budget"]
    assert budget["properties"]["warnAtPercent"]["default"] == 80
    assert budget["properties"]["gpuHours"]["exclusiveMinimum"] is True
    rules = json.dumps(budget["x-kubernetes-validations"])
    assert "has(self.gpuHours)" in rules and "spec.budget sets no limit" in rules
