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
# The secret of the internal port: the gateway requires it as `Authorization: Bearer <secret>` when its
# config names this variable, and trainer rank 0's GatewayClient sends it when the variable is set.
GATEWAY_INTERNAL_TOKEN_ENV = "GRPO_GATEWAY_INTERNAL_TOKEN"
# The bound of the metric path (spec.metric.maxAbsReward's default): a client's rewards meet the same one.
DEFAULT_MAX_ABS_REWARD = 1e6
# Largest body of a route that carries no group or transcript (Arbor's control routes, the internal ones).
DEFAULT_MAX_CONTROL_BODY_BYTES = 64 * 1024
# One chat transcript when the spec says nothing about lengths (a hand-written gateway.json).
DEFAULT_MAX_TRANSCRIPT_BYTES = 1024 * 1024


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
    max_abs_reward: float = Field(
        default=DEFAULT_MAX_ABS_REWARD,
        gt=0,
        description="Largest |reward| a client group may carry, the metric path's bound: a group with a "
        "reward beyond it is refused with 400.",
    )
    max_transcript_bytes: int = Field(
        default=DEFAULT_MAX_TRANSCRIPT_BYTES,
        ge=1024,
        description="Largest JSON size of one chat transcript: the body limit of a completion request, and "
        "G times it (plus a control body) that of a step (one group).",
    )
    max_control_body_bytes: int = Field(
        default=DEFAULT_MAX_CONTROL_BODY_BYTES,
        ge=1024,
        description="Body limit of the routes that carry no group (initialize, status, checkpoint, cancel, "
        "terminate, the internal routes).",
    )
    max_checkpoint_requests: int = Field(
        default=64, ge=1, description="Checkpoint requests held until a checkpoint answers them."
    )
    max_held_completions: int = Field(
        default=256, ge=1, description="Completion requests held at once while the trainer is away."
    )
    max_held_completion_bytes: int = Field(
        default=64 * 1024 * 1024, ge=1024, description="Their bodies' bytes held at once."
    )
    internal_token_env: str | None = Field(
        default=None,
        min_length=1,
        description="Environment variable holding the secret the internal port requires as `Authorization: "
        "Bearer <secret>` (trainer rank 0 sends $GRPO_GATEWAY_INTERNAL_TOKEN); unset: none.",
    )
    max_steps_ahead: int = Field(
        default=1,
        ge=1,
        description="Steps of groups the client may send beyond the step the trainer last asked for: the "
        "next batch ids are announced only then, so rollouts are at most this many steps off-policy.",
    )

    @property
    def max_step_body_bytes(self) -> int:
        """A step carries one group: G transcripts and the route's own fields."""
        return self.group_size * self.max_transcript_bytes + self.max_control_body_bytes

    def dump_json(self) -> str:
        """gateway.json text: camelCase keys, unset optionals omitted."""
        return self.model_dump_json(by_alias=True, exclude_none=True, indent=2)

    @classmethod
    def load(cls, path: str | Path) -> GatewayConfig:
        return cls.model_validate_json(Path(path).read_text(encoding="utf-8"))
