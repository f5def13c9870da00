"""The chart's monitoring objects, rendered offline: the PodMonitors and ServiceMonitor select the pods
and Service the operator's builders make, the scrapers allowed into vLLM's port, the dashboard ConfigMap,
and an alert rule with a runbook for every alert."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from grpo_operator.builders import job_from_object
from grpo_operator.builders.gang import generation_pod, trainer_pod
from grpo_operator.builders.network import generation_network_policy
from grpo_operator.settings import ENV_PREFIX, OperatorSettings

from tests.helm.chart import (
    CHART,
    FULLNAME,
    MONITORING_APIS,
    NAMESPACE,
    REPO,
    VALUES_DIR,
    Doc,
    env_of,
    one,
    render,
)

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
