"""Children the operator creates with one POST and later updates by server-side apply, on the real API
server: an update removes what the new manifest dropped, and never reaches a newer object of the name."""

from __future__ import annotations

from typing import Any

import pytest
from grpo_operator.runtime.kube_client import Kube
from kubernetes.client.exceptions import ApiException

from tests.harness.kube import Cluster

pytestmark = pytest.mark.slow


def config_map(namespace: str, labels: dict[str, str], data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "fields", "namespace": namespace, "labels": labels},
        "data": data,
    }


def test_an_update_removes_what_the_manifest_dropped_from_a_child_created_by_post(
    kube: Cluster, namespace: str
) -> None:
    api = Kube(kube.api_client(), field_manager="grpo-operator-test", timeout=30)
    created = api.create_for_apply(config_map(namespace, {"a": "1", "b": "2"}, {"x": "1", "y": "2"}))
    uid = created["metadata"]["uid"]

    update = config_map(namespace, {"a": "1"}, {"x": "1"})
    update["metadata"]["uid"] = uid
    api.apply(update)
    current = kube.get("configmap", "fields", namespace)
    assert current is not None
    assert current["metadata"]["labels"] == {"a": "1"} and current["data"] == {"x": "1"}, current

    # A second update (the create's fields were moved already) works the same way.
    again = config_map(namespace, {"a": "1", "c": "3"}, {})
    again["metadata"]["uid"] = uid
    api.apply(again)
    current = kube.get("configmap", "fields", namespace)
    assert current is not None
    assert current["metadata"]["labels"] == {"a": "1", "c": "3"} and not current.get("data"), current


def test_an_update_naming_a_replaced_childs_uid_leaves_the_newer_object_alone(
    kube: Cluster, namespace: str
) -> None:
    api = Kube(kube.api_client(), field_manager="grpo-operator-test", timeout=30)
    old_uid = api.create_for_apply(config_map(namespace, {"a": "1"}, {"x": "1"}))["metadata"]["uid"]
    kube.kubectl("delete", "configmap", "fields", "-n", namespace)
    kube.kubectl("create", "configmap", "fields", "-n", namespace, "--from-literal=theirs=yes")
    stale = config_map(namespace, {"a": "2"}, {"x": "2"})
    stale["metadata"]["uid"] = old_uid
    with pytest.raises(ApiException) as refused:
        api.apply(stale)
    # The API server refuses an apply whose uid is not the object's (uid is immutable).
    assert refused.value.status == 422 and "metadata.uid" in str(refused.value.body), refused.value.body
    current = kube.get("configmap", "fields", namespace)
    assert current is not None and current["data"] == {"theirs": "yes"}, current
