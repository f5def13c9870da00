"""``spec.environment``: a multi-turn environment the trainer's episodes run against, served from an image
that speaks OpenEnv's protocol, and ``EnvironmentClientConfig``, what trainer.json tells the trainer about it.

OpenEnv's server keeps one environment instance per WebSocket connection at ``/ws`` (its HTTP ``/reset``
and ``/step`` build a fresh instance per request, so they cannot carry an episode): an episode is one
connection that sends ``{"type": "reset", "data": <dataset row>}``, then ``{"type": "step", "data":
<action>}`` per model turn, and reads ``{"type": "observation", "data": {"observation": {...}, "reward":
r, "done": d}}`` or ``{"type": "error", "data": {"message": ...}}`` back. ``GET /health`` is its readiness.

The rules that tie ``spec.environment`` to the rest of the spec read spec.rollouts,
spec.generation and spec.grpo, so they sit on ``GRPOJobSpec.Rules``: they are written here (bound there by
name) with their pydantic twin, ``check_environment_rules``, which the spec's cross-object validator calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import ConfigDict, Field

from grpo_operator.api.base import ApiModel, CelRule
from grpo_operator.api.field_types import INTEGRAL_FLOAT, NO_SPACE_PATTERN, K8sInt
from grpo_operator.api.pod_fields import ENV_LIST_SCHEMA, EnvList, ResourceRequirements
from grpo_operator.api.rollouts import CLIENT_MODE, rollouts_source
from grpo_operator.api.workloads import COLOCATED

if TYPE_CHECKING:
    from grpo_operator.api.spec import GRPOJobSpec

# OpenEnv's servers listen on 8000 (its template's `uvicorn server.app:app --port 8000`).
DEFAULT_ENVIRONMENT_PORT = 8000
MAX_TURNS = 64
EnvironmentReward = Literal["Final", "Sum"]
ActionFormat = Literal["Text", "ToolCall"]
ObservationRole = Literal["user", "tool"]
FIELD_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"
CIDR_PATTERN = r"^[0-9a-fA-F:.]+/[0-9]{1,3}$"
# The longest CIDR: a full IPv6 address with an embedded IPv4 one and /128.
MAX_CIDR_LENGTH = 49


class EnvironmentSpec(ApiModel):
    """The environment service: an OpenEnv server (WebSocket ``/ws``, ``GET /health``) from the user's
    image, which the job's episodes reset with a dataset row and step with the model's turns."""

    image: str = Field(
        min_length=1,
        max_length=512,
        pattern=NO_SPACE_PATTERN,
        description="Environment server container image speaking OpenEnv's protocol (an `openenv init` "
        "environment's image, for one).",
    )
    port: K8sInt = Field(
        default=DEFAULT_ENVIRONMENT_PORT,
        ge=1,
        le=65535,
        description="Port the environment server listens on.",
    )
    replicas: K8sInt = Field(
        default=1, ge=1, le=64, description="Environment server replicas behind one Service."
    )
    runtime_class_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description="RuntimeClass of the environment pods, to run the tools the model calls under a sandbox "
        "runtime (gVisor's runsc, Kata) where the platform offers one.",
    )
    egress_cidrs: Annotated[
        list[Annotated[str, Field(max_length=MAX_CIDR_LENGTH, pattern=CIDR_PATTERN)]], Field(max_length=32)
    ] = Field(
        default_factory=list,
        description="Networks the environment pods may reach (CIDRs, with DNS to kube-system). Empty: no "
        "egress at all; the job's trainers are the only ones that can reach the pods either way.",
    )
    max_turns: K8sInt = Field(
        default=8,
        ge=1,
        le=MAX_TURNS,
        description="Model turns per episode at most; an episode still running after them is truncated.",
    )
    # In an Optional the bounds go inside (field_types.py): the CRD then carries them as minimum/maximum.
    max_turn_tokens: Annotated[int, Field(ge=1, le=131072), INTEGRAL_FLOAT] | None = Field(
        default=None,
        description="Tokens one model turn may sample at most. Unset: what is left of the episode's budget, "
        "spec.grpo.maxCompletionLength, which holds every turn and every observation of the episode.",
    )
    max_observation_tokens: K8sInt = Field(
        default=512,
        ge=1,
        le=131072,
        description="Tokens of one observation (its message, template included) kept; a longer one is cut.",
    )
    reward: EnvironmentReward = Field(
        default="Final",
        description="Final: the reward of the step that ended the episode. Sum: the sum of every step's. With "
        "spec.metric set, the metric also scores the episode's final answer (the model's last turn) and the "
        "episode's reward is the environment's plus the metric's; an environment that gives no reward then "
        "adds 0.",
    )
    action_format: ActionFormat = Field(
        default="Text",
        description="Text: each model turn is sent as the action {actionField: <turn text>}. ToolCall: each "
        'turn must hold one <tool_call>{"name": ..., "arguments": {...}}</tool_call> block, sent as OpenEnv\'s '
        'call_tool action {"type": "call_tool", "tool_name": ..., "arguments": {...}}; a turn without one '
        "is the model's format failure.",
    )
    action_field: str = Field(
        default="message",
        max_length=64,
        pattern=FIELD_NAME_PATTERN,
        description="Text actions: the action field the turn's text goes in.",
    )
    observation_field: str | None = Field(
        default=None,
        max_length=64,
        pattern=FIELD_NAME_PATTERN,
        description="The observation field whose text becomes the next message. Unset: the whole observation "
        "as JSON.",
    )
    observation_role: ObservationRole = Field(
        default="user", description="Chat role of the observation's message."
    )
    concurrency: K8sInt = Field(
        default=16,
        ge=1,
        le=1024,
        description="Episodes in flight at once (each holds one WebSocket session of the environment).",
    )
    timeout_seconds: K8sInt = Field(
        default=60, ge=1, le=3600, description="Timeout of one reset or step of the environment."
    )
    error_budget: float = Field(
        default=0.05,
        ge=0.0,
        le=1.0,
        description="Fraction of episodes in a sliding window of steps that may fail on the environment's "
        "side (errors, timeouts, malformed answers, a lost connection) before the job fails.",
    )
    max_message_bytes: K8sInt = Field(
        default=1024 * 1024,
        ge=1024,
        le=64 * 1024 * 1024,
        description="Largest message the trainer reads from the environment; a longer one fails its episode.",
    )
    env: EnvList = Field(
        default_factory=list, json_schema_extra=ENV_LIST_SCHEMA, description="Extra environment variables."
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description="Resources of each environment server pod. GPUs requested here count toward the "
        "platform's maxGpusPerJob, times replicas.",
    )


class EnvironmentClientConfig(ApiModel):
    """How the trainer runs episodes against the environment service (trainer.json ``environment``)."""

    # Lax like the rest of trainer.json, which is also written by hand for local runs.
    model_config = ConfigDict(strict=False)

    url: str = Field(min_length=1, description="Base URL, e.g. http://<job>-env:8000.")
    max_turns: int = Field(default=8, ge=1, le=MAX_TURNS)
    max_turn_tokens: int | None = Field(default=None, ge=1)
    max_observation_tokens: int = Field(default=512, ge=1)
    reward: EnvironmentReward = "Final"
    action_format: ActionFormat = "Text"
    action_field: str = "message"
    observation_field: str | None = None
    observation_role: ObservationRole = "user"
    concurrency: int = Field(default=16, ge=1)
    timeout_seconds: float = Field(default=60.0, gt=0)
    error_budget: float = Field(default=0.05, ge=0, le=1)
    max_message_bytes: int = Field(default=1024 * 1024, ge=1024)

    @classmethod
    def of(cls, spec: EnvironmentSpec, url: str) -> EnvironmentClientConfig:
        return cls(
            url=url,
            max_turns=spec.max_turns,
            max_turn_tokens=spec.max_turn_tokens,
            max_observation_tokens=spec.max_observation_tokens,
            reward=spec.reward,
            action_format=spec.action_format,
            action_field=spec.action_field,
            observation_field=spec.observation_field,
            observation_role=spec.observation_role,
            concurrency=spec.concurrency,
            timeout_seconds=float(spec.timeout_seconds),
            error_budget=spec.error_budget,
            max_message_bytes=spec.max_message_bytes,
        )


# --- the rules across the spec ----------------------------------------------------------------------------
# GRPOJobSpec.Rules binds each under the name in its constant's lowercase (the order there is the CRD's), and
# check_environment_rules is their pydantic twin.

_WITH_ENVIRONMENT = "has(self.environment)"

ENVIRONMENT_NOT_WITH_CLIENT = CelRule(
    f"!{_WITH_ENVIRONMENT} || !({CLIENT_MODE})",
    "spec.environment is not supported when spec.rollouts.source is Client: the client samples and scores its "
    "own rollouts, so no episode would run against the environment. Remove spec.environment, or use source: "
    "Metric",
    ".environment",
)
ENVIRONMENT_NOT_COLOCATED = CelRule(
    f"!{_WITH_ENVIRONMENT} || !({COLOCATED})",
    "spec.environment is not supported with spec.generation.mode: Colocate: the episodes' model turns are "
    "sampled from the job's vLLM server. Remove spec.generation.mode (Server is the default)",
    ".generation.mode",
)


def check_environment_rules(spec: GRPOJobSpec) -> None:
    """The pydantic twin of the rules above, in the order the CRD lists them: raises the first one broken."""
    if spec.environment is None:
        return
    if rollouts_source(spec) == "Client":
        raise ENVIRONMENT_NOT_WITH_CLIENT.violation()
    if spec.generation.colocated():
        raise ENVIRONMENT_NOT_COLOCATED.violation()
