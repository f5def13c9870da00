"""Everything the trainer relies on inside TRL's GRPOTrainer (and the transformers Trainer under it) that
is not their public API, in one place, with the versions it was written and checked against.

TRL has no stable extension API for what this project changes (its own advantages, dynamic sampling,
checkpoint publishing, refusing non-finite steps), so ``ProjectGRPOTrainer`` overrides private methods
and reads private results. Each one is recorded here with the parameters TRL gave it and why the trainer
needs it; tests/trainer/test_trl_adapter.py compares the record with the installed TRL and fails, naming
the item, when an upgrade changes any of them. Code outside ``trainer.py`` reaches TRL internals only
through the functions below.

To upgrade TRL: install the new version, run that test, re-read the TRL source behind every item it
names (and the ``why`` of the others), adapt ``trainer.py`` and this module, then set ``WRITTEN_FOR``.
"""

from __future__ import annotations

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
        "groups for new ones row by row (the keys in GENERATION_OUTPUT_KEYS)",
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
)

# Methods called from outside the class (validation, resume); only through the functions below.
CALLED: tuple[Internal, ...] = (
    Internal(
        "_generate",
        ("prompts",),
        "validation generates through TRL's configured backend (vLLM server or transformers); element "
        "GENERATE_COMPLETIONS_INDEX of the returned tuple is the completion texts",
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

# Attributes GRPOTrainer.__init__ sets that the trainer reads: G, the reward functions, per-mode logs, and
# (client rollouts, vLLM server backend) the vLLM generation helper whose client the policy server samples with.
INSTANCE_ATTRIBUTES = ("num_generations", "reward_funcs", "_metrics", "vllm_generation")
# Attribute of TRL's VLLMGeneration (server mode, rank 0) holding its VLLMClient.
VLLM_CLIENT_ATTRIBUTE = "vllm_client"
# Client rollouts go through GRPOTrainer's experimental ``rollout_func`` constructor argument: called in
# _generate on every rank with this rank's prompts and the trainer, after TRL's vLLM weight sync; it must
# return these keys (logprobs may be None: TRL then builds no sampling log-probabilities) and every other
# key is merged into the rows the reward functions receive.
ROLLOUT_FUNC_PARAMETER = "rollout_func"
ROLLOUT_FUNC_KEYS = ("prompt_ids", "completion_ids", "logprobs")
# Source fragments of _generate / _generate_and_score_completions that carry the behaviour above.
ROLLOUT_FUNC_CONTRACT = {
    "_generate": ("self.rollout_func(prompts, self)", "sync_weights()", "extra_fields = {k: v"),
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
}


def staged_checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    """Where transformers' _save_checkpoint has just written the checkpoint of ``step``."""
    return Path(str(output_dir)) / f"{STAGED_CHECKPOINT_PREFIX}-{step}"


def generate_completions(trainer: Any, prompts: list[Any]) -> list[Any]:
    """Completion texts for ``prompts`` from TRL's generation backend (collective in vLLM server mode:
    every rank must call it with the same number of prompts)."""
    return list(trainer._generate(prompts)[GENERATE_COMPLETIONS_INDEX])


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


def vllm_client(trainer: Any) -> Any:
    """TRL's VLLMClient of the job's vLLM server (rank 0, server mode)."""
    return getattr(trainer.vllm_generation, VLLM_CLIENT_ATTRIBUTE)
