"""The children of a client-rollout job (spec.rollouts.source: Client): the rollout gateway, the Service
naming trainer rank 0, the NetworkPolicies between them and the client, and the two configs."""

from __future__ import annotations

import json
from typing import Any

import pytest
from grpo_operator.api.gateway_config import GatewayConfig
from grpo_operator.api.trainer_config import TrainerConfig
from grpo_operator.builders import (
    Job,
    gang_hash,
    gang_pods,
    generated_secrets,
    infrastructure,
    job_from_object,
    metric_workload,
)
from grpo_operator.settings import OperatorSettings

from tests.unit.test_builders import job_object

SETTINGS = OperatorSettings()


TOKEN_SECRET = "math-gateway-token-abcde"


def client_job(
    client: dict[str, Any] | None = None, *, token_secret: str | None = TOKEN_SECRET, **spec: Any
) -> Job:
    """A client-rollout job; by default one whose gateway-token Secret the operator has recorded."""
    obj = job_object(**spec)
    del obj["spec"]["metric"], obj["spec"]["dataset"]
    obj["spec"]["rollouts"] = {"source": "Client", **({"client": client} if client is not None else {})}
    return job_from_object(obj, gateway_token_secret=token_secret)


def by_name(job: Job) -> dict[tuple[str, str], dict[str, Any]]:
    children = [
        *infrastructure(job, SETTINGS),
        *metric_workload(job, SETTINGS),
        *gang_pods(job, SETTINGS, 3, ""),
    ]
    return {(c["kind"], c["metadata"]["name"]): c for c in children}


def test_trainer_json_points_rank_0_at_the_gateway_and_has_no_metric_or_dataset() -> None:
    children = by_name(client_job())
    config = TrainerConfig.model_validate_json(children[("ConfigMap", "math-config")]["data"]["trainer.json"])
    assert config.metric is None and config.dataset is None
    assert config.rollouts is not None
    assert config.rollouts.gateway_url == "http://math-rollouts.team-a.svc:7454"
    assert config.rollouts.policy_port == 7455
    assert config.rollouts.served_model == "Qwen/Qwen2.5-1.5B-Instruct"
    trainer = children[("Pod", "math-trainer-3-0")]
    env = {e["name"] for e in trainer["spec"]["containers"][0]["env"]}
    assert "GRPO_METRIC_URL" not in env
    assert {"name": "policy", "containerPort": 7455, "protocol": "TCP"} in trainer["spec"]["containers"][0][
        "ports"
    ]


def test_gateway_json_carries_g_b_s_and_the_stable_address_of_rank_0() -> None:
    children = by_name(client_job(generation={"startupTimeoutSeconds": 900}))
    text = children[("ConfigMap", "math-config")]["data"]["gateway.json"]
    config = GatewayConfig.model_validate_json(text)
    assert (config.group_size, config.prompts_per_step, config.steps) == (8, 4, 500)
    assert config.job.namespace == "team-a" and config.job.name == "math"
    assert config.served_model == "Qwen/Qwen2.5-1.5B-Instruct"
    assert config.trainer_url == "http://math-policy.team-a.svc:7455"
    assert config.token_env is None
    assert config.completion_wait_seconds == 900
    # The policy Service selects rank 0 of whichever attempt runs, never an attempt-specific name.
    policy = children[("Service", "math-policy")]
    assert policy["spec"]["selector"] == {
        "grpo.dev/job": "math",
        "grpo.dev/role": "trainer",
        "grpo.dev/node-rank": "0",
    }
    assert policy["spec"]["ports"][0]["port"] == 7455
    rank0 = children[("Pod", "math-trainer-3-0")]["metadata"]["labels"]
    assert all(rank0.get(k) == v for k, v in policy["spec"]["selector"].items())


def test_gateway_deployment_is_one_small_secure_pod_that_never_overlaps() -> None:
    children = by_name(client_job(trainer={"image": "registry.example.com/trainer:1"}))
    deployment = children[("Deployment", "math-rollouts")]
    spec = deployment["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == "registry.example.com/trainer:1"
    assert container["command"] == ["python", "-m", "grpo_gateway"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "client"}
    # Not the kubelet's 1 s default: a gateway busy parsing large bodies is slow to answer, not dead.
    assert container["readinessProbe"]["timeoutSeconds"] == container["livenessProbe"]["timeoutSeconds"] == 5
    assert container["resources"]["requests"] == {"cpu": "100m", "memory": "256Mi"}
    # A hostile client cannot grow the gateway into the node's memory.
    assert container["resources"]["limits"] == {"memory": "1Gi"}
    assert pod["automountServiceAccountToken"] is False and pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "nvidia.com/gpu" not in json.dumps(container["resources"])
    assert {"name": "GRPO_GATEWAY_CONFIG", "value": "/etc/grpo/gateway.json"} in container["env"]
    service = children[("Service", "math-rollouts")]
    assert {(p["name"], p["port"]) for p in service["spec"]["ports"]} == {
        ("client", 7453),
        ("internal", 7454),
    }


def test_the_token_reaches_the_gateway_by_reference_only() -> None:
    job = client_job({"tokenSecretRef": {"name": "dspy-token", "key": "token"}})
    children = by_name(job)
    container = children[("Deployment", "math-rollouts")]["spec"]["template"]["spec"]["containers"][0]
    token = next(e for e in container["env"] if e["name"] == "GRPO_ROLLOUTS_TOKEN")
    assert token == {
        "name": "GRPO_ROLLOUTS_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "dspy-token", "key": "token"}},
    }
    config = GatewayConfig.model_validate_json(children[("ConfigMap", "math-config")]["data"]["gateway.json"])
    assert config.token_env == "GRPO_ROLLOUTS_TOKEN"
    assert not any(kind == "Secret" for kind, _ in children)


def test_network_policies_admit_trainers_inside_and_named_clients_outside() -> None:
    job = client_job(
        {
            "allowFrom": [
                {"podLabels": {"app": "dspy"}},
                {"podLabels": {"app": "nb"}, "namespaceLabels": {"kubernetes.io/metadata.name": "notebooks"}},
            ]
        }
    )
    children = by_name(job)
    ingress = children[("NetworkPolicy", "math-rollouts")]["spec"]["ingress"]
    internal = next(r for r in ingress if r["ports"] == [{"protocol": "TCP", "port": 7454}])
    assert internal["from"] == [
        {"podSelector": {"matchLabels": {"grpo.dev/job": "math", "grpo.dev/role": "trainer"}}}
    ]
    client = next(r for r in ingress if r["ports"] == [{"protocol": "TCP", "port": 7453}])
    assert client["from"] == [
        {"podSelector": {"matchLabels": {"grpo.dev/job": "math"}}},
        {"podSelector": {"matchLabels": {"app": "dspy"}}},
        {
            "podSelector": {"matchLabels": {"app": "nb"}},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "notebooks"}},
        },
    ]
    trainer = children[("NetworkPolicy", "math-trainer")]["spec"]["ingress"]
    assert {
        "from": [{"podSelector": {"matchLabels": {"grpo.dev/job": "math", "grpo.dev/role": "rollouts"}}}],
        "ports": [{"protocol": "TCP", "port": 7455}],
    } in trainer


def test_changing_who_may_reach_the_gateway_does_not_restart_the_gang() -> None:
    before = client_job()
    after = client_job(
        {"allowFrom": [{"podLabels": {"app": "dspy"}}], "tokenSecretRef": {"name": "t", "key": "k"}}
    )
    assert gang_hash(before) == gang_hash(after)
    gateway = by_name(before)[("Deployment", "math-rollouts")]
    changed = by_name(after)[("Deployment", "math-rollouts")]
    assert gateway["metadata"]["annotations"] != changed["metadata"]["annotations"]  # the gateway rolls


def test_gateway_json_carries_the_reward_bound_and_body_limits_from_the_spec() -> None:
    children = by_name(client_job(grpo={"maxPromptLength": 1000, "maxCompletionLength": 500}))
    raw = json.loads(children[("ConfigMap", "math-config")]["data"]["gateway.json"])
    assert raw["maxAbsReward"] == 1e6
    # 64 KiB + 64 bytes per token of prompt and completion; a step carries G = 8 of them.
    assert raw["maxTranscriptBytes"] == 65536 + 64 * 1500
    assert GatewayConfig.model_validate(raw).max_step_body_bytes == 8 * (65536 + 64 * 1500) + 65536


def _env_holding(manifest: dict[str, Any], name: str) -> list[dict[str, Any]]:
    spec = manifest["spec"].get("template", {}).get("spec") or manifest["spec"]
    containers = [*spec.get("initContainers", []), *spec["containers"]]
    return [e for c in containers for e in c.get("env", []) if e["name"] == name]


def test_only_the_gateway_and_trainer_rank_0_hold_the_internal_token() -> None:
    job = client_job(
        {"tokenSecretRef": {"name": "dspy-token", "key": "token"}},
        trainer={
            "nodes": 2,
            "gpusPerNode": 1,
            "env": [{"name": "GRPO_GATEWAY_INTERNAL_TOKEN", "value": "mine"}],
        },
        checkpoints={"volume": {"accessMode": "ReadWriteMany"}},
    )
    children = by_name(job)
    reference = {
        "name": "GRPO_GATEWAY_INTERNAL_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": TOKEN_SECRET, "key": "token"}},
    }
    holders = {
        key: entries
        for key, manifest in children.items()
        if manifest["kind"] in ("Pod", "Deployment")
        and (entries := _env_holding(manifest, "GRPO_GATEWAY_INTERNAL_TOKEN"))
    }
    # Not the vLLM pod, not rank 1; and the tenant's own trainer.env entry is dropped, not appended.
    assert holders == {
        ("Deployment", "math-rollouts"): [reference],
        ("Pod", "math-trainer-3-0"): [reference],
    }
    config = GatewayConfig.model_validate_json(children[("ConfigMap", "math-config")]["data"]["gateway.json"])
    assert config.internal_token_env == "GRPO_GATEWAY_INTERNAL_TOKEN"

    assert generated_secrets(job) == [], "recorded: never created again"


def test_until_its_token_secret_is_recorded_a_client_job_has_a_secret_to_create_and_no_gateway() -> None:
    job = client_job(token_secret=None)
    [(secret, key)] = generated_secrets(job)
    assert key == "token" and secret["kind"] == "Secret"
    # The API server picks the name: no Secret a tenant made can ever be the job's token.
    assert secret["metadata"]["generateName"] == "math-gateway-token-" and "name" not in secret["metadata"]
    assert secret["metadata"]["ownerReferences"][0]["controller"] is True
    assert secret["metadata"]["labels"]["grpo.dev/job"] == "math"
    # No value in the build: the runtime generates it when it creates the Secret.
    assert "data" not in secret and "stringData" not in secret and secret["immutable"] is True
    assert generated_secrets(job) == generated_secrets(job), "pure: the same build every time"
    built = {(c["kind"], c["metadata"]["name"]) for c in infrastructure(job, SETTINGS)}
    assert ("Deployment", "math-rollouts") not in built and ("Service", "math-rollouts") in built
    with pytest.raises(ValueError, match=r"status\.gatewayTokenSecret"):
        gang_pods(job, SETTINGS, 1, "")


def test_a_metric_job_has_no_gateway_token() -> None:
    job = job_from_object(job_object())
    assert generated_secrets(job) == []
    pods = gang_pods(job, SETTINGS, 1, "")
    assert not any(_env_holding(p, "GRPO_GATEWAY_INTERNAL_TOKEN") for p in pods)
