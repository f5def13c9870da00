"""Parts of a Kubernetes Pod spec a GRPOJob carries through to its pods: environment variables,
container resources, tolerations, affinity and image pull secrets, validated as Kubernetes would."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, WithJsonSchema, model_validator

from grpo_operator.api.base import ApiModel, CelRule, CelRules
from grpo_operator.api.field_types import (
    ENV_NAME_PATTERN,
    INTEGRAL_FLOAT,
    ObjectKey,
    ObjectName,
    Quantity,
)


class KeyRef(ApiModel):
    """One key of a Secret or ConfigMap in the job's namespace."""

    name: ObjectName = Field(description="Name of the Secret or ConfigMap (in the job's namespace).")
    key: ObjectKey
    optional: bool | None = Field(
        default=None,
        description="true: a missing object or key leaves the variable unset instead of failing.",
    )


class EnvVarSource(ApiModel):
    """Where a variable's value comes from, as in a Pod: exactly one of secretKeyRef and configMapKeyRef."""

    class Rules(CelRules):
        exactly_one_source = CelRule(
            "has(self.secretKeyRef) != has(self.configMapKeyRef)",
            "valueFrom must set exactly one of secretKeyRef and configMapKeyRef",
        )

    secret_key_ref: KeyRef | None = Field(
        default=None, description="A key of a Secret: the value never appears in the GRPOJob."
    )
    config_map_key_ref: KeyRef | None = Field(default=None, description="A key of a ConfigMap.")

    @model_validator(mode="after")
    def _exactly_one(self) -> EnvVarSource:
        if (self.secret_key_ref is None) == (self.config_map_key_ref is None):
            raise self.Rules.exactly_one_source.violation()
        return self


class EnvVar(ApiModel):
    """An environment variable for a container: a plain value, or valueFrom a Secret or ConfigMap key."""

    class Rules(CelRules):
        value_or_value_from = CelRule(
            "!has(self.value) || !has(self.valueFrom)",
            "an environment variable takes value or valueFrom, not both: keep one",
            ".valueFrom",
        )

    name: str = Field(min_length=1, max_length=256, pattern=ENV_NAME_PATTERN, description="Variable name.")
    value: str | None = Field(
        default=None,
        max_length=32768,
        description="Variable value, stored in plain text in the GRPOJob: use valueFrom.secretKeyRef for "
        "tokens and passwords. Unset (and no valueFrom) means the empty string.",
    )
    value_from: EnvVarSource | None = Field(
        default=None, description="Take the value from a Secret or ConfigMap key in the job's namespace."
    )

    @model_validator(mode="after")
    def _value_or_source(self) -> EnvVar:
        if self.value is not None and self.value_from is not None:
            raise self.Rules.value_or_value_from.violation()
        return self


def _unique_env_names(env: list[EnvVar]) -> list[EnvVar]:
    seen: set[str] = set()
    for var in env:
        if var.name in seen:
            raise ValueError(f"environment variable {var.name!r} is listed twice: keep one entry per name")
        seen.add(var.name)
    return env


EnvList = Annotated[
    list[EnvVar],
    Field(max_length=64),
    AfterValidator(_unique_env_names),
]
# Lists whose items are keyed by name: the API server rejects duplicate names itself.
ENV_LIST_SCHEMA: dict[str, Any] = {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]}


class ResourceRequirements(ApiModel):
    """Container resources as in a Pod: requests and limits keyed by resource name."""

    requests: dict[str, Quantity] = Field(
        default_factory=dict, max_length=16, description="Minimum resources, e.g. {cpu: 500m, memory: 1Gi}."
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict, max_length=16, description="Maximum resources, e.g. {memory: 2Gi}."
    )


class Toleration(ApiModel):
    """A Kubernetes toleration (as in a Pod spec)."""

    class Rules(CelRules):
        exists_without_value = CelRule(
            "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
            "a toleration with operator Exists must not set value: remove value or use operator Equal",
            ".value",
        )

        seconds_need_no_execute = CelRule(
            "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            "tolerationSeconds only applies to effect NoExecute: "
            "set effect NoExecute or remove tolerationSeconds",
            ".tolerationSeconds",
        )

    key: str | None = Field(
        default=None, max_length=316, description="Taint key; empty with Exists matches all."
    )
    operator: Literal["Exists", "Equal"] | None = Field(
        default=None, description="Exists or Equal (default)."
    )
    value: str | None = Field(default=None, max_length=63, description="Taint value for operator Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to tolerate; empty matches all."
    )
    toleration_seconds: Annotated[int, Field(ge=0, le=2**31 - 1), INTEGRAL_FLOAT] | None = Field(
        default=None, description="How long a NoExecute taint is tolerated."
    )

    @model_validator(mode="after")
    def _k8s_rules(self) -> Toleration:
        if self.operator == "Exists" and self.value:
            raise self.Rules.exists_without_value.violation()
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise self.Rules.seconds_need_no_execute.violation()
        return self


# A passthrough Kubernetes affinity term: kept as written, validated by the API server when the
# operator creates pods from it. The only place the schema preserves unknown fields.
_PassthroughObject = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]


class Affinity(ApiModel):
    """Kubernetes pod affinity, passed through to every pod of the job."""

    node_affinity: _PassthroughObject | None = Field(default=None, description="core/v1 NodeAffinity.")
    pod_affinity: _PassthroughObject | None = Field(default=None, description="core/v1 PodAffinity.")
    pod_anti_affinity: _PassthroughObject | None = Field(default=None, description="core/v1 PodAntiAffinity.")


class ImagePullSecret(ApiModel):
    """A Secret of type kubernetes.io/dockerconfigjson in the job's namespace."""

    name: ObjectName = Field(description="Name of the Secret.")
