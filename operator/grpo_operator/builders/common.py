"""Names, labels, owner references and hashes shared by every builder (pure functions)."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from grpo_operator.api.resource import API_VERSION, GROUP, KIND
from grpo_operator.api.rollouts import rollouts_source
from grpo_operator.api.spec import VOLUME_MOUNT_PATH, GRPOJobSpec
from grpo_operator.api.trainer_config import (
    CONFIG_MAP_KEY,
    CONFIG_MOUNT_DIR,
    CONFIG_PATH,
    GATEWAY_INTERNAL_PORT,
    POLICY_PORT,
)

Manifest = dict[str, Any]
Role = Literal["trainer", "generation", "metric", "rollouts", "environment"]

PART_OF = "grpo-operator"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_PART_OF = "app.kubernetes.io/part-of"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_JOB = f"{GROUP}/job"
LABEL_ROLE = f"{GROUP}/role"
LABEL_ATTEMPT = f"{GROUP}/attempt"
LABEL_NODE_RANK = f"{GROUP}/node-rank"
# Which of the job's vLLM servers (spec.generation.replicas) a generation pod is: "0", "1", ...
LABEL_GENERATION_REPLICA = f"{GROUP}/generation-replica"

# Hash of the manifest the operator meant to create; a child whose hash differs from the current
# desired one has drifted from the spec (the spec changed) and is updated or, for pods, replaced.
ANNOTATION_HASH = f"{GROUP}/spec-hash"
# Hash of trainer.json; trainer and vLLM pods carry it so that a config change reaches their hash.
ANNOTATION_CONFIG_HASH = f"{GROUP}/config-hash"
# The checkpoint a trainer pod resumes from, readable without parsing env (kubectl describe).
ANNOTATION_RESUME_FROM = f"{GROUP}/resume-from"
# The platform's default image (Helm jobDefaults.images) a trainer or vLLM pod of a job that names no image
# of its own was built with: when the platform changes the default, the pod's other image is told apart
# from one changed by hand or by a mutating webhook (reconcile/gang.py).
ANNOTATION_DEFAULT_IMAGE = f"{GROUP}/default-image"

APP_NAMES: dict[Role, str] = {
    "trainer": "grpo-trainer",
    "generation": "vllm",
    "metric": "grpo-metric",
    "rollouts": "grpo-rollouts",
    "environment": "grpo-environment",
}
# Roles whose pods a Deployment of the job creates (owned by its ReplicaSet, not by the job itself).
DEPLOYMENT_ROLES: frozenset[str] = frozenset({"metric", "rollouts", "environment"})

# Kueue's plain-pod integration (see docs/kueue.md).
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_GROUP_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
KUEUE_RETRIABLE_ANNOTATION = "kueue.x-k8s.io/retriable-in-group"

CONFIG_KEY = CONFIG_MAP_KEY
CONFIG_DIR = CONFIG_MOUNT_DIR
CONFIG_FILE = CONFIG_PATH
WORKSPACE = VOLUME_MOUNT_PATH
# The Hugging Face cache (model weights, datasets) lives on the job's volume, so a restart does not
# download the model again.
HF_CACHE = f"{WORKSPACE}/hf-cache"


@dataclass(frozen=True)
class Job:
    """The parts of a GRPOJob the builders need: identity, the validated spec, and the name of the
    gateway-token Secret the operator created for it (status.gatewayTokenSecret; client-rollout jobs, None
    until it exists)."""

    name: str
    namespace: str
    uid: str
    spec: GRPOJobSpec
    gateway_token_secret: str | None = None


# --- names: fixed by the project's conventions (docs/operations.md lists them) -------------------------


def config_map_name(job: Job) -> str:
    return f"{job.name}-config"


def created_pvc_name(job: Job) -> str:
    return f"{job.name}-ckpt"


def pvc_claim_name(job: Job) -> str:
    """The claim trainer pods mount: the user's existing claim, or the one the operator creates."""
    return job.spec.checkpoints.volume.existing_claim or created_pvc_name(job)


def metric_name(job: Job) -> str:
    return f"{job.name}-metric"


def environment_name(job: Job) -> str:
    """The environment server's Deployment, Service and NetworkPolicy (spec.environment)."""
    return f"{job.name}-env"


def generation_replicas(job: Job) -> range:
    """The job's vLLM servers by replica number: 0, 1, ... spec.generation.replicas - 1 (none when colocated)."""
    return range(job.spec.generation.server_count())


def generation_service_name(job: Job, replica: int = 0) -> str:
    # Never "vllm": Kubernetes would inject VLLM_PORT=tcp://... into every pod of the namespace and
    # vLLM reads VLLM_PORT as its own port setting and refuses to start with a URI there.
    # enableServiceLinks=false guards too. Replica 0 keeps the name a job with one server has always had.
    return f"{job.name}-gen" if replica == 0 else f"{job.name}-gen-r{replica}"


def trainer_service_name(job: Job) -> str:
    return f"{job.name}-trainer"


def trainer_rbac_name(job: Job) -> str:
    return f"{job.name}-trainer"


def generation_policy_name(job: Job) -> str:
    return f"{job.name}-gen"


def metric_policy_name(job: Job) -> str:
    return f"{job.name}-metric"


def trainer_policy_name(job: Job) -> str:
    return f"{job.name}-trainer"


def trainer_pod_name(job: Job, attempt: int, rank: int) -> str:
    return f"{job.name}-trainer-{attempt}-{rank}"


def generation_pod_name(job: Job, attempt: int, index: int, replica: int = 0) -> str:
    """``<job>-gen-<attempt>-<n>`` for replica 0 (the name a job with one server has always had),
    ``<job>-gen-r<r>-<attempt>-<n>`` for replica r; n counts the replica's replacements in the attempt."""
    return f"{generation_service_name(job, replica)}-{attempt}-{index}"


def rollouts_name(job: Job) -> str:
    """The rollout gateway's Deployment, Service and NetworkPolicy (client-rollout jobs)."""
    return f"{job.name}-rollouts"


def gateway_token_prefix(job: Job) -> str:
    """The generateName of the Secret holding the rollout gateway's internal-port token (client-rollout
    jobs): the API server appends 5 random characters, so no object the tenant made can have its name."""
    return f"{job.name}-gateway-token-"


def policy_service_name(job: Job) -> str:
    """The Service that names trainer rank 0 of whichever attempt runs (client-rollout jobs)."""
    return f"{job.name}-policy"


def client_rollouts(job: Job) -> bool:
    """spec.rollouts.source is Client: a rollout gateway instead of the metric service."""
    return rollouts_source(job.spec) == "Client"


def metric_url(job: Job) -> str | None:
    """The metric service's URL; None for a client-rollout job, which has none."""
    if job.spec.metric is None:
        return None
    return f"http://{metric_name(job)}.{job.namespace}.svc:{job.spec.metric.port}"


def environment_url(job: Job) -> str | None:
    """The environment server's URL; None for a job without spec.environment."""
    if job.spec.environment is None:
        return None
    return f"http://{environment_name(job)}.{job.namespace}.svc:{job.spec.environment.port}"


def gateway_url(job: Job) -> str:
    """The rollout gateway's internal URL, for trainer rank 0."""
    return f"http://{rollouts_name(job)}.{job.namespace}.svc:{GATEWAY_INTERNAL_PORT}"


def policy_url(job: Job) -> str:
    """Trainer rank 0's policy server, for the rollout gateway: stable across gang restarts."""
    return f"http://{policy_service_name(job)}.{job.namespace}.svc:{POLICY_PORT}"


def generation_host(job: Job, replica: int = 0) -> str:
    return f"{generation_service_name(job, replica)}.{job.namespace}.svc"


def master_addr(job: Job, attempt: int) -> str:
    """DNS name of trainer rank 0 through the headless Service (hostname.subdomain.namespace.svc)."""
    return f"{trainer_pod_name(job, attempt, 0)}.{trainer_service_name(job)}.{job.namespace}.svc"


# --- metadata -------------------------------------------------------------------------------------------


def selector_labels(job: Job, role: Role) -> dict[str, str]:
    """The labels Services, NetworkPolicies and the Deployment select on (stable for the job's life)."""
    return {LABEL_JOB: job.name, LABEL_ROLE: role}


def labels(job: Job, role: Role) -> dict[str, str]:
    return {
        LABEL_NAME: APP_NAMES[role],
        LABEL_INSTANCE: job.name,
        LABEL_COMPONENT: role,
        LABEL_PART_OF: PART_OF,
        LABEL_MANAGED_BY: PART_OF,
        **selector_labels(job, role),
    }


def owner_reference(job: Job) -> dict[str, Any]:
    # controller=True: the job is the managing controller; blockOwnerDeletion: foreground deletion of
    # the job waits for its children.
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": job.name,
        "uid": job.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def metadata(job: Job, name: str, role: Role, *, owned: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": job.namespace, "labels": labels(job, role)}
    if owned:
        meta["ownerReferences"] = [owner_reference(job)]
    return meta


def content_hash(value: Any) -> str:
    """Short, stable hash of a JSON-serialisable value."""
    blob = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def with_hash(manifest: Manifest) -> Manifest:
    """Returns the manifest with ANNOTATION_HASH set to the hash of everything else in it."""
    out = copy.deepcopy(manifest)
    annotations = out.setdefault("metadata", {}).setdefault("annotations", {})
    annotations.pop(ANNOTATION_HASH, None)
    annotations[ANNOTATION_HASH] = content_hash(out)
    return out


def cluster_ip_service(
    job: Job,
    name: str,
    role: Role,
    ports: list[tuple[str, int, int | str]],
    selector: dict[str, str] | None = None,
) -> Manifest:
    """A ClusterIP Service of the job's pods of ``role`` (or ``selector``); ``ports`` as (name, port,
    targetPort), TCP."""
    return with_hash(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": metadata(job, name, role),
            "spec": {
                "type": "ClusterIP",
                "selector": selector if selector is not None else selector_labels(job, role),
                "ports": [
                    {"name": port_name, "port": port, "targetPort": target, "protocol": "TCP"}
                    for port_name, port, target in ports
                ],
            },
        }
    )


def quantity_map(values: Mapping[str, object]) -> dict[str, str]:
    """Resource quantities as strings, the form Kubernetes returns them in (2 and "2" are equal)."""
    return {key: str(value) for key, value in values.items()}
