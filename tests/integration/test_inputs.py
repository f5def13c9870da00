"""spec.inputs on the real API server: the pods that mount a user's ConfigMap and claim are admitted in a
namespace that enforces the restricted Pod Security Standard (the API server's PodSecurity admission
judges them, through a server-side dry run of each pod the operator would create)."""

from __future__ import annotations

import json

import pytest
from grpo_operator.builders import gang_pods, job_from_object
from grpo_operator.settings import OperatorSettings

from tests.harness.kube import Cluster
from tests.unit.reconcile_world import job_object
from tests.unit.test_inputs import INPUTS

pytestmark = pytest.mark.slow


def test_pods_with_inputs_are_admitted_under_restricted_pod_security(kube: Cluster, namespace: str) -> None:
    kube.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    kube.kubectl(
        "create", "serviceaccount", "math-trainer", "-n", namespace
    )  # the job's, made by the operator
    job = job_object(
        inputs=INPUTS, model={"name": "/inputs/model"}, dataset={"train": "file:///inputs/data/train.jsonl"}
    )
    job["metadata"]["namespace"] = namespace
    pods = gang_pods(job_from_object(job), OperatorSettings(), 1, "")
    assert pods
    for pod in pods:
        result = kube.kubectl(
            "create", "--dry-run=server", "-n", namespace, "-o", "json", "-f", "-", input=json.dumps(pod)
        )
        created = json.loads(result.stdout)
        mounts = {m["mountPath"] for c in created["spec"]["containers"] for m in c["volumeMounts"]}
        assert {"/inputs/data", "/inputs/model"} <= mounts, pod["metadata"]["name"]
