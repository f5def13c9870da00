"""What the job's pods mount: the checkpoint volume (``spec.checkpoints``) and the user's read-only
inputs (``spec.inputs``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from grpo_operator.api.base import ApiModel, CelRule, CelRules
from grpo_operator.api.field_types import (
    DNS1123_LABEL_PATTERN,
    DNS1123_SUBDOMAIN_PATTERN,
    QUANTITY_PATTERN,
    K8sInt,
)

# Where the job's volume is mounted in trainer pods (and in the vLLM pod when it is ReadWriteMany).
VOLUME_MOUNT_PATH = "/workspace"


class VolumeSpec(ApiModel):
    """The checkpoint volume, mounted at /workspace in trainer pods."""

    existing_claim: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=DNS1123_SUBDOMAIN_PATTERN,
        description="Use this PVC instead of creating <job>-ckpt; the operator never deletes it.",
    )
    size: str = Field(
        default="50Gi",
        max_length=64,
        pattern=QUANTITY_PATTERN,
        description="Size of the PVC the operator creates.",
    )
    storage_class_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=DNS1123_SUBDOMAIN_PATTERN,
        description="StorageClass of the created PVC; unset means the cluster default.",
    )
    access_mode: Literal["ReadWriteOnce", "ReadWriteMany"] = Field(
        default="ReadWriteOnce",
        description="Access mode of the created PVC (with existingClaim: the claim's, as you declare it). "
        "ReadWriteMany is required when trainer.nodes > 1 and lets the vLLM pod mount the volume too "
        "(a model on the volume, the shared model cache).",
    )


class CheckpointsSpec(ApiModel):
    """When checkpoints are written and what happens to them."""

    every_steps: K8sInt = Field(default=50, ge=1, le=1_000_000, description="Checkpoint every N steps.")
    keep_last: K8sInt = Field(default=3, ge=1, le=1000, description="Checkpoints kept on the volume.")
    retention: Literal["Retain", "Delete"] = Field(
        default="Retain",
        description="Retain keeps the created PVC after the job is deleted; Delete removes it.",
    )
    volume: VolumeSpec = Field(default_factory=VolumeSpec, description="The checkpoint volume.")


# Where spec.inputs are mounted, read-only, in the trainer and vLLM pods: /inputs/<name>.
INPUTS_MOUNT_PATH = "/inputs"


class InputSpec(ApiModel):
    """Data the job reads, mounted read-only at /inputs/<name> in the trainer and vLLM pods."""

    class Rules(CelRules):
        exactly_one_source = CelRule(
            "has(self.configMap) != has(self.claim)",
            "spec.inputs[] needs exactly one of configMap (a ConfigMap, up to 1 MiB: a small dataset) or "
            "claim (a PersistentVolumeClaim: a large dataset or a model)",
        )

        sub_path_needs_claim = CelRule(
            "!has(self.subPath) || has(self.claim)",
            "spec.inputs[].subPath selects a directory of a claim: use it with claim only",
            ".subPath",
        )

        sub_path_inside_claim = CelRule(
            "!has(self.subPath) || !self.subPath.contains('..')",
            "spec.inputs[].subPath must stay inside the claim: remove '..'",
            ".subPath",
        )

    name: str = Field(
        min_length=1,
        max_length=50,
        pattern=DNS1123_LABEL_PATTERN,
        description="Mounted at /inputs/<name> (e.g. file:///inputs/<name>/train.jsonl in spec.dataset).",
    )
    config_map: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=DNS1123_SUBDOMAIN_PATTERN,
        description="A ConfigMap in the job's namespace; each key is a file (kubectl create configmap "
        "--from-file).",
    )
    claim: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=DNS1123_SUBDOMAIN_PATTERN,
        description="A PersistentVolumeClaim in the job's namespace, mounted read-only. Never changed or "
        "deleted by the operator. vLLM and trainers may run on different nodes: use a ReadOnlyMany or "
        "ReadWriteMany claim unless they share one node.",
    )
    sub_path: str | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        pattern=r"^[^/]",
        description="Directory inside the claim to mount instead of its root (relative, no '..').",
    )

    @model_validator(mode="after")
    def _one_source(self) -> InputSpec:
        if (self.config_map is None) == (self.claim is None):
            raise self.Rules.exactly_one_source.violation()
        if self.sub_path is not None and self.claim is None:
            raise self.Rules.sub_path_needs_claim.violation()
        if self.sub_path is not None and ".." in self.sub_path:
            raise self.Rules.sub_path_inside_claim.violation()
        return self
