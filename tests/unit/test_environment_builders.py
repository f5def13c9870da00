"""spec.environment on the operator's side: the API rules that refuse what is not built yet, the environment
server's Deployment, Service and NetworkPolicy `<job>-env`, the trainer.json block that points the trainer at
it, the EnvironmentReady condition, the platform limits, and that a job without spec.environment is as it
was."""

from __future__ import annotations

import json
from typing import Any

import pydantic
import pytest
from grpo_operator.api import GRPOJob
from grpo_operator.api.base import CelRule, RuleViolation
from grpo_operator.api.environment import EnvironmentClientConfig
from grpo_operator.api.spec import GRPOJobSpec
from grpo_operator.builders import Job, gang_hash, gang_pods, infrastructure, job_from_object, metric_workload
from grpo_operator.builders.environment import (
    environment_deployment,
    environment_network_policy,
    environment_service,
)
from grpo_operator.builders.gang import gang_hash_input
from grpo_operator.builders.trainer_configmap import trainer_config_text
from grpo_operator.reconcile.platform_policy import platform_violations, total_gpus
from grpo_operator.settings import OperatorSettings

from tests.unit.manifests import CLIENT, ENVIRONMENT, with_changes
from tests.unit.reconcile_world import World, events
from tests.unit.reconcile_world import job_object as world_job_object
from tests.unit.test_builders import job_object, make_job
from tests.unit.test_pod_security import restricted_violations

SETTINGS = OperatorSettings()
TRAINERS = {"podSelector": {"matchLabels": {"grpo.dev/job": "math", "grpo.dev/role": "trainer"}}}
IMAGE = "ghcr.io/example/echo-env:1.0"


def environment_object(make: Any = job_object, **environment: Any) -> dict[str, Any]:
    """A GRPOJob (of ``make``) whose episodes run against an environment server: no metric service."""
    obj: dict[str, Any] = make()
    del obj["spec"]["metric"]
    obj["spec"]["environment"] = {"image": IMAGE, **environment}
    return obj


def environment_job(**environment: Any) -> Job:
    return job_from_object(environment_object(**environment))


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(only)


# --- the API rules (the pydantic side; tests/integration/test_crd_validation.py asks the API server) ---------


def refusal(changes: dict[str, Any]) -> RuleViolation:
    with pytest.raises(pydantic.ValidationError) as info:
        GRPOJob.model_validate(with_changes(changes))
    (error,) = info.value.errors()
    cause = (error.get("ctx") or {}).get("error")
    assert isinstance(cause, RuleViolation)
    return cause


@pytest.mark.parametrize(
    ("changes", "rule", "words"),
    [
        (
            {**CLIENT, "spec.environment": {"image": IMAGE}},
            GRPOJobSpec.Rules.environment_not_with_client,
            "the client samples and scores its own rollouts",
        ),
        (
            {**ENVIRONMENT, "spec.generation.mode": "Colocate"},
            GRPOJobSpec.Rules.environment_not_colocated,
            "sampled from the job's vLLM server. Remove spec.generation.mode",
        ),
        (
            {**ENVIRONMENT, "spec.dataset": None},
            GRPOJobSpec.Rules.dataset_required,
            "resets spec.environment's episodes with",
        ),
    ],
    ids=[
        "client",
        "colocate",
        "no-dataset",
    ],
)
def test_what_is_not_built_yet_is_refused_with_what_to_do(
    changes: dict[str, Any], rule: CelRule, words: str
) -> None:
    cause = refusal(changes)
    assert cause.rule is rule
    assert words in str(cause)
    assert "spec." in rule.message and rule.field_path


def test_a_job_needs_a_reward_source_and_the_message_names_the_environment() -> None:
    cause = refusal({"spec.metric": None})
    assert cause.rule is GRPOJobSpec.Rules.metric_required
    assert "spec.environment.image" in str(cause) and "spec.rollouts.source: Client" in str(cause)
    assert "has(self.environment)" in GRPOJobSpec.Rules.metric_required.rule


def test_an_environment_job_is_valid_with_dynamic_sampling_set_or_by_the_dapo_preset() -> None:
    GRPOJob.model_validate(with_changes(ENVIRONMENT))
    GRPOJob.model_validate(with_changes({**ENVIRONMENT, "spec.grpo.dynamicSampling": True}))
    GRPOJob.model_validate(with_changes({**ENVIRONMENT, "spec.grpo.preset": "dapo"}))


# --- the manifests --------------------------------------------------------------------------------------------


def test_the_deployment_runs_the_image_on_its_named_port_with_a_health_probe() -> None:
    job = environment_job(
        port=8123,
        replicas=2,
        env=[{"name": "LEVEL", "value": "hard"}, {"name": "PORT", "value": "1"}],
        resources={"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "4Gi"}},
    )
    deployment = environment_deployment(job, SETTINGS)
    assert deployment["metadata"]["name"] == "math-env"
    assert deployment["metadata"]["labels"]["grpo.dev/role"] == "environment"
    assert deployment["metadata"]["ownerReferences"][0]["uid"] == "uid-1234"
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["selector"]["matchLabels"] == {
        "grpo.dev/job": "math",
        "grpo.dev/role": "environment",
    }
    main = container(deployment)
    assert main["image"] == IMAGE
    assert main["ports"] == [{"name": "http", "containerPort": 8123, "protocol": "TCP"}]
    env = {e["name"]: e["value"] for e in main["env"]}
    # The contract's port wins over a PORT the spec sets.
    assert (env["PORT"], env["LEVEL"]) == ("8123", "hard")
    assert main["resources"] == {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "4Gi"}}
    assert main["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert "livenessProbe" not in main


def test_requests_default_to_the_metric_pods() -> None:
    main = container(environment_deployment(environment_job(), SETTINGS))
    assert main["resources"] == {"requests": dict(SETTINGS.default_metric_requests)}


def test_the_runtime_class_is_the_specs_and_the_pod_is_restricted() -> None:
    pod = environment_deployment(environment_job(runtimeClassName="gvisor"), SETTINGS)["spec"]["template"][
        "spec"
    ]
    assert pod["runtimeClassName"] == "gvisor"
    assert pod["automountServiceAccountToken"] is False and pod["enableServiceLinks"] is False
    assert restricted_violations(pod) == []
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container({"spec": {"template": {"spec": pod}}})["securityContext"]["capabilities"] == {
        "drop": ["ALL"]
    }
    plain = environment_deployment(environment_job(), SETTINGS)["spec"]["template"]["spec"]
    assert "runtimeClassName" not in plain


def test_placement_and_pull_secrets_are_the_metric_pods() -> None:
    spec: dict[str, Any] = {
        "scheduling": {"nodeSelector": {"pool": "cpu"}, "gpuNodeSelector": {"gpu": "h100"}},
        "imagePullSecrets": [{"name": "team-registry"}],
    }
    settings = OperatorSettings(image_pull_secrets=("platform-registry",))
    metric_pod = metric_workload(make_job(**spec), settings)[0]["spec"]["template"]["spec"]
    obj = environment_object(lambda: job_object(**spec))
    env_pod = environment_deployment(job_from_object(obj), settings)["spec"]["template"]["spec"]
    for key in ("nodeSelector", "tolerations", "affinity", "priorityClassName", "imagePullSecrets"):
        assert env_pod.get(key) == metric_pod.get(key), key
    assert env_pod["nodeSelector"] == {"pool": "cpu"}, "GPU-only labels stay off the CPU pod"
    assert env_pod["imagePullSecrets"] == [{"name": "platform-registry"}, {"name": "team-registry"}]


def test_the_service_selects_the_environment_pods_on_the_port() -> None:
    service = environment_service(environment_job(port=9000))
    assert service["metadata"]["name"] == "math-env"
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"] == {"grpo.dev/job": "math", "grpo.dev/role": "environment"}
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 9000, "targetPort": "http", "protocol": "TCP"}
    ]


def test_the_network_policy_admits_the_trainers_only_and_denies_all_egress() -> None:
    policy = environment_network_policy(environment_job(port=9000))
    assert policy["metadata"]["name"] == "math-env"
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"] == {"grpo.dev/job": "math", "grpo.dev/role": "environment"}
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec["ingress"] == [{"from": [TRAINERS], "ports": [{"protocol": "TCP", "port": 9000}]}]
    assert spec["egress"] == []


def test_egress_cidrs_open_those_networks_and_dns_in_kube_system() -> None:
    cidrs = ["10.40.0.0/16", "2001:db8::/32"]
    spec = environment_network_policy(environment_job(egressCidrs=cidrs))["spec"]
    assert spec["egress"] == [
        {"to": [{"ipBlock": {"cidr": "10.40.0.0/16"}}, {"ipBlock": {"cidr": "2001:db8::/32"}}]},
        {
            "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}],
            "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
        },
    ]
    assert spec["ingress"][0]["from"] == [TRAINERS], "egress changes nothing of who gets in"


def test_an_environment_job_has_the_environment_server_and_no_metric_service() -> None:
    job = environment_job()
    children = [
        *infrastructure(job, SETTINGS),
        *metric_workload(job, SETTINGS),
        *gang_pods(job, SETTINGS, 1, ""),
    ]
    names = {(c["kind"], c["metadata"]["name"]) for c in children}
    assert {("Deployment", "math-env"), ("Service", "math-env"), ("NetworkPolicy", "math-env")} <= names
    assert not {n for n in names if n[1] == "math-metric"}
    assert [c["metadata"]["name"] for c in metric_workload(job, SETTINGS)] == ["math-env"]
    assert {n for n in names if n[0] in ("Service", "NetworkPolicy")} == {
        ("Service", "math-trainer"),
        ("Service", "math-gen"),
        ("Service", "math-env"),
        ("NetworkPolicy", "math-gen"),
        ("NetworkPolicy", "math-env"),
        ("NetworkPolicy", "math-trainer"),
    }


def test_a_job_with_an_environment_and_a_metric_runs_both_services_and_tells_the_trainer_both() -> None:
    """The environment runs the episode, the metric scores its final answer: each keeps its Deployment,
    Service and NetworkPolicy, and trainer.json carries both URLs."""
    obj = environment_object()
    obj["spec"]["metric"] = job_object()["spec"]["metric"]
    job = job_from_object(obj)
    children = [*infrastructure(job, SETTINGS), *metric_workload(job, SETTINGS)]
    names = {(c["kind"], c["metadata"]["name"]) for c in children}
    for name in ("math-env", "math-metric"):
        assert {("Deployment", name), ("Service", name), ("NetworkPolicy", name)} <= names, name
    config = json.loads(trainer_config_text(job, SETTINGS))
    assert config["metric"]["url"] == "http://math-metric.team-a.svc:8080"
    assert config["environment"]["url"] == "http://math-env.team-a.svc:8000"


# --- trainer.json -------------------------------------------------------------------------------------------


def test_trainer_json_points_the_trainer_at_the_environment_service() -> None:
    job = environment_job(port=8123, maxTurns=4, reward="Sum", actionFormat="ToolCall", timeoutSeconds=30)
    config = json.loads(trainer_config_text(job, SETTINGS))
    assert "metric" not in config and "rollouts" not in config
    block = config["environment"]
    assert block["url"] == "http://math-env.team-a.svc:8123"
    assert (block["maxTurns"], block["reward"], block["actionFormat"]) == (4, "Sum", "ToolCall")
    assert block["timeoutSeconds"] == 30.0
    parsed = EnvironmentClientConfig.model_validate(block)
    assert parsed == EnvironmentClientConfig.of(job.spec.environment, block["url"])  # type: ignore[arg-type]


def test_the_gang_restarts_for_what_the_trainer_reads_not_for_the_pod() -> None:
    base = environment_job()
    assert "environment" in gang_hash_input(base)
    assert gang_hash(environment_job(maxTurns=3)) != gang_hash(base)
    assert gang_hash(environment_job(port=9000)) != gang_hash(base)
    for pod_only in (
        {"image": "ghcr.io/example/echo-env:2.0"},
        {"replicas": 3},
        {"runtimeClassName": "gvisor"},
        {"egressCidrs": ["10.0.0.0/8"]},
        {"env": [{"name": "A", "value": "b"}]},
    ):
        assert gang_hash(environment_job(**pod_only)) == gang_hash(base), pod_only


def test_a_job_without_an_environment_is_as_it_was() -> None:
    job = make_job()
    config = json.loads(trainer_config_text(job, SETTINGS))
    assert "environment" not in config and config["metric"]["url"] == "http://math-metric.team-a.svc:8080"
    assert "environment" not in gang_hash_input(job)
    children = [*infrastructure(job, SETTINGS), *metric_workload(job, SETTINGS)]
    assert not [c for c in children if c["metadata"]["name"].endswith("-env")]
    assert all(c["metadata"]["labels"]["grpo.dev/role"] != "environment" for c in children)


# --- reconcile: readiness, suspend, platform limits -----------------------------------------------------------


def add_environment_pod(world: World, status: dict[str, Any]) -> None:
    name = "math-env-6b7c9d8f5-q2w3e"
    world.objects[("Pod", name)] = {
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"grpo.dev/job": "math", "grpo.dev/role": "environment"}},
        "spec": {"containers": [{"name": "environment"}]},
        "status": status,
    }


def test_environment_ready_says_whether_the_server_has_a_ready_pod() -> None:
    world = World(environment_object(world_job_object))
    world.settle()
    assert ("Deployment", "math-env") in world.objects and ("Deployment", "math-metric") not in world.objects
    world.run_all()
    world.settle()
    assert world.status()["phase"] == "Running"
    cond = world.condition("EnvironmentReady")
    assert (cond["status"], cond["reason"]) == ("False", "Starting")
    assert "/health" in cond["message"]
    assert all(c["type"] != "MetricReady" for c in world.status()["conditions"])
    world.objects[("Deployment", "math-env")]["status"] = {"availableReplicas": 1}
    world.step()
    cond = world.condition("EnvironmentReady")
    assert (cond["status"], cond["reason"]) == ("True", "Available")
    assert "1 of 1 environment pod(s) ready" in cond["message"] and "math-env" in cond["message"]


def test_a_stuck_environment_pod_is_named_with_its_image_and_a_warning() -> None:
    world = World(environment_object(world_job_object))
    world.settle()
    waiting = {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}}
    add_environment_pod(
        world, {"phase": "Pending", "containerStatuses": [{"name": "environment", "state": waiting}]}
    )
    plan = world.step()
    cond = world.condition("EnvironmentReady")
    assert (cond["status"], cond["reason"]) == ("False", "ImagePullBackOff")
    assert IMAGE in cond["message"] and "environment pod math-env-" in cond["message"]
    assert ("Warning", "EnvironmentNotReady") in events(plan)


def test_suspend_stops_the_environment_server_and_drops_its_condition() -> None:
    world = World(environment_object(world_job_object))
    world.settle()
    world.run_all()
    world.settle()
    assert world.condition("EnvironmentReady")
    world.job["spec"]["suspend"] = True
    world.settle()
    assert ("Deployment", "math-env") not in world.objects
    assert ("Service", "math-env") in world.objects and ("NetworkPolicy", "math-env") in world.objects
    assert all(c["type"] != "EnvironmentReady" for c in world.status()["conditions"])


def test_the_platform_limits_judge_the_environment_image_and_gpus() -> None:
    settings = OperatorSettings(
        allowed_image_prefixes=("ghcr.io/grpo-operator/",),
        vllm_image="ghcr.io/grpo-operator/vllm-openai:v0.31.0",
        max_gpus_per_job=4,
    )
    obj = environment_object(replicas=2, resources={"limits": {"nvidia.com/gpu": 1}})
    spec = job_from_object(obj).spec
    assert total_gpus(spec) == 1 + 2 + 2 * 1
    violations = platform_violations(spec, settings)
    assert any(
        v.startswith(f"spec.environment.image '{IMAGE}' is not from an allowed registry") for v in violations
    )
    (gpus,) = [v for v in violations if v.startswith("the job requests")]
    assert "the job requests 5 GPUs" in gpus
    assert "spec.environment.replicas 2 x 1 in spec.environment.resources" in gpus
