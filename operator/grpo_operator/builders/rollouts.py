"""The rollout gateway of a client-rollout job (spec.rollouts.source: Client): Deployment + Service
`<job>-rollouts`, its NetworkPolicy, Service `<job>-policy` that names trainer rank 0, and Secret
`<job>-gateway-token-xxxxx` (a name the API server picks, recorded in status.gatewayTokenSecret), the
internal port's token that only the gateway and trainer rank 0 hold.

The gateway speaks Arbor's protocol to the client (DSPy) on the client port and holds the job's protocol
state, so it must outlive gang restarts: a CPU-only Deployment beside the gang, like the metric service
it replaces, and kept after the job succeeds (DSPy calls terminate after its last step). One replica with
the Recreate strategy: two gateways behind one Service would each hand out their own batch ids.
"""

from __future__ import annotations

import copy
from typing import Any

from grpo_operator.api.gateway_config import (
    GATEWAY_CONFIG_ENV,
    GATEWAY_CONFIG_KEY,
    GATEWAY_INTERNAL_TOKEN_ENV,
)
from grpo_operator.api.trainer_config import (
    CONFIG_MOUNT_DIR,
    GATEWAY_INTERNAL_PORT,
    POLICY_PORT,
    ROLLOUTS_PORT,
    ROLLOUTS_TOKEN_ENV,
)
from grpo_operator.builders.common import (
    LABEL_JOB,
    LABEL_NODE_RANK,
    Job,
    Manifest,
    cluster_ip_service,
    config_map_name,
    content_hash,
    gateway_token_prefix,
    labels,
    metadata,
    owner_reference,
    policy_service_name,
    rollouts_name,
    selector_labels,
    with_hash,
)
from grpo_operator.builders.images import trainer_image
from grpo_operator.builders.network import ingress_policy
from grpo_operator.builders.scheduling import image_pull_secrets, pod_placement
from grpo_operator.builders.security import secure_pod_spec
from grpo_operator.builders.trainer_configmap import gateway_config_text
from grpo_operator.settings import OperatorSettings

CLIENT_PORT_NAME = "client"
INTERNAL_PORT_NAME = "internal"
# Pod template annotation: a changed gateway.json rolls the gateway (it reads its config at start).
ANNOTATION_GATEWAY_CONFIG_HASH = "grpo.dev/gateway-config-hash"
# Measured with bench/gateway_load.py (G=8, default lengths): 51 MiB idle, 52 MiB after 64 MiB bodies to a
# control route (refused unread), peak 132 MiB while 8 step bodies at the step limit arrive at once (before
# the body limits one 64 MiB body took it past 2 GiB). Body limits and at most 2 large parses at once bound
# what clients add; the groups kept for replay until a checkpoint covers them add about 2x their JSON size.
# The limit leaves ~7x headroom over the measured peak, so a hostile client cannot grow the gateway into the
# node's memory, while honest groups fit.
GATEWAY_RESOURCES: dict[str, Any] = {
    "requests": {"cpu": "100m", "memory": "256Mi"},
    "limits": {"memory": "1Gi"},
}


# The kubelet's default probe timeout is 1 s. While the gateway parses the largest bodies its limits let in
# (8 step-sized bodies at once, bench/gateway_load.py), /healthz answered in 33-44 ms (median) but up to
# 1.2 s at worst on a 2-core machine at load 8: a 1 s timeout would restart a healthy, busy gateway and lose
# the groups it holds.
GATEWAY_PROBE_TIMEOUT_SECONDS = 5

# The key of the gateway-token Secret that holds the internal port's token.
GATEWAY_TOKEN_KEY = "token"


def gateway_token_secret(job: Job) -> Manifest:
    """The internal port's token, without its value: the runtime generates the value when it creates the
    Secret (builders hold no randomness) and never updates it, since the gateway and trainer rank 0 read
    it once, at start. Immutable, so no one can change it under running pods either. A generateName, not a
    name: the API server picks a name no other object has, so the operator never needs to read a Secret
    to tell its own from one a tenant made, and the chart grants it only ``create`` on Secrets."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "generateName": gateway_token_prefix(job),
            "namespace": job.namespace,
            "labels": labels(job, "rollouts"),
            "ownerReferences": [owner_reference(job)],
        },
        "type": "Opaque",
        "immutable": True,
    }


def gateway_token_env(job: Job) -> dict[str, Any]:
    """The internal port's token by reference: the kubelet resolves it, so the value is never in a pod
    spec, and only the pods given this entry (the gateway and trainer rank 0) hold it."""
    if job.gateway_token_secret is None:
        raise ValueError(
            f"GRPOJob {job.namespace}/{job.name} has no gateway-token Secret recorded in "
            "status.gatewayTokenSecret yet: its gateway and trainer pods are built only after the operator "
            "has created that Secret (build the job from its status, or let reconcile create it first)"
        )
    ref = {"name": job.gateway_token_secret, "key": GATEWAY_TOKEN_KEY}
    return {"name": GATEWAY_INTERNAL_TOKEN_ENV, "valueFrom": {"secretKeyRef": ref}}


def gateway_env(job: Job) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": GATEWAY_CONFIG_ENV, "value": f"{CONFIG_MOUNT_DIR}/{GATEWAY_CONFIG_KEY}"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        gateway_token_env(job),
    ]
    client = job.spec.rollouts.client if job.spec.rollouts is not None else None
    if client is not None and client.token_secret_ref is not None:
        # A reference only: the kubelet resolves it, so the token is never in the GRPOJob, the pod spec
        # or the operator.
        ref = client.token_secret_ref
        env.append(
            {
                "name": ROLLOUTS_TOKEN_ENV,
                "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}},
            }
        )
    return env


def gateway_deployment(job: Job, settings: OperatorSettings) -> Manifest:
    probe = {
        "httpGet": {"path": "/healthz", "port": CLIENT_PORT_NAME},
        "timeoutSeconds": GATEWAY_PROBE_TIMEOUT_SECONDS,
    }
    container: dict[str, Any] = {
        "name": "gateway",
        "image": trainer_image(job.spec, settings),
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["python", "-m", "grpo_gateway"],
        "env": gateway_env(job),
        "ports": [
            {"name": CLIENT_PORT_NAME, "containerPort": ROLLOUTS_PORT, "protocol": "TCP"},
            {"name": INTERNAL_PORT_NAME, "containerPort": GATEWAY_INTERNAL_PORT, "protocol": "TCP"},
        ],
        "resources": copy.deepcopy(GATEWAY_RESOURCES),
        "readinessProbe": {**probe, "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {**probe, "initialDelaySeconds": 10, "periodSeconds": 10, "failureThreshold": 6},
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_MOUNT_DIR, "readOnly": True}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod_spec: dict[str, Any] = {
        # No Kubernetes API credentials and no service-link environment, like the metric pod.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "containers": [container],
        "volumes": [
            {
                "name": "config",
                "configMap": {
                    "name": config_map_name(job),
                    "items": [{"key": GATEWAY_CONFIG_KEY, "path": GATEWAY_CONFIG_KEY}],
                },
            }
        ],
        **pod_placement(job, settings, gpu=False),
        **image_pull_secrets(job, settings),
    }
    return with_hash(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": metadata(job, rollouts_name(job), "rollouts"),
            "spec": {
                "replicas": 1,
                "strategy": {"type": "Recreate"},
                "selector": {"matchLabels": selector_labels(job, "rollouts")},
                "template": {
                    "metadata": {
                        "labels": labels(job, "rollouts"),
                        "annotations": {
                            ANNOTATION_GATEWAY_CONFIG_HASH: content_hash(gateway_config_text(job))
                        },
                    },
                    "spec": secure_pod_spec(pod_spec, settings),
                },
            },
        }
    )


def gateway_service(job: Job) -> Manifest:
    return cluster_ip_service(
        job,
        rollouts_name(job),
        "rollouts",
        [
            (CLIENT_PORT_NAME, ROLLOUTS_PORT, CLIENT_PORT_NAME),
            (INTERNAL_PORT_NAME, GATEWAY_INTERNAL_PORT, INTERNAL_PORT_NAME),
        ],
    )


def policy_service(job: Job) -> Manifest:
    """Trainer rank 0 under one name for every attempt: MASTER_ADDR names the attempt's pod, which the
    gateway (living across attempts) cannot know. Only one attempt's pods exist at a time (a new gang
    starts once the old one is gone), so the selector matches one pod at most."""
    return cluster_ip_service(
        job,
        policy_service_name(job),
        "trainer",
        [("policy", POLICY_PORT, POLICY_PORT)],
        selector={**selector_labels(job, "trainer"), LABEL_NODE_RANK: "0"},
    )


def client_peers(job: Job) -> list[dict[str, Any]]:
    """NetworkPolicy peers for spec.rollouts.client.allowFrom."""
    client = job.spec.rollouts.client if job.spec.rollouts is not None else None
    peers: list[dict[str, Any]] = []
    for peer in client.allow_from if client is not None else []:
        entry: dict[str, Any] = {"podSelector": {"matchLabels": dict(peer.pod_labels)}}
        if peer.namespace_labels is not None:
            entry["namespaceSelector"] = {"matchLabels": dict(peer.namespace_labels)}
        peers.append(entry)
    return peers


def gateway_network_policy(job: Job) -> Manifest:
    # The internal port hands out the client's groups and takes the trainer's progress: the job's trainer
    # pods only. The client port: the clients the job names and the job's own pods. kubectl port-forward
    # is not filtered: the kubelet connects inside the pod's network namespace.
    ingress: list[dict[str, Any]] = [
        {
            "from": [{"podSelector": {"matchLabels": selector_labels(job, "trainer")}}],
            "ports": [{"protocol": "TCP", "port": GATEWAY_INTERNAL_PORT}],
        },
        {
            "from": [{"podSelector": {"matchLabels": {LABEL_JOB: job.name}}}, *client_peers(job)],
            "ports": [{"protocol": "TCP", "port": ROLLOUTS_PORT}],
        },
    ]
    return ingress_policy(job, rollouts_name(job), "rollouts", ingress)
