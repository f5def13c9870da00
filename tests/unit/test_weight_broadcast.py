"""spec.generation.weightSync: Broadcast: one process group of trainer rank 0 and every worker of every vLLM
replica, the default for several replicas. What the API accepts and refuses, the vLLM args and trainer.json
it renders, the NetworkPolicies that let the group form, and reconcile: a lost replica is replaced alone and
a failed trainer is replaced beside the running servers, as under Volume."""

from __future__ import annotations

import json
from typing import Any

import pydantic
import pytest
from grpo_operator.api import GRPOJob, TrainerConfig
from grpo_operator.builders import gang_pods, infrastructure, job_from_object
from grpo_operator.builders.network import generation_network_policy, trainer_network_policy
from grpo_operator.builders.trainer_configmap import trainer_config_text

from tests.unit.manifests import with_changes
from tests.unit.reconcile_world import CKPT, SETTINGS, job_object, running_world
from tests.unit.test_pod_security import restricted_violations

pytestmark = pytest.mark.unit

TRAINERS = {"podSelector": {"matchLabels": {"grpo.dev/job": "math", "grpo.dev/role": "trainer"}}}
SERVERS = {"podSelector": {"matchLabels": {"grpo.dev/job": "math", "grpo.dev/role": "generation"}}}


def job(**generation: Any) -> Any:
    return job_from_object(job_object(generation=generation))


def vllm_args(pod: dict[str, Any]) -> list[str]:
    return list(pod["spec"]["containers"][0]["args"])


def transfer_config(pod: dict[str, Any]) -> str | None:
    args = vllm_args(pod)
    flag = "--weight-transfer-config"
    return args[args.index(flag) + 1] if flag in args else None


# --- the API ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("generation", "transport"),
    [
        ({}, "NCCL"),
        ({"replicas": 1}, "NCCL"),
        ({"replicas": 2}, "Broadcast"),
        ({"replicas": 2, "weightSync": "Broadcast"}, "Broadcast"),
        ({"weightSync": "Broadcast"}, "Broadcast"),
        ({"replicas": 3, "weightSync": "Volume"}, "Volume"),
        ({"mode": "Colocate"}, None),
    ],
)
def test_the_effective_transport(generation: dict[str, Any], transport: str | None) -> None:
    assert job(**generation).spec.generation.weight_transport() == transport


def test_broadcast_needs_no_read_write_many_volume() -> None:
    # The Volume rule stays Volume's: Broadcast sends over the network, not through the volume.
    rwo = {"spec.checkpoints": {"volume": {"accessMode": "ReadWriteOnce"}}, "spec.trainer.nodes": 1}
    for generation in (
        {"replicas": 4},
        {"replicas": 4, "weightSync": "Broadcast"},
        {"weightSync": "Broadcast"},
    ):
        GRPOJob.model_validate(with_changes({**rwo, "spec.generation": generation}))
    with pytest.raises(pydantic.ValidationError, match="weightSync: Broadcast, which needs no shared volume"):
        GRPOJob.model_validate(with_changes({**rwo, "spec.generation.weightSync": "Volume"}))


def test_colocated_generation_still_refuses_broadcast() -> None:
    with pytest.raises(pydantic.ValidationError, match="mode: Colocate runs one vLLM engine"):
        GRPOJob.model_validate(
            with_changes({"spec.generation": {"mode": "Colocate", "weightSync": "Broadcast"}})
        )


def test_an_unknown_transport_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match="'NCCL', 'Volume' or 'Broadcast'"):
        GRPOJob.model_validate(with_changes({"spec.generation.weightSync": "Gloo"}))


# --- builders ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("generation", "config"),
    [
        ({}, '{"backend":"nccl"}'),
        ({"replicas": 2}, '{"backend":"grpo-broadcast"}'),
        ({"weightSync": "Broadcast"}, '{"backend":"grpo-broadcast"}'),
        ({"replicas": 2, "weightSync": "Volume"}, None),
    ],
)
def test_vllm_starts_with_the_transports_weight_transfer_engine(
    generation: dict[str, Any], config: str | None
) -> None:
    servers = [p for p in gang_pods(job(**generation), SETTINGS, 1, "") if "-gen" in p["metadata"]["name"]]
    assert servers
    for pod in servers:
        assert transfer_config(pod) == config
        # The weight routes are vLLM's dev-mode routes, whichever transport uses them.
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env["VLLM_SERVER_DEV_MODE"] == "1"


def test_broadcast_vllm_pods_mount_no_volume_for_the_weights_and_stay_restricted() -> None:
    rwo = job_from_object(
        job_object(
            generation={"replicas": 2},
            checkpoints={"volume": {"accessMode": "ReadWriteOnce"}},
            trainer={"nodes": 1},
        )
    )
    for pod in gang_pods(rwo, SETTINGS, 1, ""):
        assert restricted_violations(pod["spec"]) == [], pod["metadata"]["name"]
        if "-gen" in pod["metadata"]["name"]:
            claims = [v for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v]
            assert claims == [], "a ReadWriteOnce volume is the trainers' alone"


@pytest.mark.parametrize("replicas", [1, 3])
def test_trainer_json_names_every_server_for_broadcast_one_server_too(replicas: int) -> None:
    generation: dict[str, Any] = {"weightSync": "Broadcast"} if replicas == 1 else {"replicas": replicas}
    config = TrainerConfig.model_validate_json(trainer_config_text(job(**generation), SETTINGS))
    assert config.generation.weight_sync == "broadcast"
    assert config.generation.weight_sync_dir is None
    assert config.generation.weight_sync_port == SETTINGS.weight_sync_port == 51216
    hosts = ["math-gen.ns.svc", "math-gen-r1.ns.svc", "math-gen-r2.ns.svc"][:replicas]
    assert config.generation.server_urls == [f"http://{host}:8000" for host in hosts]
    assert (config.generation.server_host, config.generation.server_port) == ("math-gen.ns.svc", 8000)


def test_trainer_json_of_one_nccl_server_is_unchanged() -> None:
    body = json.loads(trainer_config_text(job(), SETTINGS))
    assert "weightSync" not in body["generation"] and "serverUrls" not in body["generation"]


def test_the_network_policies_let_the_broadcast_group_form_within_the_job_only() -> None:
    two = job(replicas=2)
    # vLLM pods accept the job's trainers and the job's other vLLM pods, on every port (gloo and NCCL
    # connect every pair of group members on ephemeral ports); nobody else.
    assert generation_network_policy(two, SETTINGS)["spec"]["ingress"] == [{"from": [TRAINERS, SERVERS]}]
    # Trainers already accept the job's vLLM pods on every port: the store on weightSyncPort and the rest.
    assert trainer_network_policy(two, SETTINGS)["spec"]["ingress"][0] == {"from": [SERVERS, TRAINERS]}
    policies = [m for m in infrastructure(two, SETTINGS) if m["kind"] == "NetworkPolicy"]
    for policy in policies:
        for rule in policy["spec"]["ingress"]:
            for peer in rule["from"]:
                assert "namespaceSelector" not in peer and "ipBlock" not in peer
    # The other transports keep vLLM closed to vLLM.
    for other in (job(), job(replicas=2, weightSync="Volume")):
        assert generation_network_policy(other, SETTINGS)["spec"]["ingress"] == [{"from": [TRAINERS]}]


# --- reconcile --------------------------------------------------------------------------------------------


def test_a_lost_broadcast_replica_is_replaced_alone_and_the_trainers_keep_running() -> None:
    world = running_world(generation={"replicas": 2})
    world.terminate("math-gen-r1-1-0", 1, "RuntimeError: broadcast group lost", phase="Failed")
    plan = world.step()
    assert [m["metadata"]["name"] for m in plan.creates] == ["math-gen-r1-1-1"]
    assert plan.deletes == [] and plan.restart is None
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Running", "GenerationReplaced")
    assert status.get("restarts", 0) == 0 and status["trainerAttempt"] == 1
    (replacement,) = plan.creates
    assert transfer_config(replacement) == '{"backend":"grpo-broadcast"}'


def test_a_failed_trainer_is_replaced_beside_the_running_broadcast_servers() -> None:
    world = running_world(generation={"replicas": 2})
    world.job["status"]["progress"] = {"step": 5, "totalSteps": 500}
    world.job["status"]["checkpoint"] = {"lastStep": 5, "path": CKPT}
    world.terminate("math-trainer-1-0", 1, "RuntimeError: CUDA error")
    deleted = {r.name for r in world.step().deletes}
    assert deleted == {"math-trainer-1-0", "math-trainer-1-1"}, "the vLLM replicas keep running"
    status = world.status()
    assert (status["trainerAttempt"], status["generationAttempt"], status["restarts"]) == (2, 1, 1)
    world.gone()
    world.settle()
    assert {p["metadata"]["name"] for p in world.pods("generation")} == {"math-gen-1-0", "math-gen-r1-1-0"}
    assert {p["metadata"]["name"] for p in world.pods("trainer")} == {"math-trainer-2-0", "math-trainer-2-1"}
