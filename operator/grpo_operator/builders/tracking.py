"""Trainer rank 0's variables for spec.tracking: the trackers' credentials, as Secret references only."""

from __future__ import annotations

from typing import Any

from grpo_operator.api.tracking import (
    MLFLOW_CREDENTIAL_KEYS,
    WANDB_API_KEY_ENV,
    TrackingSpec,
    resolved_tracking,
)
from grpo_operator.builders.common import Job
from grpo_operator.settings import OperatorSettings


def job_tracking(job: Job, settings: OperatorSettings) -> TrackingSpec | None:
    """The job's trackers with the platform's defaults under them (what trainer.json carries)."""
    return resolved_tracking(job.spec.tracking, settings.tracking_defaults)


def tracking_env(job: Job, settings: OperatorSettings) -> list[dict[str, Any]]:
    """Credential variables of the enabled trackers. Only references go into the pod: the kubelet resolves
    them, so no credential is ever in the GRPOJob, trainer.json, the operator's memory, logs or events."""
    tracking = job_tracking(job, settings)
    if tracking is None:
        return []
    env: list[dict[str, Any]] = []
    mlflow = tracking.mlflow_enabled()
    if mlflow is not None and mlflow.credentials_secret is not None:
        # Each key is optional: a Secret holds a username and password, or a token.
        env += [
            {
                "name": key,
                "valueFrom": {
                    "secretKeyRef": {"name": mlflow.credentials_secret, "key": key, "optional": True}
                },
            }
            for key in MLFLOW_CREDENTIAL_KEYS
        ]
    wandb = tracking.wandb_enabled()
    if wandb is not None and wandb.mode == "online" and wandb.api_key_secret_ref is not None:
        ref = wandb.api_key_secret_ref
        env.append(
            {"name": WANDB_API_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}
        )
    return env
