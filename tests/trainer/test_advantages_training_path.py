"""The seed's worked example through GRPOTrainer's real training step: the advantages that reach the
loss are the project's (population sigma), not TRL's (sample sigma + 1e-4)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from datasets import Dataset
from grpo_trainer.checkpoints import Owner
from grpo_trainer.trainer import ProjectGRPOTrainer
from transformers import AutoTokenizer
from trl.trainer.grpo_config import GRPOConfig

pytestmark = pytest.mark.trainer

SEED_REWARDS = [0.9, 0.6, 0.3, 0.2]
SEED_ADVANTAGES = [1.4606, 0.3651, -0.7303, -1.0954]


class CapturingTrainer(ProjectGRPOTrainer):
    """Records the advantages each optimisation micro-step receives."""

    seen: list[list[float]]

    def compute_loss(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        self.seen.append(inputs["advantages"].tolist())
        return super().compute_loss(model, inputs, *args, **kwargs)


def seed_rewards(prompts: list[Any], completions: list[Any], **_: Any) -> list[float | None]:
    # One group of G=4 per call, in RepeatSampler order: the worked example's rewards.
    rewards: list[float | None] = []
    rewards.extend(SEED_REWARDS * (len(prompts) // 4))
    return rewards


def make_trainer(
    tmp_path: Path, model: Path, reward: Any, scale: str = "group", steps: int = 1
) -> CapturingTrainer:
    tokenizer = AutoTokenizer.from_pretrained(model)
    args = GRPOConfig(
        output_dir=str(tmp_path / "ckpt" / ".partial"),
        num_generations=4,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        max_steps=steps,
        max_completion_length=4,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        disable_tqdm=True,
        model_init_kwargs={"dtype": "float32"},
    )
    trainer = CapturingTrainer(
        model=str(model),
        reward_funcs=[reward],
        args=args,
        train_dataset=Dataset.from_list([{"prompt": "q:"}] * 8),
        processing_class=tokenizer,
        scale_rewards_mode=scale,  # type: ignore[arg-type]
        checkpoint_dir=str(tmp_path / "ckpt"),
        keep_last=1,
        owner=Owner("default", "advantages", None, 0, str(model), "main", None),
    )
    trainer.seen = []
    return trainer


def test_seed_example_reaches_the_loss_with_population_sigma(tmp_path: Path, tiny_model: Path) -> None:
    trainer = make_trainer(tmp_path, tiny_model, seed_rewards)
    trainer.train()
    assert len(trainer.seen) == 1
    # TRL shuffles the generation batch before slicing it into micro-batches: compare as a multiset.
    assert sorted(round(a, 4) for a in trainer.seen[0]) == sorted(SEED_ADVANTAGES)
    # TRL's own formula, (r - mu) / (sample std + 1e-4), would have given +1.2645 to the best answer.
    trl_best = round(0.4 / (math.sqrt(0.3 / 3) + 1e-4), 4)
    assert trl_best == 1.2645 and max(round(a, 4) for a in trainer.seen[0]) == 1.4606
    assert trainer.grpo_step_stats.tied_groups == 0 and trainer.grpo_step_stats.rollouts == 4


def test_tied_group_reaches_the_loss_as_exact_zeros(tmp_path: Path, tiny_model: Path) -> None:
    def tied(prompts: list[Any], completions: list[Any], **_: Any) -> list[float | None]:
        return [0.3] * len(prompts)

    trainer = make_trainer(tmp_path, tiny_model, tied)
    trainer.train()
    assert trainer.seen[0] == [0.0, 0.0, 0.0, 0.0]
    assert trainer.grpo_step_stats.tied_groups == 1 and trainer.grpo_step_stats.zero_std_group_ratio == 1.0


def test_metric_errors_get_zero_advantage_and_leave_the_statistics(tmp_path: Path, tiny_model: Path) -> None:
    def with_error(prompts: list[Any], completions: list[Any], **_: Any) -> list[float | None]:
        return [0.9, None, 0.3, 0.6]

    trainer = make_trainer(tmp_path, tiny_model, with_error, scale="none")
    trainer.train()
    assert sorted(round(a, 4) for a in trainer.seen[0]) == sorted([0.3, 0.0, -0.3, 0.0])
    assert trainer.grpo_step_stats.rollouts == 4


def test_dynamic_sampling_replaces_tied_groups(tmp_path: Path, tiny_model: Path) -> None:
    calls: list[int] = []

    def first_round_tied(prompts: list[Any], completions: list[Any], **_: Any) -> list[float | None]:
        calls.append(len(prompts))
        if len(calls) == 1:
            return [0.5] * len(prompts)  # the first group is tied: it must be dropped and refilled
        return list(SEED_REWARDS)

    trainer = make_trainer(tmp_path, tiny_model, first_round_tied)
    trainer.grpo_dynamic_sampling = True
    from grpo_trainer.trainer import RefillSource

    trainer.grpo_refill = RefillSource(8, seed=0, rank=0)
    trainer.train()
    assert calls == [4, 4]
    assert sorted(round(a, 4) for a in trainer.seen[0]) == sorted(SEED_ADVANTAGES)
    stats = trainer.grpo_step_stats
    assert (stats.tied_groups, stats.refill_rounds, stats.replaced_groups) == (1, 1, 1)
    assert trainer.grpo_refill.state() == {"epoch": 0, "cursor": 1}
