"""Platform limits: what a platform team allows every GRPOJob (images, priorities, placement, claims,
GPUs, queues), checked by the operator before it creates anything for a job.

The chart's ValidatingAdmissionPolicy refuses the same jobs at apply time; this check is the second
line, for jobs stored before a limit was set, clusters without the admission policy, or a spec edited
while the policy was off. Each message names the field, the value and the limit (as its Helm value),
so the tenant knows what to change and the platform team which setting said no.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal, InvalidOperation, localcontext

from grpo_operator.api.base import ApiModel
from grpo_operator.api.image_prefixes import image_allowed as image_allowed
from grpo_operator.api.spec import GRPOJobSpec, InputSpec, ResourceRequirements, VolumeSpec
from grpo_operator.builders.images import generation_image, trainer_image

# Condition type: False (reason PolicyViolation) while the job breaks a limit, True once it no longer does.
from grpo_operator.reconcile.conditions import PLATFORM_POLICY as PLATFORM_POLICY
from grpo_operator.settings import OperatorSettings


def _listed(values: tuple[str, ...]) -> str:
    return ", ".join(values)


def _image_violations(spec: GRPOJobSpec, settings: OperatorSettings) -> list[str]:
    prefixes = settings.allowed_image_prefixes
    if not prefixes:
        return []
    # The images the pods would run: an unset trainer or vLLM image is the platform's default, which the
    # settings (and the chart) refuse to start with outside the prefixes; judged anyway, so the check holds
    # whatever started the operator.
    images = (
        *([("spec.metric.image", spec.metric.image)] if spec.metric is not None else []),
        *([("spec.environment.image", spec.environment.image)] if spec.environment is not None else []),
        (_field("trainer", spec.trainer.image), trainer_image(spec, settings)),
        # A colocated job runs no vLLM image: its engine is in the trainer image.
        *(
            []
            if spec.generation.colocated()
            else [(_field("generation", spec.generation.image), generation_image(spec, settings))]
        ),
    )
    return [
        f"{field} {image!r} is not from an allowed registry (platform limit "
        f"{settings.limit_name('allowedImagePrefixes')}: {_listed(prefixes)}): use an image that starts with one of them"
        for field, image in images
        if not any(image_allowed(image, prefix) for prefix in prefixes)
    ]


def _field(role: str, image: str | None) -> str:
    unset = "" if image else f" (unset: the platform default jobDefaults.images.{role})"
    return f"spec.{role}.image{unset}"


def _node_selector_allowed(key: str, value: str, allowed: tuple[str, ...]) -> bool:
    return key in allowed or f"{key}={value}" in allowed


def _placement_violations(spec: GRPOJobSpec, settings: OperatorSettings) -> list[str]:
    sched = spec.scheduling
    out: list[str] = []
    priorities = settings.allowed_priority_classes
    if priorities and sched.priority_class_name and sched.priority_class_name not in priorities:
        out.append(
            f"spec.scheduling.priorityClassName {sched.priority_class_name!r} is not allowed (platform "
            f"limit {settings.limit_name('allowedPriorityClasses')}: {_listed(priorities)}): name one of them or none"
        )
    keys = settings.allowed_toleration_keys
    if keys:
        for index, toleration in enumerate(sched.tolerations):
            if (toleration.key or "") not in keys:
                shown = repr(toleration.key) if toleration.key else "an empty key (tolerates every taint)"
                out.append(
                    f"spec.scheduling.tolerations[{index}] tolerates {shown}, which is not allowed "
                    f"(platform limit {settings.limit_name('allowedTolerationKeys')}: {_listed(keys)}): "
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
                        f"{settings.limit_name('allowedNodeSelectors')}: {_listed(selectors)}): select only on those labels"
                    )
        if sched.affinity is not None and sched.affinity.node_affinity:
            out.append(
                "spec.scheduling.affinity.nodeAffinity is not allowed while node selection is limited "
                f"(platform limit {settings.limit_name('allowedNodeSelectors')}: {_listed(selectors)}): "
                "use spec.scheduling.nodeSelector with those labels instead"
            )
    return out


@dataclass(frozen=True)
class ClaimField:
    """A spec field that makes the job's pods mount a PersistentVolumeClaim of the namespace.

    Every such field is listed in CLAIM_FIELDS, which both the operator's check and the chart's
    platform-limits policy read (its ``claims`` variable is ``claims_cel()``;
    tests/helm/test_chart_admission_policies.py keeps them equal), and tests/unit/test_platform_policy.py
    fails for a claim field of the API that is not listed: a new way to mount a claim cannot slip past
    platformPolicy.existingClaims.
    """

    model: type[ApiModel]  # the API model that declares the field
    field: str  # its Python name there
    path: str  # how the user writes it
    hint: str  # what to do instead, when existing claims are not allowed at all
    names: Callable[[GRPOJobSpec], list[str]]  # the claims this job mounts through it
    cel: str  # the same list in CEL, on the admission request's ``object``


CLAIM_FIELDS: tuple[ClaimField, ...] = (
    ClaimField(
        VolumeSpec,
        "existing_claim",
        "spec.checkpoints.volume.existingClaim",
        "leave existingClaim out and the operator creates the job's own volume",
        lambda spec: [c] if (c := spec.checkpoints.volume.existing_claim) else [],
        "(object.spec.?checkpoints.?volume.?existingClaim.orValue('') == '' ? []"
        " : [object.spec.checkpoints.volume.existingClaim])",
    ),
    ClaimField(
        InputSpec,
        "claim",
        "spec.inputs[].claim",
        "give the input as a ConfigMap (spec.inputs[].configMap) instead",
        lambda spec: [i.claim for i in spec.inputs if i.claim],
        "object.spec.?inputs.orValue([]).filter(i, has(i.claim)).map(i, i.claim)",
    ),
)


def job_claims(spec: GRPOJobSpec) -> list[tuple[ClaimField, str]]:
    """Every existing claim the job's pods mount, with the field that names it."""
    return [(field, name) for field in CLAIM_FIELDS for name in field.names(spec)]


def claims_cel() -> str:
    """CEL for job_claims: a list of [path, claim, hint] (the chart's ``claims`` variable)."""
    # string(c): a list literal must hold one type, and the claim names are dyn to the type checker.
    return " + ".join(f'{f.cel}.map(c, ["{f.path}", string(c), "{f.hint}"])' for f in CLAIM_FIELDS)


def _claim_violations(spec: GRPOJobSpec, settings: OperatorSettings) -> list[str]:
    claims = job_claims(spec)
    if not settings.allow_existing_claims:
        return [
            f"{field.path} {claim!r}: mounting an existing claim is not allowed "
            f"(platform limit {settings.limit_name('existingClaims.allowed')}: false): {field.hint}"
            for field, claim in claims
        ]
    names = settings.allowed_existing_claims
    return [
        f"{field.path} {claim!r} is not allowed (platform limit "
        f"{settings.limit_name('existingClaims.names')}: {_listed(names)}): name one of them or leave it out"
        for field, claim in claims
        if names and claim not in names
    ]


_QUANTITY = re.compile(r"^([0-9]*\.?[0-9]*)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9.]+)?$")
_SUFFIXES = {
    **{s: Decimal(1024) ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{s: Decimal(10) ** e for s, e in (("n", -9), ("u", -6), ("m", -3), ("k", 3), ("M", 6), ("G", 9))},
    **{s: Decimal(10) ** e for s, e in (("T", 12), ("P", 15), ("E", 18))},
}


def _whole_units(value: int | str) -> int:
    """A quantity rounded up to whole units: half a GPU still takes a GPU (CEL: isInteger, else + 1)."""
    text = str(value)
    match = _QUANTITY.fullmatch(text)
    with localcontext() as ctx:
        ctx.prec = 60
        try:
            number = Decimal(match.group(1)) if match else Decimal(text)
            suffix = (match.group(2) or "") if match else ""
            if suffix in _SUFFIXES:
                number *= _SUFFIXES[suffix]
            elif suffix:
                number *= Decimal(10) ** Decimal(suffix[1:])
        except InvalidOperation:
            # The API schema admits only quantities; anything else is as much as one could ask for.
            return 2**63
        return int(number.to_integral_value(rounding=ROUND_CEILING))


def resource_gpus(resources: ResourceRequirements, settings: OperatorSettings, skip: str = "") -> int:
    """GPUs one container asks for in ``resources``: for each GPU resource name (settings.is_gpu_resource)
    the larger of its request and limit (an extended resource's request defaults to its limit). ``skip``:
    a name the builders overwrite with the role's GPU field."""
    requests: Mapping[str, int | str] = resources.requests
    limits: Mapping[str, int | str] = resources.limits
    names = {n for n in (*requests, *limits) if n != skip and settings.is_gpu_resource(n)}
    return sum(max(_whole_units(requests.get(n, 0)), _whole_units(limits.get(n, 0))) for n in names)


@dataclass(frozen=True)
class GpuCount:
    """The GPUs one job holds while it runs, by where they come from."""

    generation: int  # spec.generation.gpus, per vLLM pod
    nodes: int  # spec.trainer.nodes
    per_node: int  # spec.trainer.gpusPerNode
    generation_resources: int  # GPU resources in spec.generation.resources
    trainer_resources: int  # GPU resources in spec.trainer.resources, per trainer pod
    metric_replicas: int
    metric_resources: int  # GPU resources in spec.metric.resources, per metric pod
    generation_replicas: int = 1  # spec.generation.replicas: vLLM pods (0 when colocated)
    environment_replicas: int = 0  # spec.environment.replicas (0 without spec.environment)
    environment_resources: int = 0  # GPU resources in spec.environment.resources, per environment pod

    @property
    def total(self) -> int:
        return (
            self.generation_replicas * (self.generation + self.generation_resources)
            + self.nodes * (self.per_node + self.trainer_resources)
            + self.metric_replicas * self.metric_resources
            + self.environment_replicas * self.environment_resources
        )

    def breakdown(self) -> str:
        """Where the total comes from, in the words the chart's admission policy uses too."""
        several = self.generation_replicas > 1
        replicas = f"spec.generation.replicas {self.generation_replicas} x " if several else ""
        trainers = f"spec.trainer.nodes {self.nodes} x spec.trainer.gpusPerNode {self.per_node}"
        if self.generation_replicas == 0:
            # Colocated generation runs on the trainers' GPUs: it adds none.
            out = f"{trainers} (spec.generation.mode: Colocate, no vLLM pod)"
        else:
            out = f"{replicas}spec.generation.gpus {self.generation} + {trainers}"
        if self.generation_resources and self.generation_replicas:
            out += f" + {replicas}{self.generation_resources} in spec.generation.resources"
        if self.trainer_resources:
            out += f" + spec.trainer.nodes {self.nodes} x {self.trainer_resources} in spec.trainer.resources"
        if self.metric_resources:
            out += f" + spec.metric.replicas {self.metric_replicas} x {self.metric_resources} in spec.metric.resources"
        if self.environment_resources:
            out += (
                f" + spec.environment.replicas {self.environment_replicas} x {self.environment_resources} in "
                "spec.environment.resources"
            )
        return out


def gpu_count(spec: GRPOJobSpec, settings: OperatorSettings) -> GpuCount:
    """Every GPU request of every pod the job creates, by role (see GpuCount)."""
    metric, environment = spec.metric, spec.environment
    return GpuCount(
        generation=spec.generation.gpus,
        generation_replicas=spec.generation.server_count(),
        nodes=spec.trainer.nodes,
        per_node=spec.trainer.gpus_per_node,
        generation_resources=resource_gpus(spec.generation.resources, settings, skip=settings.gpu_resource),
        trainer_resources=resource_gpus(spec.trainer.resources, settings, skip=settings.gpu_resource),
        metric_replicas=metric.replicas if metric else 0,
        metric_resources=resource_gpus(metric.resources, settings) if metric else 0,
        environment_replicas=environment.replicas if environment else 0,
        environment_resources=resource_gpus(environment.resources, settings) if environment else 0,
    )


def total_gpus(spec: GRPOJobSpec, settings: OperatorSettings | None = None) -> int:
    """GPUs one job holds while it runs: every vLLM pod's, every trainer pod's, every metric pod's and every
    environment pod's."""
    return gpu_count(spec, settings or OperatorSettings()).total


def _gpu_violations(spec: GRPOJobSpec, settings: OperatorSettings) -> list[str]:
    limit = settings.max_gpus_per_job
    count = gpu_count(spec, settings)
    if not limit or count.total <= limit:
        return []
    return [
        f"the job requests {count.total} GPUs ({count.breakdown()}), more than the "
        f"platform limit {settings.limit_name('maxGpusPerJob')}: {limit}: request at most {limit}"
    ]


def _queue_violations(spec: GRPOJobSpec, settings: OperatorSettings) -> list[str]:
    named = spec.scheduling.queue_name
    allowed = settings.allowed_queue_names
    if named and allowed and named not in allowed:
        return [
            f"spec.scheduling.queueName {named!r} is not allowed (platform limit "
            f"{settings.limit_name('queue.allowed')}: {_listed(allowed)}): name one of them"
        ]
    if not named and settings.require_queue_name and not settings.default_queue_name:
        return [
            f"spec.scheduling.queueName is required (platform limit {settings.limit_name('queue.required')}: true): "
            "name the Kueue LocalQueue of your team" + (f" (one of: {_listed(allowed)})" if allowed else "")
        ]
    return []


def _budget_violations(spec: GRPOJobSpec, settings: OperatorSettings) -> list[str]:
    # Nothing could count an amount without prices: running the job anyway would ignore its owner's cap.
    if spec.budget is None or spec.budget.amount is None or settings.prices:
        return []
    return [
        "spec.budget.amount is set, but this platform sets no prices (Helm pricing), so nothing could count "
        "it: use spec.budget.gpuHours instead, or ask the platform team to set prices"
    ]


def platform_violations(spec: GRPOJobSpec, settings: OperatorSettings) -> list[str]:
    """Every platform limit ``spec`` breaks, one message each (empty: the job may run)."""
    return [
        *_budget_violations(spec, settings),
        *_image_violations(spec, settings),
        *_placement_violations(spec, settings),
        *_claim_violations(spec, settings),
        *_gpu_violations(spec, settings),
        *_queue_violations(spec, settings),
    ]
