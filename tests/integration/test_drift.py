"""Children changed behind the operator's back, on the real API server: the objects as the API server
returns them (its defaults added) are not drift; a tenant's `kubectl set image` on the metric Deployment or
on a trainer pod, an edit of the trainer config, or a trainer pod relabelled out of the job, are undone."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from grpo_operator.builders import infrastructure, job_from_object
from grpo_operator.builders.children import metric_workload
from grpo_operator.builders.gang import gang_pods
from grpo_operator.reconcile.drift import drifted_fields, pod_drift
from grpo_operator.settings import OperatorSettings

from tests.harness.kube import Cluster, wait_for
from tests.harness.operator_process import Operator
from tests.integration.operator_helpers import (
    events_of,
    gang,
    get_job,
    job_manifest,
    status,
    wait_phase,
    wait_status,
)

pytestmark = pytest.mark.slow


def running_attempt(kube: Cluster, namespace: str, name: str, attempt: int) -> dict[str, Any]:
    return wait_status(
        kube,
        namespace,
        name,
        f"attempt {attempt} Running",
        lambda s: s.get("trainerAttempt") == attempt and s.get("phase") == "Running",
        timeout=120,
    )


def drifted_events(kube: Cluster, namespace: str, name: str) -> list[str]:
    return [e["message"] for e in events_of(kube, namespace, name) if e["reason"] == "ChildDrifted"]


def test_children_changed_by_a_tenant_are_put_back(
    kube: Cluster,
    namespace: str,
    operator: Operator,
) -> None:
    kube.apply(job_manifest("drift"), namespace)
    wait_phase(kube, namespace, "drift", "Running")
    job = job_from_object(get_job(kube, namespace, "drift"))
    settings = OperatorSettings()
    assert job.spec.metric is not None
    metric_image = job.spec.metric.image

    # As the API server returns them, defaults and all, the children are what the operator builds.
    for manifest in infrastructure(job, settings) + metric_workload(job, settings):
        kind, name = manifest["kind"].lower(), manifest["metadata"]["name"]
        live = kube.get(kind, name, namespace)
        assert live is not None, f"{kind} {name}"
        if manifest["kind"] in ("PersistentVolumeClaim",):
            continue
        assert drifted_fields(manifest, live) == [], (kind, name, json.dumps(live)[:3000])
    for manifest in gang_pods(job, settings, 1, ""):
        live = kube.get("pod", manifest["metadata"]["name"], namespace)
        assert live is not None and pod_drift(manifest, live) == [], manifest["metadata"]["name"]
    generation = kube.get("deployment", "drift-metric", namespace)["metadata"]["generation"]  # type: ignore[index]
    time.sleep(5)  # a few resyncs (2 s each in tests)
    assert kube.get("deployment", "drift-metric", namespace)["metadata"]["generation"] == generation  # type: ignore[index]
    assert drifted_events(kube, namespace, "drift") == [], "nothing was seen as drifted"

    # The attack: another image in the operator's metric Deployment, labels and annotations kept.
    kube.kubectl(
        "set", "image", "deployment/drift-metric", "metric=registry.example/theirs:1", "-n", namespace
    )
    wait_for(
        "the metric image put back",
        lambda: (
            (kube.get("deployment", "drift-metric", namespace) or {})["spec"]["template"]["spec"][
                "containers"
            ][0]["image"]
            == metric_image
        ),
        timeout=30,
    )
    wait_for(
        "a ChildDrifted event",
        lambda: any("Deployment drift-metric" in m for m in drifted_events(kube, namespace, "drift")),
        timeout=30,
    )

    # The trainer config (a ConfigMap, watched metadata-only): data changed is data read and restored.
    config = kube.get("configmap", "drift-config", namespace)
    assert config is not None
    key = next(iter(config["data"]))
    original = config["data"][key]
    kube.kubectl(
        "patch",
        "configmap",
        "drift-config",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps({"data": {key: "{}"}}),
    )
    wait_for(
        "the trainer config put back",
        lambda: (kube.get("configmap", "drift-config", namespace) or {}).get("data", {}).get(key) == original,
        timeout=30,
    )

    # A trainer pod's image: the gang is replaced, not counted against backoffLimit.
    kube.kubectl(
        "set", "image", "pod/drift-trainer-1-0", "trainer=registry.example/theirs:1", "-n", namespace
    )
    # The job is still Running attempt 1 when kubectl returns: wait for the attempt, not for the phase.
    s = running_attempt(kube, namespace, "drift", 2)
    assert s.get("restarts", 0) == 0, s
    assert any("Pod drift-trainer-1-0" in m for m in drifted_events(kube, namespace, "drift"))

    # A trainer pod relabelled out of the job leaves the operator's watch but is found, deleted, and the next
    # gang starts only once it is gone: never two gangs.
    kube.kubectl("label", "pod", "drift-trainer-2-0", "grpo.dev/job-", "-n", namespace)
    wait_for(
        "the relabelled pod deleted",
        lambda: kube.get("pod", "drift-trainer-2-0", namespace) is None,
        timeout=60,
    )
    s = running_attempt(kube, namespace, "drift", 3)
    assert s.get("restarts", 0) == 0, s
    assert sorted(gang(kube, namespace, "drift")) == [
        "drift-gen-3-0",
        "drift-trainer-3-0",
        "drift-trainer-3-1",
    ], status(kube, namespace, "drift")
