"""``GatewayConfig``: what the operator renders into ConfigMap ``<job>-config`` key ``gateway.json`` for the
job's rollout gateway (``python -m grpo_gateway``, env GRPO_GATEWAY_CONFIG), in client-rollout jobs.

The gateway speaks Arbor's protocol to the client on ``client_port``, serves the client's scored groups to
trainer rank 0 on ``internal_port`` and forwards completion requests to rank 0's policy server at
``trainer_url``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field

from grpo_operator.api.base import ApiModel
from grpo_operator.api.trainer_config import GATEWAY_INTERNAL_PORT, ROLLOUTS_PORT, JobRef

GATEWAY_CONFIG_KEY = "gateway.json"
GATEWAY_CONFIG_ENV = "GRPO_GATEWAY_CONFIG"


class GatewayConfig(ApiModel):
    """The rollout gateway's whole configuration (gateway.json)."""

    # Lax like trainer.json: also written by hand for local runs.
    model_config = ConfigDict(strict=False)

    api_version: Literal["grpo.dev/v1alpha1"] = Field(default="grpo.dev/v1alpha1")
    kind: Literal["GatewayConfig"] = Field(default="GatewayConfig")
    job: JobRef
    served_model: str = Field(
        min_length=1, description="spec.model.name: the only model initialize and completions accept."
    )
    group_size: int = Field(ge=1, description="G: completions per group (spec.grpo.groupSize).")
    prompts_per_step: int = Field(ge=1, description="B: groups per step (spec.grpo.promptsPerStep).")
    steps: int = Field(ge=1, description="S: steps of the run (spec.grpo.steps).")
    client_port: int = Field(default=ROLLOUTS_PORT, ge=1, le=65535, description="Arbor + OpenAI routes.")
    internal_port: int = Field(
        default=GATEWAY_INTERNAL_PORT, ge=1, le=65535, description="Routes for trainer rank 0 only."
    )
    trainer_url: str = Field(
        min_length=1, description="Trainer rank 0's policy server, e.g. http://<job>-policy.<ns>.svc:7455."
    )
    token_env: str | None = Field(
        default=None,
        min_length=1,
        description="Environment variable holding the bearer token of the OpenAI routes; unset: none.",
    )
    completion_wait_seconds: float = Field(
        default=1800.0,
        gt=0,
        description="How long a completion request waits for the trainer's policy server (e.g. through a "
        "gang restart) before it is answered 503.",
    )
    max_steps_ahead: int = Field(
        default=1,
        ge=1,
        description="Steps of groups the client may send beyond the step the trainer last asked for: the "
        "next batch ids are announced only then, so rollouts are at most this many steps off-policy.",
    )

    def dump_json(self) -> str:
        """gateway.json text: camelCase keys, unset optionals omitted."""
        return self.model_dump_json(by_alias=True, exclude_none=True, indent=2)

    @classmethod
    def load(cls, path: str | Path) -> GatewayConfig:
        return cls.model_validate_json(Path(path).read_text(encoding="utf-8"))
