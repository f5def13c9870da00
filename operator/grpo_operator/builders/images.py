"""The trainer and vLLM images a job's pods run: the spec's, or the platform's default from the operator
settings (Helm jobDefaults.images) when the spec leaves it unset.

Resolved here, when the pods are built, and never written back into the job: the stored spec keeps the
image unset, so a platform that moves its images (a registry mirror, a new release) changes one setting
instead of every job. A job stored under an earlier CRD, whose default the API server wrote into it, keeps
that image as its own (docs/platform.md, "The CRD and upgrades")."""

from __future__ import annotations

from grpo_operator.api.spec import GRPOJobSpec
from grpo_operator.builders.common import ANNOTATION_DEFAULT_IMAGE
from grpo_operator.settings import OperatorSettings


def trainer_image(spec: GRPOJobSpec, settings: OperatorSettings) -> str:
    return spec.trainer.image or settings.trainer_image


def generation_image(spec: GRPOJobSpec, settings: OperatorSettings) -> str:
    """The vLLM servers' image (a colocated job runs none: its engine is in the trainer image)."""
    return spec.generation.image or settings.vllm_image


def default_image_annotation(own: str | None, default: str) -> dict[str, str]:
    """The pod annotation that records the platform's default image, when the job leaves its own unset."""
    return {} if own else {ANNOTATION_DEFAULT_IMAGE: default}
