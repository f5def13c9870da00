"""The Helm chart, rendered offline: lint, a values matrix validated by kubeconform against the Kubernetes
and CRD schemas, values.schema.json, RBAC, Pod Security, and the wiring between the chart and the code
(operator settings, CLI flags, pod labels and ports the monitors select)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from grpo_operator.builders import job_from_object
from grpo_operator.builders.child_kinds import CHILD_KINDS
from grpo_operator.builders.gang import generation_pod, trainer_pod
from grpo_operator.builders.network import generation_network_policy
from grpo_operator.cli import _parser
from grpo_operator.settings import ENV_PREFIX, OperatorSettings

from hack.helm import kube_schemas
from tests.helm.chart import (
    CHART,
    MONITORING_APIS,
    NAMESPACE,
    REPO,
    VALUES_DIR,
    Doc,
    env_of,
    find,
    helm,
    kubeconform,
    one,
    render,
    render_text,
    run,
    values_files,
)
from tests.unit.test_pod_security import RESTRICTED_VOLUME_TYPES

FULLNAME = "grpo-grpo-operator"
ALL_KINDS = [
    ("v1", "ServiceAccount"),
    ("v1", "Service"),
    ("v1", "ConfigMap"),
    ("apps/v1", "Deployment"),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("grpo.dev/v1alpha1", "GRPOJob"),
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"),
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"),
]


@pytest.fixture(scope="session")
def schema_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Strict JSON schemas for every kind the chart renders, from Kubernetes' OpenAPI and the CRDs."""
    out = tmp_path_factory.mktemp("kube-schemas")
    crds = [*sorted((CHART / "crds").glob("*.yaml")), *kube_schemas.prometheus_operator_crds()]
    kube_schemas.write_schemas(out, ALL_KINDS, swagger=kube_schemas.kubernetes_swagger(), crd_files=crds)
    return out


def kubeconform_check(schema_dir: Path, manifests: Path) -> str:
    location = f"{schema_dir}/{kube_schemas.LOCATION_TEMPLATE}"
    proc = run(
        [kubeconform(), "-strict", "-summary", "-schema-location", location, str(manifests)],
        check=False,
    )
    assert proc.returncode == 0, f"kubeconform rejected {manifests.name}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


# --- lint and the values matrix --------------------------------------------------------------------


LINTABLE = [p for p in values_files() if p.stem in ("default", "byo-rbac", "custom")]


@pytest.mark.parametrize("values", LINTABLE, ids=lambda p: p.stem)
def test_helm_lint_strict(values: Path) -> None:
    # Values with monitoring on are not linted: `helm lint` cannot be told that the monitoring APIs
    # exist, and the chart refuses to render monitors for a cluster without them (tested below).
    proc = run([helm(), "lint", "--strict", str(CHART), "--values", str(values)], check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize("values", values_files(), ids=lambda p: p.stem)
def test_every_values_file_renders_to_valid_kubernetes_objects(
    values: Path, schema_dir: Path, tmp_path: Path
) -> None:
    text = render_text([values], api_versions=MONITORING_APIS, include_crds=True).stdout
    manifests = tmp_path / f"{values.stem}.yaml"
    manifests.write_text(text)
    summary = kubeconform_check(schema_dir, manifests)
    docs = [d for d in yaml.safe_load_all(text) if d]
    assert f"Valid: {len(docs)}, Invalid: 0, Errors: 0, Skipped: 0" in summary


def test_kubeconform_schemas_are_strict(schema_dir: Path, tmp_path: Path) -> None:
    """A misspelled field must fail validation; otherwise the matrix above would prove nothing."""
    docs = render([VALUES_DIR / "monitoring.yaml"], api_versions=MONITORING_APIS)
    typos: list[tuple[str, Any]] = [
        (
            "Deployment",
            lambda d: d["spec"]["template"]["spec"]["containers"][0].update(imagePullPolice="Always"),
        ),
        ("PodMonitor", lambda d: d["spec"]["podMetricsEndpoints"][0].update(honorLabel=True)),
        ("ClusterRole", lambda d: d["rules"][0].update(verb=["get"])),
    ]
    for kind, corrupt in typos:
        doc = json.loads(json.dumps(find(docs, kind)[0]))
        corrupt(doc)
        path = tmp_path / f"bad-{kind}.yaml"
        path.write_text(yaml.safe_dump(doc))
        location = f"{schema_dir}/{kube_schemas.LOCATION_TEMPLATE}"
        proc = run([kubeconform(), "-strict", "-schema-location", location, str(path)], check=False)
        assert proc.returncode != 0 and "additional properties" in proc.stdout, (kind, proc.stdout)


def test_example_grpojobs_validate_against_the_crd_schema(schema_dir: Path) -> None:
    examples = sorted(REPO.glob("examples/**/grpojob.yaml")) + sorted(REPO.glob("examples/*.yaml"))
    assert examples
    for path in examples:
        kubeconform_check(schema_dir, path)


# --- values.schema.json ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        ({"imagee.tag": "1"}, "additional properties 'imagee' not allowed"),
        ({"metrics.serviceMonitor.enabeld": "true"}, "additional properties 'enabeld' not allowed"),
        (
            {"prometheusRule.alerts.GRPOJobFailed.treshold": "1"},
            "additional properties 'treshold' not allowed",
        ),
        ({"operator.workers": "0"}, "workers"),
        ({"image.pullPolicy": "Sometimes"}, "pullPolicy"),
        ({"watch.namespaces[0]": "Team_A"}, "namespaces"),
        ({"jobDefaults.resources.trainer.requests.cpu": "lots"}, "cpu"),
        ({"prometheusRule.alerts.GRPOJobNoLearningSignal.threshold": "1.5"}, "threshold"),
        ({"prometheusRule.alerts.GRPOJobFailed.severity": "page"}, "severity"),
        ({"metrics.serviceMonitor.interval": "30 seconds"}, "interval"),
        ({"platformPolicy.maxGpusPerJob": "-1"}, "maxGpusPerJob"),
        (
            {"platformPolicy.allowedImagePrefix[0]": "x/"},
            "additional properties 'allowedImagePrefix' not allowed",
        ),
        ({"platformPolicy.queue.allowed[0]": "Team_A"}, "allowed"),
        (
            {"metrics.podMonitors.generation.allowFrom[0].podSelectr.matchLabels.app": "prometheus"},
            "additional properties 'podSelectr' not allowed",
        ),
        (
            # A misspelt matchLabels would otherwise leave an empty selector: every pod.
            {"metrics.podMonitors.generation.allowFrom[0].podSelector.matchLabel.app": "prometheus"},
            "additional properties 'matchLabel' not allowed",
        ),
        (
            {
                "metrics.podMonitors.generation.allowFrom[0].ipBlock.cidr": "10.0.0.0/8",
                "metrics.podMonitors.generation.allowFrom[0].podSelector.matchLabels.app": "prometheus",
            },
            "allowFrom/0': maxProperties",
        ),
    ],
)
def test_values_schema_rejects_bad_values(sets: dict[str, str], message: str) -> None:
    proc = render_text(sets=sets, check=False)
    assert proc.returncode != 0, proc.stdout[:500]
    assert "values don't meet the specifications of the schema" in proc.stderr
    assert message in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            {"watch.namespaces[0]": "team-a"},
            "watch.allNamespaces is true and watch.namespaces is set: choose one",
        ),
        ({"watch.allNamespaces": "false"}, "watch.allNamespaces is false but watch.namespaces is empty"),
        (
            {"serviceAccount.create": "false"},
            "serviceAccount.name is required when serviceAccount.create is false",
        ),
    ],
)
def test_inconsistent_values_fail_with_a_clear_message(sets: dict[str, str], message: str) -> None:
    proc = render_text(sets=sets, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("value", "api"),
    [
        ("metrics.serviceMonitor.enabled", "monitoring.coreos.com/v1/ServiceMonitor"),
        ("metrics.podMonitors.trainer.enabled", "monitoring.coreos.com/v1/PodMonitor"),
        ("metrics.podMonitors.generation.enabled", "monitoring.coreos.com/v1/PodMonitor"),
        ("prometheusRule.enabled", "monitoring.coreos.com/v1/PrometheusRule"),
    ],
)
def test_monitoring_without_the_prometheus_operator_fails_instead_of_dropping_objects(
    value: str, api: str
) -> None:
    proc = render_text(sets={value: "true"}, check=False)
    assert proc.returncode != 0
    assert f"{value}=true needs the {api} API" in proc.stderr
    assert f"--api-versions {api}" in proc.stderr


# --- the default install -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def defaults() -> list[Doc]:
    return render()


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
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicy",
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
    assert settings.shm_size == job_defaults["shmSize"]
    assert settings.trainer_termination_grace_seconds == job_defaults["trainerTerminationGracePeriodSeconds"]
    assert settings.trainer_metrics_port == job_defaults["trainerMetricsPort"]
    pod_security = job_defaults["podSecurity"]
    assert settings.pod_security == pod_security["level"]
    assert settings.pod_run_as_user == pod_security["runAsUser"]
    assert settings.pod_run_as_group == pod_security["runAsGroup"]
    assert settings.pod_fs_group == pod_security["fsGroup"]
    assert settings.vllm_port == job_defaults["vllmPort"]
    assert settings.model_cache_claim == job_defaults["modelCacheClaim"]
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


# --- RBAC -----------------------------------------------------------------------------------------------

# The operator's rules, spelled out: a change to the chart's RBAC must change this table too, on purpose.
# Why each verb is needed: templates/operator-rbac.yaml and docs/platform.md. The children's rows are
# exactly the verbs each child kind's record names (builders/child_kinds.py), which the runtime uses.
NAMESPACED_RULES = {
    ("grpo.dev", "grpojobs"): {"get", "list", "watch", "patch", "delete"},
    ("grpo.dev", "grpojobs/status"): {"get", "patch"},
    ("grpo.dev", "grpojobs/finalizers"): {"update"},
    **{(k.group, k.plural): set(k.verbs) for k in CHILD_KINDS if k.namespaced},
    ("", "events"): {"create"},
}
CLUSTER_RULES = {
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
    ("", "nodes"): {"list", "watch"},
    ("storage.k8s.io", "storageclasses"): {"list", "watch"},
}


def flatten(rules: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in rules:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"], rule
        assert not rule.get("resourceNames"), rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def test_cluster_wide_rbac_is_exactly_the_documented_rules(defaults: list[Doc]) -> None:
    role = one(defaults, "ClusterRole", FULLNAME)
    assert flatten(role["rules"]) == {**CLUSTER_RULES, **NAMESPACED_RULES}
    binding = one(defaults, "ClusterRoleBinding", FULLNAME)
    assert binding["roleRef"]["name"] == FULLNAME
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}]
    assert not find(defaults, "Role") and not find(defaults, "RoleBinding")


def test_kueue_enabled_adds_only_get_on_workloads() -> None:
    # What lets a queued job's status carry Kueue's reason (docs/kueue.md); read-only, nothing more.
    docs = render(sets={"kueue.enabled": "true"})
    role = one(docs, "ClusterRole", FULLNAME)
    kueue_rules = {("kueue.x-k8s.io", "workloads"): {"get"}}
    assert flatten(role["rules"]) == {**CLUSTER_RULES, **NAMESPACED_RULES, **kueue_rules}


def test_namespaced_watch_gets_roles_in_each_namespace_only() -> None:
    docs = render([VALUES_DIR / "namespaced.yaml"], api_versions=MONITORING_APIS)
    cluster_role = one(docs, "ClusterRole", FULLNAME)
    assert flatten(cluster_role["rules"]) == {**CLUSTER_RULES, ("", "namespaces"): {"list", "watch"}}
    for ns in ("team-a", "team-b"):
        role = one(docs, "Role", FULLNAME, ns)
        assert flatten(role["rules"]) == NAMESPACED_RULES
        binding = one(docs, "RoleBinding", FULLNAME, ns)
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": FULLNAME,
        }
        assert binding["subjects"][0]["namespace"] == NAMESPACE
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args and "--all-namespaces" not in args
    pod_monitor = one(docs, "PodMonitor")
    assert pod_monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
    alerts = {r["alert"] for g in one(docs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]}
    assert "GRPOJobNoLearningSignal" not in alerts and "GRPOJobFormatFailureRatioHigh" in alerts


def test_no_secret_access_anywhere() -> None:
    for values in values_files():
        for doc in render([values], api_versions=MONITORING_APIS):
            if doc["kind"] in ("ClusterRole", "Role"):
                for rule in doc["rules"]:
                    assert "secrets" not in rule["resources"], (values.stem, doc["metadata"]["name"], rule)


def test_rbac_can_be_left_to_the_platform_team() -> None:
    docs = render([VALUES_DIR / "byo-rbac.yaml"])
    admission = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    assert {d["kind"] for d in docs} - admission == {"Deployment", "Service"}
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "platform-grpo-operator"
    # The admission policies exempt the operator by the ServiceAccount it really runs as.
    labels = one(docs, "ValidatingAdmissionPolicy", f"{FULLNAME}-job-labels")
    assert labels["spec"]["matchConditions"][0]["expression"] == (
        f"request.userInfo.username != 'system:serviceaccount:{NAMESPACE}:platform-grpo-operator'"
    )


def test_user_roles_aggregate_into_admin_edit_and_view(defaults: list[Doc]) -> None:
    edit = one(defaults, "ClusterRole", f"{FULLNAME}-edit")
    view = one(defaults, "ClusterRole", f"{FULLNAME}-view")
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert "rbac.authorization.k8s.io/aggregate-to-edit" not in view["metadata"]["labels"]
    assert flatten(edit["rules"]) == {
        ("grpo.dev", "grpojobs"): {
            "get",
            "list",
            "watch",
            "create",
            "update",
            "patch",
            "delete",
            "deletecollection",
        },
        ("grpo.dev", "grpojobs/status"): {"get"},
    }
    assert flatten(view["rules"]) == {
        ("grpo.dev", "grpojobs"): {"get", "list", "watch"},
        ("grpo.dev", "grpojobs/status"): {"get", "list", "watch"},
    }


# --- monitoring objects select what the operator creates ------------------------------------------------


@pytest.fixture(scope="module")
def monitoring() -> list[Doc]:
    return render([VALUES_DIR / "monitoring.yaml"], api_versions=MONITORING_APIS)


SMALL_JOB: Doc = {
    "apiVersion": "grpo.dev/v1alpha1",
    "kind": "GRPOJob",
    "metadata": {"name": "math", "namespace": "team-a", "uid": "uid-1", "generation": 1},
    "spec": {
        "model": {"name": "Qwen/Qwen2.5-1.5B-Instruct"},
        "dataset": {"train": "hf://openai/gsm8k:main#train"},
        "grpo": {"groupSize": 8, "promptsPerStep": 4, "steps": 10},
        "metric": {"image": "ghcr.io/grpo-operator/metric-math:0.1.0"},
    },
}


@pytest.fixture(scope="module")
def job_pods() -> Iterator[dict[str, Doc]]:
    """A real trainer gang as the operator's builders make it (2 nodes: rank 0 and rank 1)."""
    spec = {
        **SMALL_JOB["spec"],
        "trainer": {"nodes": 2, "gpusPerNode": 2},
        "checkpoints": {"volume": {"accessMode": "ReadWriteMany"}},
    }
    job = job_from_object({**SMALL_JOB, "spec": spec})
    settings = OperatorSettings()
    yield {
        "rank0": trainer_pod(job, settings, 1, 0, ""),
        "rank1": trainer_pod(job, settings, 1, 1, ""),
        "generation": generation_pod(job, settings, 1, 0),
    }


def selects(monitor: Doc, pod: Doc) -> bool:
    wanted: dict[str, str] = monitor["spec"]["selector"]["matchLabels"]
    labels: dict[str, str] = pod["metadata"]["labels"]
    return wanted.items() <= labels.items()


def test_trainer_pod_monitor_scrapes_rank_0_only(monitoring: list[Doc], job_pods: dict[str, Doc]) -> None:
    monitor = one(monitoring, "PodMonitor", f"{FULLNAME}-trainer")
    assert selects(monitor, job_pods["rank0"]) and not selects(monitor, job_pods["rank1"])
    assert not selects(monitor, job_pods["generation"])
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    assert endpoint["port"] in {p["name"] for p in job_pods["rank0"]["spec"]["containers"][0]["ports"]}


@pytest.mark.parametrize("role", ["trainer", "generation"])
def test_pod_monitors_do_not_trust_labels_from_tenant_pods(monitoring: list[Doc], role: str) -> None:
    """Trainer and vLLM images are tenant code: with honorLabels their own namespace/grpojob labels would
    win over Kubernetes' (tests/helm/test_monitoring_labels.py shows it against a real Prometheus)."""
    endpoint = one(monitoring, "PodMonitor", f"{FULLNAME}-{role}")["spec"]["podMetricsEndpoints"][0]
    assert not endpoint.get("honorLabels", False)


def test_generation_pod_monitor_scrapes_vllm(monitoring: list[Doc], job_pods: dict[str, Doc]) -> None:
    monitor = one(monitoring, "PodMonitor", f"{FULLNAME}-generation")
    assert selects(monitor, job_pods["generation"]) and not selects(monitor, job_pods["rank0"])
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    assert endpoint["port"] in {p["name"] for p in job_pods["generation"]["spec"]["containers"][0]["ports"]}
    assert endpoint["interval"] == "30s"


@pytest.mark.parametrize("role", ["trainer", "generation"])
def test_pod_monitors_carry_the_job_name_into_grpojob(
    monitoring: list[Doc], job_pods: dict[str, Doc], role: str
) -> None:
    monitor = one(monitoring, "PodMonitor", f"{FULLNAME}-{role}")
    relabel = monitor["spec"]["podMetricsEndpoints"][0]["relabelings"][0]
    assert relabel["targetLabel"] == "grpojob"
    # Kubernetes SD exposes pod label L as __meta_kubernetes_pod_label_<L with [^a-zA-Z0-9_] -> _>.
    (source,) = relabel["sourceLabels"]
    pod = job_pods["rank0" if role == "trainer" else "generation"]
    exposed = {
        "__meta_kubernetes_pod_label_" + "".join(c if c.isalnum() or c == "_" else "_" for c in k): v
        for k, v in pod["metadata"]["labels"].items()
    }
    assert exposed[source] == "math"
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert monitor["spec"]["namespaceSelector"] == {"any": True}


PROMETHEUS_PEER = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}


@pytest.mark.parametrize("pod_monitor", [True, False], ids=["with-podmonitor", "without-podmonitor"])
def test_allow_from_admits_the_scraper_to_the_port_the_vllm_monitor_scrapes(
    pod_monitor: bool, job_pods: dict[str, Doc], tmp_path: Path
) -> None:
    """allowFrom reaches the operator as GRPO_OPERATOR_METRICS_SCRAPERS, and the settings parsed from it
    give every job's vLLM NetworkPolicy a rule for exactly the port the generation PodMonitor scrapes.
    It does not depend on the PodMonitor being on: a Prometheus without the Prometheus Operator needs it too."""
    extra = tmp_path / "allow-from.yaml"
    extra.write_text(
        yaml.safe_dump({"metrics": {"podMonitors": {"generation": {"allowFrom": [PROMETHEUS_PEER]}}}})
    )
    files = [VALUES_DIR / "monitoring.yaml", extra] if pod_monitor else [extra]
    docs = render(files, api_versions=MONITORING_APIS)
    env = env_of(one(docs, "Deployment"))
    assert json.loads(env[ENV_PREFIX + "METRICS_SCRAPERS"]) == [PROMETHEUS_PEER]
    settings = OperatorSettings.from_env(env)
    job = job_from_object(SMALL_JOB)
    ingress = generation_network_policy(job, settings)["spec"]["ingress"]
    assert len(ingress) == 2
    assert ingress[1]["from"] == [PROMETHEUS_PEER]
    (port,) = ingress[1]["ports"]
    vllm_ports = {
        p["name"]: p["containerPort"] for p in job_pods["generation"]["spec"]["containers"][0]["ports"]
    }
    scraped = "http"
    if pod_monitor:
        scraped = one(docs, "PodMonitor", f"{FULLNAME}-generation")["spec"]["podMetricsEndpoints"][0]["port"]
    assert port == {"protocol": "TCP", "port": vllm_ports[scraped]}


def test_without_allow_from_vllm_admits_only_the_trainers(monitoring: list[Doc]) -> None:
    env = env_of(one(monitoring, "Deployment"))
    assert env[ENV_PREFIX + "METRICS_SCRAPERS"] == "[]"
    job = job_from_object(SMALL_JOB)
    ingress = generation_network_policy(job, OperatorSettings.from_env(env))["spec"]["ingress"]
    assert len(ingress) == 1 and "ports" not in ingress[0]


def test_service_monitor_selects_the_metrics_service(monitoring: list[Doc]) -> None:
    monitor = one(monitoring, "ServiceMonitor", FULLNAME)
    service = one(monitoring, "Service", f"{FULLNAME}-metrics")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
    # The operator's per-job series carry the job's namespace, which must not be overwritten by the target's.
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True
    assert monitor["metadata"]["labels"]["release"] == "kps"


def test_dashboard_configmap_carries_the_generated_json(monitoring: list[Doc]) -> None:
    cm = one(monitoring, "ConfigMap", f"{FULLNAME}-dashboard", "monitoring")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "GRPO"}
    shipped = json.loads(cm["data"]["grpo-operator.json"])
    assert shipped == json.loads((CHART / "files" / "dashboards" / "grpo-operator.json").read_text())
    assert shipped["uid"] == "grpo-operator"


def test_every_alert_has_severity_summary_description_and_a_runbook_in_docs(monitoring: list[Doc]) -> None:
    groups = one(monitoring, "PrometheusRule")["spec"]["groups"]
    names = set()
    base = "https://github.com/grpo-operator/grpo-operator/blob/main/docs/runbooks/"
    for rule in (r for g in groups for r in g["rules"]):
        name = rule["alert"]
        names.add(name)
        assert rule["labels"]["severity"] in ("critical", "warning", "info")
        assert rule["labels"]["team"] == "ml-platform"
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        url = rule["annotations"]["runbook_url"]
        assert url == base + f"{name}.md"
        runbook = REPO / "docs" / "runbooks" / f"{name}.md"
        assert runbook.is_file(), f"{name} links to {runbook}, which does not exist"
        assert name in runbook.read_text()
    chart_alerts = set(yaml.safe_load((CHART / "values.yaml").read_text())["prometheusRule"]["alerts"])
    assert names == chart_alerts


def test_default_values_keep_the_schema_and_values_file_in_step() -> None:
    """Every key in values.yaml is described by values.schema.json (so none is rejected by default)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(node: Any, sch: dict[str, Any], path: str) -> None:
        if not isinstance(node, dict) or sch.get("additionalProperties") is not False:
            return
        props = sch.get("properties", {})
        for key, value in node.items():
            assert key in props, f"{path}{key} is in values.yaml but not in values.schema.json"
            walk(value, props[key], f"{path}{key}.")

    walk(values, schema, "")


# --- admission policies --------------------------------------------------------------------------------

POLICIES = ("platform-limits", "trainer-status", "job-labels")
OPERATOR_USER = f"system:serviceaccount:{NAMESPACE}:{FULLNAME}"


def test_admission_policies_are_bound_cluster_wide_and_exempt_the_operator(defaults: list[Doc]) -> None:
    for suffix in POLICIES:
        policy = one(defaults, "ValidatingAdmissionPolicy", f"{FULLNAME}-{suffix}")
        assert policy["spec"]["failurePolicy"] == "Fail"
        binding = one(defaults, "ValidatingAdmissionPolicyBinding", f"{FULLNAME}-{suffix}")
        assert binding["spec"]["policyName"] == f"{FULLNAME}-{suffix}"
        assert binding["spec"]["validationActions"] == ["Deny"]
        assert "matchResources" not in binding["spec"], "watch.allNamespaces: every namespace"
    for suffix in ("trainer-status", "job-labels"):
        policy = one(defaults, "ValidatingAdmissionPolicy", f"{FULLNAME}-{suffix}")
        conditions = " ".join(c["expression"] for c in policy["spec"]["matchConditions"])
        assert f"!= '{OPERATOR_USER}'" in conditions, conditions
    labels = one(defaults, "ValidatingAdmissionPolicy", f"{FULLNAME}-job-labels")
    controller = next(v for v in labels["spec"]["variables"] if v["name"] == "controller")
    assert "'system:serviceaccount:kube-system:replicaset-controller'" in controller["expression"]


def test_admission_policies_cover_only_the_watched_namespaces() -> None:
    docs = render([VALUES_DIR / "namespaced.yaml"], api_versions=MONITORING_APIS)
    for suffix in POLICIES:
        binding = one(docs, "ValidatingAdmissionPolicyBinding", f"{FULLNAME}-{suffix}")
        assert binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"] == [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}
        ]


def test_admission_policies_can_be_left_out() -> None:
    docs = render(sets={"admissionPolicies.enabled": "false"})
    assert not find(docs, "ValidatingAdmissionPolicy") and not find(docs, "ValidatingAdmissionPolicyBinding")


def test_platform_limits_in_the_policy_are_the_values_the_operator_gets() -> None:
    docs = render([VALUES_DIR / "platform-policy.yaml"])
    policy = one(docs, "ValidatingAdmissionPolicy", f"{FULLNAME}-platform-limits")
    # The limits are CEL literals: JSON lists, booleans and integers read as the same values in CEL.
    literals = {v["name"]: json.loads(v["expression"]) for v in policy["spec"]["variables"][:9]}
    settings = OperatorSettings.from_env(env_of(one(docs, "Deployment")))
    assert literals == {
        "prefixes": list(settings.allowed_image_prefixes),
        "priorityClasses": list(settings.allowed_priority_classes),
        "tolerationKeys": list(settings.allowed_toleration_keys),
        "nodeSelectors": list(settings.allowed_node_selectors),
        "claimsAllowed": settings.allow_existing_claims,
        "claimNames": list(settings.allowed_existing_claims),
        "queues": list(settings.allowed_queue_names),
        # With a default queue, every job ends up in a queue: the policy need not ask for one.
        "queueRequired": settings.require_queue_name and not settings.default_queue_name,
        "maxGpus": settings.max_gpus_per_job,
    }
    assert settings.max_gpus_per_job == 16 and settings.default_queue_name == "team-default"
    assert literals["prefixes"] == ["registry.example.com/", "ghcr.io/grpo-operator/", "vllm/vllm-openai:"]
    # What counts as a GPU: the operator's names, split into exact names and "*" prefixes for CEL.
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    names = json.loads(variables["gpuNames"])
    prefixes = json.loads(variables["gpuPrefixes"])
    assert set(names) == {
        settings.gpu_resource,
        *(n for n in settings.gpu_resource_names if not n.endswith("*")),
    }
    assert prefixes == [n[:-1] for n in settings.gpu_resource_names if n.endswith("*")] == ["nvidia.com/mig-"]


def test_the_policy_judges_exactly_the_claims_the_operator_judges(defaults: list[Doc]) -> None:
    """The policy's list of mounted claims is the operator's CLAIM_FIELDS in CEL: a claim field added to
    the operator's list without the policy (or the other way round) fails here."""
    from grpo_operator.reconcile.policy import claims_cel

    policy = one(defaults, "ValidatingAdmissionPolicy", f"{FULLNAME}-platform-limits")
    claims = next(v for v in policy["spec"]["variables"] if v["name"] == "claims")
    assert claims["expression"] == claims_cel()


def test_a_default_queue_outside_the_allowed_queues_fails_the_install() -> None:
    proc = render_text(
        sets={"platformPolicy.queue.default": "q", "platformPolicy.queue.allowed[0]": "r"}, check=False
    )
    assert proc.returncode != 0
    assert 'platformPolicy.queue.default "q" is not in platformPolicy.queue.allowed' in proc.stderr


def test_trainer_status_policy_freezes_exactly_the_operators_status_fields(defaults: list[Doc]) -> None:
    """Each status field is either the operator's (frozen for the trainer) or the trainer's; a field
    added to the status model without a decision here fails this test."""
    from grpo_operator.api.status import GRPOJobStatus
    from grpo_operator.reconcile import OWNED_STATUS_FIELDS
    from grpo_trainer.status import OWNED_FIELDS as TRAINER_FIELDS

    policy = one(defaults, "ValidatingAdmissionPolicy", f"{FULLNAME}-trainer-status")
    frozen = {
        message.split("not status.")[1].split(" ")[0]
        for v in policy["spec"]["validations"]
        if "not status." in (message := v.get("message", ""))
    }
    every_field = {f.alias or name for name, f in GRPOJobStatus.model_fields.items()}
    assert frozen == set(OWNED_STATUS_FIELDS)
    assert frozen | set(TRAINER_FIELDS) == every_field and not frozen & set(TRAINER_FIELDS)
