"""Per-team platform policy (Helm ``teams``; the operator setting ``team_policies``): what a platform sets for
the namespaces of one team on top of, or instead of, its global settings.

A team names its namespaces; for a job in one of them the operator uses its global settings with the
team's values in their place (``OperatorSettings.for_namespace``), and the chart renders the admission
policy once per team with the same values. Every key left out keeps the global value. Tenants cannot change
any of it: it lives in the operator's Deployment and in cluster-scoped admission objects, not in anything a
namespace's RBAC reaches.

Namespaces are named, not selected by label: the operator would otherwise need to read Namespace objects,
and a namespace label is often within reach of whoever administers the namespace.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from grpo_operator.api.base import ApiModel
from grpo_operator.api.budget import NamespaceBudget
from grpo_operator.api.field_types import DNS1123_LABEL_PATTERN

# The team's keys (as in Helm values) and the operator setting each replaces. Lists and numbers of
# platformPolicy, the images and placement of jobDefaults.
_SIMPLE = {
    "allowedImagePrefixes": "allowed_image_prefixes",
    "allowedPriorityClasses": "allowed_priority_classes",
    "allowedTolerationKeys": "allowed_toleration_keys",
    "allowedNodeSelectors": "allowed_node_selectors",
    "maxGpusPerJob": "max_gpus_per_job",
    "gpuNodeSelector": "gpu_node_selector",
    "gpuNodeAffinity": "gpu_node_affinity",
    "learningHealth": "learning_health_defaults",
    "tracking": "tracking_defaults",
}
_TUPLES = {
    "allowed_image_prefixes",
    "allowed_priority_classes",
    "allowed_toleration_keys",
    "allowed_node_selectors",
}


class TeamQueue(ApiModel):
    default: str | None = Field(default=None, description="The LocalQueue of the team's jobs that name none.")
    allowed: list[str] | None = Field(default=None, description="The LocalQueues the team's jobs may name.")
    required: bool | None = Field(default=None, description="Whether every job of the team must be queued.")


class TeamClaims(ApiModel):
    allowed: bool | None = None
    names: list[str] | None = None


class TeamImages(ApiModel):
    trainer: str | None = Field(default=None, min_length=1, description="The team's default trainer image.")
    generation: str | None = Field(default=None, min_length=1, description="The team's default vLLM image.")


class TeamPolicy(ApiModel):
    """One team: its namespaces and what differs for them from the global settings."""

    name: str = Field(pattern=DNS1123_LABEL_PATTERN, max_length=63, description="Names the team in messages.")
    namespaces: list[str] = Field(min_length=1, description="The team's namespaces, by name.")
    allowed_image_prefixes: list[str] | None = None
    allowed_priority_classes: list[str] | None = None
    allowed_toleration_keys: list[str] | None = None
    allowed_node_selectors: list[str] | None = None
    existing_claims: TeamClaims | None = None
    max_gpus_per_job: int | None = Field(default=None, ge=0)
    queue: TeamQueue | None = None
    images: TeamImages | None = None
    gpu_node_selector: dict[str, str] | None = None
    gpu_node_affinity: list[dict[str, Any]] | None = None
    learning_health: dict[str, Any] | None = None
    tracking: dict[str, Any] | None = None
    budget: NamespaceBudget | None = Field(
        default=None, description="The budget of the team's namespaces (default, maxGpuHours, maxAmount)."
    )

    @model_validator(mode="after")
    def _namespaces(self) -> TeamPolicy:
        for namespace in self.namespaces:
            if namespace == "*" or not namespace:
                raise ValueError(f"team {self.name}: name each namespace; {namespace!r} is not one")
        return self

    def overrides(self) -> tuple[dict[str, Any], dict[str, str]]:
        """The settings this team replaces (field name -> value) and, per platformPolicy key it sets, the
        Helm value that set it (for messages: "teams.<name>.<key>")."""
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        dumped = self.model_dump(by_alias=True, exclude_none=True)
        for key, setting in _SIMPLE.items():
            if key in dumped:
                values[setting] = (
                    tuple(dumped[key]) if setting in _TUPLES or key == "gpuNodeAffinity" else dumped[key]
                )
                sources[key] = f"teams.{self.name}.{key}"
        if self.existing_claims is not None:
            if self.existing_claims.allowed is not None:
                values["allow_existing_claims"] = self.existing_claims.allowed
                sources["existingClaims.allowed"] = f"teams.{self.name}.existingClaims.allowed"
            if self.existing_claims.names is not None:
                values["allowed_existing_claims"] = tuple(self.existing_claims.names)
                sources["existingClaims.names"] = f"teams.{self.name}.existingClaims.names"
        if self.queue is not None:
            for key, setting, value in (
                ("default", "default_queue_name", self.queue.default),
                (
                    "allowed",
                    "allowed_queue_names",
                    tuple(self.queue.allowed) if self.queue.allowed is not None else None,
                ),
                ("required", "require_queue_name", self.queue.required),
            ):
                if value is not None:
                    values[setting] = value
                    sources[f"queue.{key}"] = f"teams.{self.name}.queue.{key}"
        if self.images is not None:
            if self.images.trainer is not None:
                values["trainer_image"] = self.images.trainer
            if self.images.generation is not None:
                values["vllm_image"] = self.images.generation
        return values, sources


def parse_teams(entries: Any) -> list[TeamPolicy]:
    """The teams of the setting team_policies; ValueError (pydantic's ValidationError included) when one is
    not a team or a namespace is in two."""
    teams = [TeamPolicy.model_validate(dict(entry)) for entry in entries]
    seen: dict[str, str] = {}
    for team in teams:
        for namespace in team.namespaces:
            if namespace in seen:
                raise ValueError(
                    f"namespace {namespace} is in team {seen[namespace]} and in team {team.name}: a namespace "
                    "belongs to one team at most"
                )
            seen[namespace] = team.name
    return teams
