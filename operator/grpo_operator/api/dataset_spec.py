"""``spec.dataset``: where the prompts come from and how each prompt is put to the model."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from grpo_operator.api.base import ApiModel, CelRule
from grpo_operator.api.dataset_uri import (
    DATASET_URI_HELP,
    DATASET_URI_PATTERN,
    DatasetURIError,
    parse_dataset_uri,
)
from grpo_operator.api.prompt_template import PROMPT_TEMPLATE_RULES, template_fields


def _dataset_uri_field(description: str, *, required: bool) -> Any:
    extra: dict[str, Any] = {
        "x-kubernetes-validations": [
            CelRule(
                f"self.matches(r'{DATASET_URI_PATTERN}')",
                f"dataset URI has an unsupported scheme or is malformed: {DATASET_URI_HELP}",
            ).to_schema()
        ]
    }
    if required:
        return Field(max_length=2048, description=description, json_schema_extra=extra)
    return Field(default=None, max_length=2048, description=description, json_schema_extra=extra)


class DatasetSpec(ApiModel):
    """Where the prompts come from. See "Dataset URIs" in docs/api.md for the accepted schemes."""

    train: str = _dataset_uri_field(
        "Training prompts: hf://<org>/<name>[:<config>][@<revision>][#<split>] or "
        "file:///<absolute path>.jsonl|.json|.parquet.",
        required=True,
    )
    validation: str | None = _dataset_uri_field(
        "Held-out prompts scored every grpo.validation.everySteps steps; same URI schemes as train.",
        required=False,
    )
    prompt_field: str = Field(
        default="prompt", min_length=1, max_length=253, description="Dataset column holding the prompt."
    )
    answer_field: str = Field(
        default="answer",
        min_length=1,
        max_length=253,
        description="Dataset column holding the reference answer; the metric gets it with the other columns.",
    )
    system_prompt: str | None = Field(
        default=None,
        min_length=1,
        max_length=16384,
        description=(
            "Instructions put before every prompt (e.g. the answer format the metric expects): a system turn "
            "when the model has a chat template, else text followed by a blank line."
        ),
    )
    prompt_template: str | None = Field(
        default=None,
        min_length=1,
        max_length=16384,
        json_schema_extra={"x-kubernetes-validations": [r.to_schema() for r in PROMPT_TEMPLATE_RULES]},
        description=(
            "Text of each prompt with {column} placeholders filled from the row; {prompt} is the promptField "
            "column. {{ and }} are literal braces. For text prompts only (a chat-format column already holds "
            "its turns: use systemPrompt)."
        ),
    )
    apply_chat_template: bool = Field(
        default=True,
        description=(
            "Send text prompts as a user turn through the model's chat template when it has one; false "
            "sends them as raw text. Chat-format prompts (a list of {role, content}) always use it."
        ),
    )

    @field_validator("prompt_template")
    @classmethod
    def _check_template(cls, value: str | None) -> str | None:
        if value is not None:
            template_fields(value)
        return value

    @field_validator("train", "validation")
    @classmethod
    def _check_uri(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                parse_dataset_uri(value)
            except DatasetURIError as exc:
                raise ValueError(str(exc)) from None
        return value
