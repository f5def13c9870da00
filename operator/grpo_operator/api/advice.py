"""What a GRPOJob manifest is told before it runs, beyond the refusals of the schema: "did you mean" for
fields the API does not know (TRL's names among them), and warnings about settings that are valid but
likely mistakes. ``kubectl grpo check -f job.yaml`` prints both without a cluster; the chart's
``<release>-grpo-operator-warnings`` ValidatingAdmissionPolicy gives the same warnings at ``kubectl apply`` (Kubernetes
warnings: the job is still created). tests/helm/test_admission_warnings.py keeps the two sets of words equal.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from grpo_operator.api.builtin_rewards import STOCK_METRIC_IMAGE
from grpo_operator.api.compat import models_in, wire_name
from grpo_operator.api.grpo_settings import trl_names
from grpo_operator.api.resource import GRPOJob, compute_rollouts
from grpo_operator.api.spec import GRPOJobSpec

# Above this many rollouts (R = ceil(S / numIterations) * B * G) a job is warned about: a typo'd steps or
# promptsPerStep, not a plan. Ten million completions of a few hundred tokens each is already billions of
# generated tokens; a platform sets its own threshold (Helm admissionPolicies.warnings.warnAboveRollouts).
DEFAULT_WARN_ROLLOUTS = 10_000_000

# TRL's names (GRPOConfig fields, then GRPOTrainer's arguments) and where each setting lives in a GRPOJob,
# for users coming from TRL. A value starting with "spec." is a field path; anything else says what takes
# the setting's place. The spec.grpo rows come from the table of where each GRPO setting goes
# (grpo_settings.GRPO_SETTINGS); the rest are settings TRL has outside spec.grpo.
TRL_NAMES: dict[str, str] = {
    **trl_names(),
    "num_train_epochs": "spec.grpo.steps (a GRPOJob counts optimizer steps, not epochs)",
    "per_device_train_batch_size": "spec.trainer.perDeviceBatchSize",
    "gradient_accumulation_steps": "derived: B*G / (trainer GPUs * spec.trainer.perDeviceBatchSize)",
    "generation_batch_size": "derived: B*G (spec.grpo.promptsPerStep * spec.grpo.groupSize)",
    "reward_weights": "spec.metric.rewardWeights",
    "save_steps": "spec.checkpoints.everySteps",
    "save_total_limit": "spec.checkpoints.keepLast",
    "output_dir": "the job's volume (spec.checkpoints.volume); the final model is under final/",
    "report_to": "spec.tracking",
    "bf16": "spec.model.dtype (bfloat16 computes in bf16 over fp32 master weights)",
    "use_vllm": "always on: vLLM samples every completion",
    "vllm_mode": "spec.generation.mode (server is Server, colocate is Colocate)",
    "vllm_gpu_memory_utilization": "spec.generation.gpuMemoryUtilization (mode Colocate: colocateMemoryShare)",
    "vllm_tensor_parallel_size": "spec.generation.tensorParallelSize",
    "vllm_max_model_length": "spec.generation.maxModelLen",
    # GRPOTrainer's own arguments, not GRPOConfig's.
    "reward_funcs": "spec.metric.rewards (built-in rewards), spec.metric.function (your Python function) or "
    "spec.metric.image (a scoring service of your own; see docs/metric-contract.md)",
    "train_dataset": "spec.dataset.train",
    "eval_dataset": "spec.dataset.validation",
    "peft_config": "spec.grpo.lora",
    "model_init_kwargs": "spec.model (name, revision, dtype)",
}

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_HUB_URL = re.compile(r"^https?://(?:www\.)?huggingface\.co/([^/?#]+/[^/?#]+)")
IMAGE_FIELDS = ("metric", "environment", "trainer", "generation")
STOCK_REPOSITORY = "metric-builtin"


@dataclass(frozen=True)
class Advice:
    """One thing to tell the user: the field it is about and what to do."""

    field: str
    message: str

    def __str__(self) -> str:
        return self.message if self.message.startswith(self.field) else f"{self.field}: {self.message}"


def _aliases(model: type[BaseModel]) -> dict[str, type[BaseModel] | None]:
    """The wire names of ``model``'s fields, each with the API model its value holds (None for a leaf)."""
    out: dict[str, type[BaseModel] | None] = {}
    for name, info in model.model_fields.items():
        nested = models_in(info.annotation)
        out[info.alias or wire_name(name)] = nested[0] if nested else None
    return out


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _unknown(value: Any, model: type[BaseModel], path: str, out: list[Advice]) -> None:
    if isinstance(value, list):
        for i, item in enumerate(value):
            _unknown(item, model, f"{path}[{i}]", out)
        return
    if not isinstance(value, dict) or model.model_config.get("extra") == "allow":
        return  # a model that passes unknown fields through (e.g. affinity) knows them all
    known = _aliases(model)
    for key, item in value.items():
        where = f"{path}.{key}" if path else str(key)
        if key in known:
            nested = known[key]
            if nested is not None:
                _unknown(item, nested, where, out)
            continue
        trl = TRL_NAMES.get(str(key)) or TRL_NAMES.get(_snake(str(key)))
        close = difflib.get_close_matches(str(key), list(known), n=1, cutoff=0.6) or [
            k for k in known if k.lower().startswith(str(key).lower())
        ]
        if trl is not None:
            out.append(Advice(where, f"unknown field; TRL's {_snake(str(key))} is {trl} in a GRPOJob"))
        elif close:
            out.append(Advice(where, f"unknown field; did you mean {path + '.' if path else ''}{close[0]}?"))
        else:
            out.append(
                Advice(
                    where,
                    f"unknown field; the fields of {path or 'the object'} are {', '.join(sorted(known))}",
                )
            )


def unknown_fields(manifest: dict[str, Any]) -> list[Advice]:
    """Each field of a GRPOJob manifest the API does not know, with the closest known name or TRL's
    equivalent. metadata is the API server's, so only apiVersion, kind, spec and below are judged."""
    out: list[Advice] = []
    for key in manifest:
        if key not in ("apiVersion", "kind", "metadata", "spec", "status"):
            out.append(Advice(str(key), "unknown field; a GRPOJob has apiVersion, kind, metadata and spec"))
    spec = manifest.get("spec")
    if isinstance(spec, dict):
        _unknown(spec, GRPOJobSpec, "spec", out)
    return out


def image_unpinned(image: str) -> bool:
    """No tag and no digest, or the tag ``latest``: a node with pull policy IfNotPresent keeps whichever
    build it pulled first."""
    if "@" in image:
        return False
    last = image[image.rfind("/") + 1 :]
    return ":" not in last or image.endswith(":latest")


def image_message(field: str, image: str) -> str:
    return (
        f"spec.{field}.image '{image}' has no version (no tag, or :latest): with pull policy IfNotPresent "
        "each node keeps the build it pulled first, so the pods of one job, and a restarted gang, can run "
        "different code; pin a version tag or a digest (image@sha256:...)"
    )


def not_stock_image(image: str) -> bool:
    """Whether ``image`` is not the stock metric image (its repository's last part is metric-builtin, in
    whichever registry the platform mirrors it to)."""
    return not image[image.rfind("/") + 1 :].startswith(STOCK_REPOSITORY)


def stock_image_message(image: str) -> str:
    return (
        f"spec.metric.image '{image}' is not the stock metric image ({STOCK_METRIC_IMAGE} or a copy named "
        "metric-builtin): only it computes spec.metric.rewards and runs spec.metric.function, and another "
        "image ignores them and scores as it was built to; use the stock image"
    )


def model_url_message(name: str) -> str:
    hub = _HUB_URL.match(name)
    fix = f"give the Hub id '{hub.group(1)}'" if hub else "give a Hub id (org/name) or a path"
    return (
        f"spec.model.name '{name}' is a URL: vLLM and the trainer load a Hugging Face Hub id or a path "
        f"(inside the images, on the job's volume or under /inputs), and fail on a URL only once the vLLM "
        f"server starts; {fix}"
    )


def rollouts_message(spec: GRPOJobSpec, limit: int) -> str:
    g = spec.grpo
    return (
        f"the job generates {compute_rollouts(spec)} rollouts (ceil(steps {g.steps} / numIterations "
        f"{g.num_iterations or 1}) * promptsPerStep {g.prompts_per_step} * groupSize {g.group_size}), "
        f"above this platform's warning threshold of {limit} (admissionPolicies.warnings.warnAboveRollouts): check "
        "spec.grpo.steps, promptsPerStep and groupSize"
    )


def warnings(spec: GRPOJobSpec, max_rollouts: int = DEFAULT_WARN_ROLLOUTS) -> list[Advice]:
    """Settings that are valid but likely mistakes; ``max_rollouts`` 0 turns the size warning off."""
    out: list[Advice] = []
    images = {
        "metric": spec.metric.image if spec.metric is not None else None,
        "environment": spec.environment.image if spec.environment is not None else None,
        "trainer": spec.trainer.image,
        "generation": None if spec.generation.colocated() else spec.generation.image,
    }
    for field in IMAGE_FIELDS:
        image = images[field]
        if image is not None and image_unpinned(image):
            out.append(Advice(f"spec.{field}.image", image_message(field, image)))
    metric = spec.metric
    if metric is not None and (metric.rewards or metric.function) and not_stock_image(metric.image):
        out.append(Advice("spec.metric.image", stock_image_message(metric.image)))
    if _SCHEME.match(spec.model.name):
        out.append(Advice("spec.model.name", model_url_message(spec.model.name)))
    if max_rollouts and compute_rollouts(spec) > max_rollouts:
        out.append(Advice("spec.grpo.steps", rollouts_message(spec, max_rollouts)))
    return out


def check_manifest(
    manifest: dict[str, Any], max_rollouts: int = DEFAULT_WARN_ROLLOUTS
) -> tuple[list[str], list[Advice]]:
    """``(errors, advice)`` for one manifest: the refusals the API server would give (from the models),
    and the unknown fields and warnings. A manifest with unknown fields is judged on the rest."""
    from pydantic import ValidationError

    from grpo_operator.api.base import describe_validation_error

    advice = unknown_fields(manifest)
    known = _without(manifest, {a.field for a in advice})
    try:
        job = GRPOJob.model_validate(known)
    except ValidationError as exc:
        return describe_validation_error(exc), advice
    return [], advice + warnings(job.spec, max_rollouts)


def _without(value: Any, fields: set[str], path: str = "") -> Any:
    """``value`` less the fields at the dotted paths in ``fields`` (list items as ``[i]``)."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if where not in fields:
                out[key] = _without(item, fields, where)
        return out
    if isinstance(value, list):
        return [_without(item, fields, f"{path}[{i}]") for i, item in enumerate(value)]
    return value
