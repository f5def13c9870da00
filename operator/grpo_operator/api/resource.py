"""The GRPOJob resource as a whole: identity constants, the top-level model and cost arithmetic."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from grpo_operator.api.base import ApiModel, CelRule, CelRules
from grpo_operator.api.spec import GRPOJobSpec, GRPOSpec
from grpo_operator.api.status import GRPOJobStatus

GROUP = "grpo.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "GRPOJob"
PLURAL = "grpojobs"
SINGULAR = "grpojob"
SHORT_NAMES = ("grpo",)
CATEGORIES = ("all", "grpo", "ml")

# Child objects append suffixes such as "-trainer-<attempt>-<rank>" to the job name; 40 characters
# keeps every child name within the 63-character label limit.
MAX_JOB_NAME_LENGTH = 40
DNS1035_LABEL_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


class NameRules(CelRules):
    """The CEL rules on the job's name (at the CRD's root); ObjectMeta's name validator is their twin."""

    at_most_max_length = CelRule(
        f"self.metadata.name.size() <= {MAX_JOB_NAME_LENGTH}",
        f"metadata.name must be at most {MAX_JOB_NAME_LENGTH} characters (child object names append "
        "suffixes to it): choose a shorter name",
    )
    dns1035_label = CelRule(
        f"self.metadata.name.matches('{DNS1035_LABEL_PATTERN}')",
        "metadata.name must be a DNS-1035 label (lowercase letters, digits and '-', starting with a letter, "
        "ending with a letter or digit): rename the job",
    )


class ObjectMeta(BaseModel):
    """The metadata fields the API models look at; everything else is kept as is."""

    model_config = ConfigDict(extra="allow")

    name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None

    @field_validator("name")
    @classmethod
    def _check_name(cls, name: str | None) -> str | None:
        if name is not None:
            if len(name) > MAX_JOB_NAME_LENGTH:
                raise NameRules.at_most_max_length.violation()
            if not re.fullmatch(DNS1035_LABEL_PATTERN, name):
                raise NameRules.dns1035_label.violation()
        return name


class GRPOJob(ApiModel):
    """A whole GRPOJob object (manifest or API response)."""

    model_config = ConfigDict(extra="allow", strict=False)

    api_version: Literal["grpo.dev/v1alpha1"] = Field(default="grpo.dev/v1alpha1")
    kind: Literal["GRPOJob"] = Field(default="GRPOJob")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: GRPOJobSpec
    status: GRPOJobStatus | None = None

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> GRPOJob:
        """Parse an object as read from the API server or a YAML manifest."""
        return cls.model_validate(obj)


def compute_rollouts(spec: GRPOJobSpec) -> int:
    """R = ceil(S / numIterations) * B * G: completions the run generates, and metric calls it makes for
    training (each generated batch serves numIterations optimizer steps; 1 unless set)."""
    return planned_rollouts(spec.grpo)


def planned_rollouts(grpo: GRPOSpec) -> int:
    """compute_rollouts from spec.grpo alone (what the trainer has)."""
    batches = -(-grpo.steps // (grpo.num_iterations or 1))
    return batches * grpo.prompts_per_step * grpo.group_size


def compute_validation_calls(spec: GRPOJobSpec) -> int:
    """Upper bound on validation completions scored: one per prompt, maxPrompts per run, a run every
    everySteps steps and one after the last step (ceil(S / everySteps) runs). The validation set may hold
    fewer prompts."""
    return planned_validation_calls(spec.grpo, spec.grpo.validation.max_prompts)


def planned_validation_calls(grpo: GRPOSpec, prompts: int) -> int:
    """Validation completions scored over the run with ``prompts`` validation prompts per run."""
    every = grpo.validation.every_steps
    if every == 0:
        return 0
    return -(-grpo.steps // every) * prompts


def compute_metric_calls(spec: GRPOJobSpec) -> int:
    """Completions the metric service scores over the run: R plus validation (upper bound)."""
    return compute_rollouts(spec) + compute_validation_calls(spec)
