"""Platform limits: what a platform team allows every GRPOJob (images, priorities, placement, claims,
GPUs, queues), checked by the operator before it creates anything for a job.

The chart's ValidatingAdmissionPolicy refuses the same jobs at apply time; this check is the second
line, for jobs stored before a limit was set, clusters without the admission policy, or a spec edited
while the policy was off. Each message names the field, the value and the limit (as its Helm value),
so the tenant knows what to change and the platform team which setting said no.
"""

from __future__ import annotations

from grpo_operator.api.spec import GRPOJobSpec

# Condition type: False (reason PolicyViolation) while the job breaks a limit, True once it no longer does.
from grpo_operator.reconcile.conditions import PLATFORM_POLICY as PLATFORM_POLICY
from grpo_operator.settings import OperatorSettings


def _listed(values: tuple[str, ...]) -> str:
    return ", ".join(values)


def _image_violations(spec: GRPOJobSpec, prefixes: tuple[str, ...]) -> list[str]:
    if not prefixes:
        return []
    images = (
        *([("spec.metric.image", spec.metric.image)] if spec.metric is not None else []),
        ("spec.trainer.image", spec.trainer.image),
        ("spec.generation.image", spec.generation.image),
    )
    return [
        f"{field} {image!r} is not from an allowed registry (platform limit "
        f"platformPolicy.allowedImagePrefixes: {_listed(prefixes)}): use an image that starts with one of them"
        for field, image in images
        if not image.startswith(prefixes)
    ]


def _node_selector_allowed(key: str, value: str, allowed: tuple[str, ...]) -> bool:
    return key in allowed or f"{key}={value}" in allowed


def _placement_violations(spec: GRPOJobSpec, settings: OperatorSettings) -> list[str]:
    sched = spec.scheduling
    out: list[str] = []
    priorities = settings.allowed_priority_classes
    if priorities and sched.priority_class_name and sched.priority_class_name not in priorities:
        out.append(
            f"spec.scheduling.priorityClassName {sched.priority_class_name!r} is not allowed (platform "
            f"limit platformPolicy.allowedPriorityClasses: {_listed(priorities)}): name one of them or none"
        )
    keys = settings.allowed_toleration_keys
    if keys:
        for index, toleration in enumerate(sched.tolerations):
            if (toleration.key or "") not in keys:
                shown = repr(toleration.key) if toleration.key else "an empty key (tolerates every taint)"
                out.append(
                    f"spec.scheduling.tolerations[{index}] tolerates {shown}, which is not allowed "
                    f"(platform limit platformPolicy.allowedTolerationKeys: {_listed(keys)}): "
                    "tolerate only those taint keys"
                )
    selectors = settings.allowed_node_selectors
    if selectors:
        for field, labels in (
            ("nodeSelector", sched.node_selector),
            ("gpuNodeSelector", sched.gpu_node_selector),
        ):
            for key, value in labels.items():
                if not _node_selector_allowed(key, value, selectors):
                    out.append(
                        f"spec.scheduling.{field} {key}={value} is not allowed (platform limit "
                        f"platformPolicy.allowedNodeSelectors: {_listed(selectors)}): select only on those labels"
                    )
        if sched.affinity is not None and sched.affinity.node_affinity:
            out.append(
                "spec.scheduling.affinity.nodeAffinity is not allowed while node selection is limited "
                f"(platform limit platformPolicy.allowedNodeSelectors: {_listed(selectors)}): "
                "use spec.scheduling.nodeSelector with those labels instead"
            )
    return out


def _claim_violations(spec: GRPOJobSpec, settings: OperatorSettings) -> list[str]:
    claim = spec.checkpoints.volume.existing_claim
    if not claim:
        return []
    if not settings.allow_existing_claims:
        return [
            f"spec.checkpoints.volume.existingClaim {claim!r}: mounting an existing claim is not allowed "
            "(platform limit platformPolicy.existingClaims.allowed: false): leave existingClaim out and "
            "the operator creates the job's own volume"
        ]
    names = settings.allowed_existing_claims
    if names and claim not in names:
        return [
            f"spec.checkpoints.volume.existingClaim {claim!r} is not allowed (platform limit "
            f"platformPolicy.existingClaims.names: {_listed(names)}): name one of them or leave it out"
        ]
    return []


def total_gpus(spec: GRPOJobSpec) -> int:
    """GPUs one job holds while it runs: the vLLM pod's plus every trainer pod's."""
    return spec.generation.gpus + spec.trainer.nodes * spec.trainer.gpus_per_node


def _gpu_violations(spec: GRPOJobSpec, limit: int) -> list[str]:
    gpus = total_gpus(spec)
    if not limit or gpus <= limit:
        return []
    return [
        f"the job requests {gpus} GPUs (spec.generation.gpus {spec.generation.gpus} + spec.trainer.nodes "
        f"{spec.trainer.nodes} x spec.trainer.gpusPerNode {spec.trainer.gpus_per_node}), more than the "
        f"platform limit platformPolicy.maxGpusPerJob: {limit}: request at most {limit}"
    ]


def _queue_violations(spec: GRPOJobSpec, settings: OperatorSettings) -> list[str]:
    named = spec.scheduling.queue_name
    allowed = settings.allowed_queue_names
    if named and allowed and named not in allowed:
        return [
            f"spec.scheduling.queueName {named!r} is not allowed (platform limit "
            f"platformPolicy.queue.allowed: {_listed(allowed)}): name one of them"
        ]
    if not named and settings.require_queue_name and not settings.default_queue_name:
        return [
            "spec.scheduling.queueName is required (platform limit platformPolicy.queue.required: true): "
            "name the Kueue LocalQueue of your team" + (f" (one of: {_listed(allowed)})" if allowed else "")
        ]
    return []


def platform_violations(spec: GRPOJobSpec, settings: OperatorSettings) -> list[str]:
    """Every platform limit ``spec`` breaks, one message each (empty: the job may run)."""
    return [
        *_image_violations(spec, settings.allowed_image_prefixes),
        *_placement_violations(spec, settings),
        *_claim_violations(spec, settings),
        *_gpu_violations(spec, settings.max_gpus_per_job),
        *_queue_violations(spec, settings),
    ]
