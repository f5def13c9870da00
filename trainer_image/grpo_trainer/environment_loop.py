"""The environment loop (trainer.json ``environment`` and ``dataset`` set): each prompt's G episodes run
against the job's environment service through the job's vLLM server (episodes.py), enter TRL through its
rollout_func (environment_rollouts.py), and the environment's rewards train the policy. The shared steps
are in steps.py.

Rank 0 also keeps ``<outputDir>/episodes.jsonl``: per step, each episode's turns (the token ids vLLM
sampled and their log-probabilities, the action, the observation and the tokens it added) next to the
completion the loss saw and its mask, so what was trained can be checked against what was sampled.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_operator.api.learning_health import Thresholds
from grpo_operator.api.status import EpisodesStatus
from grpo_operator.api.trainer_config import TrainerConfig

from grpo_trainer.async_generation import without_prompt
from grpo_trainer.environment_client import healthy
from grpo_trainer.environment_rollouts import (
    EnvironmentReward,
    EpisodeBook,
    EpisodeRollouts,
    broadcast,
    episode_fields,
    push_trained_weights,
    vllm_turn_sampler,
)
from grpo_trainer.episodes import ChatGlue, EpisodeRunner
from grpo_trainer.errors import ConfigError, NotLearning
from grpo_trainer.grpo_config import BatchPlan, RuntimeEnv
from grpo_trainer.metric_client import ErrorBudget, MetricClient, MetricServiceUnavailable
from grpo_trainer.metric_loop import (
    DEFAULT_ERROR_WINDOW_STEPS,
    ERROR_WINDOW_ENV,
    METRIC_READY_TIMEOUT_ENV,
    connect_metric,
    load_prompts,
)
from grpo_trainer.progress import ProgressCallback
from grpo_trainer.reward import MetricReward
from grpo_trainer.sample_context import sample_context
from grpo_trainer.signals import StopFlag
from grpo_trainer.steps import (
    Workspace,
    build_trainer,
    close_status,
    finish,
    grpo_args,
    load_tokenizer,
    restore,
    start_reporting,
    tracking_options,
    train,
)
from grpo_trainer.trainer import StepStats

log = logging.getLogger("grpo_trainer.environment_loop")

# How long to wait for the environment's GET /health before giving up (it starts alongside the trainer).
ENVIRONMENT_READY_TIMEOUT_ENV = "GRPO_ENVIRONMENT_READY_TIMEOUT_SECONDS"
# How long rank 0 waits, before a step's episodes, for an environment service that stopped answering GET /health
# (the operator's Deployment replacing its pod) before the step runs anyway and its episodes fail.
ENVIRONMENT_RIDE_OUT_ENV = "GRPO_ENVIRONMENT_RIDE_OUT_SECONDS"
DEFAULT_RIDE_OUT_SECONDS = 300.0
# Episodes of a step written to episodes.jsonl (all of them when the step has fewer).
EPISODES_LOGGED_ENV = "GRPO_EPISODES_LOGGED_PER_STEP"
DEFAULT_EPISODES_LOGGED = 16


class EnvironmentUnavailable(MetricServiceUnavailable):
    """The environment service did not become healthy in time, or its failures exceeded errorBudget (the
    trainer exits as for an unavailable metric service)."""


class EnvironmentErrorBudget(ErrorBudget):
    def check(self, step: int) -> None:
        if self.fraction > self.budget:
            raise EnvironmentUnavailable(
                f"environment failures at step {step}: {self.fraction:.1%} of a {self.window_steps}-step window "
                f"of episodes failed on the environment's side (errors, timeouts, broken sessions, answers "
                f"outside OpenEnv's protocol), above spec.environment.errorBudget={self.budget:.1%}; check the "
                "environment pod's logs, or raise spec.environment.errorBudget"
            )


def ride_out(url: str, timeout: float, stop: StopFlag) -> None:
    """Before a step's episodes: an environment that does not answer (its pod being replaced) is waited for,
    up to ``timeout``, so the replacement costs the episodes in flight when it went, not whole steps of failed
    episodes. Past ``timeout`` (or at SIGTERM) the step runs and its episodes fail against the error budget."""
    if healthy(url):
        return
    log.warning(
        "the environment service at %s does not answer GET /health; waiting up to %.0fs", url, timeout
    )
    started = time.monotonic()
    deadline = started + timeout
    while time.monotonic() < deadline and not stop.is_set():
        time.sleep(1.0)
        if healthy(url):
            log.warning(
                "the environment service at %s answers again after %.1fs", url, time.monotonic() - started
            )
            return


def wait_ready(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not healthy(url):
        if time.monotonic() > deadline:
            raise EnvironmentUnavailable(
                f"the environment service at {url} did not answer GET /health within {timeout:.0f}s; check the "
                "environment pod (kubectl grpo logs JOB --role environment) and spec.environment.image"
            )
        time.sleep(1.0)


@dataclass
class EnvironmentProgressCallback(ProgressCallback):
    """ProgressCallback plus the episodes' figures in metrics.jsonl and rank 0's episodes.jsonl."""

    book: EpisodeBook = field(default_factory=EpisodeBook)
    episodes_log: Path | None = None
    logged_per_step: int = DEFAULT_EPISODES_LOGGED
    # spec.metric.errorBudget, when a metric scores the episodes' final answers beside the environment.
    metric_budget: ErrorBudget | None = None
    # Runs episodes for validation (rank 0), as for the steps.
    rollouts: EpisodeRollouts | None = None

    def _validate(self, step: int) -> None:
        """One episode per validation prompt, on the weights of ``step`` (pushed to vLLM first, as a step's
        generation pushes them), scored as training episodes are; the mean over the scored ones."""
        assert self.trainer is not None and self.validation is not None and self.rollouts is not None
        assert isinstance(self.reward, EnvironmentReward)
        trainer = self.trainer
        push_trained_weights(trainer)
        started = time.monotonic()
        answer: tuple[list[Any], list[Any], list[dict[str, Any]]] | None = None
        if self.is_main:
            rows = self.validation.rows
            data = [without_prompt(row) for row in rows]
            episodes, _ = self.rollouts.run(trainer, [row["prompt"] for row in rows], data)
            columns = {key: [row.get(key) for row in data] for key in (data[0] if data else {})}
            fields = {**columns, **episode_fields(episodes)}
            answer = (episodes, self.reward.score(fields, path=self.validation.score_path), data)
        episodes, results, data = broadcast(answer, int(trainer.accelerator.num_processes))
        rewards = [r.reward if r.kind != "error" else None for r in results]
        scored = [r for r in rewards if r is not None]
        self.validation.last_mean = sum(scored) / len(scored) if scored else None
        self.validation.last_step = step
        if self.cost is not None:
            # The metric scored each episode's final answer, if the job has one.
            calls = len(episodes) if self.reward.metric is not None else 0
            self.cost.add_validation(calls, time.monotonic() - started)
        if not self.is_main:
            return
        log.info(
            "validation at step %d: mean reward %s over %d episodes",
            step,
            self.validation.last_mean,
            len(scored),
        )
        lines = [
            {
                "step": step,
                "split": "validation",
                "prompt": episode.prompt_text,
                "completion": episode.text(),
                "reward": reward,
                "advantage": None,
                "formatFailure": result.kind == "format_failure",
                "outcome": episode.outcome,
                **sample_context(self.answer_field, row, None, result.components),
            }
            for episode, result, reward, row in zip(episodes, results, rewards, data, strict=True)
        ]
        self._append(self.output_dir / "samples.jsonl", lines)
        if self.tracker is not None:
            self.tracker.validation(step, lines)

    def check_budgets(self, stats: StepStats, step: int) -> None:
        # Each service is held to its own budget: stats.metric_errors counts the metric's failures alone (it
        # scores only what the environment did not fail), the book the environment's.
        if self.metric_budget is not None:
            self.metric_budget.record(stats.metric_errors, stats.rollouts)
            self.metric_budget.check(step)
        if self.budget is not None:
            # Out of every episode run, refill rounds' included.
            self.budget.record(self.book.stats.environment_errors, self.book.stats.episodes)
            self.budget.check(step)

    def reward_seconds(self) -> float:
        # The environment's time is inside the episodes, which are the step's generation.
        return 0.0

    def rollout_fields(self) -> dict[str, Any]:
        stats = self.book.stats
        self._write_episodes()
        m = self.metrics
        if m is not None:
            outcomes = {
                "done": stats.done,
                "truncated": stats.truncated,
                "format_failure": stats.format_failures,
                "environment_error": stats.environment_errors,
            }
            for outcome, count in outcomes.items():
                m.episodes.labels(**m.job_labels, outcome=outcome).inc(count)
            m.episode_turns.inc(stats.turns)
            m.episode_tokens.labels(**m.job_labels, source="model").inc(stats.model_tokens)
            m.episode_tokens.labels(**m.job_labels, source="environment").inc(
                stats.episode_tokens - stats.model_tokens
            )
            for seconds in stats.step_seconds:
                m.environment_step_seconds.observe(seconds)
        return stats.fields()

    def status_sections(self) -> dict[str, Any]:
        stats = self.book.stats
        n = stats.episodes
        if not n:
            return {}
        model = EpisodesStatus(
            count=n,
            turns_mean=round(stats.turns / n, 3),
            tokens_mean=round(stats.episode_tokens / n, 1),
            environment_error_ratio=round(stats.environment_errors / n, 4),
            truncated_ratio=round(stats.truncated / n, 4),
            format_failure_ratio=round(stats.format_failures / n, 4),
        )
        return {"episodes": model.model_dump(by_alias=True, exclude_none=True, mode="json")}

    def _write_episodes(self) -> None:
        if self.episodes_log is None or self.trainer is None:
            return
        trainer = self.trainer
        step = int(trainer.state.global_step)
        world = max(1, int(trainer.accelerator.num_processes))
        # Rank 0's trained rows by where they were sampled: (round, row); a row of a tied group that dynamic
        # sampling replaced was not trained.
        sources, rows = (
            getattr(trainer, "grpo_trained_sources", []),
            getattr(trainer, "grpo_trained_rows", []),
        )
        trained = dict(zip(sources, rows, strict=True)) if len(sources) == len(rows) else {}
        # The rewards of each round, every rank's in episode order (TRL gathers them): the environment's, plus
        # the metric's when one scores the final answers; NaN (unscored) is written as null.
        round_rewards: list[list[float]] = list(getattr(trainer, "grpo_round_rewards", []))
        logged = [
            (r, p, episode)
            for r, episodes in enumerate(self.book.rounds)
            for p, episode in enumerate(episodes)
        ]
        with self.episodes_log.open("a", encoding="utf-8") as out:
            for index, (round_index, position, episode) in enumerate(logged[: self.logged_per_step]):
                rewards = round_rewards[round_index] if round_index < len(round_rewards) else []
                # Another rank's row: whether it was trained is that rank's to know.
                rank0_row = position < len(self.book.rounds[round_index]) // world
                row = trained.get((round_index, position)) if rank0_row else None
                record: dict[str, Any] = {
                    "step": step,
                    "index": index,
                    "round": round_index,
                    "trained": (row is not None) if rank0_row else None,
                    "outcome": episode.outcome,
                    "policyVersion": episode.policy_version,
                    "reward": _finite_or_none(rewards[position]) if position < len(rewards) else None,
                    "environmentReward": episode.reward,
                    "reason": episode.reason,
                    "promptIds": episode.prompt_ids,
                    "prompt": episode.prompt_text,
                    "turns": [
                        {
                            "ids": t.ids,
                            "logprobs": t.logprobs,
                            "text": t.text,
                            "action": t.action,
                            "observation": t.observation,
                            "observationIds": t.glue_ids,
                            "reward": t.reward,
                            "stepSeconds": t.step_seconds,
                        }
                        for t in episode.turns
                    ],
                }
                if row is not None:
                    record["trainedIds"], record["trainedMask"] = row
                out.write(json.dumps(record, allow_nan=False, default=_finite) + "\n")


def _finite(value: Any) -> Any:
    return None


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def run_environment_loop(
    config: TrainerConfig, env: RuntimeEnv, plan: BatchPlan, workspace: Workspace, stop: StopFlag
) -> int:
    """Wait for the environment service (and the metric service, when one scores the final answers), then
    train on episodes of the dataset's prompts."""
    if config.environment is None or config.dataset is None:
        raise ConfigError("the environment loop needs trainer.json's environment and dataset")
    if config.generation.backend != "vllm-server":
        raise ConfigError(
            "episodes sample through the job's vLLM server, and generation.backend is "
            f"{config.generation.backend}: use backend vllm-server"
        )
    settings = config.environment
    if env.is_main:
        wait_ready(settings.url, float(os.environ.get(ENVIRONMENT_READY_TIMEOUT_ENV, "600")))
    metric = connect_metric(config) if config.metric is not None else None
    try:
        if metric is not None:
            metric.wait_ready(float(os.environ.get(METRIC_READY_TIMEOUT_ENV, "600")))
        return _train_episodes(config, env, plan, workspace, stop, metric)
    finally:
        if metric is not None:
            metric.close()


def _train_episodes(
    config: TrainerConfig,
    env: RuntimeEnv,
    plan: BatchPlan,
    workspace: Workspace,
    stop: StopFlag,
    metric: MetricClient | None,
) -> int:
    from grpo_trainer.cost import attempt_ledger
    from grpo_trainer.learning_health import LearningMonitor

    settings = config.environment
    assert settings is not None and config.dataset is not None  # run_environment_loop checked
    tokenizer = load_tokenizer(config)
    train_rows, validation = load_prompts(config, tokenizer)
    args = grpo_args(config, plan, env)
    scorer = MetricReward(metric, config.grpo.format_failure_score, rank=env.rank) if metric else None
    reward = EnvironmentReward(scorer)
    book = EpisodeBook()
    glue = ChatGlue(tokenizer, config.grpo.chat_template_kwargs)

    def runner_for(trainer: Any, ahead: bool) -> EpisodeRunner:
        return EpisodeRunner(
            settings,
            glue,
            vllm_turn_sampler(trainer, ahead),
            budget=int(config.grpo.max_completion_length),
            format_failure_score=config.grpo.format_failure_score,
            reward_optional=scorer is not None,
        )

    reporting = start_reporting(config, env, workspace)
    window = int(os.environ.get(ERROR_WINDOW_ENV, DEFAULT_ERROR_WINDOW_STEPS))
    callback = EnvironmentProgressCallback(
        reward=reward,
        total_steps=config.grpo.steps,
        output_dir=workspace.output_dir,
        stop=stop,
        budget=EnvironmentErrorBudget(settings.error_budget, window),
        is_main=env.is_main,
        metrics=reporting.metrics,
        status=reporting.status,
        validation=validation,
        cost=attempt_ledger(
            config, env.world_size, len(validation.rows) if validation else 0, reporting.status
        ),
        learning=LearningMonitor(Thresholds.of(config.grpo.learning_health)),
        answer_field=config.dataset.answer_field,
        book=book,
        episodes_log=Path(workspace.output_dir) / "episodes.jsonl" if env.is_main else None,
        logged_per_step=int(os.environ.get(EPISODES_LOGGED_ENV, DEFAULT_EPISODES_LOGGED)),
        metric_budget=ErrorBudget(config.metric.error_budget, window) if config.metric is not None else None,
        **tracking_options(config, workspace),
    )
    budget = float(os.environ.get(ENVIRONMENT_RIDE_OUT_ENV, DEFAULT_RIDE_OUT_SECONDS))
    rollout = EpisodeRollouts(
        runner_for, settings.concurrency, book, before_episodes=lambda: ride_out(settings.url, budget, stop)
    )
    callback.rollouts = rollout
    trainer = build_trainer(
        config, workspace, args, tokenizer, train_rows, reward, callback, reporting, rollout_func=rollout
    )
    if trainer.grpo_async is not None:
        # spec.grpo.maxStaleness: the producer runs the next steps' episodes while this one trains.
        trainer.grpo_async.episode_source = lambda prompts, rows: rollout.run(
            trainer, prompts, rows, ahead=True
        )
    resumed_step = restore(trainer, config, env, workspace, reporting)
    train(trainer, config, workspace, resumed_step)
    if callback.not_learning is not None:
        close_status(reporting)
        raise NotLearning(f"stopped as grpo.learningHealth.stopWhenUnhealthy asks: {callback.not_learning}")
    code = finish(trainer, env, workspace, stopped_by_signal=callback.stopped_by_signal)
    close_status(reporting)
    return code
