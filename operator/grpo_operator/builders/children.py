"""The whole desired set of a job's children, and parsing a GRPOJob object into a `Job`."""

from __future__ import annotations

from typing import Any

from grpo_operator.api.spec import GRPOJobSpec
from grpo_operator.builders.common import Job, Manifest, client_rollouts
from grpo_operator.builders.environment import (
    environment_deployment,
    environment_network_policy,
    environment_service,
)
from grpo_operator.builders.gang import generation_services, trainer_service
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


def job_from_object(obj: dict[str, Any], *, gateway_token_secret: str | None = None) -> Job:
    """A `Job` from a GRPOJob as read from the API server; raises pydantic.ValidationError on a bad spec.
    ``gateway_token_secret``: the gateway-token Secret's name as the operator recorded it (reconcile passes
    its own trusted copy, never the status as read: the trainer can write the status)."""
    meta = obj.get("metadata") or {}
    return Job(
        name=meta["name"],
        namespace=meta["namespace"],
        uid=meta.get("uid", ""),
        spec=GRPOJobSpec.model_validate(obj.get("spec") or {}),
        gateway_token_secret=gateway_token_secret,
    )


def infrastructure(job: Job, settings: OperatorSettings) -> list[Manifest]:
    """Children that live as long as the job runs or is suspended (everything except the gang pods and
    the metric and environment Deployments): config, volume, identity, Services, NetworkPolicies, and in a
    client-rollout job the rollout gateway, which keeps the client's session through suspends and restarts
    (once its token Secret is recorded: generated_secrets)."""
    if client_rollouts(job):
        rollouts = [gateway_service(job), policy_service(job)]
        policies = [gateway_network_policy(job)]
    else:
        # The reward source: the metric service, or the environment server (which rewards its episodes).
        rollouts, policies = [], []
        if job.spec.metric is not None:
            rollouts, policies = [metric_service(job)], [metric_network_policy(job)]
        if job.spec.environment is not None:
            rollouts.append(environment_service(job))
            policies.append(environment_network_policy(job))
    out = [
        trainer_config_map(job, settings),
        trainer_service_account(job),
        trainer_role(job),
        trainer_role_binding(job),
        trainer_service(job, settings),
        *generation_services(job, settings),
        *rollouts,
        # A colocated job has no vLLM pod for a policy to select.
        *([] if job.spec.generation.colocated() else [generation_network_policy(job, settings)]),
        *policies,
        trainer_network_policy(job, settings),
    ]
    if client_rollouts(job) and job.gateway_token_secret is not None:
        # The gateway reads its token Secret at start: its Deployment waits for the Secret's name.
        out.append(gateway_deployment(job, settings))
    pvc = checkpoint_pvc(job)
    if pvc is not None:
        out.insert(1, pvc)
    return out


def metric_workload(job: Job, settings: OperatorSettings) -> list[Manifest]:
    """The metric Deployment and the environment server's (those of the two the spec has): run while the
    gang runs, stopped when suspended or finished. None in a client-rollout job."""
    if client_rollouts(job):
        return []
    out = [metric_deployment(job, settings)] if job.spec.metric is not None else []
    if job.spec.environment is not None:
        out.append(environment_deployment(job, settings))
    return out


def generated_secrets(job: Job) -> list[tuple[Manifest, str]]:
    """Secrets to create once and never update, each with the key of the value the runtime generates when
    it creates it (no randomness in the builders): a client-rollout job's gateway token, until its name is
    recorded (after that, a new one would lock the running gang out of its gateway)."""
    if client_rollouts(job) and job.gateway_token_secret is None:
        return [(gateway_token_secret(job), GATEWAY_TOKEN_KEY)]
    return []
