"""Same name is not ownership, on the real API server: the operator never takes over, uses or deletes an
object it did not create for the job, and its deletes can never reach a newer object of the same name."""

from __future__ import annotations

import json
from typing import Any

import pytest
from grpo_operator.runtime.kube_client import Kube, Resource
from kubernetes.client.exceptions import ApiException

from tests.harness.kube import Cluster, wait_for
from tests.harness.operator_process import Operator
from tests.integration.operator_helpers import (
    events_of,
    job_manifest,
    pods,
    status,
    wait_condition,
    wait_phase,
    wait_status,
)

pytestmark = pytest.mark.slow

CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap")


def test_pre_existing_children_are_not_taken_over_used_or_deleted(
    kube: Cluster,
    namespace: str,
    operator: Operator,
) -> None:
    theirs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "own-trainer"}},
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "own-config"},
            "data": {"mine": "yes"},
        },
    ]
    kube.apply(theirs, namespace)
    kube.apply(job_manifest("own"), namespace)

    s = wait_condition(kube, namespace, "own", "Conflict", status="True")
    assert s["phase"] == "Pending" and s["reason"] == "ChildConflict"
    message = next(c for c in s["conditions"] if c["type"] == "Conflict")["message"]
    assert "ConfigMap own-config" in message and "ServiceAccount own-trainer" in message, message
    wait_for(
        "a ChildConflict event",
        lambda: any(e["reason"] == "ChildConflict" for e in events_of(kube, namespace, "own")),
        timeout=30,
    )
    wait_for("the job's own children", lambda: kube.get("service", "own-gen", namespace), timeout=30)
    assert not pods(kube, namespace, "own", ("trainer", "generation")), "no pod runs on a conflict"
    for kind, name in (("serviceaccount", "own-trainer"), ("configmap", "own-config")):
        obj = kube.get(kind, name, namespace)
        assert obj is not None and not obj["metadata"].get("ownerReferences"), obj
    config = kube.get("configmap", "own-config", namespace)
    assert config is not None and config["data"] == {"mine": "yes"}

    kube.kubectl("delete", "grpojob", "own", "-n", namespace, "--wait=true", "--timeout=60s")
    wait_for(
        "the job's own children to go", lambda: kube.get("service", "own-gen", namespace) is None, timeout=60
    )
    assert kube.get("serviceaccount", "own-trainer", namespace) is not None
    assert kube.get("configmap", "own-config", namespace) is not None

    # Freed names: the same job now starts and creates its own.
    kube.kubectl("delete", "serviceaccount/own-trainer", "configmap/own-config", "-n", namespace)
    kube.apply(job_manifest("own"), namespace)
    # The first job's checkpoint claim was retained (retention Retain) and records that job's uid: the new
    # job of the same name does not use it silently. The operator's cache may not have seen the deletes above
    # at the new job's first reconcile (a loaded machine), which then still names them; the deletes wake the
    # job again, and the condition comes to name the claim alone.
    claim_conflict = "PersistentVolumeClaim own-ckpt holds the checkpoints of an earlier GRPOJob named own"

    def names_the_claim(s: dict[str, Any]) -> bool:
        conflict: dict[str, Any] = next(
            (c for c in s.get("conditions") or [] if c.get("type") == "Conflict"), {}
        )
        return conflict.get("status") == "True" and claim_conflict in str(conflict.get("message"))

    s = wait_status(kube, namespace, "own", "a Conflict naming the retained claim", names_the_claim)
    message = next(c for c in s["conditions"] if c["type"] == "Conflict")["message"]
    assert "ConfigMap own-config" not in message, message
    assert "existingClaim: own-ckpt" in message, message
    kube.kubectl("delete", "pvc", "own-ckpt", "-n", namespace, "--wait=false")
    # The claim's deletion, a new claim and the gang's start: seconds alone, longer beside a vLLM test.
    wait_phase(kube, namespace, "own", "Running", timeout=240)
    sa = kube.get("serviceaccount", "own-trainer", namespace)
    assert sa is not None and sa["metadata"]["ownerReferences"][0]["kind"] == "GRPOJob"
    assert "Conflict" not in {c["type"] for c in status(kube, namespace, "own")["conditions"]}


def test_a_delete_with_a_stale_uid_leaves_the_newer_object_alone(kube: Cluster, namespace: str) -> None:
    api = Kube(kube.api_client(), field_manager="test", timeout=30)
    manifest = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "race", "namespace": namespace}}
    old_uid = api.create(manifest)["metadata"]["uid"]
    api.delete(CONFIGMAPS, namespace, "race", uid=old_uid)
    new_uid = api.create(manifest)["metadata"]["uid"]
    with pytest.raises(ApiException) as refused:
        api.delete(CONFIGMAPS, namespace, "race", uid=old_uid)
    assert refused.value.status == 409, refused.value.body
    assert "the UID in the precondition" in json.loads(refused.value.body)["message"]
    current = kube.get("configmap", "race", namespace)
    assert current is not None and current["metadata"]["uid"] == new_uid
