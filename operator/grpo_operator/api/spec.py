"""``GRPOJob.spec``: the single source of truth for the CRD schema and docs/api.md.

Every constraint is stated twice on purpose, in the two languages that enforce it: pydantic
(``Field`` bounds and validators, used by the operator, the trainer and the unit tests) and the
API server (OpenAPI bounds generated from the same ``Field`` bounds, plus the CEL rules in
``cel_rules``). The CEL rules and the validators next to them must say the same thing;
``tests/integration/test_crd_property.py`` checks it with random specs against a real API server.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BeforeValidator, Field, WithJsonSchema, field_validator, model_validator

from grpo_operator.api.base import ApiModel, CelRule
from grpo_operator.api.dataset_uri import (
    DATASET_URI_HELP,
    DATASET_URI_PATTERN,
    DatasetURIError,
    parse_dataset_uri,
)
from grpo_operator.api.prompt_template import PROMPT_TEMPLATE_RULES, template_fields
from grpo_operator.api.rollouts import (
    CLIENT_MODE_RULES,
    ROLLOUTS_SOURCE_IMMUTABLE,
    RolloutsSpec,
    client_mode_violation,
    rollouts_source,
)

# GPUs one Kubernetes node offers at most (an 8-GPU HGX/DGX box); per-pod GPU counts above it could
# never be scheduled.
MAX_GPUS_PER_NODE = 8

# Characters a container image reference or model id never contains. Spelled out rather than \s
# because RE2 (API server) and Rust regex (pydantic) disagree on what \s covers beyond ASCII.
NO_SPACE_PATTERN = r"^[^ \t\r\n]+$"
# Kubernetes resource.Quantity without a sign (requests are never negative).
QUANTITY_PATTERN = (
    r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
# DNS-1123 subdomain (PVC, StorageClass and PriorityClass names).
DNS1123_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# DNS-1123 label (Kueue LocalQueue names end up in a label value, so they must be label-safe).
DNS1123_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# Environment variable names as Kubernetes accepts them.
ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
# Keys of a Secret or ConfigMap as Kubernetes accepts them.
CONFIG_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"


def _integral_float_to_int(value: Any) -> Any:
    # kubectl turns YAML `8.0` into JSON `8`, and the API server accepts an integral JSON number for
    # an integer field; strict pydantic would not, so meet the API server here.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# An integer field as the API server sees it: 8 and 8.0 are the integer 8; 8.5, "8" and true are not.
_INTEGRAL_FLOAT = BeforeValidator(_integral_float_to_int)
K8sInt = Annotated[int, _INTEGRAL_FLOAT]
# In an Optional, bounds must come before the validator: Annotated[int, Field(ge=..), _INTEGRAL_FLOAT].

_QUANTITY_RE = re.compile(QUANTITY_PATTERN)


def _quantity_to_str(value: int | str) -> str:
    # One check for both forms, so a bad value gets one clear error rather than one per union branch.
    # Builders put quantities into manifests as strings; "2" and 2 mean the same to Kubernetes.
    text = str(value)
    if (isinstance(value, int) and value < 0) or len(text) > 64 or not _QUANTITY_RE.fullmatch(text):
        raise ValueError(
            f"{text!r} is not a non-negative Kubernetes quantity: write e.g. 500m, 2, 1.5 or 16Gi"
        )
    return text


# A Kubernetes quantity written as a string ("500m", "16Gi") or a non-negative integer (2).
Quantity = Annotated[
    int | str,
    AfterValidator(_quantity_to_str),
    WithJsonSchema(
        {"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN, "maxLength": 64, "minimum": 0}
    ),
]

# Where the job's volume is mounted in trainer pods (and in the vLLM pod when it is ReadWriteMany).
VOLUME_MOUNT_PATH = "/workspace"

DEFAULT_VLLM_IMAGE = "vllm/vllm-openai:v0.31.0"
DEFAULT_TRAINER_IMAGE = "ghcr.io/grpo-operator/trainer:0.1.0"


class SecretKeySelector(ApiModel):
    """One key of a Secret in the job's namespace."""

    name: str = Field(
        min_length=1,
        max_length=253,
        pattern=DNS1123_SUBDOMAIN_PATTERN,
        description="Name of the Secret (in the job's namespace).",
    )
    key: str = Field(
        min_length=1, max_length=253, pattern=CONFIG_KEY_PATTERN, description="The key whose value is used."
    )


class KeyRef(ApiModel):
    """One key of a Secret or ConfigMap in the job's namespace."""

    name: str = Field(
        min_length=1,
        max_length=253,
        pattern=DNS1123_SUBDOMAIN_PATTERN,
        description="Name of the Secret or ConfigMap (in the job's namespace).",
    )
    key: str = Field(
        min_length=1, max_length=253, pattern=CONFIG_KEY_PATTERN, description="The key whose value is used."
    )
    optional: bool | None = Field(
        default=None,
        description="true: a missing object or key leaves the variable unset instead of failing.",
    )


class ModelSpec(ApiModel):
    """The policy model to fine-tune."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            "!self.name.startsWith('-')",
            "spec.model.name must not start with '-': it is the first argument of `vllm serve`, which would "
            "read it as an option. Give a Hugging Face model id (org/name) or an absolute path",
            ".name",
        ),
    )

    name: str = Field(
        min_length=1,
        max_length=512,
        pattern=NO_SPACE_PATTERN,
        description="Hugging Face model id (org/name) or an absolute path to a model directory in the "
        "trainer image or on the job's volume.",
    )
    revision: str = Field(
        default="main",
        min_length=1,
        max_length=255,
        pattern=NO_SPACE_PATTERN,
        description="Model revision on the Hub: a branch, tag or commit hash.",
    )
    dtype: Literal["bfloat16", "float16", "float32"] = Field(
        default="bfloat16", description="Weight dtype for training and generation."
    )
    token_secret_ref: SecretKeySelector | None = Field(
        default=None,
        description="Secret key holding a Hugging Face access token for a gated or private model, e.g. "
        "{name: hf-token, key: token}. Given to vLLM and the trainers as HF_TOKEN; the token itself never "
        "appears in the GRPOJob. May be added or changed later (the gang restarts).",
    )

    @model_validator(mode="after")
    def _not_an_option(self) -> ModelSpec:
        if self.name.startswith("-"):
            raise self.cel_rules[0].violation()
        return self


def _dataset_uri_field(description: str, *, required: bool) -> Any:
    extra: dict[str, Any] = {
        "x-kubernetes-validations": [
            CelRule(
                f"self.matches(r'{DATASET_URI_PATTERN}')",
                f"dataset URI has an unsupported scheme or is malformed: {DATASET_URI_HELP}",
            ).to_schema()
        ]
    }
    if required:
        return Field(max_length=2048, description=description, json_schema_extra=extra)
    return Field(default=None, max_length=2048, description=description, json_schema_extra=extra)


class DatasetSpec(ApiModel):
    """Where the prompts come from. See "Dataset URIs" in docs/api.md for the accepted schemes."""

    train: str = _dataset_uri_field(
        "Training prompts: hf://<org>/<name>[:<config>][@<revision>][#<split>] or "
        "file:///<absolute path>.jsonl|.json|.parquet.",
        required=True,
    )
    validation: str | None = _dataset_uri_field(
        "Held-out prompts scored every grpo.validation.everySteps steps; same URI schemes as train.",
        required=False,
    )
    prompt_field: str = Field(
        default="prompt", min_length=1, max_length=253, description="Dataset column holding the prompt."
    )
    answer_field: str = Field(
        default="answer",
        min_length=1,
        max_length=253,
        description="Dataset column holding the reference answer; the metric gets it with the other columns.",
    )
    system_prompt: str | None = Field(
        default=None,
        min_length=1,
        max_length=16384,
        description=(
            "Instructions put before every prompt (e.g. the answer format the metric expects): a system turn "
            "when the model has a chat template, else text followed by a blank line."
        ),
    )
    prompt_template: str | None = Field(
        default=None,
        min_length=1,
        max_length=16384,
        json_schema_extra={"x-kubernetes-validations": [r.to_schema() for r in PROMPT_TEMPLATE_RULES]},
        description=(
            "Text of each prompt with {column} placeholders filled from the row; {prompt} is the promptField "
            "column. {{ and }} are literal braces. For text prompts only (a chat-format column already holds "
            "its turns: use systemPrompt)."
        ),
    )
    apply_chat_template: bool = Field(
        default=True,
        description=(
            "Send text prompts as a user turn through the model's chat template when it has one; false "
            "sends them as raw text. Chat-format prompts (a list of {role, content}) always use it."
        ),
    )

    @field_validator("prompt_template")
    @classmethod
    def _check_template(cls, value: str | None) -> str | None:
        if value is not None:
            template_fields(value)
        return value

    @field_validator("train", "validation")
    @classmethod
    def _check_uri(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                parse_dataset_uri(value)
            except DatasetURIError as exc:
                raise ValueError(str(exc)) from None
        return value


class LoraSpec(ApiModel):
    """Low-rank adapters instead of full fine-tuning: far less GPU memory, adapters only in checkpoints."""

    enabled: bool = Field(default=False, description="Train LoRA adapters instead of all weights.")
    r: K8sInt = Field(default=16, ge=1, le=1024, description="Adapter rank.")
    alpha: K8sInt = Field(default=32, ge=1, le=4096, description="LoRA scaling numerator (lora_alpha).")
    dropout: float = Field(default=0.05, ge=0.0, lt=1.0, description="Dropout on the adapter input.")
    target_modules: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        min_length=1,
        max_length=64,
        description="Names of the modules that get adapters.",
    )


class ValidationSpec(ApiModel):
    """Periodic scoring of held-out prompts: the honest view of whether training helps."""

    every_steps: K8sInt = Field(
        default=0, ge=0, le=1_000_000, description="Validate every N steps; 0 turns validation off."
    )
    max_prompts: K8sInt = Field(
        default=64, ge=1, le=100_000, description="Validation prompts scored per run (one completion each)."
    )
    score_path: str = Field(
        default="/score",
        min_length=1,
        max_length=256,
        pattern=r"^/[A-Za-z0-9._~/-]*$",
        description=(
            "Route of the metric service that scores validation answers. /score (default) is the training "
            "reward; another route (e.g. /validate, served by the SDK's serve(metric, validation=...)) scores "
            "them with a reward the policy never trained against, which can reveal a gamed training reward."
        ),
    )


class GRPOSpec(ApiModel):
    """GRPO itself: group size G, prompts per step B, steps S, and the optimisation knobs."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            "self.formatFailureScore < self.failureScore",
            "spec.grpo.formatFailureScore must be strictly below spec.grpo.failureScore "
            "(unparseable output must score worse than a wrong answer): lower formatFailureScore",
            ".formatFailureScore",
        ),
        CelRule(
            "!has(self.epsilonHigh) || self.epsilonHigh >= self.epsilon",
            "spec.grpo.epsilonHigh must be >= spec.grpo.epsilon (it is the upper clip bound): "
            "raise epsilonHigh or leave it unset",
            ".epsilonHigh",
        ),
    )

    group_size: K8sInt = Field(
        ge=2,
        le=256,
        description="G: completions sampled per prompt; advantages compare them, so G >= 2 (8 is typical).",
    )
    prompts_per_step: K8sInt = Field(ge=1, le=4096, description="B: prompts per optimisation step.")
    steps: K8sInt = Field(
        ge=1, le=1_000_000, description="S: optimisation steps; the run costs S*B*G rollouts."
    )
    learning_rate: float = Field(default=1e-6, gt=0.0, le=1.0, description="AdamW learning rate.")
    temperature: float = Field(
        default=1.0, gt=0.0, le=100.0, description="Sampling temperature; > 0 so a group's answers differ."
    )
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling probability mass.")
    max_prompt_length: K8sInt = Field(
        default=512, ge=1, le=1_048_576, description="Prompts are truncated to this many tokens."
    )
    max_completion_length: K8sInt = Field(
        default=256, ge=1, le=1_048_576, description="Maximum tokens generated per completion."
    )
    beta: float = Field(
        default=0.0, ge=0.0, le=100.0, description="KL coefficient against the reference model; 0 skips it."
    )
    epsilon: float = Field(default=0.2, gt=0.0, le=1.0, description="Lower (and default upper) ratio clip.")
    epsilon_high: float | None = Field(
        default=None,
        gt=0.0,
        le=1.0,
        description="Upper ratio clip (DAPO clip-higher, e.g. 0.28); unset means epsilon.",
    )
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = Field(
        default="dapo", description="Loss aggregation (TRL loss_type); dapo is TRL 1.16's default."
    )
    scale_rewards: Literal["group", "batch", "none"] = Field(
        default="group",
        description="Divide advantages by the group's population std (group), the batch std (batch), "
        "or not at all (none).",
    )
    format_failure_score: float = Field(
        default=-1.0,
        ge=-1e6,
        le=1e6,
        description="Reward for unparseable output; must be below failureScore.",
    )
    failure_score: float = Field(
        default=0.0, ge=-1e6, le=1e6, description="Reward the metric gives a parseable but wrong answer."
    )
    dynamic_sampling: bool = Field(
        default=False,
        description="Drop groups whose rewards are all equal and sample new prompts to refill (DAPO).",
    )
    seed: K8sInt = Field(
        default=42, ge=0, le=2**31 - 1, description="Seed for data order, sampling and init."
    )
    lora: LoraSpec = Field(default_factory=LoraSpec, description="LoRA adapters instead of full fine-tuning.")
    validation: ValidationSpec = Field(default_factory=ValidationSpec, description="Periodic validation.")

    @model_validator(mode="after")
    def _cross_field(self) -> GRPOSpec:
        if not self.format_failure_score < self.failure_score:
            raise self.cel_rules[0].violation()
        if self.epsilon_high is not None and self.epsilon_high < self.epsilon:
            raise self.cel_rules[1].violation()
        return self


class EnvVarSource(ApiModel):
    """Where a variable's value comes from, as in a Pod: exactly one of secretKeyRef and configMapKeyRef."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            "has(self.secretKeyRef) != has(self.configMapKeyRef)",
            "valueFrom must set exactly one of secretKeyRef and configMapKeyRef",
        ),
    )

    secret_key_ref: KeyRef | None = Field(
        default=None, description="A key of a Secret: the value never appears in the GRPOJob."
    )
    config_map_key_ref: KeyRef | None = Field(default=None, description="A key of a ConfigMap.")

    @model_validator(mode="after")
    def _exactly_one(self) -> EnvVarSource:
        if (self.secret_key_ref is None) == (self.config_map_key_ref is None):
            raise self.cel_rules[0].violation()
        return self


class EnvVar(ApiModel):
    """An environment variable for a container: a plain value, or valueFrom a Secret or ConfigMap key."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            "!has(self.value) || !has(self.valueFrom)",
            "an environment variable takes value or valueFrom, not both: keep one",
            ".valueFrom",
        ),
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
            raise self.cel_rules[0].violation()
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
_ENV_LIST_SCHEMA: dict[str, Any] = {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]}


class ResourceRequirements(ApiModel):
    """Container resources as in a Pod: requests and limits keyed by resource name."""

    requests: dict[str, Quantity] = Field(
        default_factory=dict, max_length=16, description="Minimum resources, e.g. {cpu: 500m, memory: 1Gi}."
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict, max_length=16, description="Maximum resources, e.g. {memory: 2Gi}."
    )


class MetricSpec(ApiModel):
    """The user's reward service: an HTTP server (GET /healthz, POST /score) built from their image."""

    image: str = Field(
        min_length=1, max_length=512, pattern=NO_SPACE_PATTERN, description="Metric service container image."
    )
    port: K8sInt = Field(default=8080, ge=1, le=65535, description="Port the metric server listens on.")
    replicas: K8sInt = Field(default=1, ge=1, le=64, description="Metric server replicas behind one Service.")
    batch_size: K8sInt = Field(default=32, ge=1, le=4096, description="Completions sent per POST /score.")
    concurrency: K8sInt = Field(
        default=4, ge=1, le=256, description="POST /score requests in flight at once."
    )
    timeout_seconds: K8sInt = Field(default=30, ge=1, le=3600, description="Timeout for one POST /score.")
    max_retries: K8sInt = Field(
        default=3, ge=0, le=20, description="Retries (with backoff) of a failed batch."
    )
    error_budget: float = Field(
        default=0.05,
        ge=0.0,
        le=1.0,
        description="Fraction of rollouts in a sliding window of steps that may be metric errors before the "
        "run fails.",
    )
    max_response_bytes: K8sInt = Field(
        default=4 * 1024 * 1024,
        ge=1024,
        le=256 * 1024 * 1024,
        description="Largest POST /score response body the trainer reads; a longer one makes its batch "
        "metric errors.",
    )
    max_abs_reward: float = Field(
        default=1e6,
        gt=0.0,
        le=1e12,
        description="Largest |reward| accepted; a reward beyond it (or not finite) is a metric error for its "
        "item.",
    )
    env: EnvList = Field(
        default_factory=list, json_schema_extra=_ENV_LIST_SCHEMA, description="Extra environment variables."
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements, description="CPU/memory for each metric server pod."
    )


class GenerationSpec(ApiModel):
    """The vLLM server that samples completions (server mode; weights synced from trainer rank 0)."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            "self.tensorParallelSize == self.gpus",
            "spec.generation.tensorParallelSize must equal spec.generation.gpus: the vLLM server shards the "
            "model over all its GPUs, and data parallelism (gpus > tensorParallelSize) fails for dense models "
            "with TRL's server mode, so it is not supported yet. Set tensorParallelSize to gpus",
            ".tensorParallelSize",
        ),
    )

    gpus: K8sInt = Field(
        default=1, ge=1, le=MAX_GPUS_PER_NODE, description="GPUs for vLLM (one pod, one node)."
    )
    tensor_parallel_size: K8sInt = Field(
        default=1,
        ge=1,
        le=MAX_GPUS_PER_NODE,
        description="vLLM tensor-parallel size; must equal gpus. Several vLLM data-parallel replicas "
        "(gpus > tensorParallelSize) are refused: TRL documents them as failing for dense models.",
    )
    image: str = Field(
        default=DEFAULT_VLLM_IMAGE,
        min_length=1,
        max_length=512,
        pattern=NO_SPACE_PATTERN,
        description="vLLM server image; its vLLM version must match the trainer image's.",
    )
    gpu_memory_utilization: float = Field(
        default=0.9, gt=0.0, le=1.0, description="Fraction of each GPU's memory vLLM may use."
    )
    max_model_len: Annotated[int, Field(ge=1, le=1_048_576), _INTEGRAL_FLOAT] | None = Field(
        default=None,
        description="vLLM context length; unset means the model's (prompt + completion must fit).",
    )
    startup_timeout_seconds: K8sInt = Field(
        default=1800,
        ge=60,
        le=86_400,
        description="Time the vLLM server gets from its pod's start to Ready (image pull, model download, "
        "CUDA graph capture). Trainers wait this long for its /health; past it the gang restarts (counted).",
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description="CPU/memory for the vLLM pod (GPUs come from gpus).",
    )
    env: EnvList = Field(
        default_factory=list,
        json_schema_extra=_ENV_LIST_SCHEMA,
        description="Extra environment variables of the vLLM server (VLLM_SERVER_DEV_MODE is the operator's).",
    )

    @model_validator(mode="after")
    def _tp_is_all_gpus(self) -> GenerationSpec:
        if self.tensor_parallel_size != self.gpus:
            raise self.cel_rules[0].violation()
        return self


class TrainerSpec(ApiModel):
    """The trainer gang: nodes x gpusPerNode processes, data parallel."""

    nodes: K8sInt = Field(default=1, ge=1, le=64, description="Trainer pods (one per node).")
    gpus_per_node: K8sInt = Field(
        default=1, ge=1, le=MAX_GPUS_PER_NODE, description="GPUs (and training processes) per trainer pod."
    )
    per_device_batch_size: K8sInt = Field(
        default=1,
        ge=1,
        le=1024,
        description="Completions per GPU per micro-step (gradient accumulation fills B*G).",
    )
    image: str = Field(
        default=DEFAULT_TRAINER_IMAGE,
        min_length=1,
        max_length=512,
        pattern=NO_SPACE_PATTERN,
        description="Trainer image (grpo_trainer).",
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description="CPU/memory for each trainer pod (GPUs come from gpusPerNode).",
    )
    env: EnvList = Field(
        default_factory=list, json_schema_extra=_ENV_LIST_SCHEMA, description="Extra environment variables."
    )


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


class Toleration(ApiModel):
    """A Kubernetes toleration (as in a Pod spec)."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
            "a toleration with operator Exists must not set value: remove value or use operator Equal",
            ".value",
        ),
        CelRule(
            "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            "tolerationSeconds only applies to effect NoExecute: "
            "set effect NoExecute or remove tolerationSeconds",
            ".tolerationSeconds",
        ),
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
    toleration_seconds: Annotated[int, Field(ge=0, le=2**31 - 1), _INTEGRAL_FLOAT] | None = Field(
        default=None, description="How long a NoExecute taint is tolerated."
    )

    @model_validator(mode="after")
    def _k8s_rules(self) -> Toleration:
        if self.operator == "Exists" and self.value:
            raise self.cel_rules[0].violation()
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise self.cel_rules[1].violation()
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

    name: str = Field(
        min_length=1,
        max_length=253,
        pattern=DNS1123_SUBDOMAIN_PATTERN,
        description="Name of the Secret.",
    )


# Where spec.inputs are mounted, read-only, in the trainer and vLLM pods: /inputs/<name>.
INPUTS_MOUNT_PATH = "/inputs"


class InputSpec(ApiModel):
    """Data the job reads, mounted read-only at /inputs/<name> in the trainer and vLLM pods."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            "has(self.configMap) != has(self.claim)",
            "spec.inputs[] needs exactly one of configMap (a ConfigMap, up to 1 MiB: a small dataset) or "
            "claim (a PersistentVolumeClaim: a large dataset or a model)",
        ),
        CelRule(
            "!has(self.subPath) || has(self.claim)",
            "spec.inputs[].subPath selects a directory of a claim: use it with claim only",
            ".subPath",
        ),
        CelRule(
            "!has(self.subPath) || !self.subPath.contains('..')",
            "spec.inputs[].subPath must stay inside the claim: remove '..'",
            ".subPath",
        ),
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
            raise self.cel_rules[0].violation()
        if self.sub_path is not None and self.claim is None:
            raise self.cel_rules[1].violation()
        if self.sub_path is not None and ".." in self.sub_path:
            raise self.cel_rules[2].violation()
        return self


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
    active_deadline_seconds: Annotated[int, Field(ge=1, le=31_536_000 * 10), _INTEGRAL_FLOAT] | None = Field(
        default=None, description="Fail the job after this long in total."
    )
    progress_deadline_seconds: K8sInt = Field(
        default=1800,
        ge=1,
        le=31_536_000,
        description="Running with no step advance for this long is a stall: the gang restarts (counted).",
    )
    ttl_seconds_after_finished: Annotated[int, Field(ge=0, le=31_536_000 * 10), _INTEGRAL_FLOAT] | None = (
        Field(default=None, description="Delete the finished job after this long.")
    )


# spec.model's transition rule: which model is trained never changes; the access token may (a rotated
# or a forgotten Secret must not force recreating the job and losing its checkpoints).
MODEL_IDENTITY_UNCHANGED = (
    "self.name == oldSelf.name && self.revision == oldSelf.revision && self.dtype == oldSelf.dtype"
)


class GRPOJobSpec(ApiModel):
    """Desired state of a GRPOJob."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            "(self.grpo.promptsPerStep * self.grpo.groupSize) % "
            "(self.trainer.nodes * self.trainer.gpusPerNode * self.trainer.perDeviceBatchSize) == 0",
            "spec.grpo.promptsPerStep * spec.grpo.groupSize (B*G completions per step) must be divisible "
            "by spec.trainer.nodes * spec.trainer.gpusPerNode * spec.trainer.perDeviceBatchSize "
            "(the data-parallel batch): change B or G, or the trainer's GPUs or perDeviceBatchSize",
            ".grpo.promptsPerStep",
        ),
        CelRule(
            "self.grpo.validation.everySteps == 0 || !has(self.dataset) || has(self.dataset.validation)",
            "spec.grpo.validation.everySteps > 0 needs spec.dataset.validation: set a validation dataset URI "
            "or set everySteps to 0",
            ".grpo.validation.everySteps",
        ),
        CelRule(
            f"!self.model.name.startsWith('{VOLUME_MOUNT_PATH}/') || "
            "self.checkpoints.volume.accessMode == 'ReadWriteMany'",
            f"spec.model.name is a path on the job's volume ({VOLUME_MOUNT_PATH}/...), which the vLLM pod can "
            "mount only when it is ReadWriteMany (vLLM usually runs on another node than the trainers): set "
            "spec.checkpoints.volume.accessMode: ReadWriteMany (with an existingClaim, only if the claim is "
            "ReadWriteMany), or load the model from the Hub or from a path inside both images",
            ".model.name",
        ),
        CelRule(
            "self.trainer.nodes == 1 || has(self.checkpoints.volume.existingClaim) || "
            "self.checkpoints.volume.accessMode == 'ReadWriteMany'",
            "spec.checkpoints.volume.accessMode must be ReadWriteMany when spec.trainer.nodes > 1 "
            "(trainer pods on several nodes share the volume): set accessMode: ReadWriteMany "
            "or use an existingClaim",
            ".checkpoints.volume.accessMode",
        ),
        *CLIENT_MODE_RULES,
    )

    model: ModelSpec = Field(
        description="The model to fine-tune. Immutable, except tokenSecretRef.",
        json_schema_extra={
            "x-kubernetes-validations": [
                CelRule(
                    MODEL_IDENTITY_UNCHANGED,
                    "spec.model is immutable: delete the job and create a new one to train another model",
                ).to_schema()
            ]
        },
    )
    dataset: DatasetSpec | None = Field(
        default=None,
        description="Training (and optional validation) prompts; required unless rollouts.source is Client.",
    )
    grpo: GRPOSpec = Field(
        description="GRPO hyper-parameters; groupSize, promptsPerStep and lora are immutable."
    )
    metric: MetricSpec | None = Field(
        default=None, description="The reward (metric) service; required unless rollouts.source is Client."
    )
    rollouts: RolloutsSpec | None = Field(
        default=None, description="Where scored rollouts come from; unset means the metric service."
    )
    generation: GenerationSpec = Field(
        default_factory=GenerationSpec, description="The vLLM generation server."
    )
    trainer: TrainerSpec = Field(
        default_factory=TrainerSpec, description="The trainer pods; topology is immutable."
    )
    checkpoints: CheckpointsSpec = Field(default_factory=CheckpointsSpec, description="Checkpointing.")
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec, description="Placement and queueing.")
    run_policy: RunPolicySpec = Field(default_factory=RunPolicySpec, description="Restarts and deadlines.")
    image_pull_secrets: list[ImagePullSecret] = Field(
        default_factory=list,
        max_length=16,
        description=(
            "Secrets to pull the trainer, vLLM and metric images with (added to the operator's "
            "jobDefaults.imagePullSecrets). Needed for a private registry: trainer pods run under the job's "
            "own ServiceAccount, so the pull secrets of the namespace's default ServiceAccount do not reach them."
        ),
    )
    inputs: list[InputSpec] = Field(
        default_factory=list,
        max_length=8,
        json_schema_extra={
            "x-kubernetes-validations": [
                CelRule(
                    "self.all(x, self.exists_one(y, y.name == x.name))",
                    "spec.inputs[].name must be unique: each input is mounted at /inputs/<name>",
                ).to_schema()
            ]
        },
        description=(
            "Your own data and model files, mounted read-only at /inputs/<name> in the trainer and vLLM pods "
            "before they start: a ConfigMap (small datasets) or an existing PersistentVolumeClaim (large "
            "datasets, a local model). Point spec.dataset at file:///inputs/<name>/<file> and spec.model.name "
            "at /inputs/<name>[/<dir>]."
        ),
    )

    @field_validator("inputs")
    @classmethod
    def _unique_inputs(cls, value: list[InputSpec]) -> list[InputSpec]:
        names = [i.name for i in value]
        if len(names) != len(set(names)):
            raise ValueError("spec.inputs[].name must be unique: each input is mounted at /inputs/<name>")
        return value

    suspend: bool = Field(
        default=False,
        description="true stops all pods (keeping the volume and status); false resumes from the last "
        "checkpoint.",
    )

    @model_validator(mode="after")
    def _cross_object(self) -> GRPOJobSpec:
        if (self.grpo.prompts_per_step * self.grpo.group_size) % self.trainer_data_parallel_batch() != 0:
            raise self.cel_rules[0].violation()
        violation = client_mode_violation(self)
        if violation is not None:
            raise violation
        if self.grpo.validation.every_steps > 0 and self.dataset and self.dataset.validation is None:
            raise self.cel_rules[1].violation()
        if self.model_on_volume() and self.checkpoints.volume.access_mode != "ReadWriteMany":
            raise self.cel_rules[2].violation()
        if (
            self.trainer.nodes > 1
            and self.checkpoints.volume.existing_claim is None
            and self.checkpoints.volume.access_mode != "ReadWriteMany"
        ):
            raise self.cel_rules[3].violation()
        return self

    def model_on_volume(self) -> bool:
        """model.name is a directory on the job's volume (mounted at VOLUME_MOUNT_PATH in the pods)."""
        return self.model.name.startswith(f"{VOLUME_MOUNT_PATH}/")

    def trainer_world_size(self) -> int:
        """Training processes across the gang (one per trainer GPU)."""
        return self.trainer.nodes * self.trainer.gpus_per_node

    def trainer_data_parallel_batch(self) -> int:
        """Completions processed per micro-step across the gang; B*G is a multiple of it."""
        return self.trainer_world_size() * self.trainer.per_device_batch_size

    def gradient_accumulation_steps(self) -> int:
        """Micro-steps per optimisation step: B*G / (world size * perDeviceBatchSize)."""
        return (self.grpo.prompts_per_step * self.grpo.group_size) // self.trainer_data_parallel_batch()


# Transition rules (self == oldSelf) for the immutable parts of the spec, keyed by the object they sit
# on. The generator attaches them; check_immutable below is their pydantic twin.
IMMUTABLE_FIELDS: dict[str, tuple[str, ...]] = {
    # lora: full-weight and adapter checkpoints (or adapters of another rank or modules) cannot be resumed
    # from each other.
    "grpo": ("groupSize", "promptsPerStep", "lora"),
    "trainer": ("nodes", "gpusPerNode", "perDeviceBatchSize"),
}


def immutability_rules() -> dict[str, list[CelRule]]:
    """CEL transition rules per object under spec (spec.model's whole-object rule sits on the field)."""
    return {
        obj: [
            CelRule(
                f"self.{name} == oldSelf.{name}",
                f"spec.{obj}.{name} is immutable while the job exists: delete the job and create a new one "
                "to change it",
                f".{name}",
            )
            for name in names
        ]
        for obj, names in IMMUTABLE_FIELDS.items()
    }


def check_immutable(old: GRPOJobSpec, new: GRPOJobSpec) -> list[str]:
    """Messages for every immutable field ``new`` changes relative to ``old`` (empty: update is fine)."""
    errors: list[str] = []
    if old.model.model_copy(update={"token_secret_ref": None}) != new.model.model_copy(
        update={"token_secret_ref": None}
    ):
        errors.append("spec.model is immutable: delete the job and create a new one to train another model")
    if rollouts_source(old) != rollouts_source(new):
        errors.append(ROLLOUTS_SOURCE_IMMUTABLE.message)
    old_d, new_d = old.to_dict(), new.to_dict()
    for obj, rules in immutability_rules().items():
        for name, rule in zip(IMMUTABLE_FIELDS[obj], rules, strict=True):
            if old_d[obj][name] != new_d[obj][name]:
                errors.append(rule.message)
    return errors
