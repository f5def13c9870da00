"""spec.generation.replicas: several vLLM servers per job. Their names, labels and Services, the rule that
they refuse the NCCL weight transport (Broadcast, the default for them, is in test_weight_broadcast.py), the
GPUs they count for, trainer.json's serverUrls, and reconcile: the gang waits for every replica, and a
failed replica is replaced (and counted) on its own."""

from __future__ import annotations

import json
from typing import Any

import pydantic
import pytest
from grpo_operator.api import GRPOJob, TrainerConfig
from grpo_operator.api.workloads import GenerationSpec
from grpo_operator.builders import gang_pods, infrastructure, job_from_object
from grpo_operator.builders.common import (
    KUEUE_GROUP_COUNT_ANNOTATION,
    LABEL_GENERATION_REPLICA,
    generation_pod_name,
    generation_service_name,
)
from grpo_operator.builders.trainer_configmap import trainer_config_text
from grpo_operator.kubectl_plugin import cli
from grpo_operator.kubectl_plugin.arguments import parser
from grpo_operator.reconcile.children import gang_pod_labels, generation_pod_position
from grpo_operator.reconcile.platform_policy import platform_violations, total_gpus
from grpo_operator.settings import OperatorSettings

from tests.harness.generation_ports import replica_of, rewrite_generation
from tests.unit.manifests import with_changes
from tests.unit.reconcile_world import SETTINGS, World, events, job_object, running_world

TWO = {"replicas": 2, "weightSync": "Volume"}


def job(**generation: Any) -> Any:
    return job_from_object(job_object(generation=generation))


def names(manifests: list[dict[str, Any]], kind: str | None = None) -> list[str]:
    return [m["metadata"]["name"] for m in manifests if kind is None or m["kind"] == kind]


# --- builders ---------------------------------------------------------------------------------------------


def test_each_replica_has_its_pod_and_service_and_replica_zero_keeps_todays_names() -> None:
    three = job(replicas=3, weightSync="Volume")
    pods = gang_pods(three, SETTINGS, 2, "", {1: 4})
    assert names(pods) == [
        "math-gen-2-0",
        "math-gen-r1-2-4",
        "math-gen-r2-2-0",
        "math-trainer-2-0",
        "math-trainer-2-1",
    ]
    assert [p["metadata"]["labels"][LABEL_GENERATION_REPLICA] for p in pods[:3]] == ["0", "1", "2"]
    services = {m["metadata"]["name"]: m for m in infrastructure(three, SETTINGS) if m["kind"] == "Service"}
    for replica, name in enumerate(["math-gen", "math-gen-r1", "math-gen-r2"]):
        assert services[name]["spec"]["selector"] == {
            "grpo.dev/job": "math",
            "grpo.dev/role": "generation",
            LABEL_GENERATION_REPLICA: str(replica),
        }
        # Each Service selects its replica's pod and no other.
        selected = [
            p for p in pods if services[name]["spec"]["selector"].items() <= p["metadata"]["labels"].items()
        ]
        assert names(selected) == [names(pods)[replica]]


def test_each_replica_samples_with_a_seed_of_its_own() -> None:
    pods = gang_pods(job(replicas=3, weightSync="Volume"), SETTINGS, 1, "", {})
    seeds = []
    for pod in pods[:3]:
        args = pod["spec"]["containers"][0]["args"]
        seeds.append(int(args[args.index("--seed") + 1]))
    # Replica 0 keeps the job's seed (spec.grpo.seed, 42 unless set), the others follow it.
    assert seeds == [42, 43, 44]


def test_one_server_builds_exactly_what_it_built_before_replicas() -> None:
    unset, one = job(), job(replicas=1)
    assert infrastructure(unset, SETTINGS) == infrastructure(one, SETTINGS)
    assert gang_pods(unset, SETTINGS, 1, "") == gang_pods(one, SETTINGS, 1, "")
    (service,) = [
        m
        for m in infrastructure(unset, SETTINGS)
        if m["kind"] == "Service" and m["metadata"]["name"] == "math-gen"
    ]
    # The selector a running job's Service has always had: no replica label (its pods may have none).
    assert service["spec"]["selector"] == {"grpo.dev/job": "math", "grpo.dev/role": "generation"}
    assert names(infrastructure(unset, SETTINGS), "Service") == ["math-trainer", "math-gen", "math-metric"]
    assert names(gang_pods(unset, SETTINGS, 3, "", {0: 2}))[0] == "math-gen-3-2"
    assert "serverUrls" not in trainer_config_text(unset, SETTINGS)


def test_trainer_json_names_every_replicas_service_in_order() -> None:
    config = TrainerConfig.model_validate_json(
        trainer_config_text(job(replicas=3, weightSync="Volume"), SETTINGS)
    )
    assert config.generation.server_urls == [
        "http://math-gen.ns.svc:8000",
        "http://math-gen-r1.ns.svc:8000",
        "http://math-gen-r2.ns.svc:8000",
    ]
    assert (config.generation.server_host, config.generation.server_port) == ("math-gen.ns.svc", 8000)
    assert '"serverUrls"' in trainer_config_text(job(**TWO), SETTINGS)
    # A hand-written trainer.json with several servers and NCCL is refused, not served by one server alone.
    body = json.loads(trainer_config_text(job(**TWO), SETTINGS))
    body["generation"].pop("weightSync")
    with pytest.raises(
        pydantic.ValidationError,
        match=r"serverUrls \(several vLLM servers\) needs generation\.weightSync volume or broadcast",
    ):
        TrainerConfig.model_validate(body)


def test_kueue_admits_every_vllm_pod_with_the_trainers() -> None:
    queued = job_from_object(job_object(generation=TWO, scheduling={"queueName": "q"}))
    pods = gang_pods(queued, SETTINGS, 1, "")
    assert len(pods) == 4
    assert {p["metadata"]["annotations"][KUEUE_GROUP_COUNT_ANNOTATION] for p in pods} == {"4"}


def test_the_network_policy_of_vllm_covers_every_replica() -> None:
    two = job(**TWO)
    (policy,) = [
        m
        for m in infrastructure(two, SETTINGS)
        if m["kind"] == "NetworkPolicy" and "gen" in m["metadata"]["name"]
    ]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    generation = [
        p for p in gang_pods(two, SETTINGS, 1, "") if p["metadata"]["labels"]["grpo.dev/role"] == "generation"
    ]
    assert len(generation) == 2
    assert all(selector.items() <= p["metadata"]["labels"].items() for p in generation)


def test_names_fit_kubernetes_limits_with_the_most_replicas_and_the_longest_job_name() -> None:
    obj = job_object(generation={"replicas": 16, "weightSync": "Volume"})
    obj["metadata"]["name"] = "a" * 40
    longest = job_from_object(obj)
    for child in [*infrastructure(longest, SETTINGS), *gang_pods(longest, SETTINGS, 99999, "", {15: 3})]:
        assert len(child["metadata"]["name"]) <= 63, child["metadata"]["name"]
    assert generation_service_name(longest, 15) == "a" * 40 + "-gen-r15"
    assert len(generation_pod_name(longest, 99999, 3, 15)) <= 63


def test_pod_names_parse_back_to_their_replica_attempt_and_number() -> None:
    assert generation_pod_position("math", "math-gen-3-2") == (0, 3, 2)
    assert generation_pod_position("math", "math-gen-r12-3-2") == (12, 3, 2)
    for other in ("math-gen-r0-1-0", "math-trainer-1-0", "math-gen-r1-1", "mathx-gen-1-0", "math-gen-rx-1-0"):
        assert generation_pod_position("math", other) is None, other
    assert gang_pod_labels("math", "math-gen-r2-1-0") == {
        "app.kubernetes.io/managed-by": "grpo-operator",
        "grpo.dev/job": "math",
        "grpo.dev/role": "generation",
        "grpo.dev/attempt": "1",
        LABEL_GENERATION_REPLICA: "2",
    }


# --- the API ----------------------------------------------------------------------------------------------


def test_several_replicas_refuse_the_nccl_transport() -> None:
    changes: dict[str, Any] = {"spec.generation.replicas": 2, "spec.generation.weightSync": "NCCL"}
    with pytest.raises(pydantic.ValidationError) as info:
        GRPOJob.model_validate(with_changes(changes))
    (error,) = info.value.errors()
    message = error["msg"].removeprefix("Value error, ")
    assert message == GenerationSpec.Rules.several_replicas_refuse_nccl.message
    assert "reaches one vLLM server only" in message
    assert (
        "Remove weightSync" in message
        and "weightSync: Broadcast" in message
        and "weightSync: Volume" in message
    )


def test_replicas_bounds_and_what_is_accepted() -> None:
    rwx = {"spec.checkpoints": {"volume": {"accessMode": "ReadWriteMany"}}}
    for replicas in (0, 17):
        with pytest.raises(pydantic.ValidationError, match="replicas"):
            GRPOJob.model_validate(
                with_changes(
                    {**rwx, "spec.generation.replicas": replicas, "spec.generation.weightSync": "Volume"}
                )
            )
    ok = GRPOJob.model_validate(
        with_changes({**rwx, "spec.generation.replicas": 16, "spec.generation.weightSync": "Volume"})
    )
    assert ok.spec.generation.replica_count() == 16
    assert GRPOJob.model_validate(with_changes({"spec.generation.replicas": 1})).spec.generation.replicas == 1
    assert GRPOJob.model_validate(with_changes({})).spec.generation.replica_count() == 1


# --- platform limits --------------------------------------------------------------------------------------


def test_the_gpu_limit_counts_every_replica() -> None:
    spec = job_from_object(
        job_object(generation={"replicas": 3, "weightSync": "Volume", "gpus": 2, "tensorParallelSize": 2})
    ).spec
    assert total_gpus(spec) == 3 * 2 + 2 * 2
    (message,) = platform_violations(spec, OperatorSettings(max_gpus_per_job=8))
    assert message == (
        "the job requests 10 GPUs (spec.generation.replicas 3 x spec.generation.gpus 2 + spec.trainer.nodes 2 x "
        "spec.trainer.gpusPerNode 2), more than the platform limit platformPolicy.maxGpusPerJob: 8: request at "
        "most 8"
    )
    assert platform_violations(spec, OperatorSettings(max_gpus_per_job=10)) == []


# --- reconcile --------------------------------------------------------------------------------------------


def start(world: World, ready: set[str]) -> None:
    """Every pod scheduled and running; only the named vLLM pods (and the trainers) Ready."""
    world.run_all()
    for pod in world.pods("generation"):
        if pod["metadata"]["name"] not in ready:
            pod["status"]["conditions"] = [c for c in pod["status"]["conditions"] if c["type"] != "Ready"]


def test_a_new_gang_runs_once_every_replica_is_ready() -> None:
    world = World(job_object(generation=TWO))
    plan = world.step()
    assert {"math-gen-1-0", "math-gen-r1-1-0"} <= set(names(plan.creates))
    assert {"math-gen", "math-gen-r1"} <= set(names(plan.applies, "Service"))
    assert "2 vLLM pods (1 GPU each)" in world.status()["message"] or any(
        "2 vLLM pods (1 GPU each)" in e.message for e in plan.events
    )
    world.settle()
    start(world, {"math-gen-1-0"})
    world.step()
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Initializing", "WaitingForGeneration"), status["message"]
    assert "math-gen-r1-1-0" in status["message"]
    start(world, {"math-gen-1-0", "math-gen-r1-1-0"})
    plan = world.step()
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Running", "AllPodsRunning")
    assert status["message"] == "gang attempt 1 is running: 2 vLLM pods and 2 trainer pod(s)"


def test_a_failed_replica_is_replaced_alone_and_the_others_are_left_as_they_are() -> None:
    world = running_world(generation={**TWO, "startupTimeoutSeconds": 900})
    replica0 = dict(world.pod("math-gen-1-0"))
    world.terminate("math-gen-r1-1-0", 1, "RuntimeError: Engine core initialization failed", phase="Failed")
    plan = world.step()
    assert names(plan.creates) == ["math-gen-r1-1-1"]
    assert plan.deletes == [] and plan.restart is None
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Running", "GenerationReplaced")
    assert status.get("restarts", 0) == 0 and status["trainerAttempt"] == 1
    (event,) = [e for e in plan.events if e.reason == "GenerationReplaced"]
    assert event.message.startswith("vLLM replica 1: generation pod math-gen-r1-1-0 failed: exit code 1")
    assert (
        "replaced by vLLM pod math-gen-r1-1-1 (replacement 1 of 3 of replica 1 in gang attempt 1"
        in event.message
    )
    assert world.pod("math-gen-1-0") == replica0
    assert world.pod("math-gen-r1-1-1")["metadata"]["labels"][LABEL_GENERATION_REPLICA] == "1"

    world.advance(125)
    world.step()
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Running", "GenerationReplaced")
    assert "vLLM replica 1 pod math-gen-r1-1-1 replaces a failed one" in status["message"]
    assert "(2m of 15m)" in status["message"]

    world.run_all()
    plan = world.step()
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Running", "AllPodsRunning")
    assert "vLLM replica 1 pod math-gen-r1-1-1 replaced a failed one" in status["message"]
    assert ("Normal", "Running") in events(plan)
    assert world.reconcile().is_empty()


def fail_and_replace(world: World, name: str) -> Any:
    world.terminate(name, 1, "boom", phase="Failed")
    plan = world.step()
    world.run_all()
    world.step()
    return plan


def test_each_replica_counts_its_own_replacements_and_a_fourth_failure_restarts_the_gang() -> None:
    world = running_world(generation=TWO)
    for n in range(3):
        plan = fail_and_replace(world, f"math-gen-r1-1-{n}")
        assert names(plan.creates) == [f"math-gen-r1-1-{n + 1}"]
    assert world.status()["restarts"] == 0
    # Replica 0 has replaced nothing yet: its first failure is replaced alone.
    plan = fail_and_replace(world, "math-gen-1-0")
    assert names(plan.creates) == ["math-gen-1-1"]
    assert (world.status()["phase"], world.status()["reason"]) == ("Running", "AllPodsRunning")
    # Replica 1's fourth failure in the attempt restarts the whole gang, counted.
    world.terminate("math-gen-r1-1-3", 1, "boom", phase="Failed")
    plan = world.step()
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Restarting", "GenerationFailed")
    assert status["restarts"] == 1 and plan.restart is not None
    assert "math-gen-r1-1-4" not in names(plan.creates)
    assert "math-trainer-1-0" in [r.name for r in plan.deletes]


def test_a_replicas_replacement_that_never_gets_ready_restarts_the_gang() -> None:
    world = running_world(generation={**TWO, "startupTimeoutSeconds": 600})
    world.terminate("math-gen-r1-1-0", 1, "boom", phase="Failed")
    world.step()
    world.advance(601)
    world.step()
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Restarting", "GenerationStartupTimeout")
    assert (
        "vLLM replica 1 pod math-gen-r1-1-1, which replaced a failed one, did not become Ready"
        in status["message"]
    )


def test_a_trainer_failure_restarts_the_trainers_beside_every_running_replica() -> None:
    world = running_world(generation=TWO)
    world.terminate("math-trainer-1-1", 1, "NCCL timeout")
    plan = world.step()
    assert world.status()["phase"] == "Restarting"
    assert {r.name for r in plan.deletes} == {"math-trainer-1-0", "math-trainer-1-1"}, "the replicas are kept"
    world.gone()
    world.settle()
    assert set(names(world.pods("generation"))) == {"math-gen-1-0", "math-gen-r1-1-0"}
    assert set(names(world.pods("trainer"))) == {"math-trainer-2-0", "math-trainer-2-1"}


def test_a_replica_zero_pod_without_the_replica_label_is_the_jobs_own() -> None:
    # vLLM pods made before spec.generation.replicas existed carry no replica label: not a stray.
    world = running_world()
    del world.pod("math-gen-1-0")["metadata"]["labels"][LABEL_GENERATION_REPLICA]
    assert world.reconcile().is_empty()
    # A replica label someone changed is: the pod is deleted and the gang built again.
    world = running_world(generation=TWO)
    world.pod("math-gen-r1-1-0")["metadata"]["labels"][LABEL_GENERATION_REPLICA] = "0"
    plan = world.step()
    assert "math-gen-r1-1-0" in [r.name for r in plan.deletes]
    assert ("Warning", "ChildDrifted") in events(plan)


# --- kubectl grpo logs and the local runner ---------------------------------------------------------------


def pod(name: str, attempt: int, replica: str | None) -> dict[str, Any]:
    labels = {"grpo.dev/attempt": str(attempt)}
    if replica is not None:
        labels[LABEL_GENERATION_REPLICA] = replica
    return {"metadata": {"name": name, "labels": labels}}


def test_logs_pick_the_replicas_vllm_pod() -> None:
    pods = [pod("j-gen-1-0", 1, None), pod("j-gen-r1-1-0", 1, "1"), pod("j-gen-r1-1-1", 1, "1")]
    assert cli.pick_pod(pods, "generation", 0)["metadata"]["name"] == "j-gen-1-0"  # type: ignore[index]
    assert cli.pick_pod(pods, "generation", 0, replica=1)["metadata"]["name"] == "j-gen-r1-1-1"  # type: ignore[index]
    assert cli.pick_pod(pods, "generation", 1, replica=1)["metadata"]["name"] == "j-gen-r1-1-0"  # type: ignore[index]
    assert cli.pick_pod(pods, "generation", 0, replica=2) is None
    args = parser().parse_args(["logs", "j", "--role", "generation", "--replica", "1"])
    assert args.replica == 1


def test_the_local_runner_points_each_replica_at_its_own_port() -> None:
    ports = {"0": 4100, "1": 4101}
    generation = {
        "serverHost": "math-gen.ns.svc",
        "serverPort": 8000,
        "serverUrls": ["http://math-gen.ns.svc:8000", "http://math-gen-r1.ns.svc:8000"],
    }
    rewrite_generation(generation, ports.__getitem__)
    assert generation == {
        "serverHost": "127.0.0.1",
        "serverPort": 4100,
        "serverUrls": ["http://127.0.0.1:4100", "http://127.0.0.1:4101"],
    }
    single = {"serverHost": "math-gen.ns.svc", "serverPort": 8000}
    rewrite_generation(single, ports.__getitem__)
    assert single == {"serverHost": "127.0.0.1", "serverPort": 4100}
    assert replica_of(pod("j-gen-r1-1-0", 1, "1")) == "1" and replica_of(pod("j-gen-1-0", 1, None)) == "0"
