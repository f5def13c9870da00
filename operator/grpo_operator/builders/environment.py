"""The user's environment server (spec.environment): Deployment + Service `<job>-env`, and its NetworkPolicy.

The image is tenant code that runs the tools a model calls, so it is closed in both directions: only the
job's trainer pods reach it, on its port, and it reaches nothing unless spec.environment.egressCidrs names
networks (then those, and DNS in kube-system). spec.environment.runtimeClassName puts it under a sandbox
runtime where the platform offers one; the pod meets the same Pod Security Standard as the metric pod.
"""

from __future__ import annotations

from typing import Any

from grpo_operator.api.environment import EnvironmentSpec
from grpo_operator.builders.common import (
    Job,
    Manifest,
    cluster_ip_service,
    environment_name,
    metadata,
    quantity_map,
    selector_labels,
    with_hash,
)
from grpo_operator.builders.user_service import user_service_deployment
from grpo_operator.settings import OperatorSettings

ENVIRONMENT_PORT_NAME = "http"
# Servers that read their port from the environment find spec.environment.port here (OpenEnv's template
# listens on 8000, its default, whatever this says).
ENVIRONMENT_PORT_ENV = "PORT"
# OpenEnv's readiness route.
HEALTH_PATH = "/health"
# DNS for an environment with egress: the cluster's resolver, in kube-system.
DNS_NAMESPACE = {"kubernetes.io/metadata.name": "kube-system"}


def _environment(job: Job) -> EnvironmentSpec:
    assert job.spec.environment is not None, "only a job with spec.environment has an environment server"
    return job.spec.environment


def environment_resources(job: Job, settings: OperatorSettings) -> dict[str, Any]:
    """spec.environment.resources; without requests, the metric pod's defaults (a small CPU server too)."""
    res = _environment(job).resources
    requests = quantity_map(res.requests) if res.requests else dict(settings.default_metric_requests)
    out: dict[str, Any] = {"requests": requests}
    if res.limits:
        out["limits"] = quantity_map(res.limits)
    return out


def environment_deployment(job: Job, settings: OperatorSettings) -> Manifest:
    spec = _environment(job)
    env: list[dict[str, Any]] = [{"name": ENVIRONMENT_PORT_ENV, "value": str(spec.port)}]
    env += [var.to_dict() for var in spec.env if var.name != ENVIRONMENT_PORT_ENV]
    # A plain value or a valueFrom reference, as written; neither means the empty string.
    env = [e if "valueFrom" in e else {"name": e["name"], "value": e.get("value", "")} for e in env]
    container: dict[str, Any] = {
        "name": "environment",
        "image": spec.image,
        "imagePullPolicy": settings.image_pull_policy,
        "ports": [{"name": ENVIRONMENT_PORT_NAME, "containerPort": spec.port, "protocol": "TCP"}],
        "env": env,
        "resources": environment_resources(job, settings),
        # No liveness probe: a restart would drop every episode's WebSocket session at once; the trainer
        # counts an episode the server fails against spec.environment.errorBudget.
        "readinessProbe": {
            "httpGet": {"path": HEALTH_PATH, "port": ENVIRONMENT_PORT_NAME},
            "periodSeconds": 5,
            "failureThreshold": 3,
        },
    }
    return user_service_deployment(
        job,
        settings,
        environment_name(job),
        "environment",
        container,
        spec.replicas,
        **({"runtimeClassName": spec.runtime_class_name} if spec.runtime_class_name else {}),
    )


def environment_service(job: Job) -> Manifest:
    return cluster_ip_service(
        job,
        environment_name(job),
        "environment",
        [(ENVIRONMENT_PORT_NAME, _environment(job).port, ENVIRONMENT_PORT_NAME)],
    )


def environment_network_policy(job: Job) -> Manifest:
    """Ingress from the job's trainer pods on the server's port only; egress to nothing, or, with
    spec.environment.egressCidrs, to those networks and to DNS in kube-system."""
    spec = _environment(job)
    ingress = [
        {
            "from": [{"podSelector": {"matchLabels": selector_labels(job, "trainer")}}],
            "ports": [{"protocol": "TCP", "port": spec.port}],
        }
    ]
    egress: list[dict[str, Any]] = []
    if spec.egress_cidrs:
        egress = [
            {"to": [{"ipBlock": {"cidr": cidr}} for cidr in spec.egress_cidrs]},
            {
                "to": [{"namespaceSelector": {"matchLabels": dict(DNS_NAMESPACE)}}],
                "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
            },
        ]
    return with_hash(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": metadata(job, environment_name(job), "environment"),
            "spec": {
                "podSelector": {"matchLabels": selector_labels(job, "environment")},
                # Egress listed with no rules denies every connection the pods open.
                "policyTypes": ["Ingress", "Egress"],
                "ingress": ingress,
                "egress": egress,
            },
        }
    )
