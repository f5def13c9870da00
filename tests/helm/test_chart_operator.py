"""The chart's operator Deployment, rendered offline: the default install, the restricted Pod Security
profile, and the chart's values reaching the operator as its own settings and flag parsing read them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from grpo_operator.cli import _parser
from grpo_operator.settings import ENV_PREFIX, OperatorSettings

from tests.helm.chart import (
    CHART,
    FULLNAME,
    MONITORING_APIS,
    NAMESPACE,
    VALUES_DIR,
    Doc,
    env_of,
    one,
    render,
    values_files,
)
from tests.unit.test_pod_security import RESTRICTED_VOLUME_TYPES


def test_monitoring_is_off_by_default(defaults: list[Doc]) -> None:
    kinds = sorted(d["kind"] for d in defaults)
    assert kinds == [
        "ClusterRole",
        "ClusterRole",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "Service",
        "ServiceAccount",
        # platform limits, trainer status, job labels (deny); warnings (warn)
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicyBinding",
    ]


def test_operator_deployment_runs_exactly_one_operator(defaults: list[Doc]) -> None:
    deployment = one(defaults, "Deployment", FULLNAME, NAMESPACE)
    spec = deployment["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == FULLNAME
    container = pod["containers"][0]
    assert container["image"] == "ghcr.io/grpo-operator/grpo-operator:0.1.0"
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()


def test_operator_pod_meets_the_restricted_pod_security_standard(defaults: list[Doc]) -> None:
    """The checks of the "restricted" profile (kubernetes.io/docs/concepts/security/pod-security-standards).
    tests/helm/test_install.py also admits the pod in a namespace that enforces the profile."""
    pod = one(defaults, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    for volume in pod.get("volumes", []):
        assert set(volume) - {"name"} <= RESTRICTED_VOLUME_TYPES, volume
    for container in pod["containers"]:
        sc = container["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"] and not sc["capabilities"].get("add")
        assert sc.get("privileged") is not True
        assert sc["readOnlyRootFilesystem"] is True
        assert not any("hostPort" in p for p in container.get("ports", []))


def test_metrics_service_selects_the_operator_pod(defaults: list[Doc]) -> None:
    service = one(defaults, "Service", f"{FULLNAME}-metrics", NAMESPACE)
    pod = one(defaults, "Deployment")["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    port_names = {p["name"] for p in pod["spec"]["containers"][0]["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= port_names


# --- the chart's values reach the operator as it reads them -------------------------------------------


@pytest.mark.parametrize("values", values_files(), ids=lambda p: p.stem)
def test_operator_settings_and_flags_parse_as_the_operator_parses_them(values: Path) -> None:
    docs = render([values], api_versions=MONITORING_APIS)
    container = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = env_of(one(docs, "Deployment"))
    fields = {f.upper() for f in OperatorSettings.__dataclass_fields__}
    unknown = [k for k in env if k.startswith(ENV_PREFIX) and k[len(ENV_PREFIX) :] not in fields]
    assert not unknown, f"the chart sets variables the operator does not read: {unknown}"
    args = _parser().parse_args([*container["args"]])
    assert args.command == "run"
    namespaces = tuple(args.namespace) if args.namespace else None
    settings = OperatorSettings.from_env(
        env, namespaces=namespaces, all_namespaces=True if args.all_namespaces else None
    )
    given = yaml.safe_load(values.read_text()) or {}
    chart = yaml.safe_load((CHART / "values.yaml").read_text())
    merged = deep_merge(chart, given)
    job_defaults = merged["jobDefaults"]
    assert settings.default_trainer_requests == job_defaults["resources"]["trainer"]["requests"]
    assert settings.default_generation_requests == job_defaults["resources"]["generation"]["requests"]
    assert settings.default_metric_requests == job_defaults["resources"]["metric"]["requests"]
    assert dict(settings.gpu_node_selector) == job_defaults["gpuNodeSelector"]
    assert [dict(t) for t in settings.gpu_tolerations] == job_defaults["gpuTolerations"]
    assert [dict(r) for r in settings.gpu_node_affinity] == job_defaults["gpuNodeAffinity"]
    assert settings.trainer_image == job_defaults["images"]["trainer"]
    assert settings.vllm_image == job_defaults["images"]["generation"]
    assert settings.shm_size == job_defaults["shmSize"]
    assert settings.trainer_termination_grace_seconds == job_defaults["trainerTerminationGracePeriodSeconds"]
    assert settings.trainer_metrics_port == job_defaults["trainerMetricsPort"]
    pod_security = job_defaults["podSecurity"]
    assert settings.pod_security == pod_security["level"]
    assert settings.pod_run_as_user == pod_security["runAsUser"]
    assert settings.pod_run_as_group == pod_security["runAsGroup"]
    assert settings.pod_fs_group == pod_security["fsGroup"]
    fast_network = job_defaults["fastNetwork"]
    # Numbers in the values (a device count, NCCL_IB_GID_INDEX: 3) reach the pods as strings.
    assert settings.network_resources == {k: str(v) for k, v in fast_network["resources"].items()}
    assert settings.network_pod_annotations == fast_network["podAnnotations"]
    assert settings.network_env == {k: str(v) for k, v in fast_network["env"].items()}
    assert settings.ipc_lock == fast_network["ipcLock"]
    assert settings.vllm_port == job_defaults["vllmPort"]
    assert settings.model_cache_claim == job_defaults["modelCacheClaim"]
    assert dict(settings.tracking_defaults) == job_defaults["tracking"]
    assert settings.weight_sync_port == job_defaults["weightSyncPort"]
    assert settings.master_port == job_defaults["masterPort"]
    assert settings.http_port == merged["operator"]["httpPort"]
    assert settings.workers == merged["operator"]["workers"]
    assert settings.resync_seconds == merged["operator"]["resyncSeconds"]
    assert settings.child_event_batch_seconds == merged["operator"]["childEventBatchSeconds"]
    assert settings.volume_wait_reported_seconds == merged["operator"]["volumeWaitReportedSeconds"]
    assert settings.clusterwide == merged["watch"]["allNamespaces"]
    assert set(settings.namespaces) == set(merged["watch"]["namespaces"])
    assert list(settings.metrics_scrapers) == merged["metrics"]["podMonitors"]["generation"]["allowFrom"]
    assert list(settings.trainer_metrics_scrapers) == merged["metrics"]["podMonitors"]["trainer"]["allowFrom"]
    assert list(settings.image_pull_secrets) == job_defaults["imagePullSecrets"]
    limits = merged["platformPolicy"]
    assert list(settings.allowed_image_prefixes) == limits["allowedImagePrefixes"]
    assert list(settings.allowed_priority_classes) == limits["allowedPriorityClasses"]
    assert list(settings.allowed_toleration_keys) == limits["allowedTolerationKeys"]
    assert list(settings.allowed_node_selectors) == limits["allowedNodeSelectors"]
    assert settings.allow_existing_claims == limits["existingClaims"]["allowed"]
    assert list(settings.allowed_existing_claims) == limits["existingClaims"]["names"]
    assert settings.max_gpus_per_job == limits["maxGpusPerJob"]
    assert list(settings.gpu_resource_names) == limits["gpuResourceNames"]
    assert settings.default_queue_name == limits["queue"]["default"]
    assert list(settings.allowed_queue_names) == limits["queue"]["allowed"]
    assert settings.require_queue_name == limits["queue"]["required"]
    pricing = merged["pricing"]
    if pricing["currency"]:
        assert settings.price_table is not None
        assert settings.price_table.model_dump(by_alias=True) == pricing
    else:
        assert settings.price_table is None, "without a currency the chart sets no prices"
    assert dict(settings.namespace_budgets) == merged["budgets"]["namespaces"]
    assert [dict(t) for t in settings.team_policies] == merged["teams"]
    for team in merged["teams"]:
        for namespace in team["namespaces"]:
            scoped = settings.for_namespace(namespace)
            assert scoped.max_gpus_per_job == team.get("maxGpusPerJob", limits["maxGpusPerJob"])
            images = {**job_defaults["images"], **team.get("images", {})}
            assert (scoped.trainer_image, scoped.vllm_image) == (images["trainer"], images["generation"])
    for namespace in merged["budgets"]["namespaces"]:
        assert settings.namespace_budget(namespace) is not None


def deep_merge(base: Any, override: Any) -> Any:
    if isinstance(base, dict) and isinstance(override, dict):
        return {
            k: deep_merge(base.get(k), override[k]) if k in override else base[k] for k in {*base, *override}
        }
    return override if override is not None else base


def test_custom_values_reach_the_pod() -> None:
    docs = render([VALUES_DIR / "custom.yaml"])
    deployment = one(docs, "Deployment", "grpo-ctl")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == (
        "registry.example.com/ml/grpo-operator@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    )
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["tolerations"][0]["key"] == "CriticalAddonsOnly"
    assert "nodeAffinity" in pod["affinity"]
    assert {"--verbose", "--log-format=json"} <= set(container["args"])
    assert container["ports"][0]["containerPort"] == 9091
    assert deployment["spec"]["template"]["metadata"]["annotations"] == {"example.com/owner": "ml-platform"}
    assert deployment["spec"]["template"]["metadata"]["labels"]["team"] == "ml-platform"
