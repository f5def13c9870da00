"""TRL's GRPOTrainer with this project's semantics (docs/concepts.md, docs/trainer.md):

* advantages from :func:`grpo_trainer.advantages.compute_advantages` (population sigma, exact zeros for
  tied groups, metric errors excluded) replace TRL's (sample sigma + 1e-4) on every generation round;
* a group holding a reward beyond the reward bound (``max_abs_reward``) is skipped: advantage 0 for all its
  answers, left out of the step's reward statistics and counted (``StepStats.skipped_groups``), so bad data
  neither poisons the step nor fails it, and a replay of the same group after a restart skips it again;
* tied ("no diversity") groups are counted every step and, with ``dynamicSampling``, replaced by freshly
  generated informative groups (DAPO), up to MAX_REFILL_ROUNDS extra generation rounds per step;
* checkpoints are published as ``step-N`` + ``latest.json`` (checkpoints.py) instead of HF's
  ``checkpoint-N`` rotation, stamped with their owner (job, attempt, weights);
* a step whose loss or gradient norm is NaN or infinite, or a checkpoint whose trainable weights are,
  stops training with NonFiniteTraining before anything of it is published.

The TRL and transformers internals these overrides depend on are recorded in trl_adapter.py.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from trl.trainer.grpo_trainer import GRPOTrainer

from grpo_trainer.advantages import (
    DEFAULT_MAX_ABS_REWARD,
    AdvantageResult,
    ScaleRewards,
    compute_advantages,
)
from grpo_trainer.async_generation import AsyncGeneration
from grpo_trainer.checkpoints import GRPO_STATE_FILE, Manifest, Owner, publish
from grpo_trainer.errors import NonFiniteTraining
from grpo_trainer.trl_adapter import PROJECT_LOG_KEYS, staged_checkpoint_dir, vllm_generation_class

log = logging.getLogger("grpo_trainer.trainer")
# Extra generation rounds one step may spend replacing tied groups before training on what it has.
MAX_REFILL_ROUNDS = 4


@dataclass(frozen=True)
class SkippedGroup:
    """A group of the step the trainer did not train on: ``index`` is its place among the step's groups
    (the gateway's order for client jobs), ``reward`` its reward of largest magnitude, ``bound`` the limit."""

    index: int
    reward: float
    bound: float

    @property
    def reason(self) -> str:
        return "reward_out_of_bound"

    def describe(self) -> str:
        # TRL holds rewards in float32: a reward past its range (e.g. 1e308) arrives here as inf.
        value = f"{self.reward!r}" if math.isfinite(self.reward) else "past float32's range (|r| > 3.4e+38)"
        return (
            f"its reward {value} is beyond the reward bound [-{self.bound:g}, {self.bound:g}]; the group "
            "is skipped (advantage 0 for all its answers) and counted in grpo_groups_skipped_total, and the "
            "run goes on. Fix the scorer so that every reward is finite and within the bound"
        )


# TRL's modes of the vLLM importance-sampling correction that zero a weight outside the bounds, rather than
# clamp it.
IS_MASK_MODES = frozenset({"token_mask", "sequence_mask"})


def masked_token_counts(ratio: torch.Tensor, completion_mask: torch.Tensor) -> tuple[int, int]:
    """(completion tokens whose importance weight TRL masked to 0, completion tokens). ``ratio`` is
    (B, T) in the token modes and (B, 1), one weight per completion, in the sequence modes."""
    mask = completion_mask.bool()
    zero = ratio == 0
    masked = zero[:, :1].expand_as(mask) & mask if ratio.shape[1] == 1 else zero & mask
    return int(masked.sum().item()), int(mask.sum().item())


@dataclass
class StepStats:
    """One optimizer step's scoring, over all ranks (filled on every rank; logged by rank 0)."""

    rollouts: int = 0
    rewards_mean: float = float("nan")
    rewards_std: float = float("nan")
    format_failures: int = 0
    metric_errors: int = 0
    groups: int = 0
    tied_groups: int = 0
    # The common reward of each tied group, and the step's extreme rewards (learning_health.py tells
    # groups tied at the best reward, a learned task, from groups tied lower, no signal).
    tied_values: list[float] = field(default_factory=list)
    reward_max: float = float("nan")
    reward_min: float = float("nan")
    refill_rounds: int = 0
    replaced_groups: int = 0
    # Groups left out of training because a reward lies beyond the bound (see SkippedGroup).
    skipped: list[SkippedGroup] = field(default_factory=list)
    # Each named reward component's mean over the scored completions (metrics that send components).
    components: dict[str, float] = field(default_factory=dict)

    @property
    def skipped_groups(self) -> int:
        return len(self.skipped)

    @property
    def format_failure_ratio(self) -> float:
        return self.format_failures / self.rollouts if self.rollouts else 0.0

    @property
    def metric_error_ratio(self) -> float:
        return self.metric_errors / self.rollouts if self.rollouts else 0.0

    @property
    def zero_std_group_ratio(self) -> float:
        return self.tied_groups / self.groups if self.groups else 0.0


@dataclass
class LocalSamples:
    """What this rank trained on in the last generation round, for samples.jsonl."""

    prompts: list[str] = field(default_factory=list)
    completions: list[str] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    advantages: list[float] = field(default_factory=list)
    format_failure: list[bool] = field(default_factory=list)
    # The token ids trained on: the prompt's, and the completion's up to and including its end token.
    prompt_ids: list[list[int]] = field(default_factory=list)
    completion_ids: list[list[int]] = field(default_factory=list)
    # Per completion: its dataset row, why it ended ("stop", "length"; None unknown), its reward's parts.
    examples: list[dict[str, Any]] = field(default_factory=list)
    finish_reasons: list[str | None] = field(default_factory=list)
    components: list[dict[str, float] | None] = field(default_factory=list)


class RefillSource:
    """Seeded, resumable stream of extra prompts for dynamic sampling (separate from the main sampler so
    the main data order is the same with and without it)."""

    def __init__(self, size: int, seed: int, rank: int):
        self.size, self.seed, self.rank = size, seed, rank
        self.epoch = 0
        self.cursor = 0
        self._order = self._permutation()

    def _permutation(self) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed * 1000 + self.rank * 7919 + self.epoch)
        return torch.randperm(self.size, generator=generator).tolist()

    def take(self, count: int) -> list[int]:
        out = []
        for _ in range(count):
            if self.cursor >= self.size:
                self.epoch, self.cursor = self.epoch + 1, 0
                self._order = self._permutation()
            out.append(self._order[self.cursor])
            self.cursor += 1
        return out

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "cursor": self.cursor}

    def restore(self, state: dict[str, int]) -> None:
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
        self._order = self._permutation()


def _unpadded(ids: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
    """Each row's ids where ``mask`` is set (TRL pads prompts on the left and completions on the right)."""
    return [[int(t) for t in row[keep.bool()].tolist()] for row, keep in zip(ids, mask, strict=True)]


def _pad_cat(a: torch.Tensor, b: torch.Tensor, left: bool, value: float) -> torch.Tensor:
    """Concatenate two [n, L] tensors whose L differ, padding the shorter on the given side."""
    length = max(a.shape[1], b.shape[1])

    def pad(t: torch.Tensor) -> torch.Tensor:
        missing = length - t.shape[1]
        if missing == 0:
            return t
        filler = torch.full((t.shape[0], missing, *t.shape[2:]), value, dtype=t.dtype, device=t.device)
        return torch.cat([filler, t] if left else [t, filler], dim=1)

    return torch.cat([pad(a), pad(b)], dim=0)


class ProjectGRPOTrainer(GRPOTrainer):  # type: ignore[misc]
    def __init__(
        self,
        *args: Any,
        scale_rewards_mode: ScaleRewards,
        checkpoint_dir: str,
        keep_last: int,
        owner: Owner,
        dynamic_sampling: bool = False,
        max_abs_reward: float = DEFAULT_MAX_ABS_REWARD,
        on_scored: Callable[[StepStats], None] | None = None,
        pad_token_id: int = 0,
        vllm_generation: type[Any] | None = None,
        max_staleness: int = 0,
        **kwargs: Any,
    ):
        # The vLLM helper with the job's weight transport and the served-model probe (weight_sync.py).
        with vllm_generation_class(vllm_generation):
            super().__init__(*args, **kwargs)
        self.grpo_scale_rewards: ScaleRewards = scale_rewards_mode
        # Enforced on every reward whatever its source (the metric client and the gateway bound them too).
        self.grpo_max_abs_reward = max_abs_reward
        # TRL types num_generations as optional; in training it is always set (GRPOConfig validates G >= 2).
        self.grpo_group_size = int(self.num_generations or 0)
        self.grpo_checkpoint_dir = Path(checkpoint_dir)
        self.grpo_keep_last = keep_last
        self.grpo_owner = owner
        # Set on every rank when a micro-step of the current optimizer step had a non-finite loss.
        self.grpo_step_loss_finite = True
        # Called on rank 0 with a description before NonFiniteTraining is raised (metrics, logs).
        self.grpo_on_non_finite: Callable[[str], None] | None = None
        self.grpo_dynamic_sampling = dynamic_sampling
        self.grpo_on_scored = on_scored
        self.grpo_pad_token_id = pad_token_id
        self.grpo_last_rewards: torch.Tensor | None = None
        self.grpo_last_result: AdvantageResult | None = None
        self.grpo_step_stats = StepStats()
        # Wall time of TRL's generation rounds (the weight sync to vLLM included) since the progress callback
        # last reset it: metrics.jsonl's generation_seconds.
        self.grpo_generation_seconds = 0.0
        self.grpo_samples = LocalSamples()
        self.grpo_last_manifest: Manifest | None = None
        self.grpo_refill: RefillSource | None = None
        self.grpo_current_rows: list[dict[str, Any]] = []
        # Multi-turn episodes, this rank's trained batch row by row: what the loss sees (ids, mask) and where
        # the row was sampled (generation round of the step, 0 unless dynamic sampling refilled; row of it).
        self.grpo_trained_rows: list[tuple[list[int], list[int]]] = []
        self.grpo_trained_sources: list[tuple[int, int]] = []
        # Every rank's rewards of each generation round of the step; the round under way (rollout_func reads it).
        self.grpo_round_rewards: list[list[float]] = []
        self.grpo_round = 0
        # spec.grpo.maxStaleness > 0: generation of the next steps overlaps training (async_generation.py).
        self.grpo_async: AsyncGeneration | None = None
        if max_staleness > 0 and self.use_vllm and self.vllm_mode == "server":
            self.grpo_async = AsyncGeneration(self, max_staleness)
        if dynamic_sampling and self.train_dataset is not None:
            size = len(self.train_dataset)  # type: ignore[arg-type]
            self.grpo_refill = RefillSource(size, self.args.seed, self.accelerator.process_index)

    # -- rewards and advantages ------------------------------------------------------------------------

    def _calculate_rewards(
        self, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any
    ) -> Any:
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        # One reward function (the metric service); NaN marks items it could not score.
        self.grpo_last_rewards = rewards_per_func[:, 0].detach().clone()
        return rewards_per_func

    def _generate(self, prompts: Any) -> Any:
        started = time.monotonic()
        if self.grpo_async is not None and self.rollout_func is not None:
            # Groups or episodes sampled ahead: the weight push of the step (or of the validation that
            # follows it) must wait between the producer's requests, which TRL's own push before
            # rollout_func would not (it then finds the weights pushed and skips).
            self.grpo_async.push_if_due()
        try:
            return super()._generate(prompts)
        finally:
            self.grpo_generation_seconds += time.monotonic() - started

    def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> tuple[list[Any], Any]:
        if self.grpo_async is None or not getattr(self.model, "training", False):
            return super().get_batch_samples(epoch_iterator, num_batches, device)  # type: ignore[no-any-return]
        batch_samples = self.grpo_async.batch_samples(epoch_iterator, num_batches)
        return batch_samples, self._get_num_items_in_batch(batch_samples, device)

    def _score_round(self, inputs: list[dict[str, Any]]) -> tuple[dict[str, Any], AdvantageResult, list[int]]:
        """One generation round through TRL, with our advantages. Returns TRL's output dict (advantages
        replaced), the global result and this rank's [format failures, errors, rollouts] counts."""
        # Environment jobs' rollout_func resets each episode with its dataset row, which TRL does not pass it.
        self.grpo_current_rows = inputs
        self.grpo_round = len(self.grpo_round_rewards)
        output = super()._generate_and_score_completions(inputs)
        self._log_masked_importance_weights(output)
        assert self.grpo_last_rewards is not None
        self.grpo_round_rewards.append([float(r) for r in self.grpo_last_rewards.tolist()])
        group_size = self.grpo_group_size
        result = compute_advantages(
            self.grpo_last_rewards,
            group_size,
            self.grpo_scale_rewards,
            max_abs_reward=self.grpo_max_abs_reward,
        )
        n_local = len(inputs)
        start = self.accelerator.process_index * n_local
        output["advantages"] = result.advantages[start : start + n_local].to(output["advantages"].device)
        self.grpo_last_result = result
        scored = getattr(self.reward_funcs[0], "last", None)
        ff = scored.format_failures if scored is not None else 0
        err = (
            scored.metric_errors
            if scored is not None
            else int(torch.isnan(self.grpo_last_rewards).sum().item())
        )
        return output, result, [ff, err, n_local]

    def _component_means(self) -> dict[str, float]:
        """Each reward component's mean over every rank's scored completions of the last round."""
        scored = getattr(self.reward_funcs[0], "last", None)
        component_totals = getattr(scored, "component_totals", None)
        local = component_totals() if component_totals is not None else {}
        parts = [local]
        if self.accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            parts = gather_object([local])
        merged: dict[str, tuple[float, int]] = {}
        for part in parts:
            for name, (total, count) in part.items():
                old_total, old_count = merged.get(name, (0.0, 0))
                merged[name] = (old_total + total, old_count + count)
        return {name: total / count for name, (total, count) in sorted(merged.items()) if count}

    def _log_masked_importance_weights(self, output: dict[str, Any]) -> None:
        """TRL's mask modes leave tokens out of the loss when their vLLM importance ratio is out of bounds
        but log no count of them: log the share of completion tokens so masked beside TRL's ratio
        statistics, through its own per-step logs."""
        ratio = output.get("importance_sampling_ratio")
        if ratio is None or getattr(self.args, "vllm_importance_sampling_mode", None) not in IS_MASK_MODES:
            return
        masked, total = self._global_counts(list(masked_token_counts(ratio, output["completion_mask"])))
        if total:
            key = PROJECT_LOG_KEYS["importance_sampling_masked_ratio"]
            self._metrics["train"][key].append(masked / total)

    def _global_counts(self, local: list[int]) -> list[int]:
        tensor = torch.tensor(local, dtype=torch.long, device=self.accelerator.device)
        return [int(v) for v in self.accelerator.gather(tensor).view(-1, len(local)).sum(dim=0).tolist()]

    def _record_samples(self, inputs_len: int, output: dict[str, Any], result: AdvantageResult) -> None:
        scored = getattr(self.reward_funcs[0], "last", None)
        if scored is None or not self.accelerator.is_main_process:
            return
        assert self.grpo_last_rewards is not None
        rewards = self.grpo_last_rewards[:inputs_len].tolist()
        self.grpo_samples = LocalSamples(
            prompts=list(scored.prompts),
            completions=list(scored.completions),
            rewards=rewards,
            advantages=output["advantages"].tolist(),
            format_failure=[r.kind == "format_failure" for r in scored.results],
            prompt_ids=_unpadded(output["prompt_ids"], output["prompt_mask"]),
            completion_ids=_unpadded(output["completion_ids"], output["completion_mask"]),
            examples=[item.example for item in getattr(scored, "items", [])],
            finish_reasons=[item.finish_reason for item in getattr(scored, "items", [])],
            components=[dict(r.components) if r.components else None for r in scored.results],
        )

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        if not getattr(self.model, "training", False):
            return super()._generate_and_score_completions(inputs)  # type: ignore[no-any-return]
        self.grpo_round_rewards = []
        self.grpo_trained_sources = [(0, i) for i in range(len(inputs))]
        output, result, local_counts = self._score_round(inputs)
        self._record_samples(len(inputs), output, result)
        ff, err, rollouts = self._global_counts(local_counts)
        rewards = self.grpo_last_rewards
        assert rewards is not None
        # A skipped group's rewards are out of bound: they would make the step's mean meaningless.
        kept = ~result.rejected_groups.repeat_interleave(self.grpo_group_size)
        valid = rewards.cpu()[kept & ~torch.isnan(rewards.cpu())].double()
        stats = StepStats(
            rollouts=rollouts,
            rewards_mean=float(valid.mean()) if valid.numel() else float("nan"),
            rewards_std=float(valid.std(unbiased=False)) if valid.numel() else float("nan"),
            format_failures=ff,
            metric_errors=err,
            groups=int(result.scored_groups.sum()),
            tied_groups=result.num_tied,
            tied_values=[float(v) for v in result.group_mean[result.tied_groups].tolist()],
            reward_max=float(valid.max()) if valid.numel() else float("nan"),
            reward_min=float(valid.min()) if valid.numel() else float("nan"),
            skipped=self._skipped_groups(rewards, result),
            components=self._component_means(),
        )
        if self.grpo_dynamic_sampling and self.grpo_refill is not None:
            output = self._refill_tied_groups(inputs, output, result, stats)
        if "tool_mask" in output:
            # Multi-turn episodes: what the loss sees, per row (the episode log compares it with what was sampled).
            self.grpo_trained_rows = [
                (ids, [int(m) for m in mask.tolist()[: len(ids)]])
                for ids, mask in zip(
                    _unpadded(output["completion_ids"], output["completion_mask"]),
                    output["tool_mask"],
                    strict=True,
                )
            ]
        self.grpo_step_stats = stats
        if self.grpo_on_scored is not None:
            self.grpo_on_scored(stats)
        return output

    def _skipped_groups(self, rewards: torch.Tensor, result: AdvantageResult) -> list[SkippedGroup]:
        if not result.num_rejected:
            return []
        by_group = rewards.detach().double().cpu().view(-1, self.grpo_group_size)
        skipped = []
        for index in result.rejected_groups.nonzero().view(-1).tolist():
            row = by_group[index]
            row = torch.where(torch.isnan(row), torch.zeros_like(row), row)
            skipped.append(SkippedGroup(index, float(row[row.abs().argmax()]), self.grpo_max_abs_reward))
        return skipped

    # -- dynamic sampling --------------------------------------------------------------------------------

    def _refill_tied_groups(
        self, inputs: list[dict[str, Any]], output: dict[str, Any], result: AdvantageResult, stats: StepStats
    ) -> dict[str, Any]:
        """Drop this rank's tied groups and fill their places with informative groups generated from extra
        prompts. Every rank runs the same number of rounds (generation is collective in server mode)."""
        assert self.grpo_refill is not None
        group_size = self.grpo_group_size
        n_local = len(inputs)
        groups_local = n_local // group_size
        first_group = self.accelerator.process_index * groups_local
        tied = result.tied_groups[first_group : first_group + groups_local].tolist()
        keep_rows = [i for i in range(n_local) if not tied[i // group_size]]
        merged = self._select_rows(output, keep_rows)
        sources = [(0, i) for i in keep_rows]
        missing = sum(tied)
        rounds = 0
        while rounds < MAX_REFILL_ROUNDS:
            if max(self._global_counts([missing])) == 0:
                break
            rounds += 1
            indices = self.grpo_refill.take(groups_local)
            assert self.train_dataset is not None
            extra_inputs = [dict(self.train_dataset[i]) for i in indices for _ in range(group_size)]
            extra_out, extra_result, _ = self._score_round(extra_inputs)
            extra_tied = extra_result.tied_groups[first_group : first_group + groups_local].tolist()
            extra_rejected = extra_result.rejected_groups[first_group : first_group + groups_local].tolist()
            take = [g for g, t in enumerate(extra_tied) if not t and not extra_rejected[g]][:missing]
            rows = [g * group_size + j for g in take for j in range(group_size)]
            if rows:
                merged = self._concat(merged, self._select_rows(extra_out, rows))
                sources += [(rounds, i) for i in rows]
                missing -= len(take)
        stats.refill_rounds = rounds
        replaced = self._global_counts([sum(tied) - missing])[0]
        stats.replaced_groups = replaced
        if missing:
            # Out of rounds: train on the tied groups we still need (advantage 0, so they only dilute).
            fill = [i for i in range(n_local) if tied[i // group_size]][: missing * group_size]
            merged = self._concat(merged, self._select_rows(output, fill))
            sources += [(0, i) for i in fill]
        self.grpo_trained_sources = sources
        mask = merged["completion_mask"]
        merged["num_items_in_batch"] = self.accelerator.gather(mask.sum()).sum()
        return merged

    @staticmethod
    def _select_rows(batch: dict[str, Any], rows: list[int]) -> dict[str, Any]:
        index = torch.tensor(rows, dtype=torch.long)
        out: dict[str, Any] = {}
        for key, value in batch.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                out[key] = value.index_select(0, index.to(value.device))
            else:
                out[key] = value
        return out

    def _concat(self, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in a.items():
            other = b.get(key)
            if not isinstance(value, torch.Tensor) or value.dim() == 0 or not isinstance(other, torch.Tensor):
                out[key] = value
            elif value.dim() == 1 or value.shape[1:] == other.shape[1:]:
                out[key] = torch.cat([value, other], dim=0)
            elif key == "prompt_ids":
                out[key] = _pad_cat(value, other, left=True, value=self.grpo_pad_token_id)
            elif key == "prompt_mask":
                out[key] = _pad_cat(value, other, left=True, value=0)
            elif key == "completion_ids":
                out[key] = _pad_cat(value, other, left=False, value=self.grpo_pad_token_id)
            else:  # completion-aligned masks and per-token log-probs: right padding, masked out anyway
                out[key] = _pad_cat(value, other, left=False, value=0)
        return out

    # -- non-finite guard --------------------------------------------------------------------------------

    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
        loss: torch.Tensor = super().training_step(model, inputs, num_items_in_batch)  # type: ignore[no-untyped-call]
        # transformers' logging_nan_inf_filter hides a NaN loss in the logged average: look at each one.
        if not bool(torch.isfinite(loss.detach()).all()):
            self.grpo_step_loss_finite = False
        return loss

    def _any_rank(self, flag: bool) -> bool:
        if self.accelerator.num_processes == 1:
            return flag
        tensor = torch.tensor([1 if flag else 0], device=self.accelerator.device)
        return bool(self.accelerator.gather(tensor).max().item())

    def _trainable_weights_finite(self) -> bool:
        model = self.model
        assert model is not None
        finite = all(bool(torch.isfinite(p.detach()).all()) for p in model.parameters() if p.requires_grad)
        return not self._any_rank(not finite)

    def _non_finite(self, what: str) -> None:
        step = self.state.global_step
        message = (
            f"step {step}: {what}; nothing from this step is published and the last good checkpoint is kept. "
            "Lower grpo.learningRate, check the metric's rewards (finite, sensible scale) or use "
            "scaleRewards: group; the restart resumes from the last good checkpoint"
        )
        if self.accelerator.is_main_process and self.grpo_on_non_finite is not None:
            self.grpo_on_non_finite(message)
        raise NonFiniteTraining(message)

    def _maybe_log_save_evaluate(self, tr_loss: Any, grad_norm: Any, *args: Any, **kwargs: Any) -> None:
        """Runs after every optimizer step, before its logs and its checkpoint: refuse a non-finite step."""
        loss_finite = not self._any_rank(not self.grpo_step_loss_finite)
        self.grpo_step_loss_finite = True
        norm = float(grad_norm.item() if isinstance(grad_norm, torch.Tensor) else grad_norm or 0.0)
        # With fp16 mixed precision the GradScaler skips a step with inf/NaN gradients (and lowers its scale):
        # the weights did not move, which is the scaler working, not divergence.
        skipped = bool(self.accelerator.optimizer_step_was_skipped)
        if not loss_finite:
            self._non_finite("the loss is not finite")
        if not math.isfinite(norm) and not skipped:
            self._non_finite(f"the gradient norm is {norm} and the optimizer applied it")
        if self.control.should_save and not self._trainable_weights_finite():
            self._non_finite("the weights are not finite")
        super()._maybe_log_save_evaluate(tr_loss, grad_norm, *args, **kwargs)

    # -- checkpoints ---------------------------------------------------------------------------------------

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)  # type: ignore[no-untyped-call]
        step = self.state.global_step
        staged = staged_checkpoint_dir(str(self.args.output_dir), step)
        if self.accelerator.is_main_process:
            extra = {
                "step": step,
                "refill": self.grpo_refill.state() if self.grpo_refill else None,
                "owner": self.grpo_owner.to_json(),
            }
            (staged / GRPO_STATE_FILE).write_text(json.dumps(extra), encoding="utf-8")
        # Every rank has written its RNG state and shards before rank 0 publishes the directory.
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            self.grpo_last_manifest = publish(
                staged, self.grpo_checkpoint_dir, step, self.grpo_keep_last, self.grpo_owner
            )
            if self.grpo_last_manifest is not None:
                log.info("checkpoint step %d published at %s", step, self.grpo_last_manifest.path)
        self.accelerator.wait_for_everyone()

    def restore_grpo_state(self, checkpoint: str) -> None:
        path = Path(checkpoint) / GRPO_STATE_FILE
        if path.is_file() and self.grpo_refill is not None:
            state = json.loads(path.read_text(encoding="utf-8"))
            if state.get("refill"):
                self.grpo_refill.restore(state["refill"])
