"""A client-rollout GRPOJob (spec.rollouts.source: Client) with the operator running against the local
cluster: the API server takes every child the builders make for it (the rollout gateway's Deployment,
Services and NetworkPolicies), the gateway's readiness shows as GatewayReady, the trainer's
waiting-for-client report survives the status schema, and a client's cancel (exit code 7) ends the job."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.harness.kube import Cluster, wait_for
from tests.harness.local_runner import LocalJobRunner
from tests.integration.operator_helpers import (
    _condition,
    get_job,
    job_manifest,
    pods,
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
            # Every client route needs the client's token (spec.rollouts.client.tokenSecretRef).
            answer = requests.post(
                f"{base}/v1/fine_tuning/grpo/status",
                json={"job_id": None},
                headers={"Authorization": "Bearer s3cret"},
                timeout=10,
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


def _secrets_of(kube: Cluster, namespace: str, job: str) -> list[str]:
    listed = kube.kubectl("get", "secrets", "-n", namespace, "-l", f"grpo.dev/job={job}", "-o", "name")
    return [line.removeprefix("secret/") for line in listed.stdout.split()]


def _token_refs(pod_spec: dict[str, Any]) -> list[str]:
    """The Secrets a pod spec reads the gateway's internal token from."""
    return [
        e["valueFrom"]["secretKeyRef"]["name"]
        for c in pod_spec["containers"]
        for e in c.get("env", [])
        if e["name"] == "GRPO_GATEWAY_INTERNAL_TOKEN"
    ]


def test_the_gateway_token_is_the_jobs_own_kept_across_operator_restarts_and_guards_the_internal_port(
    kube: Cluster, namespace: str, tmp_path: Path
) -> None:
    """The gateway-token Secret: created once by the operator under a name the API server picks, recorded in
    status.gatewayTokenSecret, owned by the job, its value unchanged by an operator restart; only the
    gateway and trainer rank 0 get it, and the gateway started from the operator's rendering refuses the
    internal port without it. A Secret the tenant made under a name like it is never used or changed."""
    kube.kubectl("create", "secret", "generic", "dspy-token", "-n", namespace, "--from-literal=token=s3cret")
    kube.kubectl(
        "create", "secret", "generic", "dspy-gateway-token", "-n", namespace, "--from-literal=token=theirs"
    )
    theirs = kube.get("secret", "dspy-gateway-token", namespace)
    assert theirs is not None
    with running_operator(kube, namespace, tmp_path) as operator:
        kube.apply(client_manifest("dspy"), namespace)
        wait_phase(kube, namespace, "dspy", "Running")
        name = status(kube, namespace, "dspy")["gatewayTokenSecret"]
        assert name.startswith("dspy-gateway-token-") and len(name) == len("dspy-gateway-token-") + 5
        secret = kube.get("secret", name, namespace)
        assert secret is not None
        owner = secret["metadata"]["ownerReferences"]
        assert owner == [
            {
                "apiVersion": "grpo.dev/v1alpha1",
                "kind": "GRPOJob",
                "name": "dspy",
                "uid": get_job(kube, namespace, "dspy")["metadata"]["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        assert secret["metadata"]["labels"]["grpo.dev/job"] == "dspy" and secret["immutable"] is True
        token = base64.b64decode(secret["data"]["token"]).decode()
        assert len(token) >= 43, "secrets.token_urlsafe(32): 256 random bits"
        assert token not in operator.log_tail()
        assert _secrets_of(kube, namespace, "dspy") == [name], "created once"

        # Only the gateway and trainer rank 0 hold it, by the recorded name.
        gateway = kube.get("deployment", "dspy-rollouts", namespace)
        assert gateway is not None
        assert _token_refs(gateway["spec"]["template"]["spec"]) == [name]
        holders = {
            p["metadata"]["name"]: _token_refs(p["spec"])
            for p in pods(kube, namespace, "dspy", roles=("trainer", "generation"))
            if _token_refs(p["spec"])
        }
        assert holders == {"dspy-trainer-1-0": [name]}, "not the vLLM pod"

        # A restarted operator knows the Secret by the job's status: it creates no other and reads none, and
        # the next gang's rank 0 gets the same one.
        operator.stop()
        operator.start()
        terminate_pod(kube, namespace, "dspy-trainer-1-0", 1, "boom")
        wait_for(
            "the restarted operator to create the next gang",
            lambda: kube.get("pod", "dspy-trainer-2-0", namespace) is not None,
            timeout=90,
        )
        rank0 = kube.get("pod", "dspy-trainer-2-0", namespace)
        assert rank0 is not None and _token_refs(rank0["spec"]) == [name]
        again = kube.get("secret", name, namespace)
        assert again is not None
        assert again["metadata"]["uid"] == secret["metadata"]["uid"]
        assert again["metadata"]["resourceVersion"] == secret["metadata"]["resourceVersion"]
        assert again["data"] == secret["data"]
        assert status(kube, namespace, "dspy")["gatewayTokenSecret"] == name
        assert _secrets_of(kube, namespace, "dspy") == [name]
        # The tenant's Secret: neither used nor changed.
        still = kube.get("secret", "dspy-gateway-token", namespace)
        assert still is not None and still["data"] == theirs["data"]
        assert still["metadata"]["resourceVersion"] == theirs["metadata"]["resourceVersion"]
        assert not still["metadata"].get("ownerReferences")
        assert "Conflict" not in {c["type"] for c in status(kube, namespace, "dspy")["conditions"]}

        # The gateway started from the operator's rendering (the local runner resolves secretKeyRef env as a
        # kubelet would) refuses the internal port without the token, and the trainer's env carries it.
        runner = LocalJobRunner(kube, namespace, "dspy", {}, tmp_path / "run")
        runner.workdir.mkdir(parents=True)
        try:
            runner.ensure_gateway()
            groups = f"http://127.0.0.1:{runner.gateway_internal_port}/internal/v1/groups"
            body = {"step": 1, "attempt": 1, "count": 2, "wait_seconds": 0}
            refused = requests.post(groups, json=body, timeout=10)
            assert refused.status_code == 403 and "GRPO_GATEWAY_INTERNAL_TOKEN" in refused.text
            wrong = requests.post(groups, json=body, headers={"Authorization": "Bearer guess"}, timeout=10)
            assert wrong.status_code == 403
            answered = requests.post(
                groups, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=10
            )
            assert answered.status_code != 403, answered.text
            assert runner.trainer_env(rank0)["GRPO_GATEWAY_INTERNAL_TOKEN"] == token
        finally:
            runner.close()
