"""From trainer.json (grpo_operator.api.trainer_config.TrainerConfig) and the launcher's environment to
TRL's GRPOConfig keyword arguments. Pure: no torch import, so the mapping is testable anywhere."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_operator.api.grpo_settings import trl_kwargs
from grpo_operator.api.trainer_config import CONFIG_ENV, TrainerConfig
from pydantic import ValidationError

from grpo_trainer.errors import ConfigError

# Directory under checkpoints.dir where HF Trainer writes a checkpoint before it is published as step-N;
# one subdirectory per gang attempt, so an attempt still writing its SIGTERM checkpoint and its successor
# never write the same checkpoint-N directory.
STAGING_DIRNAME = ".partial"


@dataclass(frozen=True)
class RuntimeEnv:
    """What torchrun (or the operator, for a single process) puts in the environment."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    resume_from: str | None = None
    job_namespace: str | None = None
    job_name: str | None = None
    # The gang attempt (status.trainerAttempt) this process belongs to; fences checkpoints of older attempts.
    attempt: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @staticmethod
    def from_environ(environ: Mapping[str, str] | None = None) -> RuntimeEnv:
        env = os.environ if environ is None else environ

        def integer(name: str, default: int) -> int:
            raw = env.get(name, "")
            if raw == "":
                return default
            try:
                return int(raw)
            except ValueError:
                raise ConfigError(f"environment variable {name}={raw!r} must be an integer") from None

        rank = integer("RANK", 0)
        world_size = integer("WORLD_SIZE", 1)
        if world_size < 1 or not 0 <= rank < world_size:
            raise ConfigError(
                f"RANK={rank} and WORLD_SIZE={world_size} are inconsistent: need 0 <= RANK < WORLD_SIZE"
            )
        return RuntimeEnv(
            rank=rank,
            local_rank=integer("LOCAL_RANK", 0),
            world_size=world_size,
            resume_from=env.get("RESUME_FROM") or None,
            job_namespace=env.get("GRPO_JOB_NAMESPACE") or None,
            job_name=env.get("GRPO_JOB_NAME") or None,
            attempt=integer("GRPO_TRAINER_ATTEMPT", 0),
        )


def load_config(path: str | None = None) -> TrainerConfig:
    """Read the TrainerConfig named by $GRPO_CONFIG; every problem becomes a ConfigError that says which
    file and which field."""
    config_path = path or os.environ.get(CONFIG_ENV)
    if not config_path:
        raise ConfigError(f"${CONFIG_ENV} is not set; point it at the trainer.json the operator renders")
    file = Path(config_path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {CONFIG_ENV}={config_path}: {exc.strerror or exc}") from None
    try:
        return TrainerConfig.model_validate_json(text)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"{config_path} is not a valid TrainerConfig: {problems}") from None


@dataclass(frozen=True)
class BatchPlan:
    """B prompts x G answers per optimizer step, spread over W processes:
    B*G = per_device_batch_size * W * gradient_accumulation_steps, one generation round per step."""

    prompts_per_step: int
    group_size: int
    world_size: int
    per_device_batch_size: int
    gradient_accumulation_steps: int

    @property
    def completions_per_step(self) -> int:
        return self.prompts_per_step * self.group_size

    @property
    def completions_per_rank(self) -> int:
        return self.per_device_batch_size * self.gradient_accumulation_steps


def plan_batches(
    prompts_per_step: int, group_size: int, per_device_batch_size: int, world_size: int
) -> BatchPlan:
    """Map B, G onto TRL's batch settings for the actual world size, or explain what to change."""
    if group_size < 2:
        raise ConfigError(f"grpo.groupSize is {group_size}; GRPO compares answers, so it must be at least 2")
    completions = prompts_per_step * group_size
    per_step_per_micro = per_device_batch_size * world_size
    if completions % per_step_per_micro != 0:
        divisors = [d for d in range(1, completions + 1) if completions % (d * world_size) == 0][:6]
        hint = (
            f"set spec.trainer.perDeviceBatchSize to one of {divisors}"
            if divisors
            else f"make promptsPerStep*groupSize a multiple of the {world_size} trainer processes"
        )
        raise ConfigError(
            f"cannot split B*G = {prompts_per_step}*{group_size} = {completions} completions per step over "
            f"{world_size} trainer processes x perDeviceBatchSize {per_device_batch_size} "
            f"(= {per_step_per_micro} per micro-step): {hint}"
        )
    return BatchPlan(
        prompts_per_step=prompts_per_step,
        group_size=group_size,
        world_size=world_size,
        per_device_batch_size=per_device_batch_size,
        gradient_accumulation_steps=completions // per_step_per_micro,
    )


def staging_dir(config: TrainerConfig, attempt: int = 0) -> str:
    return str(Path(config.checkpoints.dir) / STAGING_DIRNAME / f"attempt-{attempt}")


@dataclass(frozen=True)
class Precision:
    """How model.dtype becomes load dtype and mixed-precision flags."""

    load_dtype: str
    bf16: bool
    fp16: bool


def precision(dtype: str, *, lora: bool, cuda: bool) -> Precision:
    """Full fine-tuning in bfloat16 or float16 keeps fp32 master weights (and so fp32 gradients and AdamW
    state) and computes under 16-bit autocast. Weights held in bf16 do not train at production learning
    rates: bf16 keeps 8 significant bits, so an update smaller than half a unit in the last place of a weight
    rounds away (at lr 1e-6, every weight above about 4.9e-4 in magnitude), and the lost updates never add
    up. fp16 could not even take the step: its GradScaler refuses fp16 gradients ("Attempting to unscale FP16
    gradients"). With LoRA the frozen base stays in model.dtype (it is never updated) and PEFT keeps the
    trainable adapters in fp32.

    bf16 autocast runs on the CPU too, so CPU runs (tests, demo) compute as GPU runs do. fp16 autocast
    needs a GradScaler, which only pays on a GPU: a float16 job on the CPU computes in fp32."""
    if dtype == "float32":
        return Precision(load_dtype="float32", bf16=False, fp16=False)
    autocast_bf16 = dtype == "bfloat16"
    autocast_fp16 = dtype == "float16" and cuda
    return Precision(load_dtype=dtype if lora else "float32", bf16=autocast_bf16, fp16=autocast_fp16)


# transformers' default TrainingArguments.ddp_timeout: how long a process waits in a collective (seconds).
DEFAULT_COLLECTIVE_TIMEOUT_SECONDS = 1800
# What a replacement's wait leaves out: rank 0 joining the new server's weight transport and probing it.
COLLECTIVE_MARGIN_SECONDS = 300


def collective_timeout_seconds(config: TrainerConfig, plan: BatchPlan) -> int:
    """How long every other trainer process may wait in a collective (TrainingArguments.ddp_timeout) while
    rank 0 does, alone, what it may legitimately take that long to do: with a vLLM server, a request that
    fails, the wait for the replaced server (generation.startupTimeoutSeconds), the weights pushed into it
    and the request again; with an environment, every episode of the step, each of up to maxTurns turns a
    generation request and an environment step at their timeouts, ``concurrency`` at a time. Below this
    the others would give up in the step's broadcast while rank 0 rides out a replacement it is allowed to
    wait for, and the gang would restart for nothing. Never below transformers' default."""
    gen = config.generation
    if gen.backend != "vllm-server":
        return DEFAULT_COLLECTIVE_TIMEOUT_SECONDS
    wait = gen.startup_timeout_seconds + 3 * gen.request_timeout_seconds
    env = config.environment
    if env is not None:
        waves = -(-plan.completions_per_step // env.concurrency)
        wait += waves * env.max_turns * (gen.request_timeout_seconds + env.timeout_seconds)
    return max(DEFAULT_COLLECTIVE_TIMEOUT_SECONDS, math.ceil(wait + COLLECTIVE_MARGIN_SECONDS))


def grpo_config_kwargs(
    config: TrainerConfig, plan: BatchPlan, *, cuda: bool, attempt: int = 0
) -> dict[str, Any]:
    """Keyword arguments for trl.GRPOConfig. Generation goes through the job's vLLM server in server mode
    (``generation.backend: vllm-server``), through a vLLM engine inside each training process in colocate
    mode (``vllm-colocate``), or through transformers in-process (``transformers``)."""
    g = config.grpo
    mixed = precision(config.model.dtype, lora=g.lora.enabled, cuda=cuda)
    kwargs: dict[str, Any] = {
        "output_dir": staging_dir(config, attempt),
        # One validation answer per prompt; validation is run by the trainer itself (progress.py).
        "num_generations_eval": 1,
        "per_device_train_batch_size": plan.per_device_batch_size,
        "gradient_accumulation_steps": plan.gradient_accumulation_steps,
        # Every spec.grpo setting TRL has, from the one table of where each goes (api/grpo_settings.py).
        **trl_kwargs(g),
        "logging_steps": 1,
        "save_strategy": "steps",
        "save_steps": config.checkpoints.every_steps,
        # Rotation is done by checkpoints.publish() after the manifest moves, never by HF Trainer.
        "save_total_limit": None,
        "report_to": [],
        "disable_tqdm": True,
        "remove_unused_columns": False,
        "log_completions": False,
        "dataloader_num_workers": 0,
        "model_init_kwargs": {"dtype": mixed.load_dtype},
        # Mixed precision and gradient checkpointing only pay off on GPUs.
        "bf16": mixed.bf16,
        "fp16": mixed.fp16,
        "gradient_checkpointing": cuda,
        "use_cpu": not cuda,
        "ddp_timeout": collective_timeout_seconds(config, plan),
    }
    if config.trainer.sharded:
        kwargs.update(fsdp_kwargs(config, cuda=cuda))
    gen = config.generation
    if gen.backend == "vllm-server":
        if not gen.server_host:
            raise ConfigError(
                "generation.backend is vllm-server but generation.serverHost is empty; set it to the "
                "<job>-gen Service name, or use backend transformers for in-process generation"
            )
        kwargs.update(
            use_vllm=True,
            vllm_mode="server",
            vllm_server_base_url=f"http://{gen.server_host}:{gen.server_port}",
            vllm_server_timeout=gen.request_timeout_seconds,
            vllm_group_port=gen.weight_sync_port,
        )
    elif gen.backend == "vllm-colocate":
        kwargs.update(colocate_kwargs(config))
    else:
        kwargs["use_vllm"] = False
    return kwargs


def fsdp_kwargs(config: TrainerConfig, *, cuda: bool) -> dict[str, Any]:
    """TrainingArguments for trainer.sharding FSDP: FSDP2 through accelerate, one shard unit per decoder
    layer (the model's ``_no_split_modules``), parameters resharded after each forward. The parameters stay
    fp32 (the masters: model_init_kwargs loads fp32 for full fine-tuning) and accelerate's bf16/fp16 mixed
    precision becomes FSDP2's MixedPrecisionPolicy: layers gathered and computed in 16 bits, gradients
    reduced in fp32. Checkpoints are sharded (each rank writes its shards through torch.distributed.checkpoint,
    which can load them on another world size). Activation checkpointing is FSDP's own on GPUs (transformers'
    gradient checkpointing would gather every layer once more in the backward pass)."""
    check_sharding(config)
    return {
        "fsdp": True,
        "fsdp_config": {
            "version": 2,
            "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "reshard_after_forward": True,
            "state_dict_type": "SHARDED_STATE_DICT",
            "activation_checkpointing": cuda,
            # Without CUDA everything is in host memory already (and FSDP2's offload pins memory, which needs
            # a CUDA driver): the setting changes nothing there and is left off.
            "cpu_offload": bool(config.trainer.cpu_offload) and cuda,
        },
        "gradient_checkpointing": False,
    }


def check_sharding(config: TrainerConfig) -> None:
    """What FSDP is not used with, refused with what works (the API refuses the same at apply time)."""
    refusals = (
        (config.grpo.lora.enabled, "grpo.lora.enabled (use sharding DDP with LoRA)"),
        (config.generation.backend == "vllm-colocate", "generation.backend vllm-colocate (use vllm-server)"),
        (bool(config.grpo.max_staleness), "grpo.maxStaleness > 0 (remove it)"),
        (config.rollouts is not None, "client rollouts (use sharding DDP)"),
    )
    for refused, what in refusals:
        if refused:
            raise ConfigError(f"trainer.sharding FSDP is not supported with {what}")


def colocate_kwargs(config: TrainerConfig) -> dict[str, Any]:
    """GRPOConfig's colocate-mode settings: one engine per training process (no tensor parallelism across
    the trainers), taking generation.colocateMemoryShare of its device's memory (on vLLM's CPU build the KV
    cache is VLLM_CPU_KVCACHE_SPACE instead), with generation.maxModelLen as its context length. Sleep mode
    stays off: it frees the engine's memory during the optimizer step only by discarding its weights, and
    vLLM's CPU build refuses it."""
    check_colocate(config)
    gen = config.generation
    kwargs: dict[str, Any] = {
        "use_vllm": True,
        "vllm_mode": "colocate",
        "vllm_tensor_parallel_size": 1,
        "vllm_enable_sleep_mode": False,
    }
    if gen.colocate_memory_share is not None:
        kwargs["vllm_gpu_memory_utilization"] = gen.colocate_memory_share
    if gen.max_model_len is not None:
        needed = config.grpo.max_prompt_length + config.grpo.max_completion_length
        if gen.max_model_len < needed:
            raise ConfigError(
                f"generation.maxModelLen {gen.max_model_len} is shorter than grpo.maxPromptLength + "
                f"grpo.maxCompletionLength = {needed}: the colocated engine could not hold a prompt and its "
                f"answer; raise spec.generation.maxModelLen to at least {needed}, or unset it"
            )
        kwargs["vllm_max_model_length"] = gen.max_model_len
    return kwargs


def check_colocate(config: TrainerConfig) -> None:
    """What the colocated engine cannot do, refused with the fix (the API refuses both at apply time)."""
    if config.grpo.max_staleness:
        raise ConfigError(
            "grpo.maxStaleness > 0 overlaps sampling on vLLM servers with training, and generation.backend is "
            "vllm-colocate (the engine samples on the training process itself, between steps): remove "
            "maxStaleness, or use spec.generation.mode: Server"
        )
    if config.rollouts is not None:
        raise ConfigError(
            "generation.backend vllm-colocate does not serve a client's rollouts (the rollout gateway samples "
            "through the job's vLLM server): use spec.generation.mode: Server with spec.rollouts.source: Client"
        )
