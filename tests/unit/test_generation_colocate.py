"""spec.generation.mode: Colocate: vLLM inside the trainer processes. The job renders no vLLM pod, Service
or NetworkPolicy, trainer.json tells the trainer to start the engine itself, the GPUs it counts are the
trainers' alone, the rules refuse what cannot work in one process, and reconcile runs the gang without
waiting for a generation pod."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest
from grpo_operator.api import GRPOJob, TrainerConfig
from grpo_operator.api.spec import GRPOJobSpec, check_immutable
from grpo_operator.builders import gang_pods, infrastructure, job_from_object
from grpo_operator.builders.common import KUEUE_GROUP_COUNT_ANNOTATION
from grpo_operator.builders.trainer_configmap import trainer_config_text
from grpo_operator.reconcile.platform_policy import platform_violations, total_gpus
from grpo_operator.settings import OperatorSettings

from tests.unit.manifests import base_manifest, with_changes
from tests.unit.reconcile_world import SETTINGS, World, job_object, running_world

COLOCATE = {"mode": "Colocate"}


def job(**generation: Any) -> Any:
    return job_from_object(job_object(generation=generation))


def names(manifests: list[dict[str, Any]], kind: str | None = None) -> list[str]:
    return [m["metadata"]["name"] for m in manifests if kind is None or m["kind"] == kind]


def test_a_colocated_job_has_trainer_pods_and_no_vllm_pod_service_or_policy() -> None:
    colocated = job(**COLOCATE)
    assert names(gang_pods(colocated, SETTINGS, 1, "")) == ["math-trainer-1-0", "math-trainer-1-1"]
    children = infrastructure(colocated, SETTINGS)
    assert names(children, "Service") == ["math-trainer", "math-metric"]
    policies = {m["metadata"]["name"]: m for m in children if m["kind"] == "NetworkPolicy"}
    assert sorted(policies) == ["math-metric", "math-trainer"]
    # Only the trainers (and scrapers) reach the trainers: no generation peer is left open.
    peers = policies["math-trainer"]["spec"]["ingress"][0]["from"]
    assert peers == [{"podSelector": {"matchLabels": {"grpo.dev/job": "math", "grpo.dev/role": "trainer"}}}]
    # Mode Server renders what it rendered before the mode existed.
    assert infrastructure(job(), SETTINGS) == infrastructure(job(mode="Server"), SETTINGS)


def test_trainer_json_starts_the_engine_in_the_trainer_with_its_memory_share() -> None:
    config = TrainerConfig.model_validate_json(trainer_config_text(job(**COLOCATE), SETTINGS))
    gen = config.generation
    assert gen.backend == "vllm-colocate"
    assert gen.server_host is None and gen.server_urls is None and gen.weight_sync is None
    # Unset: TRL's own default share of each GPU.
    assert gen.colocate_memory_share == 0.3 and gen.max_model_len is None
    shared = job(mode="Colocate", colocateMemoryShare=0.45, maxModelLen=2048)
    gen = TrainerConfig.model_validate_json(trainer_config_text(shared, SETTINGS)).generation
    assert (gen.colocate_memory_share, gen.max_model_len) == (0.45, 2048)
    # A server job's trainer.json is as before: no colocate keys.
    assert "colocateMemoryShare" not in trainer_config_text(job(), SETTINGS)
    assert "maxModelLen" not in trainer_config_text(job(), SETTINGS)


def test_a_hand_written_trainer_json_with_colocate_knobs_on_a_server_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match=r"need generation\.backend: vllm-colocate"):
        TrainerConfig.model_validate_json(
            trainer_config_text(job(), SETTINGS).replace('"backend": "vllm-server"', '"maxModelLen": 64')
        )


def test_generation_adds_no_gpus_and_kueue_admits_the_trainers_alone() -> None:
    spec = job(**COLOCATE).spec
    assert total_gpus(spec) == 2 * 2
    (message,) = platform_violations(spec, OperatorSettings(max_gpus_per_job=3))
    assert (
        "spec.trainer.nodes 2 x spec.trainer.gpusPerNode 2 (spec.generation.mode: Colocate, no vLLM pod)"
        in (message)
    )
    queued = job_from_object(job_object(generation=COLOCATE, scheduling={"queueName": "q"}))
    pods = gang_pods(queued, SETTINGS, 1, "")
    assert {p["metadata"]["annotations"][KUEUE_GROUP_COUNT_ANNOTATION] for p in pods} == {"2"}


@pytest.mark.parametrize(
    ("generation", "rule"),
    [
        (
            {"replicas": 2, "weightSync": "Volume"},
            "replicas, weightSync, gpus and tensorParallelSize",
        ),
        ({"weightSync": "NCCL"}, "replicas, weightSync, gpus and tensorParallelSize"),
        ({"gpus": 2, "tensorParallelSize": 2}, "replicas, weightSync, gpus and tensorParallelSize"),
    ],
)
def test_server_settings_are_refused_in_colocate_mode(generation: dict[str, Any], rule: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=rule):
        GRPOJob.model_validate(with_changes({"spec.generation": {**COLOCATE, **generation}}))


def test_the_memory_share_needs_colocate_and_is_a_fraction() -> None:
    with pytest.raises(
        pydantic.ValidationError, match=r"colocateMemoryShare .* needs spec\.generation\.mode"
    ):
        GRPOJob.model_validate(with_changes({"spec.generation.colocateMemoryShare": 0.4}))
    for share in (0.0, 1.0):
        with pytest.raises(pydantic.ValidationError):
            GRPOJob.model_validate(
                with_changes({"spec.generation": {**COLOCATE, "colocateMemoryShare": share}})
            )


def test_colocate_needs_no_shared_volume_for_a_model_on_the_volume() -> None:
    # Without a vLLM pod on another node, a ReadWriteOnce volume is enough for a model stored on it.
    on_volume = {
        "spec.model.name": "/workspace/models/base",
        "spec.checkpoints.volume.accessMode": "ReadWriteOnce",
    }
    with pytest.raises(pydantic.ValidationError, match="vLLM pod can mount only when it is ReadWriteMany"):
        GRPOJob.model_validate(with_changes(on_volume))
    GRPOJob.model_validate(with_changes({**on_volume, "spec.generation": COLOCATE}))


def test_the_mode_cannot_change_while_the_job_exists() -> None:
    old = GRPOJobSpec.model_validate(base_manifest()["spec"])
    new = GRPOJobSpec.model_validate(with_changes({"spec.generation": COLOCATE})["spec"])
    (error,) = check_immutable(old, new)
    assert error.startswith("spec.generation.mode is immutable")
    explicit = GRPOJobSpec.model_validate(with_changes({"spec.generation.mode": "Server"})["spec"])
    assert check_immutable(old, explicit) == []


def test_a_colocated_gang_runs_without_waiting_for_generation() -> None:
    world = World(job_object(generation=COLOCATE))
    plan = world.step()
    assert names(plan.creates, "Pod") == ["math-trainer-1-0", "math-trainer-1-1"]
    assert any(
        "no vLLM pod (generation colocated in the trainer processes)" in e.message for e in plan.events
    )
    world.settle()
    world.run_all()
    world.step()
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Running", "AllPodsRunning"), status["message"]
    assert (
        status["message"]
        == "gang attempt 1 is running: 2 trainer pod(s), generating with vLLM colocated in them"
    )


def test_a_failed_colocated_trainer_restarts_the_gang_counted() -> None:
    world = running_world(generation=COLOCATE)
    world.terminate("math-trainer-1-1", 1, "RuntimeError: Engine core initialization failed", phase="Failed")
    plan = world.step()
    assert plan.restart is not None
    world.settle()
    status = world.status()
    assert status["restarts"] == 1 and status["trainerAttempt"] == 2
    assert names(gang_pods(job(**COLOCATE), SETTINGS, 2, ""), "Pod") == [
        "math-trainer-2-0",
        "math-trainer-2-1",
    ]
