"""A client-rollout GRPOJob (spec.rollouts.source: Client) with the operator running against the local
cluster: the API server takes every child the builders make for it (the rollout gateway's Deployment,
Services and NetworkPolicies), the gateway's readiness shows as GatewayReady, the trainer's
waiting-for-client report survives the status schema, and a client's cancel (exit code 7) ends the job."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.harness.kube import Cluster, wait_for
from tests.harness.local_runner import LocalJobRunner
from tests.integration.test_operator import (
    _condition,
    job_manifest,
    running_operator,
    status,
    terminate_pod,
    wait_condition,
    wait_phase,
)

pytestmark = pytest.mark.slow


def client_manifest(name: str) -> dict[str, Any]:
    manifest = job_manifest(name, trainer={"nodes": 1, "gpusPerNode": 1})
    spec = manifest["spec"]
    del spec["metric"], spec["dataset"]
    spec["rollouts"] = {
        "source": "Client",
        "client": {
            "allowFrom": [
                {"podLabels": {"app": "dspy-notebook"}},
                {"podLabels": {"app": "nb"}, "namespaceLabels": {"kubernetes.io/metadata.name": "notebooks"}},
            ],
            "tokenSecretRef": {"name": f"{name}-token", "key": "token"},
        },
    }
    return manifest


def test_a_client_rollout_job_runs_its_gateway_and_ends_when_the_client_cancels(
    kube: Cluster, namespace: str, tmp_path: Path
) -> None:
    kube.kubectl("create", "secret", "generic", "dspy-token", "-n", namespace, "--from-literal=token=s3cret")
    with running_operator(kube, namespace, tmp_path):
        kube.apply(client_manifest("dspy"), namespace)
        wait_phase(kube, namespace, "dspy", "Running")
        for kind, name in [
            ("deployment", "dspy-rollouts"),
            ("service", "dspy-rollouts"),
            ("service", "dspy-policy"),
            ("networkpolicy", "dspy-rollouts"),
            ("networkpolicy", "dspy-trainer"),
        ]:
            assert kube.get(kind, name, namespace) is not None, f"{kind} {name} missing"
        for kind in ("deployment", "service", "networkpolicy"):
            assert kube.get(kind, "dspy-metric", namespace) is None
        config = kube.get("configmap", "dspy-config", namespace)
        assert config is not None
        gateway = json.loads(config["data"]["gateway.json"])
        assert (gateway["groupSize"], gateway["promptsPerStep"], gateway["steps"]) == (4, 2, 10)
        assert gateway["trainerUrl"] == f"http://dspy-policy.{namespace}.svc:7455"
        ready = wait_condition(kube, namespace, "dspy", "GatewayReady", status="True")
        assert "dspy-rollouts" in _condition(ready, "GatewayReady")["message"]

        # Trainer rank 0 waits for the client: its report is kept by the status schema.
        since = "2026-12-01T03:00:00Z"
        kube.kubectl(
            "patch",
            "grpojob",
            "dspy",
            "-n",
            namespace,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": {"progress": {"step": 3, "waitingForClientSince": since}}}),
        )
        assert status(kube, namespace, "dspy")["progress"]["waitingForClientSince"] == since

        terminate_pod(kube, namespace, "dspy-trainer-1-0", 7, "the client cancelled the run")
        final = wait_phase(kube, namespace, "dspy", "Failed")
        assert final["reason"] == "CancelledByClient" and final.get("restarts", 0) == 0
        assert "after step 3" in final["message"]
        wait_for(
            "the gateway of a failed job to go",
            lambda: kube.get("deployment", "dspy-rollouts", namespace) is None,
            timeout=60,
        )


def test_the_local_runner_runs_the_gateway_and_points_the_trainer_at_it(
    kube: Cluster, namespace: str, tmp_path: Path
) -> None:
    """The local runner (the kubelet of the demo and the end-to-end tests) runs the gateway pod as a
    process with the rendered gateway.json and the job's token, and rewrites trainer.json to reach it."""
    kube.kubectl("create", "secret", "generic", "dspy-token", "-n", namespace, "--from-literal=token=s3cret")
    with running_operator(kube, namespace, tmp_path):
        kube.apply(client_manifest("dspy"), namespace)
        wait_phase(kube, namespace, "dspy", "Running")
        runner = LocalJobRunner(kube, namespace, "dspy", {}, tmp_path / "run")
        runner.workdir.mkdir(parents=True)
        try:
            assert runner.client_rollouts()
            runner.ensure_gateway()
            base = f"http://127.0.0.1:{runner.gateway_port}"
            answer = requests.post(
                f"{base}/v1/fine_tuning/grpo/status", json={"job_id": None}, timeout=10
            ).json()
            assert answer["job_id"] == f"{namespace}/dspy" and len(answer["pending_batch_ids"]) == 2
            models = f"{base}/v1/models"
            assert requests.get(models, timeout=10).status_code == 401
            assert (
                requests.get(models, headers={"Authorization": "Bearer s3cret"}, timeout=10).status_code
                == 200
            )
            config = json.loads(runner.trainer_config(tmp_path / "workspace").read_text())
            assert config["rollouts"]["gatewayUrl"] == f"http://127.0.0.1:{runner.gateway_internal_port}"
            assert config["rollouts"]["policyPort"] == runner.policy_port and "metric" not in config
        finally:
            runner.close()
