"""Where the job's pods run and for how long: placement and queueing (``spec.scheduling``), restarts
and deadlines (``spec.runPolicy``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from grpo_operator.api.base import ApiModel
from grpo_operator.api.field_types import (
    DNS1123_LABEL_PATTERN,
    DNS1123_SUBDOMAIN_PATTERN,
    INTEGRAL_FLOAT,
    K8sInt,
)
from grpo_operator.api.pod_fields import Affinity, Toleration

# Label values are at most 63 characters (Kubernetes label syntax).
NodeLabels = dict[str, Annotated[str, Field(max_length=63)]]


class SchedulingSpec(ApiModel):
    """Where the job's pods may run and how they queue."""

    node_selector: NodeLabels = Field(
        default_factory=dict,
        max_length=32,
        description=(
            "Node labels every pod of the job requires, the CPU-only metric pod included (e.g. a team's "
            "node pool). For labels only GPU nodes carry, such as nvidia.com/gpu.product, use gpuNodeSelector."
        ),
    )
    gpu_node_selector: NodeLabels = Field(
        default_factory=dict,
        max_length=32,
        description=(
            "Node labels the GPU pods (vLLM and trainers) require on top of nodeSelector, e.g. "
            "nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3. The metric pod does not get them."
        ),
    )
    tolerations: list[Toleration] = Field(
        default_factory=list,
        max_length=32,
        description="Tolerations added to every pod (the NVIDIA GPU taint is tolerated already).",
    )
    affinity: Affinity | None = Field(default=None, description="Affinity added to every pod.")
    priority_class_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=DNS1123_SUBDOMAIN_PATTERN,
        description="PriorityClass of the job's pods.",
    )
    queue_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        pattern=DNS1123_LABEL_PATTERN,
        description="Kueue LocalQueue; the pods are admitted by Kueue as one group (see docs/kueue.md).",
    )


class RunPolicySpec(ApiModel):
    """Restarts and deadlines."""

    backoff_limit: K8sInt = Field(
        default=3,
        ge=0,
        le=1000,
        description="Trainer gang restarts (failures, stalls) before the job fails; evictions do not count.",
    )
    startup_deadline_seconds: K8sInt = Field(
        default=1800, ge=1, le=31_536_000, description="Fail a start or restart not Running within this time."
    )
    active_deadline_seconds: Annotated[int, Field(ge=1, le=31_536_000 * 10), INTEGRAL_FLOAT] | None = Field(
        default=None, description="Fail the job after this long in total."
    )
    progress_deadline_seconds: K8sInt = Field(
        default=1800,
        ge=1,
        le=31_536_000,
        description="Running with no step advance for this long is a stall: the gang restarts (counted).",
    )
    ttl_seconds_after_finished: Annotated[int, Field(ge=0, le=31_536_000 * 10), INTEGRAL_FLOAT] | None = (
        Field(default=None, description="Delete the finished job after this long.")
    )
