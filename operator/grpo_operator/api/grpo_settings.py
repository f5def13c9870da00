"""Where each GRPO setting goes: every field of spec.grpo, once, with the TRL GRPOConfig field it becomes or
the part of the trainer that uses it instead.

The trainer builds its GRPOConfig keyword arguments from this table (grpo_trainer/grpo_config.py), the TRL
name map users see (advice.TRL_NAMES, docs/coming-from-trl.md, `kubectl grpo check`) takes its GRPO rows from
it, and tests/unit/test_grpo_settings.py fails when a field of GRPOSpec has no row here, so a new knob cannot
be accepted by the API and silently ignored by the trainer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from grpo_operator.api.grpo_spec import GRPOSpec

# always: passed to TRL with the spec's value (its default included). when_set: passed only when the spec
# (or its preset) sets it, so unset means TRL's own default. own: the trainer's, never given to TRL.
Passing = Literal["always", "when_set", "own"]


@dataclass(frozen=True)
class GrpoSetting:
    field: str  # GRPOSpec's Python name
    passing: Passing
    trl: tuple[str, ...] = ()  # the GRPOConfig fields it becomes
    # What users may know it as in TRL besides ``trl`` (a deprecated name), for the name map only.
    trl_aliases: tuple[str, ...] = ()
    # own: where the trainer uses it, in words; others: anything a reader must know.
    note: str = ""
    # The value TRL gets, when it is not the field's own value.
    value: Callable[[GRPOSpec], Any] | None = None

    def value_of(self, grpo: GRPOSpec) -> Any:
        return self.value(grpo) if self.value is not None else getattr(grpo, self.field)


GRPO_SETTINGS: tuple[GrpoSetting, ...] = (
    GrpoSetting("group_size", "always", ("num_generations",)),
    GrpoSetting(
        "prompts_per_step",
        "own",
        note="B: with groupSize and the trainer's GPUs it sets TRL's per_device_train_batch_size and "
        "gradient_accumulation_steps (grpo_config.plan_batches)",
    ),
    GrpoSetting("steps", "always", ("max_steps",)),
    GrpoSetting("preset", "own", note="resolved into the knobs it sets when trainer.json is built"),
    GrpoSetting("learning_rate", "always", ("learning_rate",)),
    GrpoSetting("temperature", "always", ("temperature",)),
    GrpoSetting("top_p", "always", ("top_p",)),
    GrpoSetting("top_k", "when_set", ("top_k",)),
    GrpoSetting("min_p", "when_set", ("min_p",)),
    GrpoSetting("repetition_penalty", "when_set", ("repetition_penalty",)),
    GrpoSetting(
        "chat_template_kwargs",
        "when_set",
        ("chat_template_kwargs",),
        note='"true"/"false" become booleans',
        value=lambda g: g.chat_template_arguments() or None,
    ),
    GrpoSetting(
        "max_prompt_length",
        "own",
        note="TRL 1.16 has none: the trainer truncates prompts to it when it prepares the dataset (data.prepare)",
    ),
    GrpoSetting("max_completion_length", "always", ("max_completion_length",)),
    GrpoSetting("beta", "always", ("beta",)),
    GrpoSetting("epsilon", "always", ("epsilon",)),
    GrpoSetting("epsilon_high", "always", ("epsilon_high",)),
    GrpoSetting("loss_type", "always", ("loss_type",)),
    GrpoSetting("importance_sampling_level", "when_set", ("importance_sampling_level",)),
    GrpoSetting("num_iterations", "when_set", ("num_iterations",)),
    GrpoSetting(
        "max_staleness",
        "own",
        note="η of asynchronous rollouts: how many policy versions a group may lag (async_generation)",
    ),
    GrpoSetting("mask_truncated_completions", "when_set", ("mask_truncated_completions",)),
    GrpoSetting(
        "scale_rewards",
        "always",
        ("scale_rewards",),
        note="the trainer computes the advantages itself (advantages.py); TRL's copy is kept consistent",
    ),
    GrpoSetting(
        "format_failure_score", "own", note="the reward of a completion the metric marks as a format failure"
    ),
    GrpoSetting("failure_score", "own", note="the reward of a rollout the metric could not score"),
    GrpoSetting(
        "dynamic_sampling",
        "own",
        note="tied groups (no signal) are refilled with fresh prompts within the step, as DAPO does (trainer.py)",
    ),
    GrpoSetting("vllm_importance_sampling_correction", "when_set", ("vllm_importance_sampling_correction",)),
    GrpoSetting("vllm_importance_sampling_mode", "when_set", ("vllm_importance_sampling_mode",)),
    GrpoSetting(
        "vllm_importance_sampling_cap",
        "when_set",
        ("vllm_importance_sampling_clip_max",),
        trl_aliases=("vllm_importance_sampling_cap",),
        note="TRL 1.16 deprecates vllm_importance_sampling_cap for vllm_importance_sampling_clip_max",
    ),
    GrpoSetting("seed", "always", ("seed", "data_seed")),
    GrpoSetting("lora", "own", note="the PEFT LoRA adapter the trainer builds (peft_config of GRPOTrainer)"),
    GrpoSetting(
        "validation",
        "own",
        note="held-out prompts the trainer samples and scores itself every everySteps (ProgressCallback._validate)",
    ),
    GrpoSetting(
        "learning_health", "own", note="the trainer's learning-health diagnosis thresholds (learning_health)"
    ),
)


def trl_kwargs(grpo: GRPOSpec) -> dict[str, Any]:
    """The GRPOConfig keyword arguments spec.grpo sets by itself (batch sizes and the rest come from the
    trainer's plan)."""
    kwargs: dict[str, Any] = {}
    for setting in GRPO_SETTINGS:
        if setting.passing == "own":
            continue
        value = setting.value_of(grpo)
        if setting.passing == "always" or value is not None:
            kwargs.update(dict.fromkeys(setting.trl, value))
    return kwargs


def trl_names() -> dict[str, str]:
    """TRL's name of each GRPO setting TRL has, with the GRPOJob field it is."""
    from grpo_operator.api.compat import wire_name

    return {
        name: f"spec.grpo.{wire_name(s.field)}" for s in GRPO_SETTINGS for name in (*s.trl, *s.trl_aliases)
    }
