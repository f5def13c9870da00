"""status.cost: the plan from the spec, the use so far across gang attempts, GPU-seconds by role."""

from __future__ import annotations

from typing import Any, Literal

import pytest
from grpo_operator.api.spec import GRPOJobSpec
from grpo_operator.api.trainer_config import TrainerConfig
from grpo_trainer.cost import CostLedger

from tests.unit.manifests import with_changes


def config_for(
    changes: dict[str, Any], backend: Literal["vllm-server", "transformers"] = "vllm-server"
) -> TrainerConfig:
    spec = GRPOJobSpec.model_validate(with_changes(changes)["spec"])
    return TrainerConfig.from_spec(
        "ns",
        "job",
        None,
        spec,
        metric_url="http://job-metric:8080",
        generation_host="job-gen",
        backend=backend,
    )


CHANGES = {
    "spec.grpo.steps": 10,
    "spec.grpo.promptsPerStep": 4,
    "spec.grpo.groupSize": 8,
    "spec.generation.gpus": 2,
    "spec.generation.tensorParallelSize": 2,
}


def test_the_plan_and_the_gpu_counts_come_from_the_job() -> None:
    job = {"spec": {"generation": {"gpus": 2}}}
    ledger = CostLedger.plan(config_for(CHANGES), world_size=4, validation_prompts=0, job=job)
    assert (ledger.rollouts_planned, ledger.metric_calls_planned) == (320, 320)
    assert (ledger.trainer_gpus, ledger.generation_gpus) == (4, 2)
    ledger.add_step(rollouts=32, metric_calls=32, generation_seconds=10.0, other_seconds=5.0)
    ledger.add_validation(metric_calls=8, generation_seconds=1.5)
    assert ledger.status() == {
        "cost": {
            "rollouts": 32,
            "rolloutsPlanned": 320,
            "metricCalls": 40,
            "metricCallsPlanned": 320,
            "generationGpuSeconds": 23.0,
            "trainingGpuSeconds": 20.0,
            "steps": 1,
        }
    }


def test_validation_runs_every_n_steps_and_after_the_last_one_are_planned() -> None:
    changes = {
        **CHANGES,
        "spec.dataset.validation": "file:///v.jsonl",
        "spec.grpo.validation": {"everySteps": 4},
    }
    ledger = CostLedger.plan(config_for(changes), world_size=1, validation_prompts=8, job=None)
    # Runs after steps 4, 8 and 10.
    assert ledger.metric_calls_planned == 320 + 3 * 8


def test_in_process_generation_runs_on_the_trainer_gpus() -> None:
    ledger = CostLedger.plan(
        config_for(CHANGES, backend="transformers"), 3, 0, {"spec": {"generation": {"gpus": 8}}}
    )
    assert ledger.generation_gpus == 3


def test_every_vllm_replica_counts_its_gpus_for_generation() -> None:
    job = {"spec": {"generation": {"gpus": 2, "replicas": 3}}}
    ledger = CostLedger.plan(config_for(CHANGES), 1, 0, job)
    ledger.add_step(32, 32, 1.5, 1.0)
    assert ledger.generation_gpus == 6
    assert ledger.status()["cost"]["generationGpuSeconds"] == 9.0
    malformed = {"spec": {"generation": {"gpus": 2, "replicas": "two"}}}
    assert CostLedger.plan(config_for(CHANGES), 1, 0, malformed).generation_gpus == 2


@pytest.mark.parametrize(
    "previous",
    [
        {"rollouts": 96, "metricCalls": 100, "generationGpuSeconds": 12.5, "trainingGpuSeconds": 7},
        {"rollouts": 96, "metricCalls": 100, "generationGpuSeconds": 12.5, "trainingGpuSeconds": 7, "x": "y"},
    ],
)
def test_a_new_attempt_continues_the_reported_totals(previous: dict[str, Any]) -> None:
    ledger = CostLedger.plan(config_for(CHANGES), 1, 0, {"status": {"cost": previous}})
    ledger.add_step(32, 32, 1.0, 1.0)
    cost = ledger.status()["cost"]
    assert (cost["rollouts"], cost["metricCalls"]) == (128, 132)
    assert (cost["generationGpuSeconds"], cost["trainingGpuSeconds"]) == (13.5, 8.0)


def test_malformed_totals_and_gpu_counts_are_ignored() -> None:
    job = {
        "spec": {"generation": {"gpus": "many"}},
        "status": {"cost": {"rollouts": -5, "metricCalls": True, "generationGpuSeconds": float("inf")}},
    }
    ledger = CostLedger.plan(config_for(CHANGES), 1, 0, job)
    assert ledger.generation_gpus == 1
    assert (ledger.rollouts, ledger.metric_calls, ledger.generation_gpu_seconds) == (0, 0, 0.0)
    assert CostLedger.plan(config_for(CHANGES), 1, 0, {"status": {"cost": "nonsense"}}).rollouts == 0
