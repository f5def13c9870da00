"""Platform limits, as the operator enforces them: each limit names itself when broken, a job that breaks
one gets a condition and an event and no children at all, fixing the spec lets it start, the default
Kueue queue reaches the pods of jobs that name none, and the settings come from the environment the
chart writes."""

from __future__ import annotations

import copy
import dataclasses
from datetime import UTC, datetime
from typing import Any, get_args

import pydantic
import pytest
from grpo_operator.api.base import ApiModel
from grpo_operator.api.spec import GRPOJobSpec
from grpo_operator.builders import job_from_object
from grpo_operator.builders.common import KUEUE_QUEUE_LABEL
from grpo_operator.builders.gang import gang_pods
from grpo_operator.reconcile import Observed, reconcile
from grpo_operator.reconcile.platform_policy import (
    CLAIM_FIELDS,
    PLATFORM_POLICY,
    image_allowed,
    job_claims,
    platform_violations,
    total_gpus,
)
from grpo_operator.reconcile.record import ANNOTATION_RECORD, record_annotation
from grpo_operator.settings import OperatorSettings, SettingsError

T0 = datetime(2026, 11, 29, 8, 0, 0, tzinfo=UTC)
NO_CHILDREN = Observed(objects=(), nodes=None)

LIMITS = OperatorSettings(
    allowed_image_prefixes=("registry.example.com/",),
    trainer_image="registry.example.com/grpo/trainer:0.1.0",
    vllm_image="registry.example.com/vllm/vllm-openai:v0.31.0",
    allowed_priority_classes=("grpo-batch",),
    allowed_toleration_keys=("team",),
    allowed_node_selectors=("pool", "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"),
    allow_existing_claims=True,
    allowed_existing_claims=("shared-models",),
    max_gpus_per_job=8,
    allowed_queue_names=("team-a", "team-b"),
    require_queue_name=True,
)


def job_object(**spec: Any) -> dict[str, Any]:
    """A job that meets every limit of LIMITS; keyword arguments replace whole spec sections."""
    base: dict[str, Any] = {
        "model": {"name": "Qwen/Qwen2.5-1.5B-Instruct"},
        "dataset": {"train": "hf://openai/gsm8k:main#train"},
        "grpo": {"groupSize": 8, "promptsPerStep": 4, "steps": 500},
        "metric": {"image": "registry.example.com/team/metric:1.0"},
        "generation": {
            "gpus": 2,
            "tensorParallelSize": 2,
            "image": "registry.example.com/vllm/vllm-openai:v0.31.0",
        },
        "trainer": {"nodes": 2, "gpusPerNode": 2, "image": "registry.example.com/grpo/trainer:0.1.0"},
        "checkpoints": {"volume": {"accessMode": "ReadWriteMany"}},
        "scheduling": {"queueName": "team-a"},
    }
    base.update(spec)
    return {
        "apiVersion": "grpo.dev/v1alpha1",
        "kind": "GRPOJob",
        "metadata": {"name": "math", "namespace": "ns", "uid": "uid-1", "generation": 1},
        "spec": base,
    }


def violations(**spec: Any) -> list[str]:
    return platform_violations(job_from_object(job_object(**spec)).spec, LIMITS)


def test_a_job_within_every_limit_has_no_violations() -> None:
    assert violations() == []
    assert total_gpus(job_from_object(job_object()).spec) == 2 + 2 * 2


def test_no_limits_set_allows_anything() -> None:
    spec = job_from_object(
        job_object(
            metric={"image": "docker.io/anyone/metric:1"},
            scheduling={
                "priorityClassName": "system-cluster-critical",
                "tolerations": [{"operator": "Exists"}],
            },
        )
    ).spec
    assert platform_violations(spec, OperatorSettings()) == []


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            {"metric": {"image": "docker.io/evil/metric:1"}},
            "spec.metric.image 'docker.io/evil/metric:1' is not from an allowed registry (platform limit "
            "platformPolicy.allowedImagePrefixes: registry.example.com/)",
        ),
        (
            # A registry name that merely starts like an allowed one is another registry.
            {"trainer": {"nodes": 2, "gpusPerNode": 2, "image": "registry.example.com.evil.io/t:1"}},
            "spec.trainer.image 'registry.example.com.evil.io/t:1' is not from an allowed registry",
        ),
        (
            # The stock vLLM image named by the job is not exempt.
            {"generation": {"gpus": 2, "tensorParallelSize": 2, "image": "vllm/vllm-openai:v0.31.0"}},
            "spec.generation.image 'vllm/vllm-openai:",
        ),
        (
            {"scheduling": {"queueName": "team-a", "priorityClassName": "system-cluster-critical"}},
            "spec.scheduling.priorityClassName 'system-cluster-critical' is not allowed (platform limit "
            "platformPolicy.allowedPriorityClasses: grpo-batch)",
        ),
        (
            {"scheduling": {"queueName": "team-a", "tolerations": [{"operator": "Exists"}]}},
            "spec.scheduling.tolerations[0] tolerates an empty key (tolerates every taint), which is not "
            "allowed (platform limit platformPolicy.allowedTolerationKeys: team)",
        ),
        (
            {"scheduling": {"queueName": "team-a", "tolerations": [{"key": "node-role.kubernetes.io/control-plane"}]}},
            "spec.scheduling.tolerations[0] tolerates 'node-role.kubernetes.io/control-plane'",
        ),
        (
            {"scheduling": {"queueName": "team-a", "nodeSelector": {"kubernetes.io/hostname": "infra-1"}}},
            "spec.scheduling.nodeSelector kubernetes.io/hostname=infra-1 is not allowed (platform limit "
            "platformPolicy.allowedNodeSelectors: pool, nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3)",
        ),
        (
            {"scheduling": {"queueName": "team-a", "gpuNodeSelector": {"nvidia.com/gpu.product": "GB200"}}},
            "spec.scheduling.gpuNodeSelector nvidia.com/gpu.product=GB200 is not allowed",
        ),
        (
            {"scheduling": {"queueName": "team-a", "affinity": {"nodeAffinity": {"x": 1}}}},
            "spec.scheduling.affinity.nodeAffinity is not allowed while node selection is limited",
        ),
        (
            {"checkpoints": {"volume": {"existingClaim": "someone-elses-data"}}},
            "spec.checkpoints.volume.existingClaim 'someone-elses-data' is not allowed (platform limit "
            "platformPolicy.existingClaims.names: shared-models)",
        ),
        (
            # An input claim is a claim the job mounts like any other.
            {"inputs": [{"name": "data", "claim": "someone-elses-data"}]},
            "spec.inputs[].claim 'someone-elses-data' is not allowed (platform limit "
            "platformPolicy.existingClaims.names: shared-models)",
        ),
        (
            {"trainer": {"nodes": 4, "gpusPerNode": 2, "image": "registry.example.com/grpo/trainer:0.1.0"}},
            "the job requests 10 GPUs (spec.generation.gpus 2 + spec.trainer.nodes 4 x spec.trainer.gpusPerNode "
            "2), more than the platform limit platformPolicy.maxGpusPerJob: 8",
        ),
        (
            {"scheduling": {"queueName": "someone-elses-queue"}},
            "spec.scheduling.queueName 'someone-elses-queue' is not allowed (platform limit "
            "platformPolicy.queue.allowed: team-a, team-b)",
        ),
        (
            {"scheduling": {}},
            "spec.scheduling.queueName is required (platform limit platformPolicy.queue.required: true)",
        ),
    ],
    ids=[
        "image", "registry-lookalike", "default-vllm-image", "priority", "tolerate-all", "toleration-key",
        "node-selector", "gpu-node-selector", "node-affinity", "claim-name", "input-claim-name", "gpus", "queue",
        "queue-required",
    ],
)  # fmt: skip
def test_each_broken_limit_is_named_with_the_value_and_the_setting(
    spec: dict[str, Any], expected: str
) -> None:
    found = violations(**spec)
    assert len(found) == 1, found
    assert expected in found[0], found[0]


def test_allowed_node_selector_by_key_or_by_exact_value() -> None:
    assert violations(scheduling={"queueName": "team-a", "nodeSelector": {"pool": "any-pool"}}) == []
    exact = {"queueName": "team-a", "gpuNodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}
    assert violations(scheduling=exact) == []


def test_existing_claims_can_be_forbidden_outright() -> None:
    settings = OperatorSettings(allow_existing_claims=False)
    spec = job_from_object(
        job_object(
            checkpoints={"volume": {"existingClaim": "shared-models"}},
            inputs=[{"name": "data", "claim": "datasets"}, {"name": "prompts", "configMap": "prompts"}],
        )
    ).spec
    assert platform_violations(spec, settings) == [
        "spec.checkpoints.volume.existingClaim 'shared-models': mounting an existing claim is not allowed "
        "(platform limit platformPolicy.existingClaims.allowed: false): leave existingClaim out and the "
        "operator creates the job's own volume",
        "spec.inputs[].claim 'datasets': mounting an existing claim is not allowed (platform limit "
        "platformPolicy.existingClaims.allowed: false): give the input as a ConfigMap "
        "(spec.inputs[].configMap) instead",
    ]


def _claim_fields(annotation: Any, found: set[tuple[type[ApiModel], str]], seen: set[type]) -> None:
    """Every (model, field) of the API whose name says it names a PersistentVolumeClaim."""
    if isinstance(annotation, type) and issubclass(annotation, ApiModel) and annotation not in seen:
        seen.add(annotation)
        for name, field in annotation.model_fields.items():
            if "claim" in (field.alias or name).lower():
                found.add((annotation, name))
            _claim_fields(field.annotation, found, seen)
    for arg in get_args(annotation):
        _claim_fields(arg, found, seen)


def test_every_claim_field_of_the_api_is_judged_by_the_claim_limits() -> None:
    found: set[tuple[type[ApiModel], str]] = set()
    _claim_fields(GRPOJobSpec, found, set())
    covered = {(f.model, f.field) for f in CLAIM_FIELDS}
    missing = sorted(f"{model.__name__}.{name}" for model, name in found - covered)
    assert missing == [], f"add these claim fields to reconcile/platform_policy.py CLAIM_FIELDS: {missing}"
    assert covered <= found, "CLAIM_FIELDS names a field the API does not have"
    # And each entry really lists what the field names.
    spec = job_from_object(
        job_object(
            checkpoints={"volume": {"existingClaim": "ckpt"}},
            inputs=[
                {"name": "a", "claim": "in-a"},
                {"name": "b", "configMap": "cm"},
                {"name": "c", "claim": "in-c"},
            ],
        )
    ).spec
    assert [(f.path, claim) for f, claim in job_claims(spec)] == [
        ("spec.checkpoints.volume.existingClaim", "ckpt"),
        ("spec.inputs[].claim", "in-a"),
        ("spec.inputs[].claim", "in-c"),
    ]


# --- images: prefixes match on path boundaries ----------------------------------------------------------


def test_unset_images_are_the_platform_defaults_which_must_be_allowed() -> None:
    spec = job_from_object(
        job_object(trainer={"nodes": 2, "gpusPerNode": 2}, generation={"gpus": 2, "tensorParallelSize": 2})
    ).spec
    assert spec.trainer.image is None and spec.generation.image is None
    assert platform_violations(spec, LIMITS) == []
    prefixes = ("registry.example.com/",)
    with pytest.raises(SettingsError, match=r"trainer_image .* jobDefaults.images.trainer"):
        OperatorSettings(allowed_image_prefixes=prefixes, vllm_image=LIMITS.vllm_image)
    with pytest.raises(SettingsError, match=r"vllm_image .* jobDefaults.images.generation"):
        OperatorSettings(allowed_image_prefixes=prefixes, trainer_image=LIMITS.trainer_image)


@pytest.mark.parametrize(
    ("image", "allowed"),
    [
        ("registry.example.com/team/metric:1", True),
        ("registry.example.com:5000/team/metric:1", True),
        ("registry.example.com@sha256:" + "a" * 64, True),
        ("registry.example.com", True),
        ("registry.example.com.evil.io/x:1", False),
        ("registry.example.com-evil/x:1", False),
        ("registry.example.comx/x:1", False),
    ],
)
def test_a_prefix_without_a_slash_matches_only_on_a_path_boundary(image: str, allowed: bool) -> None:
    settings = dataclasses.replace(LIMITS, allowed_image_prefixes=("registry.example.com",))
    spec = job_from_object(job_object(metric={"image": image})).spec
    found = platform_violations(spec, settings)
    assert (found == []) is allowed, found
    assert image_allowed(image, "registry.example.com") is allowed


def test_prefixes_ending_on_a_boundary_match_as_written() -> None:
    assert image_allowed("vllm/vllm-openai:v0.31.0", "vllm/vllm-openai:")
    assert not image_allowed("vllm/vllm-openai-evil:v1", "vllm/vllm-openai:")
    assert not image_allowed("vllm/vllm-openai-evil:v1", "vllm/vllm-openai")
    assert image_allowed("ghcr.io/team/trainer:1", "ghcr.io/team/")
    assert not image_allowed("ghcr.io/team-evil/trainer:1", "ghcr.io/team")


# --- GPUs: every GPU request of every pod --------------------------------------------------------------


def test_gpus_requested_in_metric_resources_count_times_replicas() -> None:
    metric = {
        "image": "registry.example.com/team/metric:1.0",
        "replicas": 4,
        "resources": {"requests": {"nvidia.com/gpu": 2, "cpu": "8"}, "limits": {"nvidia.com/gpu": "2"}},
    }
    spec = job_from_object(job_object(metric=metric)).spec
    assert total_gpus(spec) == 2 + 2 * 2 + 4 * 2
    (message,) = platform_violations(spec, LIMITS)
    assert message == (
        "the job requests 14 GPUs (spec.generation.gpus 2 + spec.trainer.nodes 2 x spec.trainer.gpusPerNode 2 "
        "+ spec.metric.replicas 4 x 2 in spec.metric.resources), more than the platform limit "
        "platformPolicy.maxGpusPerJob: 8: request at most 8"
    )


def test_mig_slices_and_platform_named_gpus_count_too() -> None:
    # A MIG slice (limits only: an extended resource's request defaults to its limit), rounded up.
    metric = {
        "image": "registry.example.com/team/metric:1.0",
        "replicas": 3,
        "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1", "nvidia.com/mig-2g.20gb": "500m"}},
    }
    spec = job_from_object(job_object(metric=metric)).spec
    assert total_gpus(spec, LIMITS) == 6 + 3 * 2
    assert "+ spec.metric.replicas 3 x 2 in spec.metric.resources" in platform_violations(spec, LIMITS)[0]
    # A name the platform adds is counted wherever it appears, trainer pods included (times nodes).
    trainer = {
        "nodes": 2,
        "gpusPerNode": 1,
        "image": "registry.example.com/grpo/trainer:0.1.0",
        "resources": {"limits": {"gpu.intel.com/i915": 2}},
    }
    spec = job_from_object(job_object(trainer=trainer)).spec
    intel = dataclasses.replace(
        LIMITS, gpu_resource_names=("nvidia.com/gpu", "gpu.intel.com/*"), max_gpus_per_job=7
    )
    assert total_gpus(spec, intel) == 2 + 2 * (1 + 2)
    assert total_gpus(spec, LIMITS) == 2 + 2 * 1, "not a GPU under the default names"
    (message,) = platform_violations(spec, dataclasses.replace(intel, max_gpus_per_job=5))
    assert "+ spec.trainer.nodes 2 x 2 in spec.trainer.resources), more than" in message


@pytest.mark.parametrize(
    ("role", "section", "field"),
    [
        ("generation", {"gpus": 2, "tensorParallelSize": 2, "resources": {"limits": {"nvidia.com/gpu": 8}}}, "gpus"),
        ("trainer", {"nodes": 2, "gpusPerNode": 2, "resources": {"requests": {"nvidia.com/mig-7g.80gb": 1}}}, "gpusPerNode"),
        ("trainer", {"nodes": 2, "gpusPerNode": 2, "resources": {"limits": {"amd.com/gpu": 4}}}, "gpusPerNode"),
    ],
)  # fmt: skip
def test_roles_with_a_gpu_field_take_no_gpus_from_resources(
    role: str, section: dict[str, Any], field: str
) -> None:
    with pytest.raises(pydantic.ValidationError) as info:
        job_from_object(job_object(**{role: section}))
    message = str(info.value)
    assert f"spec.{role}.resources must not request GPUs" in message, message
    assert f"set spec.{role}.{field} instead" in message, message


def test_a_default_queue_satisfies_a_required_queue() -> None:
    settings = OperatorSettings(require_queue_name=True, default_queue_name="team-a")
    assert platform_violations(job_from_object(job_object(scheduling={})).spec, settings) == []


# --- the operator: condition, event, no children -------------------------------------------------------


def test_a_violating_job_gets_a_condition_and_event_and_no_children() -> None:
    job = job_object(metric={"image": "docker.io/evil/metric:1"})
    plan = reconcile(copy.deepcopy(job), NO_CHILDREN, T0, LIMITS)
    assert not plan.creates and not plan.applies, "a job that breaks a limit must not get any pod or child"
    assert plan.status is not None
    assert plan.status["phase"] == "Pending"
    assert plan.status["reason"] == "PolicyViolation"
    (condition,) = [c for c in plan.status["conditions"] if c["type"] == PLATFORM_POLICY]
    assert condition["status"] == "False" and condition["reason"] == "PolicyViolation"
    assert "platformPolicy.allowedImagePrefixes" in condition["message"]
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "PolicyViolation")]
    assert "docker.io/evil/metric:1" in plan.events[0].message

    # Level-based: the same state again is not another event, nor a status change.
    job["status"] = plan.status
    assert plan.record is not None
    job["metadata"].setdefault("annotations", {})[ANNOTATION_RECORD] = record_annotation(plan.record)
    again = reconcile(copy.deepcopy(job), NO_CHILDREN, T0, LIMITS)
    assert again.is_empty(), again

    # The tenant fixes the spec: the job starts and the condition says so.
    job["spec"]["metric"]["image"] = "registry.example.com/team/metric:1.0"
    job["metadata"]["generation"] = 2
    fixed = reconcile(copy.deepcopy(job), NO_CHILDREN, T0, LIMITS)
    assert [m["metadata"]["name"] for m in fixed.creates] == [
        "math-gen-1-0",
        "math-trainer-1-0",
        "math-trainer-1-1",
    ]
    assert fixed.status is not None
    (condition,) = [c for c in fixed.status["conditions"] if c["type"] == PLATFORM_POLICY]
    assert condition["status"] == "True"


def test_jobs_within_limits_carry_no_policy_condition() -> None:
    plan = reconcile(job_object(), NO_CHILDREN, T0, LIMITS)
    assert plan.status is not None
    assert plan.creates
    assert all(c["type"] != PLATFORM_POLICY for c in plan.status.get("conditions") or [])


# --- default Kueue queue ---------------------------------------------------------------------------------


def queue_labels(settings: OperatorSettings, **spec: Any) -> set[str | None]:
    job = job_from_object(job_object(**spec))
    return {pod["metadata"]["labels"].get(KUEUE_QUEUE_LABEL) for pod in gang_pods(job, settings, 1, "")}


def test_pods_of_a_job_without_a_queue_go_to_the_default_queue() -> None:
    settings = OperatorSettings(default_queue_name="team-default")
    assert queue_labels(settings, scheduling={}) == {"team-default"}
    assert queue_labels(settings, scheduling={"queueName": "team-a"}) == {"team-a"}, (
        "the job's own queue wins"
    )
    assert queue_labels(OperatorSettings(), scheduling={}) == {None}, "no default: no Kueue, as before"


# --- settings from the chart's environment -------------------------------------------------------------


def test_limits_parse_from_the_environment() -> None:
    settings = OperatorSettings.from_env(
        {
            "GRPO_OPERATOR_ALLOWED_IMAGE_PREFIXES": "registry.example.com/,ghcr.io/team/",
            "GRPO_OPERATOR_TRAINER_IMAGE": "registry.example.com/grpo/trainer:0.1.0",
            "GRPO_OPERATOR_VLLM_IMAGE": "ghcr.io/team/vllm:v0.31.0",
            "GRPO_OPERATOR_ALLOW_EXISTING_CLAIMS": "false",
            "GRPO_OPERATOR_MAX_GPUS_PER_JOB": "16",
            "GRPO_OPERATOR_DEFAULT_QUEUE_NAME": "q",
            "GRPO_OPERATOR_ALLOWED_QUEUE_NAMES": "q,r",
            "GRPO_OPERATOR_REQUIRE_QUEUE_NAME": "true",
        }
    )
    assert settings.allowed_image_prefixes == ("registry.example.com/", "ghcr.io/team/")
    assert (settings.trainer_image, settings.vllm_image) == (
        "registry.example.com/grpo/trainer:0.1.0",
        "ghcr.io/team/vllm:v0.31.0",
    )
    assert settings.allow_existing_claims is False
    assert settings.max_gpus_per_job == 16
    assert (settings.default_queue_name, settings.allowed_queue_names, settings.require_queue_name) == (
        "q",
        ("q", "r"),
        True,
    )


def test_a_default_queue_outside_the_allowed_queues_is_refused_at_start() -> None:
    with pytest.raises(SettingsError, match="default_queue_name 'q' is not in allowed_queue_names"):
        OperatorSettings(default_queue_name="q", allowed_queue_names=("r",))
    with pytest.raises(SettingsError, match="max_gpus_per_job must be >= 0"):
        OperatorSettings(max_gpus_per_job=-1)


def test_gpu_resource_names_parse_from_the_environment_and_bad_ones_are_refused() -> None:
    settings = OperatorSettings.from_env(
        {"GRPO_OPERATOR_GPU_RESOURCE_NAMES": "nvidia.com/gpu,amd.com/gpu,nvidia.com/mig-*"}
    )
    assert settings.gpu_resource_names == ("nvidia.com/gpu", "amd.com/gpu", "nvidia.com/mig-*")
    assert settings.is_gpu_resource("amd.com/gpu") and settings.is_gpu_resource("nvidia.com/mig-3g.40gb")
    assert not settings.is_gpu_resource("cpu") and not settings.is_gpu_resource("nvidia.com/gpux")
    for bad in ("*", "nvidia.com/*/x", ""):
        with pytest.raises(SettingsError, match="gpu_resource_names"):
            OperatorSettings(gpu_resource_names=(bad,))
