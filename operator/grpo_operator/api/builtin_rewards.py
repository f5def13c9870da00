"""Rewards without building an image: ``spec.metric.rewards`` (rewards the stock metric image computes by
name) and ``spec.metric.function`` (the user's own Python function, from a ConfigMap). Either is served by
the stock metric image (``ghcr.io/grpo-operator/metric-builtin``, trainer_image/Dockerfile.metric), which
reads what to compute from its environment; the metric pod is the same isolated pod as any metric image's.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, model_validator

from grpo_operator.api.base import ApiModel, CelRule, CelRules
from grpo_operator.api.field_types import INTEGRAL_FLOAT

# A reward component's name (what the metric's "components" use): the metric protocol's rule, repeated
# here because the operator does not import the trainer's packages.
COMPONENT_NAME_PATTERN = r"^[a-z][a-z0-9_]{0,31}$"
COMPONENT_NAME_RE = re.compile(COMPONENT_NAME_PATTERN)
MAX_REWARD_COMPONENTS = 16
MAX_BUILTIN_REWARDS = 8

STOCK_METRIC_IMAGE = "ghcr.io/grpo-operator/metric-builtin:0.1.0"
# The stock image's environment: the rewards as JSON (a list of BuiltinReward in their wire form), or the
# function's source (from the ConfigMap key) and the name of the function in it.
REWARDS_ENV = "GRPO_METRIC_REWARDS"
FUNCTION_SOURCE_ENV = "GRPO_METRIC_FUNCTION_SOURCE"
FUNCTION_NAME_ENV = "GRPO_METRIC_FUNCTION_NAME"

RewardType = Literal["exactMatch", "mathAnswer", "regex", "length"]
# The types that compare with a reference answer in a dataset column (``field``).
ANSWER_TYPES = ("exactMatch", "mathAnswer")
# The component name of a reward that names none.
DEFAULT_NAMES: dict[str, str] = {
    "exactMatch": "exact_match",
    "mathAnswer": "math_answer",
    "regex": "format",
    "length": "length",
}


class BuiltinReward(ApiModel):
    """One reward the stock metric image computes; its score is the reward component ``name``."""

    class Rules(CelRules):
        regex_needs_pattern = CelRule(
            "self.type != 'regex' || has(self.pattern)",
            "spec.metric.rewards[].type regex needs pattern: the regular expression a completion must "
            "contain to score 1 (e.g. '^<think>.*</think>' for a reasoning format)",
            ".pattern",
        )
        length_needs_max_tokens = CelRule(
            "self.type != 'length' || has(self.maxTokens)",
            "spec.metric.rewards[].type length needs maxTokens: the completion length in tokens above which "
            "the penalty starts",
            ".maxTokens",
        )
        max_tokens_is_for_length = CelRule(
            "!has(self.maxTokens) || self.type == 'length'",
            "spec.metric.rewards[].maxTokens belongs to type length: remove it",
            ".maxTokens",
        )
        pattern_is_for_regex_or_exact_match = CelRule(
            "!has(self.pattern) || self.type == 'regex' || self.type == 'exactMatch'",
            "spec.metric.rewards[].pattern belongs to types regex (what a completion must contain) and "
            "exactMatch (where its answer is: the first group of the match): remove it",
            ".pattern",
        )
        field_is_for_answers = CelRule(
            "!has(self.field) || self.type == 'exactMatch' || self.type == 'mathAnswer'",
            "spec.metric.rewards[].field belongs to types exactMatch and mathAnswer (the dataset column with "
            "the reference answer): remove it",
            ".field",
        )

    type: RewardType = Field(
        description="exactMatch: 1 when the completion's answer (the first group of pattern, else the "
        "whole completion), stripped and case-folded, equals the reference in the dataset column field. "
        "mathAnswer: 1 when the completion's final answer is mathematically equal to the reference "
        "(HuggingFace's math-verify: LaTeX, fractions, expressions), a format failure when the completion "
        "holds no answer it can read. regex: 1 when the completion contains a match of pattern (Python "
        "syntax, dot matches newlines). length: 0 up to maxTokens completion tokens, then down linearly to "
        "-1 at twice maxTokens."
    )
    name: Annotated[str, Field(pattern=COMPONENT_NAME_PATTERN, max_length=32)] | None = Field(
        default=None,
        description="The reward component's name, as spec.metric.rewardWeights and status.rewards.components "
        "use it. Unset: exact_match, math_answer, format or length by type.",
    )
    field: Annotated[str, Field(min_length=1, max_length=256)] | None = Field(
        default=None,
        description="exactMatch and mathAnswer: the dataset column holding the reference answer. Unset: "
        "spec.dataset.answerField.",
    )
    pattern: Annotated[str, Field(min_length=1, max_length=4096)] | None = Field(
        default=None,
        description="regex: what a completion must contain. exactMatch: where its answer is (the first "
        "group of the first match; no match is a format failure).",
    )
    max_tokens: Annotated[int, Field(ge=1, le=1_048_576), INTEGRAL_FLOAT] | None = Field(
        default=None, description="length: completion tokens the penalty starts above."
    )

    @model_validator(mode="after")
    def _fields_of_the_type(self) -> BuiltinReward:
        if self.type == "regex" and self.pattern is None:
            raise self.Rules.regex_needs_pattern.violation()
        if self.type == "length" and self.max_tokens is None:
            raise self.Rules.length_needs_max_tokens.violation()
        if self.max_tokens is not None and self.type != "length":
            raise self.Rules.max_tokens_is_for_length.violation()
        if self.pattern is not None and self.type not in ("regex", "exactMatch"):
            raise self.Rules.pattern_is_for_regex_or_exact_match.violation()
        if self.field is not None and self.type not in ("exactMatch", "mathAnswer"):
            raise self.Rules.field_is_for_answers.violation()
        return self

    def component(self) -> str:
        """The component this reward's score is reported as."""
        return self.name or DEFAULT_NAMES[self.type]


class MetricFunction(ApiModel):
    """The user's reward function, in a ConfigMap of the job's namespace, run by the stock metric image."""

    config_map: str = Field(
        min_length=1,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
        description="Name of the ConfigMap that holds the Python source.",
    )
    key: str = Field(
        default="metric.py",
        min_length=1,
        max_length=253,
        pattern=r"^[-._a-zA-Z0-9]+$",
        description="The ConfigMap key whose value is the source.",
    )
    name: str = Field(
        default="metric",
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="The function in it: metric(example, completion[, completion_tokens, finish_reason]) "
        "returning a float or a dict of named components, and raising grpo_metric.FormatFailure for a "
        "completion it cannot grade (docs/metric-contract.md).",
    )


__all__ = [
    "ANSWER_TYPES",
    "COMPONENT_NAME_PATTERN",
    "DEFAULT_NAMES",
    "FUNCTION_NAME_ENV",
    "FUNCTION_SOURCE_ENV",
    "MAX_BUILTIN_REWARDS",
    "REWARDS_ENV",
    "STOCK_METRIC_IMAGE",
    "BuiltinReward",
    "MetricFunction",
]
