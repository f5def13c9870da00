"""NetworkPolicies: the vLLM server and the metric service accept traffic only from the job's trainers.

vLLM in dev mode serves /collective_rpc, /sleep and weight-update routes (grpo-trainer.md §4.2): anyone
who can reach it can change the model being trained. The metric service runs user code. Both are
closed to everything but this job's trainer pods, except that the platform may name metrics scrapers
(settings.metrics_scrapers) admitted to vLLM's HTTP port for /metrics.
"""

from __future__ import annotations

import copy
from typing import Any

from grpo_operator.builders.common import (
    Job,
    Manifest,
    generation_policy_name,
    metadata,
    metric_policy_name,
    selector_labels,
    with_hash,
)
from grpo_operator.settings import OperatorSettings


def generation_network_policy(job: Job, settings: OperatorSettings) -> Manifest:
    # Trainers on all ports: besides HTTP on 8000, NCCL weight transfer opens ephemeral ports in both
    # directions between trainer rank 0 and the vLLM workers, and NCCL cannot be pinned to a port range.
    ingress: list[dict[str, Any]] = [
        {"from": [{"podSelector": {"matchLabels": selector_labels(job, "trainer")}}]}
    ]
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
    return with_hash(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": metadata(job, generation_policy_name(job), "generation"),
            "spec": {
                "podSelector": {"matchLabels": selector_labels(job, "generation")},
                "policyTypes": ["Ingress"],
                "ingress": ingress,
            },
        }
    )


def metric_network_policy(job: Job) -> Manifest:
    return with_hash(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": metadata(job, metric_policy_name(job), "metric"),
            "spec": {
                "podSelector": {"matchLabels": selector_labels(job, "metric")},
                "policyTypes": ["Ingress"],
                "ingress": [
                    {
                        "from": [{"podSelector": {"matchLabels": selector_labels(job, "trainer")}}],
                        "ports": [{"protocol": "TCP", "port": job.spec.metric.port}],
                    }
                ],
            },
        }
    )
