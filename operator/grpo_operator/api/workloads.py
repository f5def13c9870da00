"""The three workloads a job runs: the user's metric service (``spec.metric``), the vLLM generation
server (``spec.generation``) and the trainer gang (``spec.trainer``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from grpo_operator.api.base import NO_SERVER_DEFAULT, ApiModel, CelRule, CelRules
from grpo_operator.api.builtin_rewards import (
    COMPONENT_NAME_PATTERN,
    COMPONENT_NAME_RE,
    DEFAULT_NAMES,
    MAX_BUILTIN_REWARDS,
    MAX_REWARD_COMPONENTS,
    STOCK_METRIC_IMAGE,
    BuiltinReward,
    MetricFunction,
)
from grpo_operator.api.field_types import INTEGRAL_FLOAT, NO_SPACE_PATTERN, K8sInt
from grpo_operator.api.pod_fields import ENV_LIST_SCHEMA, EnvList, ResourceRequirements

# GPUs one Kubernetes node offers at most (an 8-GPU HGX/DGX box); per-pod GPU counts above it could
# never be scheduled.
MAX_GPUS_PER_NODE = 8

# Resource names the API treats as GPUs wherever it sees them: the NVIDIA device plugin's (whole GPUs,
# renamed shared ones such as nvidia.com/gpu.shared, and MIG slices) and any vendor's "<vendor>/gpu".
# The platform's own list (OperatorSettings.gpu_resource_names) decides what counts toward
# maxGpusPerJob; this one keeps GPUs out of resources where a role has a GPU field.
GPU_NAME_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")
GPU_NAME_SUFFIX = "/gpu"
_GPU_NAME_CEL = " || ".join(
    [*(f"k.startsWith('{p}')" for p in GPU_NAME_PREFIXES), f"k.endsWith('{GPU_NAME_SUFFIX}')"]
)


def is_gpu_resource_name(name: str) -> bool:
    """Whether the API refuses ``name`` in the resources of a role that has a GPU field."""
    return name.startswith(GPU_NAME_PREFIXES) or name.endswith(GPU_NAME_SUFFIX)


def _no_gpus_in_resources(role: str, gpu_field: str, pods: str) -> CelRule:
    return CelRule(
        "!has(self.resources) || ("
        f"(!has(self.resources.requests) || !self.resources.requests.exists(k, {_GPU_NAME_CEL})) && "
        f"(!has(self.resources.limits) || !self.resources.limits.exists(k, {_GPU_NAME_CEL})))",
        f"spec.{role}.resources must not request GPUs (nvidia.com/gpu*, nvidia.com/mig-*, */gpu): the GPUs "
        f"of {pods} come from spec.{role}.{gpu_field} alone. Remove them from resources and set "
        f"spec.{role}.{gpu_field} instead",
        ".resources",
    )


def _gpus_in(resources: ResourceRequirements) -> bool:
    return any(is_gpu_resource_name(name) for name in (*resources.requests, *resources.limits))


# vLLM servers one job may run (spec.generation.replicas).
MAX_GENERATION_REPLICAS = 16

# The images this release ships as the platform's defaults: the operator settings trainer_image and
# vllm_image (Helm jobDefaults.images) start from them. They are no CRD defaults: a default of the CRD is
# written into every job the API server stores, so a platform behind a registry mirror could never change
# it, and every tenant would have to name both images in every job.
# The project's vLLM image (trainer_image/Dockerfile.vllm): vLLM's own v0.31.0 image plus the plugin whose
# weight-transfer engine weightSync: Broadcast needs.
DEFAULT_VLLM_IMAGE = "ghcr.io/grpo-operator/vllm:0.1.0"
DEFAULT_TRAINER_IMAGE = "ghcr.io/grpo-operator/trainer:0.1.0"


# A built-in reward's component name in CEL: its name, else its type's default (builtin_rewards.DEFAULT_NAMES).
_REWARD_NAME_CEL = (
    "(has(@.name) ? @.name : "
    + "".join(f"@.type == '{kind}' ? '{name}' : " for kind, name in list(DEFAULT_NAMES.items())[:-1])
    + f"'{list(DEFAULT_NAMES.values())[-1]}')"
)


def _reward_name(var: str) -> str:
    return _REWARD_NAME_CEL.replace("@", var)


class MetricSpec(ApiModel):
    """The reward service: an HTTP server (GET /healthz, POST /score) from the user's image, or the stock
    metric image computing built-in rewards or the user's function (api/builtin_rewards.py)."""

    class Rules(CelRules):
        reward_weight_names = CelRule(
            f"!has(self.rewardWeights) || self.rewardWeights.all(k, k.matches(r'{COMPONENT_NAME_PATTERN}'))",
            "spec.metric.rewardWeights keys must be names of the components the metric returns: lowercase "
            "letters, digits and '_', starting with a letter, at most 32 characters (e.g. accuracy, format)",
            ".rewardWeights",
        )
        rewards_or_function = CelRule(
            "!has(self.rewards) || !has(self.function)",
            "spec.metric.rewards and spec.metric.function are two ways of scoring: set one (put a built-in "
            "reward's logic into the function, or the function's into rewards)",
            ".function",
        )
        reward_names_unique = CelRule(
            f"!has(self.rewards) || self.rewards.all(a, self.rewards.exists_one(b, {_reward_name('b')} == "
            f"{_reward_name('a')}))",
            "spec.metric.rewards[] must have distinct component names: give rewards of the same type a name "
            "each",
            ".rewards",
        )
        weights_name_rewards = CelRule(
            "!has(self.rewards) || !has(self.rewardWeights) || "
            f"self.rewardWeights.all(k, self.rewards.exists(r, {_reward_name('r')} == k))",
            "spec.metric.rewardWeights names a component that no reward in spec.metric.rewards computes "
            "(every item would be a metric error): weigh the rewards' names (their name, else exact_match, "
            "math_answer, format or length by type)",
            ".rewardWeights",
        )

    image: str = Field(
        min_length=1,
        max_length=512,
        pattern=NO_SPACE_PATTERN,
        description="Metric service container image. With rewards or function: the stock metric image, "
        f"{STOCK_METRIC_IMAGE} (or your registry's copy of it).",
    )
    rewards: Annotated[list[BuiltinReward], Field(min_length=1, max_length=MAX_BUILTIN_REWARDS)] | None = (
        Field(
            default=None,
            description="Rewards the stock metric image computes, each a component of the reward (summed, or "
            "weighted by rewardWeights): exactMatch against a dataset column, mathAnswer (math-verify), regex "
            "(a format), length (a penalty). Needs image to be the stock metric image.",
        )
    )
    function: MetricFunction | None = Field(
        default=None,
        description="Your reward function's Python source in a ConfigMap, run by the stock metric image in "
        "the metric pod (no image to build). Needs image to be the stock metric image.",
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
    reward_weights: (
        Annotated[
            dict[str, Annotated[float, Field(ge=-1e6, le=1e6)]],
            Field(min_length=1, max_length=MAX_REWARD_COMPONENTS),
        ]
        | None
    ) = Field(
        default=None,
        description="Weights of the reward's named components (a metric answer's \"components\", e.g. "
        "{accuracy: 1.0, format: 0.2}): the reward the advantages use is the weighted sum of these, and an "
        "answer that lacks a weighted component is a metric error for its item. Unset: the metric's "
        '"reward", or the plain sum of its components when it sends none. Components without a weight '
        "are reported but do not count. Each component's mean is in status.rewards.components, "
        "metrics.jsonl and Prometheus either way.",
    )
    env: EnvList = Field(
        default_factory=list, json_schema_extra=ENV_LIST_SCHEMA, description="Extra environment variables."
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description="Resources of each metric server pod. GPUs requested here count toward the platform's "
        "maxGpusPerJob, times replicas.",
    )

    @field_validator("reward_weights")
    @classmethod
    def _component_names(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        # The twin of Rules.reward_weight_names, reported at the field as the rule's fieldPath does.
        if value is not None and not all(COMPONENT_NAME_RE.match(name) for name in value):
            raise cls.Rules.reward_weight_names.violation()
        return value

    @model_validator(mode="after")
    def _scoring(self) -> MetricSpec:
        if self.rewards is not None and self.function is not None:
            raise self.Rules.rewards_or_function.violation()
        if self.rewards is not None:
            names = [r.component() for r in self.rewards]
            if len(set(names)) != len(names):
                raise self.Rules.reward_names_unique.violation()
            if self.reward_weights is not None and not set(self.reward_weights) <= set(names):
                raise self.Rules.weights_name_rewards.violation()
        return self


# Where generation runs decides the job's children (vLLM pods and Services or none) and the trainer's
# loop: a running job keeps it. On the spec, like the rollouts source, because spec.generation may be
# absent (mode Server).
_MODE_OF = "(has({0}.generation) && has({0}.generation.mode) ? {0}.generation.mode : 'Server')"
GENERATION_MODE_IMMUTABLE = CelRule(
    f"{_MODE_OF.format('self')} == {_MODE_OF.format('oldSelf')}",
    "spec.generation.mode is immutable while the job exists: delete the job and create a new one to "
    "move generation between vLLM pods of its own and the trainer processes",
    ".generation.mode",
)

COLOCATED = "has(self.generation) && has(self.generation.mode) && self.generation.mode == 'Colocate'"

# TRL 1.16's default share of each GPU's memory for a vLLM engine colocated with training.
DEFAULT_COLOCATE_MEMORY_SHARE = 0.3


class GenerationSpec(ApiModel):
    """How completions are sampled: by vLLM servers of their own (mode Server, the default; weights
    synced from trainer rank 0), one or ``replicas`` of them, or by a vLLM engine inside every trainer
    process, on the trainer's GPUs (mode Colocate)."""

    class Rules(CelRules):
        tp_equals_gpus = CelRule(
            "!has(self.tensorParallelSize) || self.tensorParallelSize == self.gpus",
            "spec.generation.tensorParallelSize must equal spec.generation.gpus: the vLLM server shards the "
            "model over all its GPUs, and data parallelism (gpus > tensorParallelSize) fails for dense models "
            "with TRL's server mode, so it is not supported yet. Leave tensorParallelSize out (it follows "
            "gpus) or set it to gpus",
            ".tensorParallelSize",
        )

        no_gpus_in_resources = _no_gpus_in_resources("generation", "gpus", "the vLLM pod")

        # Not in mode Colocate, where colocate_is_in_process refuses replicas with the one fix that applies.
        several_replicas_refuse_nccl = CelRule(
            "!has(self.replicas) || self.replicas == 1 || !has(self.weightSync) || self.weightSync != 'NCCL'"
            " || (has(self.mode) && self.mode == 'Colocate')",
            "spec.generation.replicas > 1 cannot use spec.generation.weightSync: NCCL: TRL's NCCL transport "
            "reaches one vLLM server only. Remove weightSync (several replicas then use Broadcast: one process "
            "group of trainer rank 0 and every replica's vLLM workers, fed once per tensor), set weightSync: "
            "Broadcast, or set weightSync: Volume (it needs spec.checkpoints.volume.accessMode: "
            "ReadWriteMany), or set replicas to 1",
            ".replicas",
        )

        colocate_is_in_process = CelRule(
            "!has(self.mode) || self.mode != 'Colocate' || ((!has(self.replicas) || self.replicas == 1) && "
            "!has(self.weightSync) && self.gpus == 1 && "
            "(!has(self.tensorParallelSize) || self.tensorParallelSize == 1))",
            "spec.generation.mode: Colocate runs one vLLM engine inside each trainer process, on that "
            "process's GPU, and hands it the weights in memory: replicas, weightSync, gpus and "
            "tensorParallelSize (other than 1) belong to vLLM servers of their own. Remove them (the "
            "trainer's GPUs are spec.trainer.gpusPerNode), or use mode: Server",
            ".mode",
        )

        memory_share_is_colocate = CelRule(
            "!has(self.colocateMemoryShare) || (has(self.mode) && self.mode == 'Colocate')",
            "spec.generation.colocateMemoryShare is the share of each trainer GPU's memory that a colocated "
            "vLLM engine takes, so it needs spec.generation.mode: Colocate; a vLLM server's share is "
            "spec.generation.gpuMemoryUtilization",
            ".colocateMemoryShare",
        )

    mode: Literal["Server", "Colocate"] | None = Field(
        default=None,
        description="Server (unset): vLLM runs in pods of its own (replicas of them, gpus GPUs each) and "
        "trainer rank 0 sends it the weights after every step. Colocate: every trainer process runs a vLLM "
        "engine on its own GPU, sharing it with training (colocateMemoryShare of its memory), and the "
        "weights reach it in memory; the job has no vLLM pod, Service or generation GPUs, and the trainer "
        "image must carry vLLM. Colocate pays off for small jobs on one or two GPUs; see docs/trainer.md.",
    )
    colocate_memory_share: Annotated[float, Field(gt=0.0, lt=1.0)] | None = Field(
        default=None,
        description="Mode Colocate: fraction of each trainer GPU's memory the colocated vLLM engine takes "
        "for its weights and KV cache (TRL's vllm_gpu_memory_utilization); the rest is training's. "
        f"Unset: {DEFAULT_COLOCATE_MEMORY_SHARE}.",
    )
    gpus: K8sInt = Field(
        default=1,
        ge=1,
        le=MAX_GPUS_PER_NODE,
        description="GPUs of each vLLM pod (one pod, one node); the job's generation GPUs are gpus x replicas.",
    )
    replicas: Annotated[int, Field(ge=1, le=MAX_GENERATION_REPLICAS), INTEGRAL_FLOAT] | None = Field(
        default=None,
        description="vLLM servers (unset: 1). Each is a pod of its own with gpus GPUs (= tensorParallelSize) "
        "and a Service of its own (<job>-gen for the first, <job>-gen-r<r> for replica r); the trainer "
        "spreads each step's rollouts over the replicas that are ready and pushes the weights to every "
        "replica after each step. More than 1 needs weightSync Broadcast (the default then) or Volume. Each "
        "replica fails, is replaced and counts its replacements on its own.",
    )
    # The default 1 is a placeholder: left out, it follows gpus (mode Server) and stays 1 (mode Colocate),
    # set by _tp_is_all_gpus. No CRD default, or the API server would write 1 next to gpus: 2.
    tensor_parallel_size: K8sInt = Field(
        default=1,
        ge=1,
        le=MAX_GPUS_PER_NODE,
        json_schema_extra=NO_SERVER_DEFAULT,
        description="vLLM tensor-parallel size; unset: gpus, and if set it must equal gpus. Several vLLM "
        "data-parallel replicas (gpus > tensorParallelSize) are refused: TRL documents them as failing "
        "for dense models.",
    )
    image: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        pattern=NO_SPACE_PATTERN,
        description="vLLM server image; its vLLM version must match the trainer image's. Unset: the "
        f"platform's default (the operator's jobDefaults.images.generation; {DEFAULT_VLLM_IMAGE} as shipped), "
        "read when the pods are created and not stored in the job.",
    )
    gpu_memory_utilization: float = Field(
        default=0.9, gt=0.0, le=1.0, description="Fraction of each GPU's memory vLLM may use."
    )
    max_model_len: Annotated[int, Field(ge=1, le=1_048_576), INTEGRAL_FLOAT] | None = Field(
        default=None,
        description="vLLM context length (prompt + completion must fit). Unset: the model's own, lowered by "
        "the vLLM pods to what fits their KV-cache memory (vLLM's auto-fit) instead of failing to start.",
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
        description="CPU/memory for the vLLM pod; GPUs come from gpus and are refused here.",
    )
    env: EnvList = Field(
        default_factory=list,
        json_schema_extra=ENV_LIST_SCHEMA,
        description="Extra environment variables of the vLLM server (VLLM_SERVER_DEV_MODE is the operator's).",
    )
    weight_sync: Literal["NCCL", "Volume", "Broadcast"] | None = Field(
        default=None,
        description="How trainer rank 0 sends the weights to vLLM after every optimizer step. Unset: NCCL "
        "with one replica, Broadcast with several. NCCL: TRL's broadcast over NCCL from trainer rank 0 to "
        "the workers of one vLLM server; needs GPUs on both sides and a pod-to-pod path on the weight-sync "
        "port; one replica only. Broadcast: one torch.distributed process group of trainer rank 0 and every "
        "worker of every replica (gloo without CUDA, NCCL with it), each tensor sent once to all of them; "
        "needs the project's vLLM image, which carries its grpo-broadcast weight-transfer engine (the "
        "platform guide, docs/platform.md, tells how to mirror it), and pod-to-pod paths between the job's "
        "trainer and vLLM pods, which the job's NetworkPolicies open. Volume: rank 0 writes the weights as safetensors to the job's volume and every replica "
        "reloads them from there; works without CUDA and without any port between the pods, costs a write "
        "and a read of the full weights per step, and needs spec.checkpoints.volume.accessMode: "
        "ReadWriteMany (both pods mount the volume).",
    )

    @model_validator(mode="after")
    def _tp_is_all_gpus(self) -> GenerationSpec:
        tp_set = "tensor_parallel_size" in self.model_fields_set
        if tp_set and self.tensor_parallel_size != self.gpus:
            raise self.Rules.tp_equals_gpus.violation()
        if _gpus_in(self.resources):
            raise self.Rules.no_gpus_in_resources.violation()
        if self.replica_count() > 1 and self.weight_sync == "NCCL" and not self.colocated():
            raise self.Rules.several_replicas_refuse_nccl.violation()
        if self.colocated() and (
            self.replica_count() > 1
            or self.weight_sync is not None
            or self.gpus != 1
            or (tp_set and self.tensor_parallel_size != 1)
        ):
            raise self.Rules.colocate_is_in_process.violation()
        if not tp_set:
            # Recorded as set, so a dump and a re-validation (trainer.json, the gang hash) keep it.
            self.tensor_parallel_size = self.gpus
        if self.colocate_memory_share is not None and not self.colocated():
            raise self.Rules.memory_share_is_colocate.violation()
        return self

    def colocated(self) -> bool:
        """Whether vLLM runs inside the trainer processes (mode Colocate) instead of in pods of its own."""
        return self.mode == "Colocate"

    def weight_transport(self) -> Literal["NCCL", "Volume", "Broadcast"] | None:
        """The weight transport the job uses: weightSync, else NCCL for one server and Broadcast for
        several; None when colocated (the weights reach the engine in memory)."""
        if self.colocated():
            return None
        if self.weight_sync is not None:
            return self.weight_sync
        return "Broadcast" if self.replica_count() > 1 else "NCCL"

    def replica_count(self) -> int:
        """The vLLM servers the job runs (replicas, 1 when unset)."""
        return self.replicas or 1

    def server_count(self) -> int:
        """The vLLM pods each gang attempt runs: none when colocated."""
        return 0 if self.colocated() else self.replica_count()

    def pod_gpus(self) -> int:
        """GPUs the job's vLLM pods take together (gpus x replicas; none when colocated)."""
        return self.gpus * self.server_count()


# spec.trainer.sharding is FSDP, in a CEL expression over the job's spec.
SHARDED = "has(self.trainer) && has(self.trainer.sharding) && self.trainer.sharding == 'FSDP'"


class TrainerSpec(ApiModel):
    """The trainer gang: nodes x gpusPerNode processes, data parallel."""

    class Rules(CelRules):
        no_gpus_in_resources = _no_gpus_in_resources("trainer", "gpusPerNode", "each trainer pod")
        offload_needs_fsdp = CelRule(
            "!has(self.cpuOffload) || !self.cpuOffload || (has(self.sharding) && self.sharding == 'FSDP')",
            "spec.trainer.cpuOffload moves FSDP's parameter shards, gradients and optimizer state to host memory, "
            "and spec.trainer.sharding is not FSDP: set sharding: FSDP, or remove cpuOffload",
            ".cpuOffload",
        )

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
    sharding: Literal["DDP", "FSDP"] | None = Field(
        default=None,
        description="Unset or DDP: every trainer process holds the whole model, its gradients and optimizer state (16 "
        "bytes per parameter in full fine-tuning); FSDP: FSDP2 shards all three over every trainer process of "
        "every node (fp32 masters, 16-bit compute). FSDP is for models whose training state does not fit "
        "one GPU; not with LoRA, generation.mode Colocate, grpo.maxStaleness or rollouts.source Client.",
    )
    cpu_offload: bool | None = Field(
        default=None,
        description="FSDP only: keep parameter shards, gradients and optimizer state in host memory between "
        "uses (the optimizer step runs on the CPU); fits a larger model on fewer GPUs, at slower steps.",
    )
    image: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        pattern=NO_SPACE_PATTERN,
        description="Trainer image (grpo_trainer). Unset: the platform's default (the operator's "
        f"jobDefaults.images.trainer; {DEFAULT_TRAINER_IMAGE} as shipped), read when the pods are created "
        "and not stored in the job.",
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description="CPU/memory for each trainer pod; GPUs come from gpusPerNode and are refused here.",
    )
    env: EnvList = Field(
        default_factory=list, json_schema_extra=ENV_LIST_SCHEMA, description="Extra environment variables."
    )

    @model_validator(mode="after")
    def _gpus_from_gpus_per_node(self) -> TrainerSpec:
        if _gpus_in(self.resources):
            raise self.Rules.no_gpus_in_resources.violation()
        if self.cpu_offload and self.sharding != "FSDP":
            raise self.Rules.offload_needs_fsdp.violation()
        return self
