"""Prices, amounts and the platform's namespace budgets (issue 49, items 1, 3 and 4): what a GPU-hour of each
role costs and why, status.spend and the forecast's amount, a budget in money, the platform's default and
maximum budget per namespace, and the showback series the operator exports."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from grpo_operator.api.pricing import GpuRate, PriceTable, Showback, charges, job_rates
from grpo_operator.builders import job_from_object
from grpo_operator.observability import OperatorMetrics
from grpo_operator.settings import OperatorSettings, SettingsError

from tests.unit.reconcile_world import CKPT, T0, World, events, job_object
from tests.unit.test_operator_metrics import samples

pytestmark = pytest.mark.unit

PRICES: dict[str, Any] = {
    "currency": "USD",
    "gpuHour": {
        "default": 2.0,
        "resources": {"nvidia.com/gpu": 2.5, "nvidia.com/mig-3g.40gb": 1.0},
        "nodeLabels": {
            "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3": 4.0,
            "nvidia.com/gpu.product=NVIDIA-H200": 5.0,
            "pool=spot": 1.5,
        },
    },
    "metricCallsPerThousand": 0.5,
    "storageGbMonth": 0.1,
}
PRICED = OperatorSettings(prices=PRICES)


def spec(**changes: Any) -> Any:
    return job_from_object(job_object(**changes)).spec


def table() -> PriceTable:
    return PriceTable.model_validate(PRICES)


def test_a_gpu_hour_is_priced_by_the_label_the_job_selects_then_its_resource_then_the_default() -> None:
    plain = job_rates(spec(), table(), "nvidia.com/gpu", {})
    assert plain.gpu_hour == GpuRate(2.5, "nvidia.com/gpu")
    h100 = spec(scheduling={"gpuNodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}})
    rates = job_rates(h100, table(), "nvidia.com/gpu", {})
    assert rates.describe() == "4 USD a GPU-hour (node label nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3)"
    # The platform's own selector counts too, and of several priced labels the dearest wins.
    spot = spec(scheduling={"nodeSelector": {"pool": "spot"}})
    assert job_rates(spot, table(), "nvidia.com/gpu", {}).gpu_hour.price == 1.5
    h200 = {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert job_rates(spot, table(), "nvidia.com/gpu", h200).gpu_hour.price == 5.0
    # A platform handing out MIG slices under their own resource name prices that name.
    assert job_rates(spec(), table(), "nvidia.com/mig-3g.40gb", {}).gpu_hour.price == 1.0
    assert job_rates(spec(), table(), "amd.com/gpu", {}).gpu_hour == GpuRate(2.0, "default")


def test_the_use_is_priced_by_role_with_calls_and_the_claim_since_creation() -> None:
    rates = job_rates(
        spec(scheduling={"gpuNodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"}}),
        table(),
        "nvidia.com/gpu",
        {},
    )
    cost = {"trainingGpuSeconds": 7200, "generationGpuSeconds": 3600, "metricCalls": 4000, "rollouts": 4000}
    bill = charges(rates, cost, T0, T0 + timedelta(days=30))
    assert bill.gpu == pytest.approx(3 * 5.0)
    assert bill.calls == pytest.approx(4 * 0.5), "rollouts are priced only for environment jobs"
    assert bill.storage == pytest.approx(50 * 2**30 / 1e9 * 0.1), "50Gi for 30 days"
    assert bill.total == pytest.approx(15 + 2 + 5.36870912)
    hostile = charges(rates, {"trainingGpuSeconds": "lots", "metricCalls": -5, "rollouts": 1e400}, T0, T0)
    assert hostile.total == 0
    own_claim = job_rates(
        spec(checkpoints={"volume": {"existingClaim": "shared"}}), table(), "nvidia.com/gpu", {}
    )
    assert own_claim.storage_gb == 0, "a claim the operator did not create is not charged"


def priced_world(settings: OperatorSettings = PRICED, **spec_changes: Any) -> World:
    world = World(job_object(**spec_changes), settings=settings)
    world.settle()
    world.run_all()
    world.settle()
    world.job["status"]["checkpoint"] = {"lastStep": 50, "path": CKPT}
    return world


def report(world: World, hours: float, step: int = 10, calls: int = 0) -> None:
    world.job["status"]["cost"] = {
        "generationGpuSeconds": hours * 1800,
        "trainingGpuSeconds": hours * 1800,
        "metricCalls": calls,
        "steps": step,
    }
    world.job["status"]["progress"] = {"step": step, "totalSteps": 500}


def test_status_spend_follows_the_cost_and_is_rewritten_only_when_it_moves_by_a_percent() -> None:
    world = priced_world()
    report(world, 10)
    world.step()
    spend = world.status()["spend"]
    assert spend["currency"] == "USD" and spend["gpu"] == pytest.approx(25.0)
    assert spend["prices"] == "2.5 USD a GPU-hour (nvidia.com/gpu)"
    forecast = world.status()["forecast"]
    assert forecast["currency"] == "USD"
    assert forecast["amount"] == pytest.approx(25.0 * 50, rel=0.01), "500 steps at the cost of the first 10"
    assert "USD at the platform's prices" in forecast["message"]
    report(world, 10.05)  # +0.5 %
    assert world.reconcile().status is None, "a step that moves the amount by under 1 % writes nothing"
    report(world, 11)
    world.step()
    assert world.status()["spend"]["gpu"] == pytest.approx(27.5)


def test_without_prices_there_is_no_spend_and_a_money_budget_is_held_with_what_to_do() -> None:
    world = priced_world(OperatorSettings())
    report(world, 10)
    world.step()
    assert "spend" not in world.status() and "amount" not in world.status()["forecast"]
    held = World(job_object(budget={"amount": 100}))
    plan = held.step()
    assert not plan.creates and held.condition("PlatformPolicy")["status"] == "False"
    assert (
        "spec.budget.amount is set, but this platform sets no prices (Helm pricing)"
        in held.status()["message"]
    )


def test_a_budget_in_money_suspends_the_job_at_its_amount() -> None:
    world = priced_world(budget={"amount": 100, "warnAtPercent": 50})
    report(world, 24)  # 60 USD of GPU time and some storage
    plan = world.step()
    assert events(plan) == [("Warning", "BudgetNearlySpent")]
    assert "USD (spec.budget.amount)" in plan.events[0].message
    report(world, 40)  # 100 USD of GPU time alone
    world.step()
    status = world.status()
    assert status["phase"] == "Suspended" and status["reason"] == "BudgetExhausted"
    assert "of its 100 USD (spec.budget.amount), priced from status.cost" in status["message"]
    assert "Raise spec.budget.amount above" in status["message"]
    world.job["spec"]["budget"]["amount"] = 200
    world.step()
    assert world.condition("Suspended")["reason"] == "Resumed"


NAMESPACE_BUDGETS = {"ns": {"default": {"gpuHours": 10}, "maxGpuHours": 50}, "*": {"maxGpuHours": 5}}


def test_the_platforms_namespace_default_applies_to_jobs_without_a_budget_and_its_maximum_to_all() -> None:
    settings = OperatorSettings(namespace_budgets=NAMESPACE_BUDGETS)
    world = priced_world(settings)
    report(world, 10.5)
    world.step()
    status = world.status()
    assert status["reason"] == "BudgetExhausted"
    assert (
        "spent 10.5 of its 10 GPU-hours (the platform's default budget, Helm budgets.namespaces for "
        "namespace ns default.gpuHours)" in status["message"]
    )
    assert "Set spec.budget.gpuHours above 10.5" in status["message"]
    world.job["spec"]["budget"] = {"gpuHours": 20}
    world.step()
    assert world.condition("Suspended")["reason"] == "Resumed", "the job's own budget replaces the default"

    capped = priced_world(settings, budget={"gpuHours": 1000})
    report(capped, 50)
    capped.step()
    assert (
        "of its 50 GPU-hours (the platform's maximum, Helm budgets.namespaces" in capped.status()["message"]
    )
    assert "Only the platform team can raise" in capped.status()["message"]


def test_namespace_budgets_and_prices_are_checked_when_the_operator_starts() -> None:
    with pytest.raises(SettingsError, match=r"prices \(Helm pricing\) is not valid: .*default"):
        OperatorSettings(prices={"currency": "USD", "gpuHour": {}})
    with pytest.raises(SettingsError, match="limits an amount, but no prices are set"):
        OperatorSettings(namespace_budgets={"team-a": {"maxAmount": 100}})
    with pytest.raises(SettingsError, match="not key=value"):
        OperatorSettings(prices={"currency": "USD", "gpuHour": {"default": 1, "nodeLabels": {"h100": 4}}})
    with pytest.raises(SettingsError, match=r"budgets.namespaces\) is not valid"):
        OperatorSettings(namespace_budgets={"team-a": {"default": {"warnAtPercent": 50}}})


def test_the_showback_series_carry_the_spend_and_the_limits_per_job() -> None:
    showbacks = {
        ("team-a", "math"): Showback(7200, 3600, amount=12.5, currency="USD", budget_gpu_hours=10),
        ("team-b", "code"): Showback(60, 0),
    }
    metrics = OperatorMetrics(dict, lambda: showbacks)
    gpu = samples(metrics, "grpo_operator_job_gpu_seconds_total")
    assert gpu[(("grpojob", "math"), ("namespace", "team-a"), ("role", "training"))] == 7200
    assert gpu[(("grpojob", "code"), ("namespace", "team-b"), ("role", "generation"))] == 0
    assert samples(metrics, "grpo_operator_job_spend_total") == {
        (("currency", "USD"), ("grpojob", "math"), ("namespace", "team-a")): 12.5
    }
    assert samples(metrics, "grpo_operator_job_budget_gpu_seconds") == {
        (("grpojob", "math"), ("namespace", "team-a")): 36000
    }


def test_the_operator_remembers_each_jobs_showback_from_its_reconcile() -> None:
    world = priced_world(budget={"gpuHours": 100})
    report(world, 10)
    figures = world.step().showback
    assert figures is not None and figures.amount is not None
    assert (figures.training_gpu_seconds, figures.generation_gpu_seconds) == (18000, 18000)
    assert (figures.currency, figures.budget_gpu_hours, figures.budget_amount) == ("USD", 100, None)
    assert figures.amount == pytest.approx(25.0, abs=0.01), "GPU time, and seconds of claim storage"
