"""The steps every trainer loop shares, whatever the rollout source: plan the batches, claim the
checkpoint directory, load the tokenizer, build the GRPO config and the trainer, start the reporters,
restore, train, and the ending. A loop (metric_loop.py, client_loop.py) strings them together with the
steps of its own rollout source; main.py only picks the loop and maps errors to exit codes.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_operator.api.trainer_config import TrainerConfig

from grpo_trainer import memory_plan
from grpo_trainer.errors import ConfigError, ExitCode
from grpo_trainer.grpo_config import BatchPlan, RuntimeEnv, grpo_config_kwargs, plan_batches
from grpo_trainer.tracking import TrackingPlan
from grpo_trainer.trl_adapter import allow_fsdp_on_cpu, load_checkpoint_weights
from grpo_trainer.vllm_wait import wait_for_vllm

if TYPE_CHECKING:
    from grpo_trainer.checkpoints import Owner
    from grpo_trainer.progress import ProgressCallback
    from grpo_trainer.prom import TrainerMetrics
    from grpo_trainer.status import StatusReporter
    from grpo_trainer.trainer import ProjectGRPOTrainer

memory_log = logging.getLogger("grpo_trainer.memory_plan")
log = logging.getLogger("grpo_trainer")

# GRPOConfig arguments that decide the algorithm (logged at start; the rest are batch and run plumbing).
ALGORITHM_KWARGS = (
    "loss_type",
    "importance_sampling_level",
    "epsilon",
    "epsilon_high",
    "beta",
    "scale_rewards",
    "num_iterations",
    "mask_truncated_completions",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "chat_template_kwargs",
    "vllm_importance_sampling_correction",
    "vllm_importance_sampling_mode",
    "vllm_importance_sampling_clip_max",
)


def _is_local_dir(name: str) -> bool:
    return Path(name).is_dir()


@dataclass(frozen=True)
class Workspace:
    """Who this run is and where it reads and writes: the job, the checkpoint owner, the directories and
    the checkpoint it resumes from (None: a fresh start)."""

    namespace: str
    name: str
    owner: Owner
    checkpoint_dir: Path
    output_dir: Path
    resume: str | None
    # model.dtype: the final model is written in it (final_model.py), whatever the training weights are held in.
    model_dtype: str = "float32"


@dataclass(frozen=True)
class Reporting:
    """Rank 0's reporters (None on other ranks, and status None without a Kubernetes API)."""

    metrics: TrainerMetrics | None
    status: StatusReporter | None


def plan_steps(config: TrainerConfig, env: RuntimeEnv) -> BatchPlan:
    """B prompts x G answers per step mapped onto the actual world size, or a ConfigError saying what to change."""
    plan = plan_batches(
        config.grpo.prompts_per_step,
        config.grpo.group_size,
        config.trainer.per_device_batch_size,
        env.world_size,
    )
    expected = config.trainer.nodes * config.trainer.gpus_per_node
    if expected != env.world_size:
        log.warning(
            "trainer.json describes %d processes (%d nodes x %d) but WORLD_SIZE is %d; batches are mapped onto %d",
            expected,
            config.trainer.nodes,
            config.trainer.gpus_per_node,
            env.world_size,
            env.world_size,
        )
    if config.grpo.dynamic_sampling and plan.completions_per_rank % config.grpo.group_size:
        raise ConfigError(
            f"dynamicSampling needs whole groups on every trainer process: promptsPerStep "
            f"{config.grpo.prompts_per_step} must be a multiple of the {env.world_size} processes"
        )
    return plan


def check_memory(config: TrainerConfig, env: RuntimeEnv) -> None:
    """Before anything is loaded: on CUDA, a memory plan (memory_plan.py) that does not fit the GPU raises
    MemoryPlanExceeded; on the CPU the plan is only logged."""
    memory_plan.check_job(config, env.world_size, gpu_memory(env), log=memory_log if env.is_main else None)


def gpu_memory(env: RuntimeEnv) -> int | None:
    """Total memory of this process's GPU; None without CUDA (or without torch)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.get_device_properties(env.local_rank % torch.cuda.device_count()).total_memory)


def claim_workspace(config: TrainerConfig, env: RuntimeEnv) -> Workspace:
    """Claim the checkpoint directory for this attempt (rank 0), find the checkpoint to resume and
    clean what killed attempts left half-written."""
    from grpo_trainer.checkpoints import Owner, claim, clean_staging, resolve_resume

    checkpoint_dir = Path(config.checkpoints.dir)
    output_dir = Path(config.output_dir)
    namespace = env.job_namespace or config.job.namespace
    name = env.job_name or config.job.name
    owner = Owner.from_config(config, env.attempt, namespace, name)
    if env.is_main:
        # Before anything is loaded: the attempt this one replaces may still be writing its SIGTERM checkpoint.
        claim(checkpoint_dir, owner)
    resume = resolve_resume(env.resume_from, checkpoint_dir, owner)
    if env.is_main:
        output_dir.mkdir(parents=True, exist_ok=True)
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        clean_staging(checkpoint_dir, owner)
    return Workspace(namespace, name, owner, checkpoint_dir, output_dir, resume, config.model.dtype)


def model_revision(config: TrainerConfig) -> str | None:
    """The Hub revision to load; None for a model in a local directory (it has no revisions)."""
    return None if _is_local_dir(config.model.name) else config.model.revision


def load_tokenizer(config: TrainerConfig) -> Any:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(config.model.name, revision=model_revision(config))
    except OSError as exc:
        raise ConfigError(f"cannot load the tokenizer of model {config.model.name!r}: {exc}") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def grpo_args(config: TrainerConfig, plan: BatchPlan, env: RuntimeEnv, **overrides: Any) -> Any:
    """TRL's GRPOConfig for this run (``overrides`` replace keys of grpo_config_kwargs). With the vLLM
    server backend, waits for the server first."""
    import torch
    from trl.trainer.grpo_config import GRPOConfig

    cuda = torch.cuda.is_available()
    kwargs = grpo_config_kwargs(config, plan, cuda=cuda, attempt=env.attempt)
    kwargs.update(overrides)
    if config.trainer.sharded and not cuda:
        allow_fsdp_on_cpu()
    if env.is_main:
        # What the loss and sampling run with, preset resolved: the stored spec shows only the preset's name.
        knobs = ", ".join(f"{key}={kwargs[key]}" for key in ALGORITHM_KWARGS if key in kwargs)
        preset = f"preset {config.grpo.preset}: " if config.grpo.preset else ""
        log.info("GRPO %s%s, dynamic_sampling=%s", preset, knobs, config.grpo.dynamic_sampling)
    if config.generation.backend == "vllm-colocate":
        require_vllm()
    if config.generation.backend == "vllm-server":
        # Before GRPOConfig (which joins the process group) and TRL's client (whose own timeout then
        # only covers a server that already answers): vLLM may still be loading the model.
        deadline = time.monotonic() + config.generation.startup_timeout_seconds
        for url in config.generation.server_urls or [kwargs["vllm_server_base_url"]]:
            wait_for_vllm(url, max(1.0, deadline - time.monotonic()))
    revision = model_revision(config)
    if revision:
        kwargs["model_init_kwargs"]["revision"] = revision
    return GRPOConfig(**kwargs)


def require_vllm() -> None:
    """The colocated engine runs in this process: a trainer image without the vllm package cannot serve
    generation.backend vllm-colocate (TRL would fail later, after loading the model)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            "generation.backend is vllm-colocate (spec.generation.mode: Colocate) but this trainer image has no "
            "vllm package: the engine runs inside the training process. Use a trainer image built with "
            "trainer_image/requirements-vllm.txt (spec.trainer.image), or spec.generation.mode: Server"
        )


def peft_config(config: TrainerConfig) -> Any:
    """PEFT's LoraConfig when grpo.lora is enabled, else None (full fine-tuning)."""
    if not config.grpo.lora.enabled:
        return None
    from peft import LoraConfig

    lora = config.grpo.lora
    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        task_type="CAUSAL_LM",
    )


def start_reporting(config: TrainerConfig, env: RuntimeEnv, workspace: Workspace) -> Reporting:
    """Rank 0 serves Prometheus and patches the GRPOJob's status; other ranks report nothing."""
    if not env.is_main:
        return Reporting(metrics=None, status=None)
    from grpo_trainer.prom import TrainerMetrics

    metrics = TrainerMetrics.create(workspace.name, workspace.namespace)
    metrics.serve(config.metrics_port)
    return Reporting(metrics=metrics, status=_status_reporter(config, workspace.namespace, workspace.name))


def tracking_options(config: TrainerConfig, workspace: Workspace) -> dict[str, Any]:
    """The ProgressCallback's trackers (spec.tracking, the platform's defaults already in trainer.json):
    what they are told about the job, where on its volume they write, and the resolved configuration."""
    if config.tracking is None or not config.tracking.any_enabled():
        return {}
    return {
        "tracking": TrackingPlan(
            spec=config.tracking,
            namespace=workspace.namespace,
            name=workspace.name,
            uid=config.job.uid or "",
            output_dir=workspace.output_dir,
            configuration=config.dump_json(),
        )
    }


def build_trainer(
    config: TrainerConfig,
    workspace: Workspace,
    args: Any,
    tokenizer: Any,
    train_dataset: Any,
    reward: Any,
    callback: ProgressCallback,
    reporting: Reporting,
    **extra: Any,
) -> ProjectGRPOTrainer:
    """The project's GRPOTrainer wired to the callback and the reporters; ``extra`` goes to its constructor
    (e.g. TRL's rollout_func)."""
    from grpo_trainer.trainer import ProjectGRPOTrainer

    served = config.generation.backend == "vllm-server"
    colocated = config.generation.backend == "vllm-colocate"
    if colocated:
        from grpo_trainer import colocate

        # What the colocated engine cannot do was refused when ``args`` was built (grpo_args).
        probe = colocate.EngineProbe(tokenizer)
        extra["vllm_generation"] = colocate.generation_class(probe, config.model.dtype)
    elif served:
        from grpo_trainer.served_generation import generation_class
        from grpo_trainer.weight_sync import ServedModelProbe

        gen = config.generation
        extra["vllm_generation"] = generation_class(
            gen.weight_sync,
            gen.weight_sync_dir,
            ServedModelProbe(tokenizer),
            # Riding out a replaced server pushes the weights from rank 0 alone; sharded weights are gathered by
            # every rank together, so under FSDP a lost server fails the step and the gang resumes from its
            # checkpoint instead.
            0.0 if config.trainer.sharded else gen.startup_timeout_seconds,
            gen.server_urls,
            config.model.dtype,
            config.grpo.lora.enabled,
            broadcast_port=gen.weight_sync_port,
            push_timeout_seconds=gen.request_timeout_seconds,
        )
        if config.rollouts is None:
            # Client rollouts are refused an eta at apply time: the client samples, not the trainer. Episodes
            # (a rollout_func too) run ahead through the same producer.
            extra["max_staleness"] = config.grpo.max_staleness or 0
        if "rollout_func" not in extra:
            from grpo_trainer.single_turn import SingleTurnRollouts

            # Single-turn completions enter TRL through its rollout_func, as episodes and client rollouts do.
            extra["rollout_func"] = SingleTurnRollouts()
        # TRL warns at start that rollout_func is experimental; trl_adapter.py records what the trainer
        # relies on in it, and tests/trainer/test_trl_adapter.py checks that on every TRL upgrade.
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    elif config.grpo.max_staleness:
        raise ConfigError(
            "grpo.maxStaleness > 0 overlaps the vLLM server's sampling with training, and generation.backend is "
            "transformers (in-process sampling, on the training process itself): use backend vllm-server, or "
            "remove maxStaleness"
        )
    trainer = ProjectGRPOTrainer(
        model=config.model.name,
        reward_funcs=[reward],
        args=args,
        train_dataset=train_dataset,
        processing_class=tokenizer,
        peft_config=peft_config(config),
        callbacks=[callback],
        scale_rewards_mode=config.grpo.scale_rewards,
        checkpoint_dir=str(workspace.checkpoint_dir),
        keep_last=config.checkpoints.keep_last,
        owner=workspace.owner,
        dynamic_sampling=config.grpo.dynamic_sampling,
        max_abs_reward=reward_bound(config),
        on_scored=callback.on_scored,
        pad_token_id=int(tokenizer.pad_token_id),
        **extra,
    )
    if config.trainer.sharded and not trainer.is_fsdp_enabled:
        raise ConfigError(
            "trainer.sharding is FSDP but the trainer was not started as a distributed process group (accelerate "
            "shards only under torchrun, which the operator's trainer pods use): launch it with torchrun, or set "
            "spec.trainer.sharding: DDP"
        )
    callback.trainer = trainer
    metrics = reporting.metrics
    if metrics is not None:
        trainer.grpo_on_non_finite = lambda _: metrics.non_finite_steps.inc()
    if (served or colocated) and trainer.accelerator.is_main_process:
        transport = colocate.TRANSPORT if colocated else config.generation.weight_sync or "nccl"
        trainer.vllm_generation.on_sync = SyncReporter(  # type: ignore[attr-defined]
            trainer, reporting, transport, workspace.output_dir / SYNC_LOG
        )
    return trainer


# One line per weight sync in the output directory, beside metrics.jsonl.
SYNC_LOG = "weight_syncs.jsonl"


@dataclass
class SyncReporter:
    """Rank 0's report of each weight sync: a line in output/weight_syncs.jsonl, Prometheus,
    status.servedModel, and a warning in the log when vLLM serves other weights than the trainer's
    (weight_sync.ServedModelProbe)."""

    trainer: Any
    reporting: Reporting
    transport: str
    path: Path

    def __call__(self, report: Any) -> None:
        step = int(self.trainer.state.global_step)
        metrics = self.reporting.metrics
        if metrics is not None:
            metrics.weight_sync_seconds.set(report.seconds)
        body: dict[str, Any] = {"lastSyncSeconds": round(report.seconds, 3)}
        if self.transport in _status_transports():
            body["weightSync"] = self.transport
        probe = report.probe
        if probe is not None:
            if metrics is not None:
                metrics.served_logprob_diff.set(probe.mean_abs_diff)
                if not probe.in_sync:
                    metrics.served_model_drifts.inc()
            body.update(
                checkedStep=step,
                logprobDiff=round(probe.mean_abs_diff, 4) if probe.mean_abs_diff < 1e6 else 1e6,
                inSync=probe.in_sync,
                message=None if probe.in_sync else probe.describe(),
            )
            if probe.in_sync:
                log.info("step %d: served model matches the trained one (%.4f)", step, probe.mean_abs_diff)
            else:
                log.warning("step %d: %s", step, probe.describe())
        record = {"step": step, "transport": self.transport, "seconds": round(report.seconds, 4)}
        if report.after_replacement:
            record["after_replacement"] = True
        if report.bytes is not None:
            record.update(bytes=report.bytes, weights=report.weights)
        if report.replicas is not None:
            record["replicas"] = report.replicas
            body.update(
                replicas=len(report.replicas["requests"]), replicasServing=len(report.replicas["serving"])
            )
        if probe is not None:
            record.update(
                logprob_diff=probe.mean_abs_diff, max_logprob_diff=probe.max_abs_diff, in_sync=probe.in_sync
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        if self.reporting.status is not None:
            self.reporting.status.update({"servedModel": body})


@functools.cache
def _status_transports() -> tuple[str, ...]:
    """The transports status.servedModel.weightSync accepts (the API's enum): a transport the API does not
    name (yet) leaves the field out rather than have the whole status patch refused."""
    from typing import get_args

    from grpo_operator.api.status import ServedModelStatus

    values: list[str] = []
    for arg in get_args(ServedModelStatus.model_fields["weight_sync"].annotation):
        values += [v for v in get_args(arg) if isinstance(v, str)]
    return tuple(values)


def reward_bound(config: TrainerConfig) -> float:
    """The largest |reward| the trainer trains on: spec.metric.maxAbsReward for metric-service jobs; for
    client jobs the bound the rollout gateway enforces on the client's rewards (the same default)."""
    from grpo_trainer.advantages import DEFAULT_MAX_ABS_REWARD, MAX_REWARD_BOUND

    if config.metric is None:
        return DEFAULT_MAX_ABS_REWARD
    bound = config.metric.max_abs_reward
    if bound > MAX_REWARD_BOUND:
        # Only a hand-written trainer.json gets here: the API caps spec.metric.maxAbsReward at 1e12.
        raise ConfigError(
            f"metric.maxAbsReward {bound:g} in trainer.json is above {MAX_REWARD_BOUND:g}, the largest bound "
            "under which advantages stay finite in float32; lower it (spec.metric.maxAbsReward allows up to 1e12)"
        )
    return bound


def restore(
    trainer: ProjectGRPOTrainer,
    config: TrainerConfig,
    env: RuntimeEnv,
    workspace: Workspace,
    reporting: Reporting,
) -> int:
    """Restore the project's state from the checkpoint resumed from (the weights, optimizer and data position
    are restored by trainer.train); returns the step resumed at (0: a fresh start)."""
    from grpo_trainer.progress import truncate_jsonl

    resume = workspace.resume
    resumed_step = _checkpoint_step(resume) if resume else 0
    if resume:
        log.info("resuming from %s", resume)
        trainer.restore_grpo_state(resume)
        if env.is_main:
            truncate_jsonl(workspace.output_dir / "metrics.jsonl", resumed_step)
            truncate_jsonl(workspace.output_dir / "samples.jsonl", resumed_step)
            # Environment jobs: the replayed steps' episodes are logged again when they are trained.
            truncate_jsonl(workspace.output_dir / "episodes.jsonl", resumed_step)
        if reporting.metrics is not None:
            # The newest checkpoint is the one resumed from, not "none yet": checkpoint age (dashboard,
            # GRPOJobCheckpointStale) keeps counting across a restart instead of starting from zero.
            reporting.metrics.last_checkpoint_step.set(resumed_step)
            reporting.metrics.last_checkpoint_timestamp.set(
                _checkpoint_time(resume, workspace.checkpoint_dir)
            )
    if reporting.status is not None:
        reporting.status.update({"progress": {"totalSteps": config.grpo.steps}}, force=True)
    return resumed_step


def train(
    trainer: ProjectGRPOTrainer, config: TrainerConfig, workspace: Workspace, resumed_step: int
) -> None:
    """Run the remaining steps (none when the checkpoint resumed from is the final one)."""
    resume = workspace.resume
    if resume and resumed_step >= config.grpo.steps:
        # Killed after the final checkpoint (e.g. while saving the model): the run is complete.
        # transformers' loop would still take one more step past max_steps when resumed there.
        log.info(
            "the checkpoint at step %d already completes the %d steps: saving the final model only",
            resumed_step,
            config.grpo.steps,
        )
        load_checkpoint_weights(trainer, resume)
        trainer.state.global_step = resumed_step
    else:
        trainer.train(resume_from_checkpoint=resume)


def finish(
    trainer: ProjectGRPOTrainer,
    env: RuntimeEnv,
    workspace: Workspace,
    *,
    stopped_by_signal: bool,
    waiting: str = "",
    on_finished: Callable[[int], None] | None = None,
) -> int:
    """The ending of every loop, unless the run failed or was cancelled: stopped by SIGTERM, the checkpoint
    just written is what the next attempt resumes from (``waiting`` says where the signal came); otherwise
    rank 0 saves the final model and then calls ``on_finished`` with the last step. Returns ExitCode.OK."""
    step = int(trainer.state.global_step)
    if stopped_by_signal:
        log.info("stopped by SIGTERM%s after checkpointing step %d", waiting, step)
    elif env.is_main or trainer.is_fsdp_enabled:
        # Gathering sharded weights is a collective: under FSDP every rank takes part, rank 0 writes.
        save_final_model(trainer, workspace, workspace.model_dtype, writer=env.is_main)
        if env.is_main and on_finished is not None:
            on_finished(step)
    return int(ExitCode.OK)


def close_status(reporting: Reporting) -> None:
    """Flush the last status patch and stop the reporter's thread."""
    if reporting.status is not None:
        reporting.status.close()


def save_final_model(
    trainer: ProjectGRPOTrainer, workspace: Workspace, dtype: str, *, writer: bool = True
) -> None:
    """The final model in ``dtype`` (model.dtype), though fp32 master weights trained it: an ordinary Hugging
    Face model directory. A sharded model is gathered one tensor at a time by every rank (``writer``: this
    rank writes); an unsharded one is saved by transformers and cast shard by shard."""
    from grpo_trainer.final_model import cast_saved_model, save_gathered_model

    out = workspace.output_dir / "model"
    if trainer.is_fsdp_enabled:
        size = save_gathered_model(trainer, out, dtype, writer=writer)
    else:
        trainer.save_model(str(out))
        size = cast_saved_model(out, dtype)
    if not writer:
        return
    log.info(
        "training finished: %d steps; final model in %s (%s, %.1f MB)",
        trainer.state.global_step,
        out,
        dtype,
        size / 1e6,
    )


# -- helpers -------------------------------------------------------------------------------------------------


def _checkpoint_time(path: str, checkpoint_dir: Path) -> float:
    """When the checkpoint at ``path`` was published: the manifest's time if it names it, else the
    directory's modification time."""
    from datetime import datetime

    from grpo_trainer.checkpoints import read_manifest

    manifest = read_manifest(checkpoint_dir)
    if manifest is not None and Path(manifest.path).resolve() == Path(path).resolve():
        try:
            return datetime.fromisoformat(manifest.time).timestamp()
        except ValueError:
            pass
    return Path(path).stat().st_mtime


def _checkpoint_step(path: str) -> int:
    import json

    state = json.loads((Path(path) / "trainer_state.json").read_text(encoding="utf-8"))
    return int(state.get("global_step", 0))


def _status_reporter(config: TrainerConfig, namespace: str, name: str) -> Any:
    from grpo_trainer.status import StatusReporter

    if not (os.environ.get("KUBERNETES_SERVICE_HOST") or os.environ.get("KUBECONFIG")):
        log.info("no in-cluster config and no KUBECONFIG: GRPOJob status will not be patched")
        return None
    try:
        return StatusReporter(namespace, name, config.status_patch_interval_seconds, uid=config.job.uid)
    except Exception as exc:  # a missing or broken kubeconfig must not stop training
        log.warning("cannot reach the Kubernetes API (%s): GRPOJob status will not be patched", exc)
        return None
