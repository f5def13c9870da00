"""``spec.grpo``: the GRPO hyper-parameters, LoRA adapters and periodic validation."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from grpo_operator.api.base import ApiModel, CelRule, CelRules
from grpo_operator.api.field_types import K8sInt


class LoraSpec(ApiModel):
    """Low-rank adapters instead of full fine-tuning: far less GPU memory, adapters only in checkpoints."""

    enabled: bool = Field(default=False, description="Train LoRA adapters instead of all weights.")
    r: K8sInt = Field(default=16, ge=1, le=1024, description="Adapter rank.")
    alpha: K8sInt = Field(default=32, ge=1, le=4096, description="LoRA scaling numerator (lora_alpha).")
    dropout: float = Field(default=0.05, ge=0.0, lt=1.0, description="Dropout on the adapter input.")
    target_modules: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        min_length=1,
        max_length=64,
        description="Names of the modules that get adapters.",
    )


class ValidationSpec(ApiModel):
    """Periodic scoring of held-out prompts: the honest view of whether training helps."""

    every_steps: K8sInt = Field(
        default=0, ge=0, le=1_000_000, description="Validate every N steps; 0 turns validation off."
    )
    max_prompts: K8sInt = Field(
        default=64, ge=1, le=100_000, description="Validation prompts scored per run (one completion each)."
    )
    score_path: str = Field(
        default="/score",
        min_length=1,
        max_length=256,
        pattern=r"^/[A-Za-z0-9._~/-]*$",
        description=(
            "Route of the metric service that scores validation answers. /score (default) is the training "
            "reward; another route (e.g. /validate, served by the SDK's serve(metric, validation=...)) scores "
            "them with a reward the policy never trained against, which can reveal a gamed training reward."
        ),
    )


class GRPOSpec(ApiModel):
    """GRPO itself: group size G, prompts per step B, steps S, and the optimisation knobs."""

    class Rules(CelRules):
        format_failure_below_failure = CelRule(
            "self.formatFailureScore < self.failureScore",
            "spec.grpo.formatFailureScore must be strictly below spec.grpo.failureScore "
            "(unparseable output must score worse than a wrong answer): lower formatFailureScore",
            ".formatFailureScore",
        )

        epsilon_high_at_least_epsilon = CelRule(
            "!has(self.epsilonHigh) || self.epsilonHigh >= self.epsilon",
            "spec.grpo.epsilonHigh must be >= spec.grpo.epsilon (it is the upper clip bound): "
            "raise epsilonHigh or leave it unset",
            ".epsilonHigh",
        )

    group_size: K8sInt = Field(
        ge=2,
        le=256,
        description="G: completions sampled per prompt; advantages compare them, so G >= 2 (8 is typical).",
    )
    prompts_per_step: K8sInt = Field(ge=1, le=4096, description="B: prompts per optimisation step.")
    steps: K8sInt = Field(
        ge=1, le=1_000_000, description="S: optimisation steps; the run costs S*B*G rollouts."
    )
    learning_rate: float = Field(default=1e-6, gt=0.0, le=1.0, description="AdamW learning rate.")
    temperature: float = Field(
        default=1.0, gt=0.0, le=100.0, description="Sampling temperature; > 0 so a group's answers differ."
    )
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling probability mass.")
    max_prompt_length: K8sInt = Field(
        default=512, ge=1, le=1_048_576, description="Prompts are truncated to this many tokens."
    )
    max_completion_length: K8sInt = Field(
        default=256, ge=1, le=1_048_576, description="Maximum tokens generated per completion."
    )
    beta: float = Field(
        default=0.0, ge=0.0, le=100.0, description="KL coefficient against the reference model; 0 skips it."
    )
    epsilon: float = Field(default=0.2, gt=0.0, le=1.0, description="Lower (and default upper) ratio clip.")
    epsilon_high: float | None = Field(
        default=None,
        gt=0.0,
        le=1.0,
        description="Upper ratio clip (DAPO clip-higher, e.g. 0.28); unset means epsilon.",
    )
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = Field(
        default="dapo", description="Loss aggregation (TRL loss_type); dapo is TRL 1.16's default."
    )
    scale_rewards: Literal["group", "batch", "none"] = Field(
        default="group",
        description="Divide advantages by the group's population std (group), the batch std (batch), "
        "or not at all (none).",
    )
    format_failure_score: float = Field(
        default=-1.0,
        ge=-1e6,
        le=1e6,
        description="Reward for unparseable output; must be below failureScore.",
    )
    failure_score: float = Field(
        default=0.0, ge=-1e6, le=1e6, description="Reward the metric gives a parseable but wrong answer."
    )
    dynamic_sampling: bool = Field(
        default=False,
        description="Drop groups whose rewards are all equal and sample new prompts to refill (DAPO).",
    )
    seed: K8sInt = Field(
        default=42, ge=0, le=2**31 - 1, description="Seed for data order, sampling and init."
    )
    lora: LoraSpec = Field(default_factory=LoraSpec, description="LoRA adapters instead of full fine-tuning.")
    validation: ValidationSpec = Field(default_factory=ValidationSpec, description="Periodic validation.")

    @model_validator(mode="after")
    def _cross_field(self) -> GRPOSpec:
        if not self.format_failure_score < self.failure_score:
            raise self.Rules.format_failure_below_failure.violation()
        if self.epsilon_high is not None and self.epsilon_high < self.epsilon:
            raise self.Rules.epsilon_high_at_least_epsilon.violation()
        return self
