"""The whole desired set of a job's children, and parsing a GRPOJob object into a `Job`."""

from __future__ import annotations

from typing import Any

from grpo_operator.api.spec import GRPOJobSpec
from grpo_operator.builders.common import Job, Manifest, client_rollouts
from grpo_operator.builders.gang import generation_service, trainer_service
from grpo_operator.builders.metric import metric_deployment, metric_service
from grpo_operator.builders.network import (
    generation_network_policy,
    metric_network_policy,
    trainer_network_policy,
)
from grpo_operator.builders.rbac import trainer_role, trainer_role_binding, trainer_service_account
from grpo_operator.builders.rollouts import (
    GATEWAY_TOKEN_KEY,
    gateway_deployment,
    gateway_network_policy,
    gateway_service,
    gateway_token_secret,
    policy_service,
)
from grpo_operator.builders.storage import checkpoint_pvc
from grpo_operator.builders.trainer_configmap import trainer_config_map
from grpo_operator.settings import OperatorSettings


def job_from_object(obj: dict[str, Any]) -> Job:
    """A `Job` from a GRPOJob as read from the API server; raises pydantic.ValidationError on a bad spec."""
    meta = obj.get("metadata") or {}
    return Job(
        name=meta["name"],
        namespace=meta["namespace"],
        uid=meta.get("uid", ""),
        spec=GRPOJobSpec.model_validate(obj.get("spec") or {}),
    )


def infrastructure(job: Job, settings: OperatorSettings) -> list[Manifest]:
    """Children that live as long as the job runs or is suspended (everything except the gang pods and
    the metric Deployment): config, volume, identity, Services, NetworkPolicies, and in a client-rollout
    job the rollout gateway, which keeps the client's session through suspends and restarts."""
    if client_rollouts(job):
        rollouts = [gateway_service(job), policy_service(job)]
        policies = [gateway_network_policy(job)]
    else:
        rollouts, policies = [metric_service(job)], [metric_network_policy(job)]
    out = [
        trainer_config_map(job, settings),
        trainer_service_account(job),
        trainer_role(job),
        trainer_role_binding(job),
        trainer_service(job, settings),
        generation_service(job, settings),
        *rollouts,
        generation_network_policy(job, settings),
        *policies,
        trainer_network_policy(job, settings),
    ]
    if client_rollouts(job):
        out.append(gateway_deployment(job, settings))
    pvc = checkpoint_pvc(job)
    if pvc is not None:
        out.insert(1, pvc)
    return out


def metric_workload(job: Job, settings: OperatorSettings) -> list[Manifest]:
    """The metric Deployment: runs while the gang runs, stopped when suspended or finished. None in a
    client-rollout job."""
    return [] if client_rollouts(job) else [metric_deployment(job, settings)]


def generated_secrets(job: Job) -> list[tuple[Manifest, str]]:
    """Secrets created once and never updated, each with the key of the value the runtime generates when
    it creates it (no randomness in the builders): a client-rollout job's gateway token."""
    return [(gateway_token_secret(job), GATEWAY_TOKEN_KEY)] if client_rollouts(job) else []
