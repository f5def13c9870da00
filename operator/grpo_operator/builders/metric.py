"""The user's metric service: Deployment + Service `<job>-metric`."""

from __future__ import annotations

import json
from typing import Any

from grpo_operator.api.builtin_rewards import (
    ANSWER_TYPES,
    FUNCTION_NAME_ENV,
    FUNCTION_SOURCE_ENV,
    REWARDS_ENV,
)
from grpo_operator.api.spec import MetricSpec
from grpo_operator.builders.common import (
    Job,
    Manifest,
    cluster_ip_service,
    metric_name,
    quantity_map,
)
from grpo_operator.builders.user_service import user_service_deployment
from grpo_operator.settings import OperatorSettings

METRIC_PORT_NAME = "http"
# The SDK's serve() and most servers read the port from here; the contract's port is spec.metric.port.
METRIC_PORT_ENV = "GRPO_METRIC_PORT"


def _metric(job: Job) -> MetricSpec:
    assert job.spec.metric is not None, "a client-rollout job has no metric service"
    return job.spec.metric


def metric_resources(job: Job, settings: OperatorSettings) -> dict[str, Any]:
    res = _metric(job).resources
    requests = quantity_map(res.requests) if res.requests else dict(settings.default_metric_requests)
    out: dict[str, Any] = {"requests": requests}
    if res.limits:
        out["limits"] = quantity_map(res.limits)
    return out


def scoring_env(spec: MetricSpec, answer_field: str = "answer") -> list[dict[str, Any]]:
    """What the stock metric image computes: the built-in rewards as JSON (a reward that compares with a
    reference and names no column reads spec.dataset.answerField), or the user's function's source from its
    ConfigMap key (resolved by the kubelet, so the operator never reads the tenant's ConfigMap)."""
    if spec.rewards is not None:
        wire = [r.to_dict() for r in spec.rewards]
        for reward in wire:
            if reward["type"] in ANSWER_TYPES:
                reward.setdefault("field", answer_field)
        rewards = json.dumps(wire, separators=(",", ":"), sort_keys=True)
        return [{"name": REWARDS_ENV, "value": rewards}]
    if spec.function is not None:
        source = {"configMapKeyRef": {"name": spec.function.config_map, "key": spec.function.key}}
        return [
            {"name": FUNCTION_SOURCE_ENV, "valueFrom": source},
            {"name": FUNCTION_NAME_ENV, "value": spec.function.name},
        ]
    return []


def metric_deployment(job: Job, settings: OperatorSettings) -> Manifest:
    spec = _metric(job)
    port = spec.port
    answer_field = job.spec.dataset.answer_field if job.spec.dataset is not None else "answer"
    env = [{"name": METRIC_PORT_ENV, "value": str(port)}, *scoring_env(spec, answer_field)]
    reserved = {METRIC_PORT_ENV}
    if spec.rewards is not None or spec.function is not None:
        reserved |= {REWARDS_ENV, FUNCTION_SOURCE_ENV, FUNCTION_NAME_ENV}
    env += [var.to_dict() for var in spec.env if var.name not in reserved]
    # A plain value or a valueFrom reference, as written; neither means the empty string.
    env = [e if "valueFrom" in e else {"name": e["name"], "value": e.get("value", "")} for e in env]
    container: dict[str, Any] = {
        "name": "metric",
        "image": spec.image,
        "imagePullPolicy": settings.image_pull_policy,
        "ports": [{"name": METRIC_PORT_NAME, "containerPort": port, "protocol": "TCP"}],
        "env": env,
        "resources": metric_resources(job, settings),
        "readinessProbe": {
            "httpGet": {"path": "/healthz", "port": METRIC_PORT_NAME},
            "periodSeconds": 5,
            "failureThreshold": 3,
        },
        # A wedged metric server is restarted by the kubelet; scoring errors in between are counted
        # by the trainer against metric.errorBudget rather than failing the run.
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": METRIC_PORT_NAME},
            "initialDelaySeconds": 10,
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
    }
    return user_service_deployment(job, settings, metric_name(job), "metric", container, spec.replicas)


def metric_service(job: Job) -> Manifest:
    return cluster_ip_service(
        job, metric_name(job), "metric", [(METRIC_PORT_NAME, _metric(job).port, METRIC_PORT_NAME)]
    )
