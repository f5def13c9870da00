"""``spec.model``: the policy model to fine-tune, and the Secret holding its access token."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from grpo_operator.api.base import ApiModel, CelRule, CelRules
from grpo_operator.api.field_types import NO_SPACE_PATTERN, ObjectKey, ObjectName


class SecretKeySelector(ApiModel):
    """One key of a Secret in the job's namespace."""

    name: ObjectName = Field(description="Name of the Secret (in the job's namespace).")
    key: ObjectKey


class ModelSpec(ApiModel):
    """The policy model to fine-tune."""

    class Rules(CelRules):
        not_an_option = CelRule(
            "!self.name.startsWith('-')",
            "spec.model.name must not start with '-': it is the first argument of `vllm serve`, which would "
            "read it as an option. Give a Hugging Face model id (org/name) or an absolute path",
            ".name",
        )

    name: str = Field(
        min_length=1,
        max_length=512,
        pattern=NO_SPACE_PATTERN,
        description="Hugging Face model id (org/name) or an absolute path to a model directory in the "
        "trainer image or on the job's volume.",
    )
    revision: str = Field(
        default="main",
        min_length=1,
        max_length=255,
        pattern=NO_SPACE_PATTERN,
        description="Model revision on the Hub: a branch, tag or commit hash.",
    )
    dtype: Literal["bfloat16", "float16", "float32"] = Field(
        default="bfloat16", description="Weight dtype for training and generation."
    )
    token_secret_ref: SecretKeySelector | None = Field(
        default=None,
        description="Secret key holding a Hugging Face access token for a gated or private model, e.g. "
        "{name: hf-token, key: token}. Given to vLLM and the trainers as HF_TOKEN; the token itself never "
        "appears in the GRPOJob. May be added or changed later (the gang restarts).",
    )

    @model_validator(mode="after")
    def _not_an_option(self) -> ModelSpec:
        if self.name.startswith("-"):
            raise self.Rules.not_an_option.violation()
        return self
