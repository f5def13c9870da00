"""A tenant's trainer cannot publish series under another team's namespace or job.

Trainer rank 0 runs the tenant's image, so whatever labels its /metrics carries are the tenant's choice.
A real Prometheus (Debian's package) scrapes a process that forges namespace="team-b", grpojob="victim"
with the scrape configuration the chart's trainer PodMonitor amounts to (as the Prometheus Operator
generates it; file discovery carries the __meta_kubernetes_* labels of a pod in team-a); the stored series
must carry team-a and the pod's job, and no trace of the forged values.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from tests.harness.kube import wait_for
from tests.harness.ports import free_port
from tests.helm.chart import MONITORING_APIS, VALUES_DIR, find, render
from tests.helm.test_monitoring_e2e import Prometheus, pod_monitor_job

FORGED = {"namespace": "team-b", "grpojob": "victim", "pod": "victim-trainer-1-0", "job": "team-b/x"}


@pytest.fixture
def forging_trainer() -> Iterator[int]:
    registry = CollectorRegistry()
    gauge = Gauge("grpo_step", "Training step.", list(FORGED), registry=registry)
    gauge.labels(**FORGED).set(7)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        yield port
    finally:
        server.shutdown()
        thread.join(timeout=10)


def test_series_carry_the_pods_namespace_and_job_not_the_labels_the_pod_wrote(
    tmp_path: Path, forging_trainer: int
) -> None:
    docs = render([VALUES_DIR / "monitoring.yaml"], api_versions=MONITORING_APIS)
    (monitor,) = [m for m in find(docs, "PodMonitor") if m["metadata"]["name"].endswith("-trainer")]
    targets = tmp_path / "targets.json"
    targets.write_text(
        json.dumps(
            [
                {
                    "targets": [f"127.0.0.1:{forging_trainer}"],
                    "labels": {
                        "__meta_kubernetes_namespace": "team-a",
                        "__meta_kubernetes_pod_name": "math-trainer-1-0",
                        "__meta_kubernetes_pod_label_grpo_dev_job": "math",
                    },
                }
            ]
        )
    )
    prometheus = Prometheus(tmp_path, {"scrape_configs": [pod_monitor_job(monitor, targets)]})
    try:

        def scraped() -> list[dict[str, Any]] | None:
            result: list[dict[str, Any]] = prometheus.api("query", query="grpo_step")["result"]
            return result or None

        series = wait_for("the trainer target scraped", scraped, timeout=60)
    finally:
        prometheus.stop()
    (only,) = series
    labels = only["metric"]
    assert labels["namespace"] == "team-a" and labels["grpojob"] == "math", labels
    assert labels["pod"] == "math-trainer-1-0", labels
    assert not any(v in FORGED.values() for k, v in labels.items() if k != "__name__"), labels
    assert not any(k.startswith("exported_") for k in labels), labels
