"""The platform's fast network (settings.network_*, ipc_lock) on trainer and vLLM pods, and the start-up
refusals that keep it from breaking every job: a capability the namespaces' Pod Security Standard forbids,
a variable or annotation the operator itself sets, a resource that is no device."""

from __future__ import annotations

from typing import Any

import pytest
from grpo_operator.api.pod_env import OPERATOR_POD_ENV
from grpo_operator.builders import gang_pods, job_from_object, metric_workload
from grpo_operator.settings import OperatorSettings, SettingsError

from tests.unit.test_builders import job_object
from tests.unit.test_builders_rollouts import client_job
from tests.unit.test_pod_security import restricted_violations

RDMA = "rdma/rdma_shared_device_a"
MULTUS = "k8s.v1.cni.cncf.io/networks"
FAST = {
    "GRPO_OPERATOR_NETWORK_RESOURCES": f'{{"{RDMA}": 1}}',
    "GRPO_OPERATOR_NETWORK_POD_ANNOTATIONS": f'{{"{MULTUS}": "rdma-net"}}',
    "GRPO_OPERATOR_NETWORK_ENV": '{"NCCL_SOCKET_IFNAME": "net1", "NCCL_IB_HCA": "mlx5_0", "NCCL_IB_GID_INDEX": 3}',
}
WITH_IPC_LOCK = {**FAST, "GRPO_OPERATOR_IPC_LOCK": "true", "GRPO_OPERATOR_POD_SECURITY": "privileged"}


def pods(settings: OperatorSettings, **spec: Any) -> dict[str, dict[str, Any]]:
    """The gang's pods by role ("gen", "trainer"; the first of each) and the metric pod ("metric")."""
    job = job_from_object(job_object(**spec))
    out: dict[str, dict[str, Any]] = {}
    for pod in gang_pods(job, settings, 1, ""):
        out.setdefault(pod["metadata"]["name"].split("-")[1], pod)
    (metric,) = [d for d in metric_workload(job, settings) if d["kind"] == "Deployment"]
    out["metric"] = {
        "metadata": metric["spec"]["template"]["metadata"],
        "spec": metric["spec"]["template"]["spec"],
    }
    return out


def env(pod: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(e["name"], e.get("value", e.get("valueFrom"))) for e in pod["spec"]["containers"][0]["env"]]


def test_nothing_changes_while_the_settings_are_empty() -> None:
    for role, pod in pods(OperatorSettings()).items():
        container = pod["spec"]["containers"][0]
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}, role
        assert not any(name.startswith("NCCL_IB") for name, _ in env(pod)), role
        assert RDMA not in container["resources"].get("limits", {}), role


def test_trainer_and_vllm_pods_get_the_devices_annotations_and_variables() -> None:
    settings = OperatorSettings.from_env(FAST)
    found = pods(settings)
    for role in ("gen", "trainer"):
        pod = found[role]
        container = pod["spec"]["containers"][0]
        # Extended resources cannot be overcommitted: the request equals the limit.
        assert container["resources"]["requests"][RDMA] == container["resources"]["limits"][RDMA] == "1", role
        assert container["resources"]["limits"]["nvidia.com/gpu"] == {"gen": "1", "trainer": "2"}[role]
        assert pod["metadata"]["annotations"][MULTUS] == "rdma-net", role
        variables = dict(env(pod))
        # A number in the Helm values (3) reaches the pod as the string Kubernetes requires.
        assert (variables["NCCL_SOCKET_IFNAME"], variables["NCCL_IB_GID_INDEX"]) == ("net1", "3"), role
        assert variables["NCCL_IB_HCA"] == "mlx5_0", role
        # Without ipc_lock the pods still meet the restricted standard.
        assert restricted_violations(pod["spec"]) == [], role
    metric = found["metric"]
    assert MULTUS not in (metric["metadata"].get("annotations") or {})
    assert "NCCL_SOCKET_IFNAME" not in dict(env(metric))
    assert RDMA not in metric["spec"]["containers"][0]["resources"].get("requests", {})


def test_the_platforms_variables_and_devices_win_over_the_jobs_own() -> None:
    settings = OperatorSettings.from_env(FAST)
    job_env = [{"name": "NCCL_SOCKET_IFNAME", "value": "eth0"}, {"name": "NCCL_DEBUG", "value": "INFO"}]
    found = pods(
        settings,
        trainer={"env": job_env, "resources": {"limits": {RDMA: 4}}},
        generation={"env": job_env},
    )
    for role in ("gen", "trainer"):
        names = [name for name, _ in env(found[role])]
        assert names.count("NCCL_SOCKET_IFNAME") == 1, role
        variables = dict(env(found[role]))
        assert variables["NCCL_SOCKET_IFNAME"] == "net1", role
        # What the platform does not set stays the job's to choose.
        assert variables["NCCL_DEBUG"] == "INFO", role
    assert found["trainer"]["spec"]["containers"][0]["resources"]["limits"][RDMA] == "1"


def test_ipc_lock_is_the_one_capability_added_and_only_to_trainer_and_vllm() -> None:
    found = pods(OperatorSettings.from_env(WITH_IPC_LOCK))
    for role in ("gen", "trainer"):
        context = found[role]["spec"]["containers"][0]["securityContext"]
        assert context["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}, role
        assert context["privileged"] is False and context["allowPrivilegeEscalation"] is False, role
        # The image's own user, as at baseline: an added capability is effective only for root.
        assert "runAsUser" not in found[role]["spec"]["securityContext"], role
        assert f"{found[role]['spec']['containers'][0]['name']}: adds capabilities" in restricted_violations(
            found[role]["spec"]
        )
    assert found["metric"]["spec"]["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_a_replacement_vllm_pod_gets_them_too() -> None:
    from grpo_operator.builders.gang import generation_pod

    job = job_from_object(job_object())
    pod = generation_pod(job, OperatorSettings.from_env(WITH_IPC_LOCK), 1, index=1)
    assert pod["metadata"]["annotations"][MULTUS] == "rdma-net"
    assert pod["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]


def test_every_variable_the_operator_sets_on_its_pods_is_one_the_platform_may_not() -> None:
    """OPERATOR_POD_ENV is what network_env is checked against: a pod with every optional variable (an HF
    token, trackers' credentials, a client-rollout rank 0) must carry no variable missing from it."""
    spec: dict[str, Any] = {
        "model": {"tokenSecretRef": {"name": "hf", "key": "token"}},
        "tracking": {
            "mlflow": {"trackingUri": "http://mlflow:5000", "credentialsSecret": "mlflow"},
            "wandb": {"project": "p", "apiKeySecretRef": {"name": "wandb", "key": "apiKey"}},
        },
    }
    settings = OperatorSettings()
    jobs = [job_from_object(job_object(**spec)), client_job(**spec)]
    names = {
        e["name"]
        for job in jobs
        for pod in gang_pods(job, settings, 1, "")
        for e in pod["spec"]["containers"][0]["env"]
    }
    assert names - OPERATOR_POD_ENV == set()


@pytest.mark.parametrize(
    ("env", "words"),
    [
        (
            {"GRPO_OPERATOR_IPC_LOCK": "true"},
            "ipc_lock (GRPO_OPERATOR_IPC_LOCK, Helm: jobDefaults.fastNetwork.ipcLock) adds the IPC_LOCK capability",
        ),
        (
            {"GRPO_OPERATOR_IPC_LOCK": "true", "GRPO_OPERATOR_POD_SECURITY": "baseline"},
            "the 'baseline' Pod Security Standard forbids",
        ),
        ({"GRPO_OPERATOR_IPC_LOCK": "true"}, "pod-security.kubernetes.io/enforce=privileged"),
        ({"GRPO_OPERATOR_POD_SECURITY": "privileged"}, "ipc_lock .* is off, and nothing else needs"),
        ({"GRPO_OPERATOR_NETWORK_ENV": '{"MASTER_PORT": "1"}'}, "has 'MASTER_PORT': the operator sets this"),
        ({"GRPO_OPERATOR_NETWORK_ENV": '{"HF_HOME": "/x"}'}, "has 'HF_HOME': the operator sets this"),
        ({"GRPO_OPERATOR_NETWORK_ENV": '{"NCCL IB": "x"}'}, "not an environment variable name"),
        ({"GRPO_OPERATOR_NETWORK_ENV": '{"NCCL_IB_HCA": ["mlx5_0"]}'}, "not a string or number"),
        ({"GRPO_OPERATOR_NETWORK_ENV": '["NCCL_IB_HCA"]'}, "expected a JSON object"),
        ({"GRPO_OPERATOR_NETWORK_RESOURCES": '{"nvidia.com/gpu": 1}'}, "GPUs are requested by each job"),
        ({"GRPO_OPERATOR_NETWORK_RESOURCES": '{"memory": "1Gi"}'}, "not an extended resource name"),
        ({"GRPO_OPERATOR_NETWORK_RESOURCES": f'{{"{RDMA}": "0.5"}}'}, "not a whole number above 0"),
        ({"GRPO_OPERATOR_NETWORK_POD_ANNOTATIONS": '{"grpo.dev/spec-hash": "x"}'}, "annotations of grpo.dev"),
        (
            {"GRPO_OPERATOR_NETWORK_POD_ANNOTATIONS": '{"kueue.x-k8s.io/pod-group-name": "x"}'},
            "kueue.x-k8s.io",
        ),
        ({"GRPO_OPERATOR_NETWORK_POD_ANNOTATIONS": '{"bad key!": "x"}'}, "not an annotation key"),
    ],
)
def test_settings_that_would_break_every_job_are_refused_at_start_up(env: dict[str, str], words: str) -> None:
    with pytest.raises(SettingsError, match=words.replace("(", r"\(").replace(")", r"\)")):
        OperatorSettings.from_env(env)


def test_ipc_lock_with_the_privileged_level_is_accepted() -> None:
    settings = OperatorSettings.from_env(WITH_IPC_LOCK)
    assert settings.ipc_lock and settings.pod_security == "privileged"
    assert settings.network_resources == {RDMA: "1"}
