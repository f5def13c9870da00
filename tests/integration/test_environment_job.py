"""A job with spec.environment on the real API server and the operator: it runs with the environment server
`<job>-env` (Deployment, Service, NetworkPolicy) in the metric service's place, its children stay as the
operator built them (the egress-denying policy included: no re-apply loop), EnvironmentReady says when the
server has a ready pod, and suspending the job stops the server."""

from __future__ import annotations

import json
import time

import pytest
from grpo_operator.builders import infrastructure, job_from_object
from grpo_operator.builders.children import metric_workload
from grpo_operator.reconcile.drift import drifted_fields
from grpo_operator.settings import OperatorSettings

from tests.harness.kube import Cluster, wait_for
from tests.harness.operator_process import Operator
from tests.integration.operator_helpers import get_job, job_manifest, status, wait_phase, wait_status

pytestmark = pytest.mark.slow

IMAGE = "ghcr.io/example/echo-env:1.0"


def test_an_environment_job_runs_with_its_server_in_place_of_the_metric_service(
    kube: Cluster, namespace: str, operator: Operator
) -> None:
    # The API server refuses pods of a RuntimeClass that does not exist (EnvironmentReady says FailedCreate).
    runtime_class = {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": f"sandbox-{namespace}"},
        "handler": "runsc",
    }
    kube.apply(runtime_class)
    try:
        manifest = job_manifest(
            "env", environment={"image": IMAGE, "runtimeClassName": f"sandbox-{namespace}"}
        )
        del manifest["spec"]["metric"]
        kube.apply(manifest, namespace)
        run_and_suspend(kube, namespace)
    finally:
        kube.kubectl("delete", "runtimeclass", f"sandbox-{namespace}", "--wait=false", check=False)


def run_and_suspend(kube: Cluster, namespace: str) -> None:
    """Job `env`, applied: Running with its children as built, EnvironmentReady, then suspended."""
    wait_phase(kube, namespace, "env", "Running")
    job = job_from_object(get_job(kube, namespace, "env"))
    settings = OperatorSettings()

    built = infrastructure(job, settings) + metric_workload(job, settings)
    assert {("Deployment", "env-env"), ("Service", "env-env"), ("NetworkPolicy", "env-env")} <= {
        (m["kind"], m["metadata"]["name"]) for m in built
    }
    for child in built:
        kind, name = child["kind"].lower(), child["metadata"]["name"]
        live = kube.get(kind, name, namespace)
        assert live is not None, f"{kind} {name}"
        if child["kind"] != "PersistentVolumeClaim":
            assert drifted_fields(child, live) == [], (kind, name, json.dumps(live)[:3000])
    assert kube.get("deployment", "env-metric", namespace) is None
    assert kube.get("service", "env-metric", namespace) is None

    policy = kube.get("networkpolicy", "env-env", namespace)
    assert policy is not None and policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert not policy["spec"].get("egress"), "no egress rule: the server opens no connection"
    config = json.loads((kube.get("configmap", "env-config", namespace) or {})["data"]["trainer.json"])
    assert config["environment"]["url"] == f"http://env-env.{namespace}.svc:8000" and "metric" not in config

    wait_status(
        kube,
        namespace,
        "env",
        "EnvironmentReady True",
        lambda s: any(
            c["type"] == "EnvironmentReady" and c["status"] == "True" for c in s.get("conditions") or []
        ),
        timeout=60,
    )
    generations = {
        kind: (kube.get(kind, "env-env", namespace) or {})["metadata"]["generation"]
        for kind in ("deployment", "networkpolicy")
    }
    time.sleep(5)  # a few resyncs (2 s each in tests): nothing is re-applied
    for kind, generation in generations.items():
        assert (kube.get(kind, "env-env", namespace) or {})["metadata"]["generation"] == generation, kind

    kube.kubectl(
        "patch", "grpojob", "env", "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":true}}'
    )
    wait_phase(kube, namespace, "env", "Suspended")
    wait_for(
        "the environment Deployment stopped",
        lambda: kube.get("deployment", "env-env", namespace) is None,
        timeout=60,
    )
    assert kube.get("service", "env-env", namespace) is not None
    assert all(
        c["type"] != "EnvironmentReady" for c in status(kube, namespace, "env").get("conditions") or []
    )
