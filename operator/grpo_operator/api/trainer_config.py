"""``TrainerConfig``: what the operator renders into ConfigMap ``<job>-config`` key ``trainer.json``
(mounted at /etc/grpo/trainer.json, env GRPO_CONFIG) and the trainer reads.

It reuses the spec's ``model``, ``dataset`` and ``grpo`` models unchanged, so a knob added to the spec
reaches the trainer without a second definition. Load with ``TrainerConfig.load(path)`` or
``TrainerConfig.model_validate_json(text)``; write with ``config.dump_json()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from grpo_operator.api.base import ApiModel
from grpo_operator.api.compat import later_defaults_exclude
from grpo_operator.api.environment import EnvironmentClientConfig
from grpo_operator.api.spec import VOLUME_MOUNT_PATH as VOLUME_MOUNT_PATH
from grpo_operator.api.spec import DatasetSpec, GRPOJobSpec, GRPOSpec, ModelSpec
from grpo_operator.api.tracking import TrackingSpec
from grpo_operator.api.workloads import DEFAULT_COLOCATE_MEMORY_SHARE

CONFIG_MAP_KEY = "trainer.json"
CONFIG_MOUNT_DIR = "/etc/grpo"
CONFIG_PATH = f"{CONFIG_MOUNT_DIR}/{CONFIG_MAP_KEY}"
CONFIG_ENV = "GRPO_CONFIG"
DEFAULT_CHECKPOINT_DIR = f"{VOLUME_MOUNT_PATH}/checkpoints"
DEFAULT_OUTPUT_DIR = f"{VOLUME_MOUNT_PATH}/output"
# Where rank 0 writes the weights vLLM reloads (spec.generation.weightSync: Volume), on the job's volume.
WEIGHT_SYNC_SUBDIR = "weight-sync"
# Under outputDir: each trainer process's stderr, kept past its pod (a gang restart deletes every pod, and
# with them the logs Kubernetes holds): logs/attempt-<trainerAttempt>/rank-<global rank>.log.
TRAINER_LOGS_SUBDIR = "logs"


def trainer_log_path(output_dir: str, attempt: int, rank: int) -> str:
    return f"{output_dir}/{TRAINER_LOGS_SUBDIR}/attempt-{attempt}/rank-{rank}.log"


def generation_log_path(output_dir: str, attempt: int, replica: int) -> str:
    """vLLM replica ``replica``'s output in a gang attempt, kept by the generation pod's supervisor where the
    pod mounts the job's volume (a ReadWriteMany volume)."""
    return f"{output_dir}/{TRAINER_LOGS_SUBDIR}/attempt-{attempt}/vllm-{replica}.log"


VLLM_SERVER_PORT = 8000
# TRL's vllm_group_port default: the weight-sync rendezvous, bound on trainer rank 0.
WEIGHT_SYNC_PORT = 51216
TRAINER_METRICS_PORT = 9090
# Arbor's default port, so a DSPy user's api_base looks the same as with a local Arbor server.
ROLLOUTS_PORT = 7453
# The rollout gateway's port for trainer rank 0 (groups, progress): the job's trainer pods only.
GATEWAY_INTERNAL_PORT = 7454
# Trainer rank 0's policy server (OpenAI-compatible completions from the current policy), which the
# rollout gateway forwards the client's completion requests to.
POLICY_PORT = 7455
# The environment variable of the rollout gateway holding the per-job bearer token
# (spec.rollouts.client.tokenSecretRef).
ROLLOUTS_TOKEN_ENV = "GRPO_ROLLOUTS_TOKEN"


class _ConfigModel(ApiModel):
    # Lax on purpose: trainer.json is also written by hand for local runs, where 10 for 10.0 is fine.
    # The spec models embedded in it (model, dataset, grpo) keep their own strict config.
    model_config = ConfigDict(strict=False)


class JobRef(_ConfigModel):
    """The GRPOJob this trainer belongs to (status patches go there)."""

    namespace: str = Field(min_length=1, description="Namespace of the GRPOJob.")
    name: str = Field(min_length=1, description="Name of the GRPOJob.")
    uid: str | None = Field(
        default=None, description="metadata.uid, to refuse patching a recreated namesake."
    )


class TrainerTopology(_ConfigModel):
    """The gang layout; the trainer checks it against the actual world size."""

    nodes: int = Field(default=1, ge=1, description="Trainer pods.")
    gpus_per_node: int = Field(default=1, ge=1, description="Processes per pod.")
    per_device_batch_size: int = Field(default=1, ge=1, description="Completions per process per micro-step.")
    # None (left out of trainer.json, which an older trainer image would refuse) means DDP / no offload.
    sharding: Literal["DDP", "FSDP"] | None = Field(
        default=None, description="DDP: every process holds the whole model; FSDP: FSDP2 shards it over all."
    )
    cpu_offload: bool | None = Field(
        default=None, description="FSDP: shards, gradients and optimizer state in host memory."
    )

    @property
    def sharded(self) -> bool:
        return self.sharding == "FSDP"


class GenerationConfig(_ConfigModel):
    """How completions are generated."""

    backend: Literal["vllm-server", "vllm-colocate", "transformers"] = Field(
        default="vllm-server",
        description="vllm-server: the job's vLLM servers (spec.generation.mode: Server); vllm-colocate: a "
        "vLLM engine inside every training process (spec.generation.mode: Colocate); transformers: "
        "in-process generate() (CPU tests).",
    )
    colocate_memory_share: float | None = Field(
        default=None,
        gt=0.0,
        lt=1.0,
        description="vllm-colocate: fraction of each device's memory the colocated engine takes (unset: "
        "TRL's default, 0.3).",
    )
    max_model_len: int | None = Field(
        default=None,
        ge=1,
        description="vllm-colocate: the colocated engine's context length (unset: the model's).",
    )
    server_host: str | None = Field(
        default=None, description="vLLM server host, e.g. <job>-gen.<namespace>.svc."
    )
    server_port: int = Field(default=VLLM_SERVER_PORT, ge=1, le=65535, description="vLLM HTTP port.")
    server_urls: list[Annotated[str, Field(min_length=1)]] | None = Field(
        default=None,
        min_length=1,
        description="With several vLLM servers (spec.generation.replicas > 1), and with weightSync broadcast "
        "always: the base URL of every replica's Service, in replica order, e.g. "
        "http://<job>-gen.<namespace>.svc:8000 then http://<job>-gen-r1.<namespace>.svc:8000; their number "
        "is the replica count (one for broadcast to one server). Unset with one server under nccl or "
        "volume, which serverHost and serverPort name (they name replica 0 either way).",
    )
    weight_sync_port: int = Field(
        default=WEIGHT_SYNC_PORT, ge=1, le=65535, description="NCCL weight-sync port on trainer rank 0."
    )
    startup_timeout_seconds: float = Field(
        default=1800.0,
        gt=0,
        description="How long to wait for the vLLM server's /health before giving up (its start-up budget); "
        "TRL's own client starts only once it answers.",
    )
    request_timeout_seconds: float = Field(
        default=600.0,
        gt=0,
        description="How long TRL's client waits for a vLLM server that already answered.",
    )
    weight_sync: Literal["nccl", "volume", "broadcast"] | None = Field(
        default=None,
        description="How rank 0 sends weights to vLLM after each step: nccl (unset: TRL's NCCL broadcast to "
        "one server), volume (safetensors written under weightSyncDir, which vLLM reloads through "
        "/collective_rpc) or broadcast (one process group of rank 0 and every worker of every server, "
        "through the project's grpo-broadcast weight-transfer engine: gloo without CUDA, NCCL with it).",
    )
    weight_sync_dir: str | None = Field(
        default=None,
        min_length=1,
        description="Directory on the volume both the trainer and vLLM mount (weightSync: volume).",
    )

    @model_validator(mode="after")
    def _replicas_reload_from_the_volume(self) -> GenerationConfig:
        if self.server_urls is not None and self.weight_sync not in ("volume", "broadcast"):
            raise ValueError(
                "generation.serverUrls (several vLLM servers) needs generation.weightSync volume or broadcast: "
                "TRL's NCCL transport reaches one server only"
            )
        if self.backend != "vllm-colocate" and (
            self.colocate_memory_share is not None or self.max_model_len is not None
        ):
            raise ValueError(
                "generation.colocateMemoryShare and generation.maxModelLen configure the colocated vLLM "
                "engine: they need generation.backend: vllm-colocate"
            )
        return self


class MetricClientConfig(_ConfigModel):
    """How the trainer calls the metric service."""

    url: str = Field(min_length=1, description="Base URL, e.g. http://<job>-metric:8080.")
    batch_size: int = Field(default=32, ge=1, description="Completions per POST /score.")
    concurrency: int = Field(default=4, ge=1, description="Requests in flight at once.")
    timeout_seconds: float = Field(default=30.0, gt=0, description="Timeout of one request.")
    max_retries: int = Field(default=3, ge=0, description="Retries of a failed batch.")
    error_budget: float = Field(default=0.05, ge=0, le=1, description="Tolerated metric-error fraction.")
    max_response_bytes: int = Field(
        default=4 * 1024 * 1024, ge=1024, description="Largest /score response body read."
    )
    max_abs_reward: float = Field(default=1e6, gt=0, description="Largest |reward| accepted.")
    reward_weights: dict[str, float] | None = Field(
        default=None,
        description="Weights of the reward's named components (spec.metric.rewardWeights); unset: the "
        "metric's reward, or the sum of its components.",
    )


class ClientRolloutsConfig(_ConfigModel):
    """Rollouts and rewards come from a client (spec.rollouts.source: Client), e.g. DSPy's GRPO optimizer
    through Arbor's provider: trainer rank 0 serves Arbor's fine-tuning routes and OpenAI-compatible
    completions on ``port`` and trains on the scored groups the client sends."""

    port: int = Field(
        default=ROLLOUTS_PORT,
        ge=1,
        le=65535,
        description="Client port of the job's rollout gateway (Arbor's protocol), for messages and docs.",
    )
    served_model: str = Field(
        min_length=1,
        description="The model name the client must name in initialize and completions (spec.model.name).",
    )
    token_env: str | None = Field(
        default=None,
        min_length=1,
        description="Environment variable holding the bearer token the completion routes require; unset: none.",
    )
    gateway_url: str = Field(
        min_length=1,
        description="Internal URL of the job's rollout gateway, e.g. http://<job>-rollouts.<namespace>.svc:7454: "
        "rank 0 pulls the client's groups from it and reports progress to it.",
    )
    policy_port: int = Field(
        default=POLICY_PORT,
        ge=1,
        le=65535,
        description="Port of rank 0's policy server, where the gateway forwards completion requests.",
    )


class CheckpointConfig(_ConfigModel):
    """Where and how often checkpoints are written."""

    dir: str = Field(default=DEFAULT_CHECKPOINT_DIR, min_length=1, description="Checkpoint root directory.")
    every_steps: int = Field(default=50, ge=1, description="Checkpoint every N steps.")
    keep_last: int = Field(default=3, ge=1, description="Checkpoints kept.")


class TrainerConfig(_ConfigModel):
    """The trainer's whole configuration (trainer.json)."""

    api_version: Literal["grpo.dev/v1alpha1"] = Field(default="grpo.dev/v1alpha1")
    kind: Literal["TrainerConfig"] = Field(default="TrainerConfig")
    job: JobRef
    model: ModelSpec
    # The prompts (metric-service jobs); client-rollout jobs get their prompts from the client.
    dataset: DatasetSpec | None = None
    grpo: GRPOSpec
    trainer: TrainerTopology = Field(default_factory=TrainerTopology)
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    # metric (the job's metric service scores rollouts the trainer generates), rollouts (a client sends scored
    # rollouts), environment (episodes), or environment and metric (the metric scores episodes' final answers).
    metric: MetricClientConfig | None = None
    rollouts: ClientRolloutsConfig | None = None
    # Episodes against the job's environment service (spec.environment) instead of single-turn sampling.
    environment: EnvironmentClientConfig | None = None
    checkpoints: CheckpointConfig = Field(default_factory=CheckpointConfig)
    tracking: TrackingSpec | None = None
    output_dir: str = Field(
        default=DEFAULT_OUTPUT_DIR, min_length=1, description="samples.jsonl and metrics.jsonl go here."
    )
    metrics_port: int = Field(
        default=TRAINER_METRICS_PORT, ge=1, le=65535, description="Prometheus /metrics port on rank 0."
    )
    status_patch_interval_seconds: float = Field(
        default=10.0,
        gt=0,
        description="Minimum time between status patches (checkpoints and the end always patch).",
    )

    @model_validator(mode="after")
    def _resolve_preset(self) -> TrainerConfig:
        # grpo.preset becomes the knobs it sets here, for the operator's trainer.json and for one written by
        # hand alike, so the trainer reads only resolved values (and a written trainer.json shows them).
        self.grpo = self.grpo.resolved(sampled_by_client=self.rollouts is not None)
        return self

    @model_validator(mode="after")
    def _one_rollout_source(self) -> TrainerConfig:
        # The environment may run beside the metric (episodes, their final answers scored by the metric);
        # otherwise exactly one source.
        sources = [self.metric is not None or self.environment is not None, self.rollouts is not None]
        if sum(sources) != 1:
            raise ValueError(
                "trainer.json needs one of metric (the metric service scores what the trainer generates), "
                "rollouts (a client sends scored rollouts) and environment (episodes against the job's "
                "environment service, which rewards them; with metric too, the metric also scores each "
                "episode's final answer)"
            )
        if (self.metric is not None or self.environment is not None) and self.dataset is None:
            raise ValueError(
                "trainer.json has a metric or environment service but no dataset to take prompts from"
            )
        return self

    @classmethod
    def from_spec(
        cls,
        namespace: str,
        name: str,
        uid: str | None,
        spec: GRPOJobSpec,
        *,
        metric_url: str | None,
        generation_host: str | None,
        generation_replica_hosts: Sequence[str] = (),
        backend: Literal["vllm-server", "transformers"] = "vllm-server",
        vllm_port: int = VLLM_SERVER_PORT,
        weight_sync_port: int = WEIGHT_SYNC_PORT,
        metrics_port: int = TRAINER_METRICS_PORT,
        checkpoint_dir: str = DEFAULT_CHECKPOINT_DIR,
        output_dir: str = DEFAULT_OUTPUT_DIR,
        gateway_url: str | None = None,
        environment_url: str | None = None,
    ) -> TrainerConfig:
        """Render the trainer config for a job (pure: same inputs, same config). The ports are the
        operator's settings, the same values it puts on the pods and Services. A job whose rollouts come
        from a client (spec.rollouts.source: Client) needs ``gateway_url``, any other ``metric_url``. A job
        with several vLLM servers (spec.generation.replicas > 1) needs ``generation_replica_hosts``: every
        replica's Service host in replica order, ``generation_host`` first (with one server under
        Broadcast, which names its servers in serverUrls too, left empty it is ``generation_host``)."""
        colocated = spec.generation.colocated()
        engine: Literal["vllm-server", "vllm-colocate", "transformers"] = backend
        if colocated and backend == "vllm-server":
            # No vLLM server exists: the engine runs inside the training processes.
            engine, generation_host = "vllm-colocate", None
        if backend == "vllm-server" and not generation_host and not colocated:
            raise ValueError("backend vllm-server needs generation_host (the <job>-gen Service's DNS name)")
        replicas = spec.generation.replica_count()
        transport = spec.generation.weight_transport()
        server_urls: list[str] | None = None
        # Broadcast forms its group with every server of the pool, one server too: the URLs always.
        if engine == "vllm-server" and (replicas > 1 or transport == "Broadcast"):
            hosts = list(generation_replica_hosts) or (
                [generation_host] if replicas == 1 and generation_host else []
            )
            if len(hosts) != replicas or hosts[0] != generation_host:
                raise ValueError(
                    f"spec.generation.replicas is {replicas}: generation_replica_hosts must name the Service "
                    f"host of each replica in order, generation_host first (got {hosts})"
                )
            server_urls = [f"http://{host}:{vllm_port}" for host in hosts]
        metric: MetricClientConfig | None = None
        rollouts: ClientRolloutsConfig | None = None
        environment: EnvironmentClientConfig | None = None
        if spec.environment is not None:
            if not environment_url:
                raise ValueError(
                    "a job with spec.environment needs environment_url (the <job>-env Service's URL)"
                )
            environment = EnvironmentClientConfig.of(spec.environment, environment_url)
        if spec.metric is not None:
            if not metric_url:
                raise ValueError("a job with spec.metric needs metric_url (the <job>-metric Service's URL)")
            metric = MetricClientConfig(
                url=metric_url,
                batch_size=spec.metric.batch_size,
                concurrency=spec.metric.concurrency,
                timeout_seconds=float(spec.metric.timeout_seconds),
                max_retries=spec.metric.max_retries,
                error_budget=spec.metric.error_budget,
                max_response_bytes=spec.metric.max_response_bytes,
                max_abs_reward=spec.metric.max_abs_reward,
                reward_weights=spec.metric.reward_weights,
            )
        elif environment is None:
            if not gateway_url:
                raise ValueError(
                    "a job with spec.rollouts.source: Client needs gateway_url (its rollout gateway)"
                )
            # The trainer's policy server is reached by the gateway alone (NetworkPolicy), which checks the
            # client's bearer token itself: the trainer gets no token.
            rollouts = ClientRolloutsConfig(served_model=spec.model.name, gateway_url=gateway_url)
        volume_sync = transport == "Volume"
        weight_sync: Literal["volume", "broadcast"] | None = None
        if transport == "Volume":
            weight_sync = "volume"
        elif transport == "Broadcast":
            weight_sync = "broadcast"
        return cls(
            job=JobRef(namespace=namespace, name=name, uid=uid),
            model=spec.model.model_copy(deep=True),
            dataset=spec.dataset.model_copy(deep=True) if spec.dataset is not None else None,
            grpo=spec.grpo.model_copy(deep=True),
            trainer=TrainerTopology(
                nodes=spec.trainer.nodes,
                gpus_per_node=spec.trainer.gpus_per_node,
                per_device_batch_size=spec.trainer.per_device_batch_size,
                sharding=spec.trainer.sharding,
                cpu_offload=spec.trainer.cpu_offload,
            ),
            generation=GenerationConfig(
                backend=engine,
                server_host=generation_host,
                server_port=vllm_port,
                server_urls=server_urls,
                weight_sync_port=weight_sync_port,
                startup_timeout_seconds=float(spec.generation.startup_timeout_seconds),
                weight_sync=weight_sync,
                weight_sync_dir=f"{VOLUME_MOUNT_PATH}/{WEIGHT_SYNC_SUBDIR}" if volume_sync else None,
                colocate_memory_share=(
                    spec.generation.colocate_memory_share or DEFAULT_COLOCATE_MEMORY_SHARE
                    if colocated
                    else None
                ),
                max_model_len=spec.generation.max_model_len if colocated else None,
            ),
            metric=metric,
            rollouts=rollouts,
            environment=environment,
            checkpoints=CheckpointConfig(
                dir=checkpoint_dir,
                every_steps=spec.checkpoints.every_steps,
                keep_last=spec.checkpoints.keep_last,
            ),
            tracking=spec.tracking.model_copy(deep=True) if spec.tracking is not None else None,
            output_dir=output_dir,
            metrics_port=metrics_port,
        )

    def dump_json(self) -> str:
        """trainer.json text: camelCase keys, unset optionals omitted, stable key order. Fields added after
        the first release are omitted at their default, so an older trainer image still reads it."""
        return self.model_dump_json(
            by_alias=True, exclude_none=True, indent=2, exclude=later_defaults_exclude(self)
        )

    @classmethod
    def load(cls, path: str | Path) -> TrainerConfig:
        """Read trainer.json; a malformed file raises pydantic.ValidationError naming the bad fields."""
        return cls.model_validate_json(Path(path).read_text(encoding="utf-8"))
