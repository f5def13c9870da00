"""Per-step reporting on rank 0: metrics.jsonl, samples.jsonl, Prometheus, GRPOJob status; validation
runs and SIGTERM handling on every rank (both need collectives, so every rank takes part)."""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from grpo_operator.api.learning_health import describe as describe_learning
from grpo_operator.api.status import CheckpointStatus, ProgressStatus, RewardsStatus, StalenessStatus
from transformers import TrainerCallback

from grpo_trainer.async_generation import RolloutStep
from grpo_trainer.client_rollouts import ClientReward
from grpo_trainer.cost import CostLedger
from grpo_trainer.environment_rollouts import EnvironmentReward
from grpo_trainer.learning_health import LearningMonitor, StepFigures
from grpo_trainer.metric_client import ErrorBudget
from grpo_trainer.prom import TrainerMetrics, finite, logged_fields, set_logged_gauges
from grpo_trainer.reported_components import ComponentNames
from grpo_trainer.reward import MetricReward
from grpo_trainer.sample_context import sample_context
from grpo_trainer.signals import StopFlag
from grpo_trainer.status import StatusReporter
from grpo_trainer.trackers import Trackers, open_trackers
from grpo_trainer.tracking import TrackingPlan
from grpo_trainer.trainer import ProjectGRPOTrainer, StepStats
from grpo_trainer.training_state import TrainingState
from grpo_trainer.trl_adapter import LOG_KEYS, PROJECT_LOG_KEYS, clear_eval_metrics, generate_completions
from grpo_trainer.update_health import StepSignal, UpdateHealth, UpdateReport

log = logging.getLogger("grpo_trainer.progress")

# What _any_rank_stopping agrees on: SIGTERM (checkpoint, exit 0 to be resumed) outranks the learning-health
# stop (checkpoint, exit NOT_LEARNING).
_STOP_SIGNAL = 2
_STOP_NOT_LEARNING = 1

# Groups per step written to samples.jsonl: enough for a person to read, small enough for long runs.
SAMPLE_GROUPS_PER_STEP = 2


def iso_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def truncate_jsonl(path: Path, after_step: int) -> None:
    """On resume, drop records of steps after the checkpoint: they are about to be redone."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if int(json.loads(line).get("step", 0)) <= after_step:
                kept.append(line)
        except (ValueError, AttributeError):
            continue
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")
    tmp.replace(path)


@dataclass
class Validation:
    rows: list[dict[str, Any]]
    every_steps: int
    # Route of the metric service that scores validation answers (spec.grpo.validation.scorePath).
    score_path: str = "/score"
    last_mean: float | None = None
    last_step: int | None = None


@dataclass
class ProgressCallback(TrainerCallback):  # type: ignore[misc]
    reward: MetricReward | ClientReward | EnvironmentReward
    total_steps: int
    output_dir: Path
    stop: StopFlag
    # The metric error budget; None for client rollouts (the client scores, nothing can fail here).
    budget: ErrorBudget | None
    is_main: bool
    metrics: TrainerMetrics | None = None
    status: StatusReporter | None = None
    validation: Validation | None = None
    trainer: ProjectGRPOTrainer | None = None
    stopped_by_signal: bool = False
    _step_started: float = field(default_factory=time.monotonic)
    _last_tokens: float = 0.0
    _last_step_seconds: float = 0.0
    _last_generation_seconds: float = 0.0
    # The generation round the last logged step reported (see on_log).
    _reported: StepStats | None = None
    _components: ComponentNames = field(default_factory=ComponentNames)
    # status.cost (rank 0 only; None elsewhere and without a status to write it to).
    cost: CostLedger | None = None
    _step_metric_started: float = 0.0
    _last_metric_seconds: float = 0.0
    # Asynchronous jobs: what the last step's groups were (async_generation.py).
    _rollout_step: RolloutStep | None = None
    _groups_dropped: int = 0
    # A sample of the weights compared around each optimizer step (update_health.py).
    update_health: UpdateHealth = field(default_factory=UpdateHealth)
    # What this rank holds in parameters, gradients and optimizer state (training_state.py).
    training_state: TrainingState = field(default_factory=TrainingState)
    # Rank 0's diagnosis of whether the run learns (learning_health.py); thresholds from
    # grpo.learningHealth.
    learning: LearningMonitor = field(default_factory=LearningMonitor)
    # Set on rank 0 when stopWhenUnhealthy asks to stop; every rank agrees at the next step's end.
    _stop_not_learning: bool = False
    # The diagnosis the run stopped on (every rank; rank 0's words), for the exit's message.
    not_learning: str | None = None
    # spec.dataset.answerField: the column samples.jsonl shows as each completion's reference answer.
    answer_field: str = "answer"
    # spec.tracking: the trackers rank 0 reports to (None: none), opened when training begins, at the step
    # resumed from.
    tracking: TrackingPlan | None = None
    tracker: Trackers | None = None

    # -- called from inside the generation round (every rank, global numbers) ----------------------------

    def on_scored(self, stats: StepStats) -> None:
        step = self.trainer.state.global_step + 1 if self.trainer is not None else 0
        if self.is_main:
            for skipped in stats.skipped:
                log.warning("step %d: %s: %s", step, self.describe_group(skipped.index), skipped.describe())
        self.check_budgets(stats, step)

    def check_budgets(self, stats: StepStats, step: int) -> None:
        """Hold the step's unscored rollouts against the error budget (raises when it is spent)."""
        if self.budget is None:
            return
        self.budget.record(stats.metric_errors, stats.rollouts)
        self.budget.check(step)

    def describe_group(self, index: int) -> str:
        """How a log line names group ``index`` of the current step."""
        return f"group {index} of the step"

    # -- HF TrainerCallback hooks ----------------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        if self.is_main and self.tracking is not None and self.tracker is None:
            step = int(state.global_step)
            self.tracker = open_trackers(self.tracking, resumed_step=step)
            self.tracker.configuration(self.tracking.configuration, args.to_json_string(), step)

    def on_train_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        if self.tracker is not None:
            self.tracker.close()
            self.tracker = None

    def on_step_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        self._step_started = time.monotonic()
        self._step_metric_started = self.reward_seconds()
        if self.trainer is not None:
            self.trainer.grpo_generation_seconds = 0.0

    def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        self._last_step_seconds = time.monotonic() - self._step_started
        self._last_metric_seconds = self.reward_seconds() - self._step_metric_started
        # Read before validation, which generates too but is not part of the step.
        self._last_generation_seconds = self.trainer.grpo_generation_seconds if self.trainer else 0.0
        if self.is_main and self.trainer is not None and self.trainer.grpo_async is not None:
            self._rollout_step = self.trainer.grpo_async.step_ended(self._step_started)
        stopping = self._any_rank_stopping()
        if stopping == _STOP_SIGNAL:
            log.info("SIGTERM received: saving a checkpoint at step %d and exiting", state.global_step)
            self.stopped_by_signal = True
            control.should_save = True
            control.should_training_stop = True
        elif stopping == _STOP_NOT_LEARNING:
            self.not_learning = self._not_learning_message()
            log.warning(
                "grpo.learningHealth.stopWhenUnhealthy: saving a checkpoint at step %d and stopping: %s",
                state.global_step,
                self.not_learning,
            )
            control.should_save = True
            control.should_training_stop = True
        if state.global_step >= self.total_steps:
            control.should_save = True  # the final step is always checkpointed
        if (
            self.validation
            and self.validation.every_steps
            and (
                state.global_step % self.validation.every_steps == 0 or state.global_step >= self.total_steps
            )
        ):
            self._validate(state.global_step)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.update_health.before_step(kwargs.get("model"))
        self.training_state.before_first_step(kwargs.get("model"))

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        accelerator = self.trainer.accelerator if self.trainer is not None else None
        self.update_health.after_step(bool(accelerator and accelerator.optimizer_step_was_skipped))
        self.training_state.after_first_step(self.trainer.optimizer if self.trainer is not None else None)

    def _any_rank_stopping(self) -> int:
        """0, _STOP_SIGNAL or _STOP_NOT_LEARNING, agreed by every rank (a signal wins)."""
        flag = _STOP_SIGNAL if self.stop.is_set() else (_STOP_NOT_LEARNING if self._stop_not_learning else 0)
        if self.trainer is None or self.trainer.accelerator.num_processes == 1:
            return flag
        # torchrun delivers SIGTERM to every rank, but not at the same instant, and only rank 0 judges the
        # learning health: agree before acting.
        tensor = torch.tensor([flag], device=self.trainer.accelerator.device)
        return int(self.trainer.accelerator.gather(tensor).max().item())

    def _not_learning_message(self) -> str:
        if self.learning.current is None or self.trainer is None:
            return "rank 0 diagnosed that the job is not learning (status.learning has the reason)"
        return describe_learning(self.learning.status_model(self.trainer.state.global_step))

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any
    ) -> None:
        if not self.is_main or not logs or "train_runtime" in logs or self.trainer is None:
            return
        stats = self.trainer.grpo_step_stats
        # With grpo.numIterations > 1 a step can train again on the batch an earlier step generated: it
        # generated and scored nothing, so it counts nothing, and its reward figures are that batch's.
        fresh = stats is not self._reported
        self._reported = stats
        generated = stats if fresh else StepStats()
        origin = self.rollout_fields() if fresh else {}
        step = state.global_step
        record: dict[str, Any] = {
            "step": step,
            "time": iso_now(),
            "reward_mean": finite(stats.rewards_mean),
            "reward_std": finite(stats.rewards_std),
            "format_failure_ratio": stats.format_failure_ratio,
            "zero_std_group_ratio": stats.zero_std_group_ratio,
            "metric_error_ratio": stats.metric_error_ratio,
            "rollouts": generated.rollouts,
            "groups": generated.groups,
            "tied_groups": generated.tied_groups,
            "skipped_groups": generated.skipped_groups,
            "refill_rounds": generated.refill_rounds,
            **logged_fields(logs),
            **origin,
            "step_seconds": round(self._last_step_seconds, 4),
            "generation_seconds": round(self._last_generation_seconds, 4),
            "metric_seconds": round(self.reward_seconds(), 4),
        }
        rollout = self._rollout_step if fresh else None
        if rollout is not None:
            record.update(self._rollout_fields(rollout))
        if torch.cuda.is_available():
            # Peak since the process started, on this rank's GPU: what a memory request must cover.
            record["gpu_memory_peak_bytes"] = int(torch.cuda.max_memory_allocated())
        if self.validation and self.validation.last_step == step:
            record["validation_mean"] = self.validation.last_mean
        components = self._components.reported(stats.components)
        if components:
            record["reward_components"] = components
        updates = self.update_health.judge(step, self._step_signal(args, stats, logs))
        if updates is not None:
            record.update(updates.fields)
        previous = self.learning.current
        diagnosis = self.learning.observe(self._step_figures(step, stats, logs, updates))
        record["learning_health"] = diagnosis.reason
        if self.learning.should_stop():
            self._stop_not_learning = True
        held = self.training_state.take()
        if held is not None:
            record["rank_state_bytes"] = held
        self._append(self.output_dir / "metrics.jsonl", [record])
        samples = self._write_samples(step) if fresh else []
        if self.tracker is not None:
            self.tracker.step(step, record, samples)
        if self.metrics is not None:
            self._export(stats, generated, logs, step)
            if rollout is not None:
                self._export_rollout(rollout)
            else:
                # Sampled by the weights being trained (or by the client through the policy server, which
                # serves them): staleness 0 for every group the step generated.
                for _group in range(generated.groups):
                    self.metrics.rollout_staleness.observe(0)
            self.metrics.client_completions_unmatched.inc(int(origin.get("client_completions_unmatched", 0)))
            for name, mean in components.items():
                self.metrics.set_component(name, mean)
            self.metrics.set_learning_health(diagnosis.reason)
            if updates is not None:
                self.metrics.updated_parameter_fraction.set(updates.sample.fraction)
                if updates.sample.ratio is not None:
                    self.metrics.update_to_weight_ratio.set(updates.sample.ratio)
        if self.cost is not None:
            # Each dynamic-sampling refill round generated and scored a batch as large as the step's.
            made = generated.rollouts * (1 + generated.refill_rounds)
            scored_by_metric = made if isinstance(self.reward, MetricReward) else 0
            generation = self._last_generation_seconds if fresh else 0.0
            training = self._last_step_seconds - generation - self._last_metric_seconds
            self.cost.add_step(made, scored_by_metric, generation, training)
        if self.status is not None:
            body = self._status_body(stats, step, components)
            if self.cost is not None:
                body.update(self.cost.status())
            if rollout is not None:
                body["staleness"] = self._staleness_status(rollout)
            if updates is not None:
                body["updates"] = updates.status
            body["learning"] = self.learning.status(step)
            body.update(self.status_sections() if fresh else {})
            changed = previous is None or previous.reason != diagnosis.reason
            self.status.update(body, force=changed or (updates is not None and updates.changed))

    def on_save(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        if not self.is_main or self.trainer is None or self.trainer.grpo_last_manifest is None:
            return
        manifest = self.trainer.grpo_last_manifest
        if self.metrics is not None:
            self.metrics.last_checkpoint_step.set(manifest.step)
            self.metrics.last_checkpoint_timestamp.set(time.time())
        if self.status is not None:
            checkpoint = CheckpointStatus.model_validate(
                {"lastStep": manifest.step, "path": manifest.path, "time": manifest.time}
            )
            self.status.update(
                {"checkpoint": checkpoint.model_dump(by_alias=True, exclude_none=True, mode="json")},
                force=True,
            )

    # -- helpers -------------------------------------------------------------------------------------------

    def rollout_fields(self) -> dict[str, Any]:
        """metrics.jsonl fields about where the step's rollouts came from (client-rollout jobs add some)."""
        return {}

    def status_sections(self) -> dict[str, Any]:
        """Status sections of the loop's own (environment jobs: episodes), patched with the step's."""
        return {}

    @staticmethod
    def _step_signal(args: Any, stats: StepStats, logs: dict[str, Any]) -> StepSignal:
        """What the step's own figures say about its learning signal (update_health.py)."""
        return StepSignal(
            learning_rate=finite(logs.get(LOG_KEYS["learning_rate"])),
            peak_learning_rate=float(args.learning_rate),
            zero_std_group_ratio=stats.zero_std_group_ratio,
            truncated_ratio=finite(logs.get(LOG_KEYS["truncated_ratio"])),
            mask_truncated=bool(getattr(args, "mask_truncated_completions", False)),
        )

    def _step_figures(
        self,
        step: int,
        stats: StepStats,
        logs: dict[str, Any],
        updates: UpdateReport | None,
    ) -> StepFigures:
        """What learning_health.py judges the step by."""
        args = self.trainer.args if self.trainer is not None else None
        verdict = updates.verdict if updates is not None else None
        validated = self.validation is not None and self.validation.last_step == step
        return StepFigures(
            step=step,
            reward_mean=finite(stats.rewards_mean),
            reward_std=finite(stats.rewards_std),
            reward_max=finite(stats.reward_max),
            reward_min=finite(stats.reward_min),
            tied_ratio=stats.zero_std_group_ratio,
            tied_values=tuple(stats.tied_values),
            truncated_ratio=finite(logs.get(LOG_KEYS["truncated_ratio"])),
            mask_truncated=bool(getattr(args, "mask_truncated_completions", False)),
            metric_error_ratio=stats.metric_error_ratio,
            masked_ratio=finite(logs.get(PROJECT_LOG_KEYS["importance_sampling_masked_ratio"])),
            kl=finite(logs.get(LOG_KEYS["kl"])),
            entropy=finite(logs.get(LOG_KEYS["entropy"])),
            format_failure_ratio=stats.format_failure_ratio,
            validation_mean=self.validation.last_mean if validated and self.validation is not None else None,
            vanishing_cause=verdict.cause if verdict is not None and verdict.vanishing else None,
            learning_rate=finite(logs.get(LOG_KEYS["learning_rate"])),
            updated_fraction=updates.sample.fraction if updates is not None else None,
        )

    def reward_seconds(self) -> float:
        """Cumulative wall time spent waiting for rewards (the metric service's scoring)."""
        if isinstance(self.reward, MetricReward):
            return self.reward.client.stats.seconds_in_score
        return 0.0

    def _status_body(
        self, stats: StepStats, step: int, components: dict[str, float] | None = None
    ) -> dict[str, Any]:
        progress = ProgressStatus.model_validate(
            {
                "step": step,
                "totalSteps": self.total_steps,
                "display": f"{step}/{self.total_steps}",
                "lastStepTime": iso_now(),
                "stepDurationSeconds": round(self._last_step_seconds, 3),
            }
        )
        rewards: dict[str, Any] = {
            "mean": finite(stats.rewards_mean),
            "std": finite(stats.rewards_std),
            "formatFailureRatio": stats.format_failure_ratio,
            "zeroStdGroupRatio": stats.zero_std_group_ratio,
            "metricErrorRatio": stats.metric_error_ratio,
        }
        if self.validation and self.validation.last_step is not None:
            rewards["validationMean"] = self.validation.last_mean
            rewards["validationStep"] = self.validation.last_step
        # Four decimals: `kubectl get grpo` prints the number as stored, and the full float is noise there
        # (metrics.jsonl and Prometheus keep full precision).
        rounded = {k: round(v, 4) if isinstance(v, float) else v for k, v in rewards.items() if v is not None}
        if components:
            rounded["components"] = {name: round(mean, 4) for name, mean in components.items()}
        model = RewardsStatus.model_validate(rounded)
        return {
            "progress": progress.model_dump(by_alias=True, exclude_none=True, mode="json"),
            "rewards": model.model_dump(by_alias=True, exclude_none=True, mode="json"),
        }

    def _export(self, stats: StepStats, generated: StepStats, logs: dict[str, Any], step: int) -> None:
        """Gauges from ``stats`` (the batch the step trained on), counters from ``generated`` (what the step
        generated: nothing when it reused an earlier step's batch)."""
        m = self.metrics
        assert m is not None
        m.step.set(step)
        m.total_steps.set(self.total_steps)
        for gauge, value in ((m.reward_mean, stats.rewards_mean), (m.reward_std, stats.rewards_std)):
            number = finite(value)
            if number is not None:
                gauge.set(number)
        set_logged_gauges(m, logs)
        m.format_failures.inc(generated.format_failures)
        m.metric_errors.inc(generated.metric_errors)
        m.zero_std_groups.inc(generated.tied_groups)
        m.groups_skipped.inc(generated.skipped_groups)
        m.groups.inc(generated.groups)
        m.zero_std_group_ratio.set(stats.zero_std_group_ratio)
        m.rollouts.inc(generated.rollouts)
        tokens = finite(logs.get(LOG_KEYS["tokens"])) or 0.0  # TRL reports a running total
        if tokens > self._last_tokens:
            m.tokens.inc(tokens - self._last_tokens)
            self._last_tokens = tokens
        m.step_duration.observe(self._last_step_seconds)
        m.last_step_timestamp.set(time.time())
        seconds = self.reward_seconds()
        counted = getattr(self, "_metric_seconds_counted", 0.0)
        if seconds > counted:
            m.metric_score_seconds.inc(seconds - counted)
            self._metric_seconds_counted = seconds
        if self.validation and self.validation.last_step == step and self.validation.last_mean is not None:
            m.validation_reward.set(self.validation.last_mean)

    def _rollout_fields(self, rollout: RolloutStep) -> dict[str, Any]:
        """metrics.jsonl fields of an asynchronous job's step (docs/metrics.md)."""
        return {
            "policy_version": rollout.policy_version,
            "staleness": rollout.staleness,
            "groups_dropped": rollout.groups if rollout.dropped else 0,
            "dropped_reason": rollout.dropped,
            "rollout_wait_seconds": round(rollout.waited_seconds, 4),
            "generation_overlap_seconds": round(rollout.overlap_seconds, 4),
            "generation_overlap_ratio": round(self._overlap_ratio(rollout), 4),
            **rollout.sampling_fields(),
        }

    def _overlap_ratio(self, rollout: RolloutStep) -> float:
        seconds = self._last_step_seconds
        return min(1.0, rollout.overlap_seconds / seconds) if seconds > 0 else 0.0

    def _staleness_status(self, rollout: RolloutStep) -> dict[str, Any]:
        self._groups_dropped += rollout.groups if rollout.dropped else 0
        pipeline = self.trainer.grpo_async if self.trainer is not None else None
        model = StalenessStatus.model_validate(
            {
                "maxStaleness": pipeline.max_staleness if pipeline is not None else None,
                "last": rollout.staleness,
                "policyVersion": rollout.policy_version,
                "overlapRatio": round(self._overlap_ratio(rollout), 4),
                "groupsDropped": self._groups_dropped,
            }
        )
        return model.model_dump(by_alias=True, exclude_none=True, mode="json")

    def _export_rollout(self, rollout: RolloutStep) -> None:
        m = self.metrics
        assert m is not None
        for _ in range(rollout.groups):
            m.rollout_staleness.observe(rollout.staleness)
        if rollout.dropped:
            m.groups_dropped(rollout.dropped).inc(rollout.groups)
        m.rollout_wait_seconds.inc(rollout.waited_seconds)
        m.generation_overlap_ratio.set(self._overlap_ratio(rollout))

    def _write_samples(self, step: int) -> list[dict[str, Any]]:
        assert self.trainer is not None
        s = self.trainer.grpo_samples
        limit = SAMPLE_GROUPS_PER_STEP * self.trainer.grpo_group_size
        lines = [
            {
                "step": step,
                "split": "train",
                "prompt": s.prompts[i],
                "completion": s.completions[i],
                "reward": finite(s.rewards[i]) if i < len(s.rewards) else None,
                "advantage": s.advantages[i] if i < len(s.advantages) else None,
                "formatFailure": s.format_failure[i] if i < len(s.format_failure) else False,
                **({"promptIds": s.prompt_ids[i]} if i < len(s.prompt_ids) else {}),
                **({"completionIds": s.completion_ids[i]} if i < len(s.completion_ids) else {}),
                **sample_context(
                    self.answer_field,
                    s.examples[i] if i < len(s.examples) else {},
                    s.finish_reasons[i] if i < len(s.finish_reasons) else None,
                    s.components[i] if i < len(s.components) else None,
                ),
            }
            for i in range(min(limit, len(s.prompts)))
        ]
        self._append(self.output_dir / "samples.jsonl", lines)
        return lines

    @staticmethod
    def _append(path: Path, records: list[dict[str, Any]]) -> None:
        if not records:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as handle:
            for record in records:
                handle.write(json.dumps(record, allow_nan=False) + "\n")

    def _validate(self, step: int) -> None:
        """Score one sampled answer per validation prompt (all ranks generate their shard)."""
        assert self.trainer is not None and self.validation is not None
        assert isinstance(self.reward, MetricReward), "validation is scored by the metric service"
        trainer = self.trainer
        world, rank = trainer.accelerator.num_processes, trainer.accelerator.process_index
        rows = self.validation.rows
        per_rank = math.ceil(len(rows) / world)
        shard = rows[rank::world]
        real = len(shard)
        # Generation is collective in server mode, so every rank sends the same number of prompts.
        shard = shard + [rows[0]] * (per_rank - real)
        prompts = [row["prompt"] for row in shard]
        model = trainer.model
        assert model is not None
        was_training = model.training
        model.eval()
        generation_started = time.monotonic()
        try:
            with torch.no_grad():
                completions, completion_ids = generate_completions(trainer, prompts)
        finally:
            model.train(was_training)
            clear_eval_metrics(trainer)
        if self.cost is not None:
            # Every rank's answers are scored; rank 0's ledger counts them all.
            self.cost.add_validation(len(rows), time.monotonic() - generation_started)
        columns = {key: [row[key] for row in shard] for key in shard[0]} if shard else {}
        columns.pop("prompt", None)
        items = self.reward.build_items(
            prompts, completions, columns, tag=f"v{step}", completion_ids=completion_ids
        )[:real]
        results = self.reward.client.score(items, path=self.validation.score_path)
        rewards = [self.reward.to_reward(r) for r in results]
        scored = [r for r in rewards if r is not None]
        local = torch.tensor(
            [sum(scored), float(len(scored))], dtype=torch.float64, device=trainer.accelerator.device
        )
        total, count = trainer.accelerator.gather(local).view(-1, 2).sum(dim=0).tolist()
        self.validation.last_mean = total / count if count else None
        self.validation.last_step = step
        if self.is_main:
            log.info(
                "validation at step %d: mean reward %s over %d answers",
                step,
                self.validation.last_mean,
                int(count),
            )
            lines = [
                {
                    "step": step,
                    "split": "validation",
                    "prompt": item.prompt,
                    "completion": item.completion,
                    "reward": reward,
                    "advantage": None,
                    "formatFailure": result.kind == "format_failure",
                    **sample_context(self.answer_field, item.example, item.finish_reason, result.components),
                }
                for item, result, reward in zip(items, results, rewards, strict=True)
            ]
            self._append(self.output_dir / "samples.jsonl", lines)
            if self.tracker is not None:
                self.tracker.validation(step, lines)
