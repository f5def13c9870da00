"""``GRPOJob.spec``: the single source of truth for the CRD schema and docs/api.md.

``GRPOJobSpec`` lists the spec's parts; each part's model lives in the module named for it
(``model_spec``, ``dataset_spec``, ``grpo_spec``, ``workloads``, ``storage``, ``scheduling``, with
``pod_fields`` and ``field_types`` shared by them). This module keeps what involves several parts: the
rules across them, and which fields may never change. It re-exports the parts' public names, so
``from grpo_operator.api.spec import X`` works for all of them.

Every constraint is stated twice on purpose, in the two languages that enforce it: pydantic
(``Field`` bounds and validators, used by the operator, the trainer and the unit tests) and the
API server (OpenAPI bounds generated from the same ``Field`` bounds, plus each model's CEL rules,
its ``Rules``). A validator raises the rule it mirrors by name; tests/unit/test_api_rules.py breaks
every rule on both sides, and ``tests/integration/test_crd_property.py`` compares the two verdicts
on random specs against a real API server.
"""

from __future__ import annotations

import json

from pydantic import Field, field_validator, model_validator

from grpo_operator.api import environment as env_rules
from grpo_operator.api.base import ApiModel, CelRule, CelRules
from grpo_operator.api.budget import BudgetSpec
from grpo_operator.api.compat import wire_name
from grpo_operator.api.dataset_spec import DatasetSpec
from grpo_operator.api.environment import EnvironmentSpec, check_environment_rules
from grpo_operator.api.field_types import (
    CONFIG_KEY_PATTERN,
    DNS1123_LABEL_PATTERN,
    DNS1123_SUBDOMAIN_PATTERN,
    ENV_NAME_PATTERN,
    NO_SPACE_PATTERN,
    QUANTITY_PATTERN,
    K8sInt,
    Quantity,
)
from grpo_operator.api.grpo_presets import cel_effective
from grpo_operator.api.grpo_spec import DEFAULT_LOSS_TYPE, GRPOSpec, LoraSpec, ValidationSpec
from grpo_operator.api.model_spec import ModelSpec, SecretKeySelector
from grpo_operator.api.pod_fields import (
    Affinity,
    EnvList,
    EnvVar,
    EnvVarSource,
    ImagePullSecret,
    KeyRef,
    ResourceRequirements,
    Toleration,
)
from grpo_operator.api.rollouts import CLIENT_MODE, ROLLOUTS_SOURCE_IMMUTABLE, RolloutsSpec, rollouts_source
from grpo_operator.api.scheduling import NodeLabels, RunPolicySpec, SchedulingSpec
from grpo_operator.api.storage import (
    INPUTS_MOUNT_PATH,
    VOLUME_MOUNT_PATH,
    CheckpointsSpec,
    InputSpec,
    VolumeSpec,
)
from grpo_operator.api.tracking import TrackingSpec
from grpo_operator.api.workloads import (
    COLOCATED,
    DEFAULT_TRAINER_IMAGE,
    DEFAULT_VLLM_IMAGE,
    GENERATION_MODE_IMMUTABLE,
    MAX_GPUS_PER_NODE,
    SHARDED,
    GenerationSpec,
    MetricSpec,
    TrainerSpec,
)

__all__ = [
    "CONFIG_KEY_PATTERN",
    "DEFAULT_TRAINER_IMAGE",
    "DEFAULT_VLLM_IMAGE",
    "DNS1123_LABEL_PATTERN",
    "DNS1123_SUBDOMAIN_PATTERN",
    "ENV_NAME_PATTERN",
    "IMMUTABLE_FIELDS",
    "INPUTS_MOUNT_PATH",
    "MAX_GPUS_PER_NODE",
    "MODEL_IDENTITY_UNCHANGED",
    "MODEL_IMMUTABLE",
    "NO_SPACE_PATTERN",
    "QUANTITY_PATTERN",
    "UNIQUE_INPUT_NAMES",
    "VOLUME_MOUNT_PATH",
    "Affinity",
    "CheckpointsSpec",
    "DatasetSpec",
    "EnvList",
    "EnvVar",
    "EnvVarSource",
    "GRPOJobSpec",
    "GRPOSpec",
    "GenerationSpec",
    "ImagePullSecret",
    "InputSpec",
    "K8sInt",
    "KeyRef",
    "LoraSpec",
    "MetricSpec",
    "ModelSpec",
    "NodeLabels",
    "Quantity",
    "ResourceRequirements",
    "RolloutsSpec",
    "RunPolicySpec",
    "SchedulingSpec",
    "SecretKeySelector",
    "Toleration",
    "TrainerSpec",
    "ValidationSpec",
    "VolumeSpec",
    "check_immutable",
    "immutability_rule",
    "immutability_rules",
]


# spec.grpo knobs about how the trainer samples and corrects for its sampler: refused when a client samples
# (its requests set the sampling; the correction keeps TRL's defaults).
TRAINER_SAMPLING_FIELDS = (
    "top_k",
    "min_p",
    "repetition_penalty",
    "vllm_importance_sampling_correction",
    "vllm_importance_sampling_mode",
    "vllm_importance_sampling_cap",
)
TRAINER_SAMPLING_KNOBS = tuple(wire_name(name) for name in TRAINER_SAMPLING_FIELDS)

# spec.model's transition rule: which model is trained never changes; the access token may (a rotated
# or a forgotten Secret must not force recreating the job and losing its checkpoints).
MODEL_IDENTITY_UNCHANGED = (
    "self.name == oldSelf.name && self.revision == oldSelf.revision && self.dtype == oldSelf.dtype"
)
MODEL_IMMUTABLE = CelRule(
    MODEL_IDENTITY_UNCHANGED,
    "spec.model is immutable: delete the job and create a new one to train another model",
)
# spec.inputs' rule sits on the list, since it compares the items; _unique_inputs is its pydantic twin.
UNIQUE_INPUT_NAMES = CelRule(
    "self.all(x, self.exists_one(y, y.name == x.name))",
    "spec.inputs[].name must be unique: each input is mounted at /inputs/<name>",
)


_COMPLETIONS = "(self.grpo.promptsPerStep * self.grpo.groupSize)"
_DP_BATCH = "(self.trainer.nodes * self.trainer.gpusPerNode * self.trainer.perDeviceBatchSize)"
_BATCH_MESSAGE = (
    "spec.grpo.promptsPerStep * spec.grpo.groupSize (B*G completions per step) must be divisible "
    "by spec.trainer.nodes * spec.trainer.gpusPerNode * spec.trainer.perDeviceBatchSize "
    "(the data-parallel batch): change B or G, or the trainer's GPUs or perDeviceBatchSize"
)


# The numbers batch_divides_evenly adds to its message: "{}" here, "%d" in the CEL format() string.
_BATCH_NUMBERS = ". Here B*G = {}*{} = {} and the data-parallel batch is {}*{}*{} = {}"


def batch_numbers(b: int, g: int, nodes: int, gpus: int, per_device: int) -> str:
    """What batch_divides_evenly's message expression appends, for these numbers."""
    return _BATCH_NUMBERS.format(b, g, b * g, nodes, gpus, per_device, nodes * gpus * per_device)


class GRPOJobSpec(ApiModel):
    """Desired state of a GRPOJob."""

    class Rules(CelRules):
        batch_divides_evenly = CelRule(
            f"{_COMPLETIONS} % {_DP_BATCH} == 0",
            _BATCH_MESSAGE,
            ".grpo.promptsPerStep",
            # format(), not string(): the API server's cost estimate of string(int) is unbounded, and the CRD
            # is refused with it.
            message_expression=json.dumps(_BATCH_MESSAGE + _BATCH_NUMBERS.replace("{}", "%d"))
            + ".format([self.grpo.promptsPerStep, self.grpo.groupSize, "
            f"{_COMPLETIONS}, self.trainer.nodes, self.trainer.gpusPerNode, self.trainer.perDeviceBatchSize, "
            f"{_DP_BATCH}])",
        )

        validation_needs_dataset = CelRule(
            "self.grpo.validation.everySteps == 0 || !has(self.dataset) || has(self.dataset.validation)",
            "spec.grpo.validation.everySteps > 0 needs spec.dataset.validation: set a validation dataset URI "
            "or set everySteps to 0",
            ".grpo.validation.everySteps",
        )

        model_on_volume_needs_rwx = CelRule(
            f"!self.model.name.startsWith('{VOLUME_MOUNT_PATH}/') || "
            f"self.checkpoints.volume.accessMode == 'ReadWriteMany' || ({COLOCATED})",
            f"spec.model.name is a path on the job's volume ({VOLUME_MOUNT_PATH}/...), which the vLLM pod can "
            "mount only when it is ReadWriteMany (vLLM usually runs on another node than the trainers): set "
            "spec.checkpoints.volume.accessMode: ReadWriteMany (with an existingClaim, only if the claim is "
            "ReadWriteMany), or load the model from the Hub or from a path inside both images",
            ".model.name",
        )

        volume_weight_sync_needs_rwx = CelRule(
            "!has(self.generation.weightSync) || self.generation.weightSync != 'Volume' || "
            "self.checkpoints.volume.accessMode == 'ReadWriteMany'",
            "spec.generation.weightSync: Volume hands the weights to vLLM through the job's volume, which the "
            "vLLM pod can mount only when it is ReadWriteMany (vLLM usually runs on another node than the "
            "trainers): set spec.checkpoints.volume.accessMode: ReadWriteMany (with an existingClaim, only if "
            "the claim is ReadWriteMany), or use weightSync: Broadcast, which needs no shared volume",
            ".generation.weightSync",
        )

        multi_node_needs_rwx = CelRule(
            "self.trainer.nodes == 1 || has(self.checkpoints.volume.existingClaim) || "
            "self.checkpoints.volume.accessMode == 'ReadWriteMany'",
            "spec.checkpoints.volume.accessMode must be ReadWriteMany when spec.trainer.nodes > 1 "
            "(trainer pods on several nodes share the volume): set accessMode: ReadWriteMany "
            "or use an existingClaim",
            ".checkpoints.volume.accessMode",
        )

        # A reward source: the metric service, the environment (it rewards its episodes) or a client.
        # Client-rollout jobs (spec.rollouts.source: Client) have no metric service and no dataset.
        metric_required = CelRule(
            f"has(self.metric) || has(self.environment) || ({CLIENT_MODE})",
            "spec.metric is required: the metric service scores the completions the trainer samples. Set "
            "spec.metric.image, or spec.environment.image to run multi-turn episodes that the environment "
            "rewards, or set spec.rollouts.source: Client to have a client (e.g. DSPy) send scored rollouts "
            "instead",
            ".metric",
        )

        dataset_required = CelRule(
            f"has(self.dataset) || ({CLIENT_MODE})",
            "spec.dataset is required: it holds the prompts the trainer samples completions for (or resets "
            "spec.environment's episodes with). Set spec.dataset.train, or set spec.rollouts.source: Client to "
            "have a client (e.g. DSPy) send its prompts with its scored rollouts",
            ".dataset",
        )

        no_metric_with_client = CelRule(
            f"!({CLIENT_MODE}) || !has(self.metric)",
            "spec.metric must not be set when spec.rollouts.source is Client: the client scores its own "
            "rollouts, so the metric service would never be called. Remove spec.metric",
            ".metric",
        )

        no_dataset_with_client = CelRule(
            f"!({CLIENT_MODE}) || !has(self.dataset)",
            "spec.dataset must not be set when spec.rollouts.source is Client: the client sends its prompts "
            "with its scored rollouts, so the dataset would never be read. Remove spec.dataset",
            ".dataset",
        )

        no_dynamic_sampling_with_client = CelRule(
            # dynamicSampling has no default in the CRD (spec.grpo.preset fills it): absent means false here,
            # since a preset's dynamic sampling is left out for client rollouts.
            f"!({CLIENT_MODE}) || !has(self.grpo.dynamicSampling) || !self.grpo.dynamicSampling",
            "spec.grpo.dynamicSampling is not supported when spec.rollouts.source is Client: the client "
            "generates the groups, so the trainer cannot drop tied groups and sample new prompts to refill "
            "the step. Set dynamicSampling to false",
            ".grpo.dynamicSampling",
        )

        no_validation_with_client = CelRule(
            f"!({CLIENT_MODE}) || self.grpo.validation.everySteps == 0",
            "spec.grpo.validation.everySteps must be 0 when spec.rollouts.source is Client: there is no "
            "dataset or metric service to validate with (DSPy validates on the client: GRPO's valset). Set "
            "everySteps to 0",
            ".grpo.validation.everySteps",
        )

        no_iterations_with_client = CelRule(
            f"!({CLIENT_MODE}) || !has(self.grpo.numIterations) || self.grpo.numIterations == 1",
            "spec.grpo.numIterations > 1 is not supported when spec.rollouts.source is Client: the client sends "
            "a batch of groups for every step and waits for that step, so the trainer cannot train several "
            "steps on one batch. Remove numIterations",
            ".grpo.numIterations",
        )

        no_async_with_client = CelRule(
            f"!({CLIENT_MODE}) || !has(self.grpo.maxStaleness) || self.grpo.maxStaleness == 0",
            "spec.grpo.maxStaleness > 0 is not supported when spec.rollouts.source is Client: the client samples "
            "the groups itself, through the policy server, and waits for each step's weights before it samples "
            "again, so there is nothing for the trainer to overlap. Remove maxStaleness",
            ".grpo.maxStaleness",
        )

        no_sampling_knobs_with_client = CelRule(
            f"!({CLIENT_MODE}) || !({' || '.join(f'has(self.grpo.{k})' for k in TRAINER_SAMPLING_KNOBS)})",
            "spec.grpo.topK, minP and repetitionPenalty shape how the trainer samples, and it does not when "
            "spec.rollouts.source is Client: the client samples, its requests to the policy server set how; the "
            "vllmImportanceSampling* knobs stay at TRL's defaults for client rollouts (on, sequence_mask, cap "
            "3). Remove them",
            ".grpo",
        )

        vespo_needs_token_correction = CelRule(
            f"({CLIENT_MODE}) || {cel_effective('loss_type', repr(DEFAULT_LOSS_TYPE), 'self.grpo')} != 'vespo' || "
            "(has(self.grpo.vllmImportanceSamplingCorrection) && !self.grpo.vllmImportanceSamplingCorrection) || "
            "(has(self.grpo.vllmImportanceSamplingMode) && "
            "self.grpo.vllmImportanceSamplingMode in ['token_truncate', 'token_mask'])",
            "spec.grpo.lossType vespo weighs whole sequences itself and takes the vLLM importance-sampling "
            "correction only per token (TRL refuses to start otherwise): set spec.grpo.vllmImportanceSamplingMode "
            "to token_truncate or token_mask, or vllmImportanceSamplingCorrection to false",
            ".grpo.vllmImportanceSamplingMode",
        )

        colocate_not_with_client = CelRule(
            f"!({CLIENT_MODE}) || !({COLOCATED})",
            "spec.generation.mode: Colocate is not supported when spec.rollouts.source is Client: the client's "
            "completions are served by the job's vLLM server through the rollout gateway. Remove "
            "spec.generation.mode, or use source: Metric",
            ".generation.mode",
        )

        colocate_context_fits = CelRule(
            f"!({COLOCATED}) || !has(self.generation.maxModelLen) || "
            "self.generation.maxModelLen >= self.grpo.maxPromptLength + self.grpo.maxCompletionLength",
            "spec.generation.maxModelLen is shorter than spec.grpo.maxPromptLength + maxCompletionLength: the "
            "colocated vLLM engine could not hold a whole prompt and its answer. Raise maxModelLen to at "
            "least their sum, or leave it unset (the model's own context length)",
            ".generation.maxModelLen",
        )

        colocate_not_asynchronous = CelRule(
            f"!({COLOCATED}) || !has(self.grpo.maxStaleness) || self.grpo.maxStaleness == 0",
            "spec.grpo.maxStaleness > 0 overlaps sampling on the vLLM servers with training on the trainer "
            "GPUs, and spec.generation.mode: Colocate samples on the trainer GPUs themselves, between steps. "
            "Remove maxStaleness, or use mode: Server",
            ".grpo.maxStaleness",
        )

        fsdp_not_with_lora = CelRule(
            f"!({SHARDED}) || !has(self.grpo.lora) || !has(self.grpo.lora.enabled) || !self.grpo.lora.enabled",
            "spec.trainer.sharding: FSDP is not supported with spec.grpo.lora.enabled: the adapters would be merged "
            "into sharded weights for every weight sync, which the trainer does not do. LoRA's frozen base and "
            "small adapters fit where full fine-tuning does not: use sharding: DDP with LoRA, or full "
            "fine-tuning with FSDP",
            ".trainer.sharding",
        )

        fsdp_not_colocated = CelRule(
            f"!({SHARDED}) || !({COLOCATED})",
            "spec.trainer.sharding: FSDP is not supported with spec.generation.mode: Colocate: a colocated engine "
            "takes a whole copy of the weights on every trainer GPU, which is what sharding avoids. Use "
            "generation.mode: Server with FSDP",
            ".trainer.sharding",
        )

        fsdp_not_asynchronous = CelRule(
            f"!({SHARDED}) || !has(self.grpo.maxStaleness) || self.grpo.maxStaleness == 0",
            "spec.trainer.sharding: FSDP is not supported with spec.grpo.maxStaleness > 0 yet: asynchronous "
            "rollouts push weights from rank 0 alone, and sharded weights are gathered by every rank together. "
            "Remove maxStaleness, or use sharding: DDP",
            ".trainer.sharding",
        )

        fsdp_not_with_client = CelRule(
            f"!({SHARDED}) || !({CLIENT_MODE})",
            "spec.trainer.sharding: FSDP is not supported when spec.rollouts.source is Client: the policy server "
            "answers from rank 0's model alone, which holds only a shard under FSDP. Use sharding: DDP",
            ".trainer.sharding",
        )

        # spec.environment's (api/environment.py, with their pydantic twin check_environment_rules).
        environment_not_with_client = env_rules.ENVIRONMENT_NOT_WITH_CLIENT
        environment_not_colocated = env_rules.ENVIRONMENT_NOT_COLOCATED

    model: ModelSpec = Field(
        description="The model to fine-tune. Immutable, except tokenSecretRef.",
        json_schema_extra={"x-kubernetes-validations": [MODEL_IMMUTABLE.to_schema()]},
    )
    dataset: DatasetSpec | None = Field(
        default=None,
        description="Training (and optional validation) prompts; required unless rollouts.source is Client.",
    )
    grpo: GRPOSpec = Field(
        description="GRPO hyper-parameters; groupSize, promptsPerStep and lora are immutable."
    )
    metric: MetricSpec | None = Field(
        default=None,
        description="The reward (metric) service; required unless spec.environment is set or rollouts.source is "
        "Client.",
    )
    environment: EnvironmentSpec | None = Field(
        default=None,
        description="A multi-turn environment (an image speaking OpenEnv's protocol): each prompt's episodes "
        "alternate the model's turns with the environment's steps, and the environment rewards them. A job "
        "has spec.metric or spec.environment.",
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
    tracking: TrackingSpec | None = Field(
        default=None, description="Experiment trackers the trainer reports to (TensorBoard)."
    )
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
        json_schema_extra={"x-kubernetes-validations": [UNIQUE_INPUT_NAMES.to_schema()]},
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
            raise ValueError(UNIQUE_INPUT_NAMES.message)
        return value

    suspend: bool = Field(
        default=False,
        description="true stops all pods (keeping the volume and status); false resumes from the last "
        "checkpoint.",
    )
    budget: BudgetSpec | None = Field(
        default=None,
        description="What the job may spend before the operator suspends it (docs/platform.md, Budgets).",
    )

    @model_validator(mode="after")
    def _cross_object(self) -> GRPOJobSpec:
        if (self.grpo.prompts_per_step * self.grpo.group_size) % self.trainer_data_parallel_batch() != 0:
            raise self.Rules.batch_divides_evenly.violation(
                batch_numbers(
                    self.grpo.prompts_per_step,
                    self.grpo.group_size,
                    self.trainer.nodes,
                    self.trainer.gpus_per_node,
                    self.trainer.per_device_batch_size,
                )
            )
        self._client_mode_rules()
        check_environment_rules(self)
        if self.grpo.validation.every_steps > 0 and self.dataset and self.dataset.validation is None:
            raise self.Rules.validation_needs_dataset.violation()
        if (
            self.model_on_volume()
            and self.checkpoints.volume.access_mode != "ReadWriteMany"
            and not self.generation.colocated()
        ):
            raise self.Rules.model_on_volume_needs_rwx.violation()
        if self.generation.weight_sync == "Volume" and self.checkpoints.volume.access_mode != "ReadWriteMany":
            raise self.Rules.volume_weight_sync_needs_rwx.violation()
        if (
            self.trainer.nodes > 1
            and self.checkpoints.volume.existing_claim is None
            and self.checkpoints.volume.access_mode != "ReadWriteMany"
        ):
            raise self.Rules.multi_node_needs_rwx.violation()
        if self.generation.colocated() and rollouts_source(self) == "Client":
            raise self.Rules.colocate_not_with_client.violation()
        if (
            self.generation.colocated()
            and self.generation.max_model_len is not None
            and self.generation.max_model_len < self.grpo.max_prompt_length + self.grpo.max_completion_length
        ):
            raise self.Rules.colocate_context_fits.violation()
        if self.generation.colocated() and self.grpo.max_staleness:
            raise self.Rules.colocate_not_asynchronous.violation()
        self._sharding_rules()
        return self

    def _sharding_rules(self) -> None:
        """The pydantic twin of the FSDP rules, in the order the CRD lists them."""
        if self.trainer.sharding != "FSDP":
            return
        if self.grpo.lora.enabled:
            raise self.Rules.fsdp_not_with_lora.violation()
        if self.generation.colocated():
            raise self.Rules.fsdp_not_colocated.violation()
        if self.grpo.max_staleness:
            raise self.Rules.fsdp_not_asynchronous.violation()
        if rollouts_source(self) == "Client":
            raise self.Rules.fsdp_not_with_client.violation()

    def _client_mode_rules(self) -> None:
        """The pydantic twin of the client-mode rules, in the order the CRD lists them."""
        client = rollouts_source(self) == "Client"
        rules = self.Rules
        if self.metric is None and self.environment is None and not client:
            raise rules.metric_required.violation()
        if self.dataset is None and not client:
            raise rules.dataset_required.violation()
        if client and self.metric is not None:
            raise rules.no_metric_with_client.violation()
        if client and self.dataset is not None:
            raise rules.no_dataset_with_client.violation()
        if client and self.grpo.dynamic_sampling:
            raise rules.no_dynamic_sampling_with_client.violation()
        if client and self.grpo.validation.every_steps > 0:
            raise rules.no_validation_with_client.violation()
        if client and (self.grpo.num_iterations or 1) > 1:
            raise rules.no_iterations_with_client.violation()
        if client and self.grpo.max_staleness:
            raise rules.no_async_with_client.violation()
        if client and any(self.grpo.is_set(name) for name in TRAINER_SAMPLING_FIELDS):
            raise rules.no_sampling_knobs_with_client.violation()
        if (
            not client
            and self.grpo.effective("loss_type") == "vespo"
            and self.grpo.vllm_importance_sampling_correction is not False
            and self.grpo.vllm_importance_sampling_mode not in ("token_truncate", "token_mask")
        ):
            raise rules.vespo_needs_token_correction.violation()

    def resolved_grpo(self) -> GRPOSpec:
        """spec.grpo with its preset resolved, as training uses it (see GRPOSpec.resolved)."""
        return self.grpo.resolved(sampled_by_client=rollouts_source(self) == "Client")

    def preset_summary(self) -> str | None:
        """What spec.grpo.preset resolved to, one line; None without a preset."""
        return self.grpo.preset_summary(sampled_by_client=rollouts_source(self) == "Client")

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


def immutability_rule(obj: str, name: str) -> CelRule:
    """The CEL transition rule that keeps ``spec.<obj>.<name>`` as it was created."""
    return CelRule(
        f"self.{name} == oldSelf.{name}",
        f"spec.{obj}.{name} is immutable while the job exists: delete the job and create a new one to change it",
        f".{name}",
    )


def immutability_rules() -> dict[str, list[CelRule]]:
    """CEL transition rules per object under spec (spec.model's whole-object rule sits on the field)."""
    return {obj: [immutability_rule(obj, name) for name in names] for obj, names in IMMUTABLE_FIELDS.items()}


def check_immutable(old: GRPOJobSpec, new: GRPOJobSpec) -> list[str]:
    """Messages for every immutable field ``new`` changes relative to ``old`` (empty: update is fine)."""
    errors: list[str] = []
    if old.model.model_copy(update={"token_secret_ref": None}) != new.model.model_copy(
        update={"token_secret_ref": None}
    ):
        errors.append(MODEL_IMMUTABLE.message)
    if rollouts_source(old) != rollouts_source(new):
        errors.append(ROLLOUTS_SOURCE_IMMUTABLE.message)
    if old.generation.colocated() != new.generation.colocated():
        errors.append(GENERATION_MODE_IMMUTABLE.message)
    old_d, new_d = old.to_dict(), new.to_dict()
    for obj, names in IMMUTABLE_FIELDS.items():
        for name in names:
            if old_d[obj][name] != new_d[obj][name]:
                errors.append(immutability_rule(obj, name).message)
    return errors
