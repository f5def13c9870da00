"""The Helm chart itself, rendered offline: `helm lint`, a values matrix validated by kubeconform against
the Kubernetes and CRD schemas, the examples against the CRD schema, and values.schema.json. What the
rendered objects say is checked by the other tests/helm/test_chart_*.py files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack.helm import kube_schemas
from tests.helm.chart import (
    CHART,
    MONITORING_APIS,
    REPO,
    VALUES_DIR,
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
        ({"jobDefaults.fastNetwork.resources.rdma": "1"}, "invalid propertyName 'rdma'"),
        ({"jobDefaults.fastNetwork.resources.rdma/hca": "0"}, "rdma~1hca': minimum: got 0, want 1"),
        ({"jobDefaults.fastNetwork.env.NCCL-IB-HCA": "mlx5_0"}, "invalid propertyName 'NCCL-IB-HCA'"),
        ({"jobDefaults.fastNetwork.ipcLoc": "true"}, "additional properties 'ipcLoc' not allowed"),
        # IPC_LOCK is allowed by the privileged Pod Security Standard alone, and nothing else needs that level.
        ({"jobDefaults.fastNetwork.ipcLock": "true"}, "podSecurity/level': value must be 'privileged'"),
        ({"jobDefaults.podSecurity.level": "privileged"}, "podSecurity/level': 'not' failed"),
        ({"pricing.currency": "US dollars"}, "pricing/currency"),
        ({"pricing.gpuHour.default": "-1"}, "default': minimum: got -1, want 0"),
        ({"pricing.gpuHour.nodeLabels.h100": "4"}, "invalid propertyName 'h100'"),
        ({"budgets.namespaces.team-a.default.warnAtPercent": "90"}, "default': 'anyOf' failed"),
        ({"budgets.namespaces.team-a.maxGpuHours": "0"}, "maxGpuHours': exclusiveMinimum"),
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
        (
            {"budgets.namespaces.team-a.maxAmount": "100"},
            "budgets.namespaces.team-a limits an amount, but pricing.currency is empty",
        ),
    ],
)
def test_inconsistent_values_fail_with_a_clear_message(sets: dict[str, str], message: str) -> None:
    proc = render_text(sets=sets, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("sets", "role", "image"),
    [
        ({}, "trainer", "ghcr.io/grpo-operator/trainer:0.1.0"),
        (
            # The project's trainer image allowed, its vLLM image (the default generation image) not.
            {"platformPolicy.allowedImagePrefixes[1]": "ghcr.io/grpo-operator/trainer:"},
            "generation",
            "ghcr.io/grpo-operator/vllm:0.1.0",
        ),
        (
            # A lookalike registry is not under the prefix: matched on path boundaries, as the operator does.
            {
                "jobDefaults.images.trainer": "registry.example.com.evil.io/trainer:1",
                "jobDefaults.images.generation": "registry.example.com/vllm/vllm-openai:v0.31.0",
            },
            "trainer",
            "registry.example.com.evil.io/trainer:1",
        ),
    ],
    ids=["trainer", "generation", "lookalike"],
)
def test_the_chart_refuses_default_images_outside_the_allowed_prefixes(
    sets: dict[str, str], role: str, image: str
) -> None:
    """Every job that names no image runs jobDefaults.images: outside the allow-list, each would be refused."""
    proc = render_text(
        sets={"platformPolicy.allowedImagePrefixes[0]": "registry.example.com", **sets}, check=False
    )
    assert proc.returncode != 0, proc.stdout[:500]
    assert (
        f'jobDefaults.images.{role} "{image}" is not under platformPolicy.allowedImagePrefixes' in proc.stderr
    )
    assert f"set jobDefaults.images.{role} to your registry's copy of it" in proc.stderr, proc.stderr


def test_default_images_under_the_allowed_prefixes_render_into_the_operator_settings() -> None:
    mirror = {
        "platformPolicy.allowedImagePrefixes[0]": "registry.example.com",
        "jobDefaults.images.trainer": "registry.example.com/grpo/trainer:0.1.0",
        "jobDefaults.images.generation": "registry.example.com/vllm/vllm-openai:v0.31.0",
    }
    env = env_of(one(render(sets=mirror), "Deployment"))
    assert env["GRPO_OPERATOR_TRAINER_IMAGE"] == "registry.example.com/grpo/trainer:0.1.0"
    assert env["GRPO_OPERATOR_VLLM_IMAGE"] == "registry.example.com/vllm/vllm-openai:v0.31.0"


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
