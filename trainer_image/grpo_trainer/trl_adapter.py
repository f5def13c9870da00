"""Everything the trainer relies on inside TRL's GRPOTrainer (and the transformers Trainer under it) that
is not their public API, in one place, with the versions it was written and checked against.

TRL has no stable extension API for what this project changes (its own advantages, dynamic sampling,
checkpoint publishing, refusing non-finite steps), so ``ProjectGRPOTrainer`` overrides private methods
and reads private results. Each one is recorded here with the parameters TRL gave it and why the trainer
needs it; tests/trainer/test_trl_adapter.py compares the record with the installed TRL and fails, naming
the item, when an upgrade changes any of them. Code outside ``trainer.py`` reaches TRL internals only
through the functions below. Where a job's completions come from (single-turn sampling from the vLLM
servers, episodes, a client's groups) is not among them: each enters through TRL's public ``rollout_func``
hook (single_turn.py), whose contract is recorded here too.

To upgrade TRL: install the new version, run that test, re-read the TRL source behind every item it
names (and the ``why`` of the others), adapt ``trainer.py`` and this module, then set ``WRITTEN_FOR``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The versions the overrides below were written against and tested with (pyproject.toml pins them).
WRITTEN_FOR = {"trl": "1.16.0", "transformers": "5.17.0"}


@dataclass(frozen=True)
class Internal:
    """A private method of TRL's GRPOTrainer or transformers' Trainer the trainer overrides or calls."""

    name: str
    # The leading parameters (after self) the trainer passes or receives, in TRL's order.
    parameters: tuple[str, ...]
    why: str


# Methods ProjectGRPOTrainer overrides; each override calls the original and changes what it returns.
OVERRIDDEN: tuple[Internal, ...] = (
    Internal(
        "_calculate_rewards",
        ("inputs", "prompts", "completions", "completion_ids_list"),
        "keeps column 0 of the [completions, reward functions] tensor: the metric's rewards, NaN where unscored",
    ),
    Internal(
        "_generate_and_score_completions",
        ("inputs",),
        "replaces output['advantages'] with the project's advantages and, with dynamicSampling, swaps tied "
        "groups for new ones row by row (the keys in GENERATION_OUTPUT_KEYS); TRL calls it once per "
        "generated batch, every num_iterations optimizer steps, which is how progress.py tells a step "
        "that generated from one that reuses the buffered batch",
    ),
    Internal(
        "_generate",
        ("prompts",),
        "times every generation round (the weight sync to vLLM included): metrics.jsonl generation_seconds; "
        "with groups or episodes sampled ahead (a rollout_func and maxStaleness) it pushes the step's weights "
        "first, between the producer's runs, so that TRL's own push before rollout_func (when "
        "_last_loaded_step lags global_step) finds them pushed",
    ),
    Internal(
        "training_step",
        ("model", "inputs", "num_items_in_batch"),
        "sees every micro-step's loss: transformers' logging averages a NaN away",
    ),
    Internal(
        "_maybe_log_save_evaluate",
        ("tr_loss", "grad_norm", "model", "trial", "epoch", "ignore_keys_for_eval", "start_time"),
        "runs after each optimizer step and before its logs and checkpoint: a non-finite step is refused here",
    ),
    Internal(
        "_save_checkpoint",
        ("model", "trial"),
        "writes into <output_dir>/checkpoint-<step> (STAGED_CHECKPOINT_PREFIX), then the trainer publishes it",
    ),
    Internal(
        "get_batch_samples",
        ("epoch_iterator", "num_batches", "device"),
        "transformers' Trainer reads each optimizer step's batches through it: asynchronous jobs read up to "
        "maxStaleness steps ahead from the same iterator (async_generation.py), and count the step's items "
        "with _get_num_items_in_batch as the original does",
    ),
)

# Methods called from outside the class (validation, resume); only through the functions below.
CALLED: tuple[Internal, ...] = (
    Internal(
        "_generate",
        ("prompts",),
        "validation generates through TRL's configured backend (the rollout_func of vLLM server jobs, a "
        "colocated engine or transformers); element "
        "GENERATE_COMPLETIONS_INDEX of the returned tuple is the completion texts, element "
        "GENERATE_COMPLETION_IDS_INDEX their token ids",
    ),
    Internal(
        "_get_num_items_in_batch",
        ("batch_samples", "device"),
        "what get_batch_samples returns beside the batches, kept for the batches read ahead",
    ),
    Internal(
        "_load_from_checkpoint",
        ("resume_from_checkpoint",),
        "a run killed after its final checkpoint loads the weights without taking another step; a client-rollout "
        "run loads the resumed weights before its policy server answers",
    ),
    Internal(
        "_save_checkpoint",
        ("model", "trial"),
        "a client's terminate ends training between two steps, outside transformers' loop: the final "
        "checkpoint is written (and published by the override) by calling it directly",
    ),
)

# Attributes GRPOTrainer.__init__ sets that the trainer reads: G, the reward functions, per-mode logs,
# (client rollouts, vLLM server backend) the vLLM generation helper whose client the policy server samples
# with, and the end-of-sequence ids TRL tells a truncated completion by (the metric's finishReason).
INSTANCE_ATTRIBUTES = (
    "num_generations",
    "reward_funcs",
    "_metrics",
    "vllm_generation",
    "eos_token_ids",
    # Asynchronous jobs: the step whose weights vLLM was last given (set to -1 in __init__).
    "_last_loaded_step",
    # The project's rollout_func (single-turn sampling from vLLM servers, episodes, client rollouts); None
    # when TRL samples in the training processes itself (colocated engine, transformers).
    "rollout_func",
    # single_turn.py: validation's answers per prompt, and the chat-template arguments TRL tokenizes with.
    "num_generations_eval",
    "chat_template_kwargs",
)
# Attribute of TRL's VLLMGeneration (server mode, rank 0) holding its VLLMClient.
VLLM_CLIENT_ATTRIBUTE = "vllm_client"
# GRPOTrainer.__init__ builds its vLLM helper from this name of its module (trl.trainer.grpo_trainer), with
# no constructor argument to pass another class; the weight sync (weight_sync.py) subclasses it, overriding
# these methods and reading these attributes TRL's own constructor sets.
VLLM_GENERATION_MODULE = "trl.trainer.grpo_trainer"
VLLM_GENERATION_NAME = "VLLMGeneration"
# Both subclasses (served_generation.generation_class for server mode, colocate.generation_class for colocate mode)
# override these, calling the original in _init_vllm; the colocate sync replaces TRL's (see below);
# _iter_named_params yields TRL's tensors cast to the served dtype (weight_sync.served_tensors), so every
# sync, and the metadata TRL reads from the same iteration, carries 16-bit tensors of fp32 masters.
VLLM_GENERATION_OVERRIDDEN = ("_init_vllm", "sync_weights", "_iter_named_params")
# VLLMGeneration methods the subclasses call: the (name, tensor) pairs in vLLM's names, PEFT adapters merged
# while the iteration runs and unmerged in place once it ends, gathered under FSDP / ZeRO-3 (collective).
VLLM_GENERATION_CALLED = ("_iter_named_params",)
# VLLMGeneration.generate's sampling parameters in server mode, read by async_generation.sampling_params so
# that groups sampled ahead are sampled as the step itself would be.
VLLM_SAMPLING_ATTRIBUTES = (
    "repetition_penalty",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_completion_length",
    "logprobs",
    "structured_outputs_regex",
    "generation_kwargs",
)
VLLM_GENERATION_ATTRIBUTES = (
    "mode",
    "model",
    "accelerator",
    "server_base_url",
    "server_host",
    "server_port",
    "server_timeout",
)
# Colocate mode (generation.backend vllm-colocate): VLLMGeneration attributes colocate.generation_class reads.
# ``llm`` is the vllm.LLM engine _init_vllm builds in the training process.
VLLM_COLOCATE_ATTRIBUTES = ("llm", "enable_sleep_mode", "gpu_memory_utilization")
# VLLMGeneration._init_vllm builds the colocated engine by calling this name of this module (vllm.LLM) with
# no dtype (vLLM's "auto" serves a float32 checkpoint in 16 bits); colocate.engine_dtype rebinds it for the
# call so that the engine serves trainer.json's model.dtype, as a vLLM server started with --dtype does.
VLLM_ENGINE_MODULE = "trl.generation.vllm_generation"
VLLM_ENGINE_NAME = "LLM"
# TRL's colocate sync_weights loads each tensor through this path from the engine to vLLM's model runner and
# then into ``model.load_weights``, which vLLM's CPU build refuses after the first load; the override takes
# the same path to the runner and calls its ``reload_weights`` (checkpoint format) instead, then the engine's
# reset_prefix_cache as TRL does.
VLLM_COLOCATE_RUNNER_PATH = ("llm_engine", "model_executor", "driver_worker", "model_runner")
VLLM_COLOCATE_SYNC_CONTRACT = (
    "self.llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights(",
    "self.llm.reset_prefix_cache()",
)
# VLLMClient attributes and methods the volume transport's client sets up or relies on (its constructor
# is not run: it refuses to start without the vllm package).
VLLM_CLIENT_ATTRIBUTES = ("session", "base_url", "model", "_updating_weights", "communicator")
VLLM_CLIENT_METHODS = ("check_server", "_get", "generate", "get_server_info", "reset_prefix_cache")
# Client rollouts go through GRPOTrainer's experimental ``rollout_func`` constructor argument: called in
# _generate on every rank with this rank's prompts and the trainer, after TRL's vLLM weight sync; it must
# return these keys (logprobs may be None: TRL then builds no sampling log-probabilities) and every other
# key is merged into the rows the reward functions receive.
ROLLOUT_FUNC_PARAMETER = "rollout_func"
ROLLOUT_FUNC_KEYS = ("prompt_ids", "completion_ids", "logprobs")
# Source fragments of _generate / _generate_and_score_completions that carry the behaviour above.
# Environment jobs return ``env_mask`` too (1 on the model's tokens, 0 on the environment's), which TRL pops
# from the extra fields and multiplies into the loss mask as it does its own tool mask.
ROLLOUT_FUNC_CONTRACT = {
    "_generate": (
        "self.rollout_func(prompts, self)",
        "sync_weights()",
        "extra_fields = {k: v",
        'tool_mask = extra_fields.pop("env_mask", None)',
    ),
    "_generate_and_score_completions": (
        "if sampling_per_token_logps_list is not None",
        "inp[key] = values[i]",
    ),
}
# Keys of the dict _generate_and_score_completions returns that the trainer reads, replaces or pads.
GENERATION_OUTPUT_KEYS = (
    "prompt_ids",
    "prompt_mask",
    "completion_ids",
    "completion_mask",
    "advantages",
    "num_items_in_batch",
)
GENERATE_COMPLETIONS_INDEX = 3
GENERATE_COMPLETION_IDS_INDEX = 1
# transformers' checkpoint directory name, "<prefix>-<step>" (PREFIX_CHECKPOINT_DIR).
STAGED_CHECKPOINT_PREFIX = "checkpoint"
# Keys of the logs TRL hands to callbacks every step, by what the trainer exports them as.
LOG_KEYS = {
    "loss": "loss",
    "kl": "kl",
    "clip_ratio": "clip_ratio/region_mean",
    "completion_length": "completions/mean_length",
    "learning_rate": "learning_rate",
    # A running total of prompt and completion tokens, not a per-step count.
    "tokens": "num_tokens",
    "clip_ratio_low": "clip_ratio/low_mean",
    "clip_ratio_high": "clip_ratio/high_mean",
    "entropy": "entropy",
    # Completions whose last token is neither EOS nor pad: cut off at max_completion_length.
    "truncated_ratio": "completions/clipped_ratio",
    # Only while the vLLM importance-sampling correction is on (server generation).
    "importance_sampling_ratio_mean": "sampling/importance_sampling_ratio/mean",
    "importance_sampling_ratio_min": "sampling/importance_sampling_ratio/min",
    "importance_sampling_ratio_max": "sampling/importance_sampling_ratio/max",
}
# Keys the project adds to TRL's per-step logs itself (trainer.py appends them to the instance's _metrics,
# so TRL averages and logs them with its own); not checked against TRL's source.
PROJECT_LOG_KEYS = {
    "importance_sampling_masked_ratio": "sampling/importance_sampling_masked_ratio",
}


# accelerate 1.15 makes DistributedType.FSDP of an fsdp_plugin only on accelerator process groups (CUDA, XPU,
# NPU, ...): a CPU process group (gloo, DistributedType.MULTI_CPU) is wrapped in DDP whatever plugin it is
# given. FSDP2 itself shards on a CPU device mesh over gloo, so allow_fsdp_on_cpu() lets accelerate take its
# FSDP path there, and sharded training is tested where there is no GPU. These fragments of
# AcceleratorState.__init__ are what it repeats for a CPU group (the branch a GPU group takes); the test
# fails when accelerate changes them.
ACCELERATE_FSDP_STATE_CONTRACT = (
    "self.distributed_type = DistributedType.FSDP",
    'if self._mixed_precision != "no" and fsdp_plugin is not None:',
    "fsdp_plugin.set_mixed_precision(self._mixed_precision)",
    "self.fsdp_plugin = fsdp_plugin",
)


def allow_fsdp_on_cpu() -> None:
    """Process-wide and idempotent: an AcceleratorState given an FSDP plugin on a CPU process group becomes
    an FSDP one, as it would on GPUs (ACCELERATE_FSDP_STATE_CONTRACT). Called before the trainer builds its
    Accelerator, only for sharded jobs without CUDA."""
    import accelerate.state as accelerate_state
    from accelerate.utils import DistributedType

    state_class: Any = accelerate_state.AcceleratorState
    if getattr(state_class, "_grpo_fsdp_on_cpu", False):
        return
    original = state_class.__init__

    def init(self: Any, *args: Any, fsdp_plugin: Any = None, **kwargs: Any) -> None:
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        plugin = fsdp_plugin if fsdp_plugin is not None else getattr(self, "fsdp_plugin", None)
        if plugin is None or self.distributed_type != DistributedType.MULTI_CPU:
            return
        if fsdp_plugin is not None and self._mixed_precision != "no":
            fsdp_plugin.set_mixed_precision(self._mixed_precision)
        self.distributed_type = DistributedType.FSDP
        self.fsdp_plugin = plugin

    state_class.__init__ = init
    state_class._grpo_fsdp_on_cpu = True


def completion_end_token_ids(trainer: Any, pad_token_id: int | None) -> frozenset[int]:
    """The token ids TRL counts as a completion's own end (``eos_and_pad`` in GRPOTrainer): the model's
    end-of-sequence ids and the pad token."""
    ids = {int(i) for i in trainer.eos_token_ids if i is not None}
    if pad_token_id is not None:
        ids.add(int(pad_token_id))
    return frozenset(ids)


def staged_checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    """Where transformers' _save_checkpoint has just written the checkpoint of ``step``."""
    return Path(str(output_dir)) / f"{STAGED_CHECKPOINT_PREFIX}-{step}"


def generate_completions(trainer: Any, prompts: list[Any]) -> tuple[list[Any], list[list[int]]]:
    """Completion texts for ``prompts`` from TRL's generation backend, and their token ids (collective in
    vLLM server mode: every rank must call it with the same number of prompts)."""
    generated = trainer._generate(prompts)
    ids = [list(map(int, row)) for row in generated[GENERATE_COMPLETION_IDS_INDEX]]
    return list(generated[GENERATE_COMPLETIONS_INDEX]), ids


def clear_eval_metrics(trainer: Any) -> None:
    """Forget what generation logged under "eval", so validation does not leak into TRL's logs."""
    trainer._metrics["eval"].clear()


def load_checkpoint_weights(trainer: Any, checkpoint: str) -> None:
    """Load a checkpoint's weights into the trainer's model without training."""
    trainer._load_from_checkpoint(checkpoint)


def save_checkpoint_now(trainer: Any) -> None:
    """Write (and, through ProjectGRPOTrainer's override, publish) a checkpoint of the current step outside
    transformers' loop; collective: every rank calls it."""
    trainer._save_checkpoint(trainer.model, None)


@contextmanager
def vllm_generation_class(cls: type[Any] | None) -> Iterator[None]:
    """While GRPOTrainer.__init__ runs inside this block, it builds ``cls`` as its vLLM helper (None: TRL's)."""
    import importlib

    if cls is None:
        yield
        return
    module = importlib.import_module(VLLM_GENERATION_MODULE)
    original = getattr(module, VLLM_GENERATION_NAME)
    setattr(module, VLLM_GENERATION_NAME, cls)
    try:
        yield
    finally:
        setattr(module, VLLM_GENERATION_NAME, original)


def vllm_client(trainer: Any) -> Any:
    """TRL's VLLMClient of the job's vLLM server (rank 0, server mode)."""
    return getattr(trainer.vllm_generation, VLLM_CLIENT_ATTRIBUTE)
