"""The verbs each child kind's record names (builders/child_kinds.py), which the chart grants and nothing
more, are enough for what the operator's client does to every child it applies: create it, update it by
server-side apply (which first reads it), delete it. Run on the real API server as a user holding exactly
the records' verbs, so a verb the runtime needs and the record lacks fails here with the API server's 403."""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest
from grpo_operator.api.resource import GROUP, PLURAL
from grpo_operator.builders import generated_secrets, infrastructure, metric_workload
from grpo_operator.builders.child_kinds import CHILD_KINDS
from grpo_operator.runtime.kube_client import Kube, resource_for
from grpo_operator.settings import OperatorSettings
from kubernetes import config
from kubernetes.client.exceptions import ApiException

from tests.harness.kube import Cluster
from tests.unit.test_builders import make_job
from tests.unit.test_builders_rollouts import client_job

USER = "child-kinds-operator"


def records_role(namespace: str) -> dict[str, Any]:
    rules: list[dict[str, Any]] = [
        {"apiGroups": [k.group], "resources": [k.plural], "verbs": sorted(k.verbs)} for k in CHILD_KINDS
    ]
    # What the per-job trainer Role grants: RBAC lets only a holder of it create that Role.
    rules.append({"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"], "verbs": ["get", "patch"]})
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": USER, "namespace": namespace},
        "rules": rules,
    }


def operator_with_the_records_verbs(kube: Cluster, namespace: str) -> Kube:
    kube.apply(records_role(namespace))
    kube.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": USER, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": USER},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
        }
    )
    api = config.new_client_from_config(config_file=str(kube.kubeconfig))
    api.set_default_header("Impersonate-User", USER)
    return Kube(api, field_manager="grpo-operator-test", timeout=30)


def test_the_records_verbs_let_the_operator_create_update_and_delete_every_applied_child(
    kube: Cluster, namespace: str
) -> None:
    operator = operator_with_the_records_verbs(kube, namespace)
    job = make_job()
    written: list[tuple[str, str, str]] = []
    settings = OperatorSettings()
    for manifest in [*infrastructure(job, settings), *metric_workload(job, settings)]:
        manifest = copy.deepcopy(manifest)
        meta = manifest["metadata"]
        meta["namespace"] = namespace
        # No GRPOJob owns them here: the garbage collector would remove children of a missing owner.
        meta.pop("ownerReferences", None)
        created = operator.create_for_apply(manifest)
        uid = created["metadata"]["uid"]
        update = copy.deepcopy(manifest)
        update["metadata"]["uid"] = uid
        update["metadata"].setdefault("labels", {})["grpo.dev/updated"] = "yes"
        applied = _updated(operator, update)
        assert applied["metadata"]["labels"]["grpo.dev/updated"] == "yes", manifest["kind"]
        written.append((manifest["kind"], meta["name"], uid))
    # Deleted once all exist: a RoleBinding is created only while its Role exists (RBAC escalation check).
    for kind, name, uid in written:
        operator.delete(resource_for(kind), namespace, name, uid=uid)


def _updated(operator: Kube, manifest: dict[str, Any]) -> dict[str, Any]:
    """An update, tried again while another controller changes the object between the update's read and
    its write (a claim gets its protection finalizer): 409, on which the operator decides again too."""
    for _ in range(20):
        try:
            return operator.apply(manifest)
        except ApiException as exc:
            if exc.status != 409:
                raise
            time.sleep(0.5)
    raise AssertionError(f"{manifest['kind']} {manifest['metadata']['name']} kept changing under the update")


def test_the_records_verbs_let_the_operator_create_its_token_secret_and_read_no_secret(
    kube: Cluster, namespace: str
) -> None:
    """The gateway token is created under a generateName and known by the name the create returns: create
    is enough, and the operator cannot read it (or any other Secret) back."""
    kube.kubectl("create", "secret", "generic", "theirs", "-n", namespace, "--from-literal=token=x")
    operator = operator_with_the_records_verbs(kube, namespace)
    [(secret, key)] = generated_secrets(client_job(token_secret=None))
    manifest = copy.deepcopy(secret)
    manifest["metadata"]["namespace"] = namespace
    manifest["metadata"].pop("ownerReferences")
    manifest["stringData"] = {key: "generated"}
    created = operator.create(manifest)
    name = created["metadata"]["name"]
    assert name.startswith("math-gateway-token-") and len(name) == len("math-gateway-token-") + 5
    for other in (name, "theirs"):
        with pytest.raises(ApiException) as refused:
            operator.get(resource_for("Secret"), namespace, other)
        assert refused.value.status == 403, other
    with pytest.raises(ApiException) as refused:
        operator.list(resource_for("Secret"), namespace)
    assert refused.value.status == 403
