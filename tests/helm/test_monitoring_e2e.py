"""End to end: a real Prometheus (Debian's package) scrapes the operator and a CPU training run the way
the chart's ServiceMonitor and PodMonitor tell a Prometheus Operator to, loads the chart's alert rules,
and every dashboard panel's query returns data.

What happens, all against the local cluster:
- the chart is installed (monitors included, against the Prometheus Operator's CRDs) watching two
  namespaces; the operator runs as its ServiceAccount (tests/helm/cluster.py);
- namespace A runs the tiny demo job for real on the CPU (the test harness's local runner plays the
  kubelet); after the first checkpoint the trainer is killed (SIGKILL, exit 137 as a kubelet reports it),
  so the operator restarts the gang and it resumes from that checkpoint;
- namespace B has a ResourceQuota of zero pods and a job, so the operator meets real API errors;
- Prometheus's scrape configuration is derived from the installed ServiceMonitor and PodMonitor: the same
  job names, target labels and relabelings the Prometheus Operator generates (Kubernetes service
  discovery is replaced by file-based discovery carrying the same __meta_kubernetes_* labels, because the
  pods are simulated and the processes are local). Intervals are 1s instead of 15-30s to keep it short.

The training run here generates in-process (no vLLM server: its start-up would double this test's
time), so panels that query vllm: metrics are reported as "exported by vLLM, not scraped here" — the test
asserts that exactly those panels are the ones without data. That their names are what vLLM exports is
checked against a real vLLM server's /metrics in tests/trainer/test_vllm_weight_sync.py.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness.kube import Cluster, wait_for
from tests.harness.kubelet_kill import kill_like_a_kubelet
from tests.harness.local_runner import LocalJobRunner
from tests.harness.ports import free_port
from tests.helm.chart import REPO, metric_names, prometheus
from tests.helm.cluster import apply_monitoring_crds, helm_cmd, helm_install, operator_as

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

STEPS = 24  # long enough (several seconds of training) for 1 s scrapes to see every gauge
METRIC_IMAGE = "ghcr.io/grpo-operator/metric-tiny-demo:0.1.0"
RATE_INTERVAL = "30s"  # what Grafana's $__rate_interval is for a 1s scrape at this zoom


def tiny_job(name: str) -> dict[str, Any]:
    job: dict[str, Any] = yaml.safe_load((REPO / "examples" / "tiny" / "grpojob.yaml").read_text())
    job["metadata"]["name"] = name
    job["spec"]["grpo"]["steps"] = STEPS
    job["spec"]["grpo"]["validation"]["everySteps"] = 2
    job["spec"]["checkpoints"]["everySteps"] = 2
    # examples/tiny/metric_components.py answers these two components (weighted here, through the operator).
    job["spec"]["metric"]["rewardWeights"] = {"target_share": 1.0, "finished": 0.1}
    return job


# --- Prometheus configuration as the Prometheus Operator would generate it ------------------------------


def relabelings(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Prometheus Operator relabeling objects (camelCase) as Prometheus relabel_configs."""
    keys = {"sourceLabels": "source_labels", "targetLabel": "target_label", "replacement": "replacement",
            "regex": "regex", "action": "action", "separator": "separator", "modulus": "modulus"}  # fmt: skip
    return [{keys[k]: v for k, v in item.items()} for item in items]


def service_monitor_job(monitor: dict[str, Any], service: str, target: str) -> dict[str, Any]:
    meta = monitor["metadata"]
    endpoint = monitor["spec"]["endpoints"][0]
    return {
        "job_name": f"serviceMonitor/{meta['namespace']}/{meta['name']}/0",
        "scrape_interval": "1s",
        "scrape_timeout": "1s",
        "metrics_path": endpoint.get("path", "/metrics"),
        "honor_labels": bool(endpoint.get("honorLabels", False)),
        "static_configs": [
            {
                "targets": [target],
                "labels": {
                    "__meta_kubernetes_namespace": meta["namespace"],
                    "__meta_kubernetes_service_name": service,
                    "__meta_kubernetes_pod_name": f"{service}-local",
                },
            }
        ],
        # The labels the Prometheus Operator sets on every ServiceMonitor target (job = the Service).
        "relabel_configs": [
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"},
            {"target_label": "endpoint", "replacement": endpoint["port"]},
            *relabelings(endpoint.get("relabelings", [])),
        ],
    }


def pod_monitor_job(monitor: dict[str, Any], targets_file: Path) -> dict[str, Any]:
    meta = monitor["metadata"]
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    return {
        "job_name": f"podMonitor/{meta['namespace']}/{meta['name']}/0",
        "scrape_interval": "1s",
        "scrape_timeout": "1s",
        "metrics_path": endpoint.get("path", "/metrics"),
        "honor_labels": bool(endpoint.get("honorLabels", False)),
        "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": "1s"}],
        # The labels the Prometheus Operator sets on every PodMonitor target (job = namespace/name).
        "relabel_configs": [
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"target_label": "job", "replacement": f"{meta['namespace']}/{meta['name']}"},
            {"target_label": "endpoint", "replacement": endpoint["port"]},
            *relabelings(endpoint.get("relabelings", [])),
        ],
        "metric_relabel_configs": relabelings(endpoint.get("metricRelabelings", [])),
    }


def write_pod_targets(path: Path, runner: LocalJobRunner, workdir: Path) -> None:
    """File-based discovery standing in for Kubernetes SD: the running trainer rank 0 with its pod's labels."""
    groups = []
    config = workdir / "trainer.json"
    for name, proc in runner.trainers.items():
        if proc.popen.poll() is not None or not config.exists():
            continue
        pod = runner.kube.get("pod", name, runner.namespace)
        if pod is None:
            continue
        port = json.loads(config.read_text())["metricsPort"]
        labels = {
            "__meta_kubernetes_namespace": runner.namespace,
            "__meta_kubernetes_pod_name": name,
            **{
                "__meta_kubernetes_pod_label_" + "".join(c if c.isalnum() else "_" for c in k): v
                for k, v in pod["metadata"]["labels"].items()
            },
        }
        groups.append({"targets": [f"127.0.0.1:{port}"], "labels": labels})
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups))
    tmp.replace(path)


class Prometheus:
    def __init__(self, workdir: Path, config: dict[str, Any]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        self.log = workdir / "prometheus.log"
        self._log_handle = self.log.open("wb")
        self.popen = subprocess.Popen(
            [
                prometheus(),
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
            ],
            stdout=self._log_handle,
            stderr=subprocess.STDOUT,
        )
        wait_for("prometheus /-/ready", self._ready, timeout=60)

    def _ready(self) -> bool:
        if self.popen.poll() is not None:
            raise AssertionError(
                f"prometheus exited {self.popen.returncode}:\n{self.log.read_text()[-3000:]}"
            )
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return int(response.status) == 200
        except OSError:
            return False

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=30) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._log_handle.close()


# --- the run ----------------------------------------------------------------------------------------------


@pytest.fixture
def two_namespaces(kube: Cluster) -> Iterator[tuple[str, str]]:
    names = (kube.new_namespace("train"), kube.new_namespace("quota"))
    yield names
    for name in names:
        kube.delete_namespace(name)


def claim_dir(kube: Cluster, namespace: str, claim: str) -> Path:
    def bound() -> str | None:
        pvc = kube.get("pvc", claim, namespace) or {}
        phase = (pvc.get("status") or {}).get("phase")
        return (pvc.get("spec") or {}).get("volumeName") if phase == "Bound" else None

    volume = wait_for(f"claim {claim} bound", bound, timeout=90)
    pv = kube.get("pv", volume)
    assert pv is not None
    return Path(pv["spec"]["hostPath"]["path"])


def substitute(expr: str, namespace: str, job: str) -> str:
    return (
        expr.replace("$__rate_interval", RATE_INTERVAL)
        .replace("$__range", "15m")
        .replace("$namespace", namespace)
        .replace("$grpojob", job)
    )


def test_prometheus_scrapes_operator_and_training_and_every_panel_has_data(
    kube: Cluster, namespace: str, two_namespaces: tuple[str, str], tmp_path: Path
) -> None:
    train_ns, quota_ns = two_namespaces
    release = f"m{uuid.uuid4().hex[:6]}"
    fullname = f"{release}-grpo-operator"
    job = "tiny"
    apply_monitoring_crds(kube)
    helm_install(
        kube,
        release,
        namespace,
        {
            "watch.allNamespaces": "false",
            "watch.namespaces[0]": train_ns,
            "watch.namespaces[1]": quota_ns,
            "metrics.serviceMonitor.enabled": "true",
            "metrics.podMonitors.trainer.enabled": "true",
            "metrics.podMonitors.generation.enabled": "true",
            "prometheusRule.enabled": "true",
            "dashboards.enabled": "true",
            # Prices and budgets, so the spend panels have data (a budget far above what the run spends).
            "pricing.currency": "USD",
            "pricing.gpuHour.default": "3",
            f"budgets.namespaces.{train_ns}.default.gpuHours": "100",
            f"budgets.namespaces.{train_ns}.default.amount": "1000",
            f"prometheusRule.alerts.GRPONamespaceOverMonthlyAmount.amounts.{train_ns}": "1000",
        },
    )
    prom: Prometheus | None = None
    runner: LocalJobRunner | None = None
    try:
        installed = {
            kind: kube.get(kind, name, namespace)
            for kind, name in (
                ("servicemonitor", fullname),
                ("podmonitor", f"{fullname}-trainer"),
                ("prometheusrule", fullname),
                ("configmap", f"{fullname}-dashboard"),
            )
        }
        assert all(installed.values()), installed
        dashboard = json.loads(installed["configmap"]["data"]["grpo-operator.json"])  # type: ignore[index]
        rules = tmp_path / "rules.yaml"
        rules.write_text(yaml.safe_dump({"groups": installed["prometheusrule"]["spec"]["groups"]}))  # type: ignore[index]

        with operator_as(
            kube, deployment=fullname, namespace=namespace, service_account=fullname, workdir=tmp_path
        ) as operator:
            targets = tmp_path / "trainer-targets.json"
            targets.write_text("[]")
            prom = Prometheus(
                tmp_path,
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": [str(rules)],
                    "scrape_configs": [
                        service_monitor_job(
                            installed["servicemonitor"],  # type: ignore[arg-type]
                            f"{fullname}-metrics",
                            f"127.0.0.1:{operator.port}",
                        ),
                        pod_monitor_job(installed["podmonitor"], targets),  # type: ignore[arg-type]
                    ],
                },
            )
            started = time.time()

            # Namespace B: no pod may be created, so the operator's creates fail with 403 (quota).
            kube.apply(
                {
                    "apiVersion": "v1",
                    "kind": "ResourceQuota",
                    "metadata": {"name": "no-pods"},
                    "spec": {"hard": {"pods": "0"}},
                },
                namespace=quota_ns,
            )
            kube.apply(tiny_job("blocked"), namespace=quota_ns)

            # Namespace A: the tiny job, trained for real.
            kube.apply(tiny_job(job), namespace=train_ns)
            sys.path.insert(0, str(REPO / "examples" / "tiny"))
            from seed import seed  # examples/tiny/seed.py: the demo's volume preparation

            seed(claim_dir(kube, train_ns, f"{job}-ckpt"))
            workdir = tmp_path / "run"
            workdir.mkdir()
            runner = LocalJobRunner(
                kube,
                train_ns,
                job,
                # The demo task's reward in named parts, so the reward-components panel has data too.
                {METRIC_IMAGE: [sys.executable, "examples/tiny/metric_components.py"]},
                workdir,
                # Prometheus scraping the trainer is what this tests; vLLM's start-up would add minutes.
                generation="in-process-transformers",
            )
            killed = False
            deadline = time.monotonic() + 900
            phase = ""
            while time.monotonic() < deadline:
                runner.step()
                write_pod_targets(targets, runner, workdir)
                status = (kube.get("grpojob", job, train_ns) or {}).get("status") or {}
                phase = str(status.get("phase") or "")
                if phase in ("Succeeded", "Failed") and not runner.trainers:
                    break
                checkpoint = (status.get("checkpoint") or {}).get("lastStep") or 0
                if not killed and checkpoint >= 2 and runner.trainers:
                    # Let Prometheus see the checkpoint before the process goes.
                    time.sleep(3)
                    kill_like_a_kubelet(kube, runner, next(iter(runner.trainers)))
                    killed = True
                time.sleep(1)
            logs = "\n".join(p.read_text(errors="replace")[-2000:] for p in workdir.glob("*.log"))
            assert phase == "Succeeded", (
                f"job ended {phase!r}; logs:\n{logs}\noperator:\n{operator.log_text()[-3000:]}"
            )
            assert killed, "the trainer was never killed: no restart was exercised"
            final = kube.get("grpojob", job, train_ns)
            assert final is not None and final["status"]["restarts"] == 1
            # The metric's named reward parts reached the status through the trainer.
            components = final["status"]["rewards"].get("components") or {}
            assert set(components) == {"target_share", "finished"}, final["status"]["rewards"]
            time.sleep(3)  # a last scrape of the operator
            ended = time.time()

            # The rules load and evaluate without errors against the real series.
            groups = prom.api("rules")["groups"]
            health = {r["name"]: (r["health"], r.get("lastError", "")) for g in groups for r in g["rules"]}
            installed_rules = {
                r.get("alert") or r.get("record")
                for g in installed["prometheusrule"]["spec"]["groups"]  # type: ignore[index]
                for r in g["rules"]
            }
            assert set(health) == installed_rules and all(h == "ok" for h, _ in health.values()), health

            # Every panel's query, as Grafana would send it for this job.
            empty: list[str] = []
            vllm: list[str] = []
            for panel in dashboard["panels"]:
                for target in panel.get("targets", []):
                    expr = substitute(target["expr"], train_ns, job)
                    data = prom.api("query_range", query=expr, start=str(started), end=str(ended), step="2")
                    has_data = any(series["values"] for series in data["result"])
                    if "vllm:" in expr:
                        vllm.append(f"{panel['title']} ({', '.join(sorted(metric_names(expr)))})")
                        assert not has_data, "no vLLM server runs here, yet a vllm: query has data"
                    elif not has_data:
                        empty.append(f"{panel['title']} [{target['refId']}]: {expr}")
            assert not empty, "panels without data:\n" + "\n".join(empty)
            warnings.warn(
                UserWarning(
                    f"{len(vllm)} dashboard queries read metrics exported by vLLM, not scraped here (the "
                    "run generates in-process), so they were not checked for data (their names are, against "
                    "a real vLLM, in tests/trainer/test_vllm_weight_sync.py): " + "; ".join(vllm)
                ),
                stacklevel=1,
            )
            assert len(vllm) == 6

            # The quota made real API errors, visible to the operator's metrics and the dashboard.
            errors = prom.api(
                "query", query='sum(grpo_operator_api_errors_total{code="403"})', time=str(ended)
            )
            assert errors["result"] and float(errors["result"][0]["value"][1]) > 0
    finally:
        if runner is not None:
            runner.close()
        if prom is not None:
            prom.stop()
        helm_cmd(kube, "uninstall", release, "--namespace", namespace, "--wait", "--timeout", "2m")
