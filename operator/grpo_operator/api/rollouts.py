"""``spec.rollouts``: where a job's scored rollouts come from.

``Metric`` (the default, and what a job without ``spec.rollouts`` gets): the trainer samples completions
for the dataset's prompts and the user's metric service scores them. ``Client``: a client program, such
as DSPy's ``GRPO`` optimizer through Arbor's provider, samples from the job's policy, scores with its own
metric and sends the scored groups to the job's rollout gateway (``<job>-rollouts``). The job then has no
dataset and no metric service; G, B and S still describe the run, and the gateway checks what the client
sends against them.

The rules that tie ``spec.rollouts`` to the rest of the spec sit on ``GRPOJobSpec.Rules`` (they read
spec.metric, spec.dataset and spec.grpo), with their pydantic twin in its cross-object validator.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field, field_validator, model_validator

from grpo_operator.api.base import ApiModel, CelRule, CelRules
from grpo_operator.api.model_spec import SecretKeySelector

if TYPE_CHECKING:
    from grpo_operator.api.spec import GRPOJobSpec

# Kubernetes label syntax: an optional DNS-subdomain prefix and a name of at most 63 characters;
# values of at most 63 characters, empty allowed.
LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
_LABEL_KEY_RE = re.compile(LABEL_KEY_PATTERN)

LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]


def _label_map_rule(field: str) -> CelRule:
    return CelRule(
        f"self.all(k, k.size() <= 316 && k.matches(r'{LABEL_KEY_PATTERN}'))",
        f"spec.rollouts.client.allowFrom[].{field} keys must be Kubernetes label keys "
        "([prefix/]name; the name of letters, digits, '-', '_' and '.')",
    )


def _check_label_keys(labels: dict[str, str] | None, field: str) -> dict[str, str] | None:
    for key in labels or {}:
        if len(key) > 316 or not _LABEL_KEY_RE.fullmatch(key):
            raise ValueError(_label_map_rule(field).message + f"; {key!r} is not")
    return labels


# Without a pod label a peer would admit every pod (of the named namespaces): name the client.
_POD_LABELS_NOT_EMPTY = CelRule(
    "self.size() > 0",
    "spec.rollouts.client.allowFrom[].podLabels must name at least one label of the client pods "
    "(e.g. {app: dspy-notebook})",
)

# An empty namespaceSelector selects every namespace: any pod of the cluster with the pod labels would reach
# the gateway. Unset already means the job's own namespace.
_NAMESPACE_LABELS_NOT_EMPTY = CelRule(
    "self.size() > 0",
    "spec.rollouts.client.allowFrom[].namespaceLabels: {} would admit pods of every namespace: name the "
    "client's namespace (e.g. {kubernetes.io/metadata.name: notebooks}) or leave it unset for the job's own",
)


class ClientPeer(ApiModel):
    """Pods that may call the job's rollout gateway (a NetworkPolicy peer)."""

    pod_labels: dict[str, LabelValue] = Field(
        max_length=32,
        json_schema_extra={
            "x-kubernetes-validations": [
                _POD_LABELS_NOT_EMPTY.to_schema(),
                _label_map_rule("podLabels").to_schema(),
            ]
        },
        description="Labels the client pods carry, e.g. {app: dspy-notebook}.",
    )
    namespace_labels: dict[str, LabelValue] | None = Field(
        default=None,
        max_length=32,
        json_schema_extra={
            "x-kubernetes-validations": [
                _NAMESPACE_LABELS_NOT_EMPTY.to_schema(),
                _label_map_rule("namespaceLabels").to_schema(),
            ]
        },
        description="Labels of the namespaces the client pods run in (e.g. "
        "{kubernetes.io/metadata.name: notebooks}); unset: the job's own namespace.",
    )

    @field_validator("pod_labels")
    @classmethod
    def _pod_keys(cls, value: dict[str, str]) -> dict[str, str]:
        if not value:
            raise ValueError(_POD_LABELS_NOT_EMPTY.message)
        _check_label_keys(value, "podLabels")
        return value

    @field_validator("namespace_labels")
    @classmethod
    def _namespace_keys(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None and not value:
            raise ValueError(_NAMESPACE_LABELS_NOT_EMPTY.message)
        return _check_label_keys(value, "namespaceLabels")


class ClientRolloutsSpec(ApiModel):
    """Who may talk to the rollout gateway, and with which token."""

    allow_from: list[ClientPeer] = Field(
        default_factory=list,
        max_length=16,
        description="Pods admitted to the gateway's client port (7453) besides the job's own pods. Empty: "
        "only `kubectl port-forward svc/<job>-rollouts 7453`, which goes through Kubernetes "
        "authentication.",
    )
    token_secret_ref: SecretKeySelector | None = Field(
        default=None,
        description="Secret key whose value the gateway requires on every client route (all but /healthz): "
        "as `Authorization: Bearer <token>` (DSPy's api_key) or as the password of HTTP basic auth, which "
        "Arbor's provider and the OpenAI client send for an api_base of http://dspy:<token>@host:7453/v1/. "
        "Passed to the gateway by reference only.",
    )


class RolloutsSpec(ApiModel):
    """Where scored rollouts come from: the metric service (default) or a client such as DSPy."""

    class Rules(CelRules):
        client_only_for_client = CelRule(
            "self.source == 'Client' || !has(self.client)",
            "spec.rollouts.client applies only with spec.rollouts.source: Client: set source to Client or "
            "remove client",
            ".client",
        )

    source: Literal["Metric", "Client"] = Field(
        default="Metric",
        description="Metric: the trainer samples the dataset's prompts and spec.metric scores them. Client: a "
        "client (DSPy's GRPO through Arbor's provider) sends scored groups to the job's rollout gateway "
        "<job>-rollouts; spec.metric and spec.dataset are then not set. Immutable.",
    )
    client: ClientRolloutsSpec | None = Field(
        default=None, description="Access to the rollout gateway (source: Client only)."
    )

    @model_validator(mode="after")
    def _client_only_for_client(self) -> RolloutsSpec:
        if self.client is not None and self.source != "Client":
            raise self.Rules.client_only_for_client.violation()
        return self


# CEL: the job's rollouts come from a client. The rules that tie spec.rollouts to the rest of the spec sit
# on GRPOJobSpec (they read spec.metric, spec.dataset and spec.grpo).
CLIENT_MODE = "has(self.rollouts) && self.rollouts.source == 'Client'"


# spec.rollouts.source never changes: a job that trained from its metric service cannot continue from a
# client or the other way round (different children, different trainer loop). A transition rule on the
# spec, not on spec.rollouts, because an absent spec.rollouts means Metric.
SOURCE_OF_SELF = "(has(self.rollouts) ? self.rollouts.source : 'Metric')"
ROLLOUTS_SOURCE_IMMUTABLE = CelRule(
    f"{SOURCE_OF_SELF} == (has(oldSelf.rollouts) ? oldSelf.rollouts.source : 'Metric')",
    "spec.rollouts.source is immutable while the job exists: delete the job and create a new one to "
    "change where its rollouts come from",
    ".rollouts.source",
)


def rollouts_source(spec: GRPOJobSpec) -> Literal["Metric", "Client"]:
    """Metric unless spec.rollouts says Client."""
    return spec.rollouts.source if spec.rollouts is not None else "Metric"
