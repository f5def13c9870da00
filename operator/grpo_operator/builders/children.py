"""The whole desired set of a job's children, and parsing a GRPOJob object into a `Job`."""

from __future__ import annotations

from typing import Any

from grpo_operator.api.spec import GRPOJobSpec
from grpo_operator.builders.common import Job, Manifest
from grpo_operator.builders.config import trainer_config_map
from grpo_operator.builders.gang import generation_service, trainer_service
from grpo_operator.builders.metric import metric_deployment, metric_service
from grpo_operator.builders.network import (
    generation_network_policy,
    metric_network_policy,
    trainer_network_policy,
)
from grpo_operator.builders.rbac import trainer_role, trainer_role_binding, trainer_service_account
from grpo_operator.builders.storage import checkpoint_pvc
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
    the metric Deployment): config, volume, identity, Services, NetworkPolicies."""
    out = [
        trainer_config_map(job, settings),
        trainer_service_account(job),
        trainer_role(job),
        trainer_role_binding(job),
        trainer_service(job, settings),
        generation_service(job, settings),
        metric_service(job),
        generation_network_policy(job, settings),
        metric_network_policy(job),
        trainer_network_policy(job, settings),
    ]
    pvc = checkpoint_pvc(job)
    if pvc is not None:
        out.insert(1, pvc)
    return out


def metric_workload(job: Job, settings: OperatorSettings) -> list[Manifest]:
    """The metric Deployment: runs while the gang runs, stopped when suspended or finished."""
    return [metric_deployment(job, settings)]
