"""The trainer's identity: a ServiceAccount allowed to patch its own GRPOJob's status and nothing else."""

from __future__ import annotations

from grpo_operator.api.resource import GROUP, PLURAL
from grpo_operator.builders.common import Job, Manifest, metadata, trainer_rbac_name, with_hash


def trainer_service_account(job: Job) -> Manifest:
    return with_hash(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": metadata(job, trainer_rbac_name(job), "trainer"),
        }
    )


def trainer_role(job: Job) -> Manifest:
    # resourceNames pins the rule to this one job; only the status subresource, so the trainer can
    # report progress but never change the spec. `get` lets the trainer read back what it wrote.
    return with_hash(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": metadata(job, trainer_rbac_name(job), "trainer"),
            "rules": [
                {
                    "apiGroups": [GROUP],
                    "resources": [f"{PLURAL}/status"],
                    "resourceNames": [job.name],
                    "verbs": ["get", "patch"],
                }
            ],
        }
    )


def trainer_role_binding(job: Job) -> Manifest:
    name = trainer_rbac_name(job)
    return with_hash(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": metadata(job, name, "trainer"),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": job.namespace}],
        }
    )
