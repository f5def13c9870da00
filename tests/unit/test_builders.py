"""Builders: every child of a job, as pure functions of (job, operator settings)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from grpo_operator.api import TrainerConfig
from grpo_operator.api.pod_env import RESERVED_TRAINER_ENV
from grpo_operator.builders import Job, gang_hash, gang_pods, infrastructure, job_from_object, metric_workload
from grpo_operator.builders.common import (
    ANNOTATION_HASH,
    LABEL_JOB,
    LABEL_NAME,
    LABEL_PART_OF,
    LABEL_ROLE,
    generation_pod_name,
    trainer_pod_name,
)
from grpo_operator.builders.gang import VLLM_SUPERVISOR, generation_pod, trainer_pod
from grpo_operator.settings import OperatorSettings, SettingsError

SETTINGS = OperatorSettings()
REQUIRED_LABELS = (LABEL_NAME, LABEL_PART_OF, LABEL_JOB, LABEL_ROLE)


def job_object(name: str = "math", namespace: str = "team-a", **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": {"name": "Qwen/Qwen2.5-1.5B-Instruct"},
        "dataset": {"train": "hf://openai/gsm8k:main#train"},
        "grpo": {"groupSize": 8, "promptsPerStep": 4, "steps": 500},
        "metric": {"image": "ghcr.io/grpo-operator/metric-math:0.1.0"},
        "trainer": {"nodes": 1, "gpusPerNode": 2},
    }
    for key, value in spec.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return {
        "apiVersion": "grpo.dev/v1alpha1",
        "kind": "GRPOJob",
        "metadata": {"name": name, "namespace": namespace, "uid": "uid-1234", "generation": 1},
        "spec": base,
    }


def make_job(**spec: Any) -> Job:
    return job_from_object(job_object(**spec))


def all_children(job: Job, attempt: int = 1, resume_from: str = "") -> list[dict[str, Any]]:
    return [
        *infrastructure(job, SETTINGS),
        *metric_workload(job, SETTINGS),
        *gang_pods(job, SETTINGS, attempt, resume_from),
    ]


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    container = pod["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def pod_specs(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    if manifest["kind"] == "Pod":
        return [manifest["spec"]]
    if manifest["kind"] == "Deployment":
        return [manifest["spec"]["template"]["spec"]]
    return []


def test_every_child_has_a_fixed_name_the_labels_and_the_namespace() -> None:
    job = make_job(
        trainer={"nodes": 2, "gpusPerNode": 4}, checkpoints={"volume": {"accessMode": "ReadWriteMany"}}
    )
    children = all_children(job)
    names = {(c["kind"], c["metadata"]["name"]) for c in children}
    assert names == {
        ("ConfigMap", "math-config"),
        ("PersistentVolumeClaim", "math-ckpt"),
        ("ServiceAccount", "math-trainer"),
        ("Role", "math-trainer"),
        ("RoleBinding", "math-trainer"),
        ("Service", "math-trainer"),
        ("Service", "math-gen"),
        ("Service", "math-metric"),
        ("NetworkPolicy", "math-gen"),
        ("NetworkPolicy", "math-metric"),
        ("NetworkPolicy", "math-trainer"),
        ("Deployment", "math-metric"),
        ("Pod", "math-gen-1-0"),
        ("Pod", "math-trainer-1-0"),
        ("Pod", "math-trainer-1-1"),
    }
    for child in children:
        meta = child["metadata"]
        assert meta["namespace"] == "team-a"
        for label in REQUIRED_LABELS:
            assert meta["labels"].get(label), f"{child['kind']}/{meta['name']} lacks label {label}"
        assert meta["labels"][LABEL_PART_OF] == "grpo-operator"
        assert meta["labels"][LABEL_JOB] == "math"
        assert meta["labels"][LABEL_ROLE] in ("trainer", "generation", "metric")
        assert "generateName" not in meta
    # No Service may be called "vllm": Kubernetes would inject VLLM_PORT=tcp://... into every pod.
    assert all(c["metadata"]["name"] != "vllm" for c in children if c["kind"] == "Service")


def test_children_are_owned_by_the_job_except_a_retained_volume() -> None:
    retained = make_job(checkpoints={"retention": "Retain"})
    for child in all_children(retained):
        refs = child["metadata"].get("ownerReferences")
        if child["kind"] == "PersistentVolumeClaim":
            assert refs is None, "a retained PVC must outlive the job, so the job must not own it"
        else:
            assert refs == [
                {
                    "apiVersion": "grpo.dev/v1alpha1",
                    "kind": "GRPOJob",
                    "name": "math",
                    "uid": "uid-1234",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ]
    deleted = make_job(checkpoints={"retention": "Delete"})
    pvc = next(c for c in infrastructure(deleted, SETTINGS) if c["kind"] == "PersistentVolumeClaim")
    assert pvc["metadata"]["ownerReferences"][0]["uid"] == "uid-1234"


def test_existing_claim_is_used_and_never_created() -> None:
    job = make_job(checkpoints={"volume": {"existingClaim": "shared-ckpt"}})
    assert not [c for c in infrastructure(job, SETTINGS) if c["kind"] == "PersistentVolumeClaim"]
    pod = trainer_pod(job, SETTINGS, 1, 0, "")
    claims = [
        v["persistentVolumeClaim"]["claimName"]
        for v in pod["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    ]
    assert claims == ["shared-ckpt"]


def test_pvc_follows_the_volume_spec() -> None:
    job = make_job(
        checkpoints={"volume": {"size": "200Gi", "storageClassName": "fast", "accessMode": "ReadWriteMany"}}
    )
    pvc = next(c for c in infrastructure(job, SETTINGS) if c["kind"] == "PersistentVolumeClaim")
    assert pvc["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "200Gi"}},
        "storageClassName": "fast",
    }


def test_builders_are_deterministic() -> None:
    job = make_job()
    first = all_children(job, 3, "/workspace/checkpoints/step-50")
    second = all_children(make_job(), 3, "/workspace/checkpoints/step-50")
    assert first == second
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)


def test_spec_hash_changes_with_the_spec_only() -> None:
    job = make_job()
    config_map = infrastructure(job, SETTINGS)[0]
    changed = make_job(grpo={"learningRate": 5e-6})
    assert (
        infrastructure(changed, SETTINGS)[0]["metadata"]["annotations"][ANNOTATION_HASH]
        != (config_map["metadata"]["annotations"][ANNOTATION_HASH])
    )
    # The gang hash covers what shapes the pods, not the attempt or the resume point.
    assert gang_hash(job) == gang_hash(make_job())
    assert gang_hash(job) != gang_hash(changed)
    assert gang_hash(job) != gang_hash(make_job(generation={"image": "vllm/vllm-openai:v0.30.0"}))
    assert gang_hash(job) == gang_hash(make_job(runPolicy={"backoffLimit": 7}))
    assert gang_hash(job) == gang_hash(make_job(metric={"image": "other/metric:2", "replicas": 3}))
    assert gang_hash(job) == gang_hash(make_job(checkpoints={"retention": "Delete"}))
    assert gang_hash(job) == gang_hash(make_job(suspend=True))
    assert gang_hash(job) != gang_hash(make_job(metric={"batchSize": 64}))
    assert gang_hash(job) != gang_hash(make_job(scheduling={"priorityClassName": "high"}))
    pods = gang_pods(job, SETTINGS, 4, "/ckpt")
    assert {p["metadata"]["annotations"][ANNOTATION_HASH] for p in pods} == {gang_hash(job)}


def test_config_map_holds_the_trainer_config() -> None:
    job = make_job(
        trainer={"nodes": 2, "gpusPerNode": 4}, checkpoints={"volume": {"accessMode": "ReadWriteMany"}}
    )
    config_map = infrastructure(job, SETTINGS)[0]
    assert config_map["kind"] == "ConfigMap"
    config = TrainerConfig.model_validate_json(config_map["data"]["trainer.json"])
    assert (config.job.namespace, config.job.name, config.job.uid) == ("team-a", "math", "uid-1234")
    assert (config.grpo.group_size, config.grpo.prompts_per_step, config.grpo.steps) == (8, 4, 500)
    assert (config.trainer.nodes, config.trainer.gpus_per_node) == (2, 4)
    assert config.generation.backend == "vllm-server"
    assert config.generation.server_host == "math-gen.team-a.svc"
    assert config.generation.server_port == SETTINGS.vllm_port
    assert config.generation.weight_sync_port == SETTINGS.weight_sync_port
    assert config.metric is not None and config.metric.url == "http://math-metric.team-a.svc:8080"
    assert config.model.name == "Qwen/Qwen2.5-1.5B-Instruct"


def test_generation_pod_runs_vllm_in_the_mode_trl_needs() -> None:
    job = make_job(generation={"gpus": 4, "tensorParallelSize": 4, "maxModelLen": 4096})
    pod = generation_pod(job, SETTINGS, 2, 0)
    assert pod["metadata"]["name"] == "math-gen-2-0"
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert container["image"] == "ghcr.io/grpo-operator/vllm:0.1.0"
    # `vllm serve <args>` under the supervisor that reports an exit nobody asked for (vLLM's exit 0 when
    # its engine dies) as a failure, in the termination message the kubelet reads.
    assert container["command"][:3] == ["python3", "-c", VLLM_SUPERVISOR]
    assert container["command"][3:] == ["--termination-log", "/dev/termination-log", "--", "vllm", "serve"]
    assert container["terminationMessagePath"] == "/dev/termination-log"
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    args = container["args"]
    assert args[0] == "Qwen/Qwen2.5-1.5B-Instruct"

    def flag(name: str) -> str:
        return str(args[args.index(name) + 1])

    assert flag("--port") == "8000"
    assert flag("--tensor-parallel-size") == "4"
    assert flag("--gpu-memory-utilization") == "0.9"
    assert flag("--weight-transfer-config") == '{"backend":"nccl"}'
    assert flag("--logprobs-mode") == "processed_logprobs"
    assert flag("--max-logprobs") == "-1"
    assert flag("--max-model-len") == "4096"
    # Unset: vLLM's auto-fit (-1), the model's context lowered to what the KV cache can hold, so a 128k-token
    # model on a smaller memory share starts instead of refusing after its model load.
    unset = generation_pod(make_job(generation={"gpus": 1}), SETTINGS, 2, 0)["spec"]["containers"][0]["args"]
    assert unset[unset.index("--max-model-len") + 1] == "-1"
    assert flag("--revision") == "main"
    assert "--data-parallel-size" not in args
    assert env_of(pod)["VLLM_SERVER_DEV_MODE"] == "1"
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    # A server busy with a step's requests answers /health late, not never: 10 s, not the kubelet's 1 s.
    assert container["readinessProbe"]["timeoutSeconds"] == 10
    assert container["ports"][0]["containerPort"] == 8000
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "4"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False


def test_trainer_pods_carry_the_contract_environment() -> None:
    job = make_job(
        trainer={"nodes": 3, "gpusPerNode": 8},
        grpo={"promptsPerStep": 6},
        checkpoints={"volume": {"accessMode": "ReadWriteMany"}},
    )
    pods = gang_pods(job, SETTINGS, 5, "/workspace/checkpoints/step-100")
    assert [p["metadata"]["name"] for p in pods] == [
        "math-gen-5-0",
        "math-trainer-5-0",
        "math-trainer-5-1",
        "math-trainer-5-2",
    ]
    for rank, pod in enumerate(pods[1:]):
        env = env_of(pod)
        assert env["GRPO_CONFIG"] == "/etc/grpo/trainer.json"
        assert env["RESUME_FROM"] == "/workspace/checkpoints/step-100"
        assert env["NODE_RANK"] == str(rank)
        assert env["NNODES"] == "3"
        assert env["NPROC_PER_NODE"] == "8"
        assert env["RANK"] == str(rank * 8)
        assert env["WORLD_SIZE"] == "24"
        assert env["MASTER_ADDR"] == "math-trainer-5-0.math-trainer.team-a.svc"
        assert env["MASTER_PORT"] == "29500"
        assert env["GRPO_JOB_NAMESPACE"] == "team-a"
        assert env["GRPO_JOB_NAME"] == "math"
        assert env["GRPO_VLLM_URL"] == "http://math-gen.team-a.svc:8000"
        assert env["GRPO_METRIC_URL"] == "http://math-metric.team-a.svc:8080"
        assert env["VLLM_HOST_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        spec = pod["spec"]
        assert spec["hostname"] == pod["metadata"]["name"]
        assert spec["subdomain"] == "math-trainer"
        assert spec["serviceAccountName"] == "math-trainer"
        assert spec["restartPolicy"] == "Never"
        (container,) = spec["containers"]
        assert container["command"] == ["torchrun"]
        assert container["args"] == [
            "--nnodes=$(NNODES)",
            "--nproc-per-node=$(NPROC_PER_NODE)",
            "--node-rank=$(NODE_RANK)",
            "--master-addr=$(MASTER_ADDR)",
            "--master-port=$(MASTER_PORT)",
            # A node that starts first waits for the others as long as the operator's start-up deadline.
            "--rdzv-conf=timeout=1800",
            "-m",
            "grpo_trainer",
        ]
        assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
        assert container["resources"]["requests"]["nvidia.com/gpu"] == "8"
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert {"/etc/grpo", "/workspace", "/dev/shm"} <= mounts


def test_user_env_cannot_override_the_contract() -> None:
    job = make_job(trainer={"env": [{"name": "RANK", "value": "7"}, {"name": "NCCL_DEBUG", "value": "INFO"}]})
    env = env_of(trainer_pod(job, SETTINGS, 1, 0, ""))
    assert env["RANK"] == "0"
    assert env["NCCL_DEBUG"] == "INFO"
    names = [e["name"] for e in trainer_pod(job, SETTINGS, 1, 0, "")["spec"]["containers"][0]["env"]]
    assert len(names) == len(set(names)), "each variable must appear once"
    assert "RANK" in RESERVED_TRAINER_ENV


def test_gpu_pods_land_on_gpu_nodes_and_honour_the_scheduling_passthrough() -> None:
    toleration = {"key": "team", "operator": "Equal", "value": "a", "effect": "NoSchedule"}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}
                ]
            }
        }
    }
    job = make_job(
        scheduling={
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            "tolerations": [toleration],
            "affinity": affinity,
            "priorityClassName": "training-high",
        }
    )
    for manifest in all_children(job):
        for spec in pod_specs(manifest):
            assert spec["tolerations"].count(toleration) == 1
            assert spec["affinity"] == affinity
            assert spec["priorityClassName"] == "training-high"
            assert spec["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
            assert spec["enableServiceLinks"] is False
            gpu = manifest["kind"] == "Pod"
            has_gpu_toleration = {"key": "nvidia.com/gpu", "operator": "Exists"} in spec["tolerations"]
            assert has_gpu_toleration == gpu
            assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


def test_gpu_pods_need_no_node_label_by_default() -> None:
    """Only GPU feature discovery sets nvidia.com/gpu.present; a cluster with just the NVIDIA device plugin
    (most managed clouds) has no such label, and a default selector on it would leave every job Pending.
    The GPU request is what places the pods; the tolerations cover the usual GPU node taints."""
    for pod in gang_pods(make_job(), SETTINGS, 1, ""):
        spec = pod["spec"]
        assert "nodeSelector" not in spec, pod["metadata"]["name"]
        assert int(spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]) >= 1
        tolerations = spec["tolerations"]
        # GKE taints nvidia.com/gpu=present:NoSchedule, the GPU operator nvidia.com/gpu:NoSchedule.
        assert {"key": "nvidia.com/gpu", "operator": "Exists"} in tolerations
        # AKS documents sku=gpu:NoSchedule for GPU node pools.
        assert {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"} in tolerations


def test_queue_name_groups_the_gang_for_kueue() -> None:
    job = make_job(
        trainer={"nodes": 2, "gpusPerNode": 4},
        scheduling={"queueName": "team-a-queue"},
        checkpoints={"volume": {"accessMode": "ReadWriteMany"}},
    )
    pods = gang_pods(job, SETTINGS, 3, "")
    for pod in pods:
        assert pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a-queue"
        assert pod["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] == "math-a3"
        assert pod["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == str(len(pods))
    plain = gang_pods(make_job(), SETTINGS, 1, "")
    assert not any("kueue.x-k8s.io/queue-name" in p["metadata"]["labels"] for p in plain)


def test_metric_service_runs_the_users_image_without_credentials() -> None:
    job = make_job(metric={"port": 9000, "replicas": 2, "env": [{"name": "STRICT", "value": "1"}]})
    (deployment,) = metric_workload(job, SETTINGS)
    assert deployment["spec"]["replicas"] == 2
    pod_spec = deployment["spec"]["template"]["spec"]
    assert pod_spec["automountServiceAccountToken"] is False
    (container,) = pod_spec["containers"]
    assert container["image"] == "ghcr.io/grpo-operator/metric-math:0.1.0"
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["ports"][0]["containerPort"] == 9000
    assert container["resources"]["requests"] == dict(SETTINGS.default_metric_requests)
    assert {"name": "STRICT", "value": "1"} in container["env"]
    assert deployment["spec"]["selector"]["matchLabels"] == {
        "grpo.dev/job": "math",
        "grpo.dev/role": "metric",
    }
    service = next(c for c in infrastructure(job, SETTINGS) if c["metadata"]["name"] == "math-metric")
    assert service["spec"]["ports"][0]["port"] == 9000
    assert service["spec"]["selector"] == {"grpo.dev/job": "math", "grpo.dev/role": "metric"}


def test_trainer_role_allows_patching_only_its_own_status() -> None:
    job = make_job()
    role = next(c for c in infrastructure(job, SETTINGS) if c["kind"] == "Role")
    assert role["rules"] == [
        {
            "apiGroups": ["grpo.dev"],
            "resources": ["grpojobs/status"],
            "resourceNames": ["math"],
            "verbs": ["get", "patch"],
        }
    ]
    binding = next(c for c in infrastructure(job, SETTINGS) if c["kind"] == "RoleBinding")
    assert binding["roleRef"]["name"] == "math-trainer"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "math-trainer", "namespace": "team-a"}]


def test_network_policies_admit_only_the_jobs_trainers() -> None:
    job = make_job()
    policies = {
        c["metadata"]["name"]: c for c in infrastructure(job, SETTINGS) if c["kind"] == "NetworkPolicy"
    }
    trainers = {"podSelector": {"matchLabels": {"grpo.dev/job": "math", "grpo.dev/role": "trainer"}}}
    gen = policies["math-gen"]["spec"]
    assert gen["podSelector"]["matchLabels"] == {"grpo.dev/job": "math", "grpo.dev/role": "generation"}
    assert gen["ingress"] == [{"from": [trainers]}]
    metric = policies["math-metric"]["spec"]
    assert metric["podSelector"]["matchLabels"]["grpo.dev/role"] == "metric"
    assert metric["ingress"] == [{"from": [trainers], "ports": [{"protocol": "TCP", "port": 8080}]}]


def test_names_fit_kubernetes_limits_for_the_longest_job_name() -> None:
    name = "a" * 40
    job = job_from_object(job_object(name=name))
    for child in all_children(job, attempt=99999):
        assert len(child["metadata"]["name"]) <= 63, child["metadata"]["name"]
    assert len(trainer_pod_name(job, 99999, 63)) <= 63
    assert len(generation_pod_name(job, 99999, 0)) <= 63


def test_vllm_shares_the_volume_only_when_it_can_be_mounted_twice() -> None:
    rwo = generation_pod(make_job(), SETTINGS, 1)
    assert not any("persistentVolumeClaim" in v for v in rwo["spec"]["volumes"])
    rwx = generation_pod(make_job(checkpoints={"volume": {"accessMode": "ReadWriteMany"}}), SETTINGS, 1)
    assert any("persistentVolumeClaim" in v for v in rwx["spec"]["volumes"])
    assert env_of(rwx)["HF_HOME"] == "/workspace/hf-cache"


def test_builders_do_not_mutate_their_input() -> None:
    obj = job_object()
    before = copy.deepcopy(obj)
    all_children(job_from_object(obj))
    assert obj == before


def test_settings_from_environment_and_errors() -> None:
    settings = OperatorSettings.from_env(
        {
            "GRPO_OPERATOR_RESYNC_SECONDS": "5",
            "GRPO_OPERATOR_NAMESPACES": "a, b",
            "GRPO_OPERATOR_GPU_NODE_SELECTOR": '{"gpu": "yes"}',
            "GRPO_OPERATOR_PERMANENT_EXIT_CODES": "2,3",
        },
        workers=8,
    )
    assert settings.resync_seconds == 5.0
    assert settings.namespaces == ("a", "b")
    assert settings.gpu_node_selector == {"gpu": "yes"}
    assert settings.permanent_exit_codes == (2, 3)
    assert settings.workers == 8
    with pytest.raises(SettingsError, match="GRPO_OPERATOR_WORKERS"):
        OperatorSettings.from_env({"GRPO_OPERATOR_WORKERS": "many"})
    with pytest.raises(SettingsError, match="not both"):
        OperatorSettings(namespaces=("a",), all_namespaces=True)
