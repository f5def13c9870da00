"""NetworkPolicies: every pod of a job accepts traffic only from the peers its role needs.

vLLM in dev mode (VLLM_SERVER_DEV_MODE=1) serves /collective_rpc, /sleep and weight-update routes: anyone
who can reach it can change the model being trained. The metric service runs user code. Both are
closed to everything but this job's trainer pods, except that the platform may name metrics scrapers
(settings.metrics_scrapers) admitted to vLLM's HTTP port for /metrics.

Trainer pods bind unauthenticated stores: torch.distributed's rendezvous and the weight-sync TCPStore
(which then hands out NCCL or gloo connections). They accept the job's own vLLM and trainer pods on every
port and the named scrapers on the metrics port. Being explicit also matters in namespaces with a
default-deny ingress policy, where without this policy vLLM could not reach rank 0 at all.

The Broadcast weight transport makes one process group of trainer rank 0 and every worker of every vLLM
replica: after the rendezvous on rank 0's weight-sync port, gloo and NCCL connect every pair of members on
ephemeral ports, which neither lets one pin. Under Broadcast the vLLM pods therefore also accept the job's
own vLLM pods, on every port (with one replica, the pod itself); nothing outside the job gets in by it.
"""

from __future__ import annotations

import copy
from typing import Any

from grpo_operator.api.trainer_config import POLICY_PORT
from grpo_operator.builders.common import (
    Job,
    Manifest,
    Role,
    client_rollouts,
    generation_policy_name,
    metadata,
    metric_policy_name,
    selector_labels,
    trainer_policy_name,
    with_hash,
)
from grpo_operator.settings import OperatorSettings


def ingress_policy(job: Job, name: str, role: Role, ingress: list[dict[str, Any]]) -> Manifest:
    """The NetworkPolicy that admits only `ingress` to the job's pods of one role."""
    return with_hash(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": metadata(job, name, role),
            "spec": {
                "podSelector": {"matchLabels": selector_labels(job, role)},
                "policyTypes": ["Ingress"],
                "ingress": ingress,
            },
        }
    )


def broadcast_group(job: Job) -> bool:
    """Whether the job's vLLM pods must accept one another: the Broadcast transport. With one replica the
    only such peer is the pod itself, whose tensor-parallel workers may connect through its pod IP."""
    return job.spec.generation.weight_transport() == "Broadcast"


def generation_network_policy(job: Job, settings: OperatorSettings) -> Manifest:
    # Trainers on all ports: besides HTTP on 8000, NCCL weight transfer opens ephemeral ports in both
    # directions between trainer rank 0 and the vLLM workers, and NCCL cannot be pinned to a port range.
    peers = [{"podSelector": {"matchLabels": selector_labels(job, "trainer")}}]
    if broadcast_group(job):
        # The Broadcast group's members connect pairwise: vLLM pod to vLLM pod, on ephemeral ports.
        peers.append({"podSelector": {"matchLabels": selector_labels(job, "generation")}})
    ingress: list[dict[str, Any]] = [{"from": peers}]
    if settings.metrics_scrapers:
        # Scrapers on the HTTP port only, where vLLM serves /metrics (and, unavoidably, its API: a
        # NetworkPolicy cannot restrict paths, hence opt-in and only for the peers the platform names).
        # The rule is part of the spec-hash, so changing the setting re-applies every job's policy.
        ingress.append(
            {
                "from": [copy.deepcopy(dict(peer)) for peer in settings.metrics_scrapers],
                "ports": [{"protocol": "TCP", "port": settings.vllm_port}],
            }
        )
    return ingress_policy(job, generation_policy_name(job), "generation", ingress)


def metric_network_policy(job: Job) -> Manifest:
    assert job.spec.metric is not None, "a client-rollout job has no metric service"
    ingress: list[dict[str, Any]] = [
        {
            "from": [{"podSelector": {"matchLabels": selector_labels(job, "trainer")}}],
            "ports": [{"protocol": "TCP", "port": job.spec.metric.port}],
        }
    ]
    return ingress_policy(job, metric_policy_name(job), "metric", ingress)


def trainer_network_policy(job: Job, settings: OperatorSettings) -> Manifest:
    # The job's vLLM and trainer pods on all ports: vLLM workers connect to rank 0's weight-sync store
    # and then open NCCL connections on ephemeral ports; trainer ranks rendezvous with rank 0 and then
    # talk NCCL among themselves. Nothing else gets in, except the scrapers on the metrics port. A
    # colocated job has trainer pods alone.
    peers = [{"podSelector": {"matchLabels": selector_labels(job, "trainer")}}]
    if not job.spec.generation.colocated():
        peers.insert(0, {"podSelector": {"matchLabels": selector_labels(job, "generation")}})
    ingress: list[dict[str, Any]] = [{"from": peers}]
    if client_rollouts(job):
        # The rollout gateway forwards the client's completion requests to rank 0's policy server.
        ingress.append(
            {
                "from": [{"podSelector": {"matchLabels": selector_labels(job, "rollouts")}}],
                "ports": [{"protocol": "TCP", "port": POLICY_PORT}],
            }
        )
    scrapers: list[dict[str, Any]] = []
    for peer in (*settings.metrics_scrapers, *settings.trainer_metrics_scrapers):
        if dict(peer) not in scrapers:
            scrapers.append(copy.deepcopy(dict(peer)))
    if scrapers:
        ingress.append(
            {"from": scrapers, "ports": [{"protocol": "TCP", "port": settings.trainer_metrics_port}]}
        )
    return ingress_policy(job, trainer_policy_name(job), "trainer", ingress)
