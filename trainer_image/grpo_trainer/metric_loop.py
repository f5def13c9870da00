"""The metric-service loop (trainer.json ``metric`` and ``dataset`` set): the trainer generates answers to
the dataset's prompts and the job's metric service scores them. The shared steps are in steps.py.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from grpo_operator.api.learning_health import Thresholds
from grpo_operator.api.trainer_config import TrainerConfig

from grpo_trainer.errors import ConfigError, NotLearning
from grpo_trainer.grpo_config import BatchPlan, RuntimeEnv
from grpo_trainer.metric_client import ClientSettings, ErrorBudget, MetricClient
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

if TYPE_CHECKING:
    from grpo_trainer.progress import Validation

# How long to wait for the metric service's /healthz before giving up (it starts alongside the trainer).
METRIC_READY_TIMEOUT_ENV = "GRPO_METRIC_READY_TIMEOUT_SECONDS"
# Steps in the sliding window that metric.errorBudget is measured over.
ERROR_WINDOW_ENV = "GRPO_METRIC_ERROR_WINDOW_STEPS"
DEFAULT_ERROR_WINDOW_STEPS = 20
# How long the metric client's circuit breaker stays open before it probes the service again.
BREAKER_COOLDOWN_ENV = "GRPO_METRIC_BREAKER_COOLDOWN_SECONDS"


def connect_metric(config: TrainerConfig) -> MetricClient:
    """The metric service's client (not yet waited for)."""
    if config.metric is None or config.dataset is None:
        raise ConfigError("the metric-service loop needs trainer.json's metric and dataset; it has neither")
    m = config.metric
    return MetricClient(
        ClientSettings(
            url=m.url,
            batch_size=m.batch_size,
            concurrency=m.concurrency,
            timeout_seconds=m.timeout_seconds,
            max_retries=m.max_retries,
            max_response_bytes=m.max_response_bytes,
            max_abs_reward=m.max_abs_reward,
            reward_weights=m.reward_weights,
            breaker_cooldown_seconds=float(os.environ.get(BREAKER_COOLDOWN_ENV, "5")),
        )
    )


def load_prompts(config: TrainerConfig, tokenizer: Any) -> tuple[Any, Validation | None]:
    """The training prompts and the validation set (None when validation is off)."""
    from grpo_trainer.data import load_rows, prepare
    from grpo_trainer.progress import Validation

    dataset = config.dataset
    assert dataset is not None  # connect_metric refused a config without one
    train_rows = prepare(
        load_rows(dataset.train),
        dataset,
        tokenizer,
        config.grpo.max_prompt_length,
        dataset.train,
    )
    v = config.grpo.validation
    if not (dataset.validation and v.every_steps):
        return train_rows, None
    val = prepare(
        load_rows(dataset.validation),
        dataset,
        tokenizer,
        config.grpo.max_prompt_length,
        dataset.validation,
    )
    validation = Validation(
        rows=[dict(r) for r in val.select(range(min(v.max_prompts, len(val))))],
        every_steps=v.every_steps,
        score_path=v.score_path,
    )
    return train_rows, validation


def run_metric_loop(
    config: TrainerConfig, env: RuntimeEnv, plan: BatchPlan, workspace: Workspace, stop: StopFlag
) -> int:
    """Wait for the metric service, then train on the dataset's prompts with its scores as rewards."""
    from grpo_trainer.cost import attempt_ledger
    from grpo_trainer.learning_health import LearningMonitor
    from grpo_trainer.progress import ProgressCallback
    from grpo_trainer.reward import CompletionEnds, MetricReward
    from grpo_trainer.trl_adapter import completion_end_token_ids

    client = connect_metric(config)
    assert config.metric is not None
    try:
        client.wait_ready(float(os.environ.get(METRIC_READY_TIMEOUT_ENV, "600")))
        tokenizer = load_tokenizer(config)
        train_rows, validation = load_prompts(config, tokenizer)
        args = grpo_args(config, plan, env)
        reward = MetricReward(client, config.grpo.format_failure_score, rank=env.rank)
        window = int(os.environ.get(ERROR_WINDOW_ENV, DEFAULT_ERROR_WINDOW_STEPS))
        reporting = start_reporting(config, env, workspace)
        callback = ProgressCallback(
            reward=reward,
            total_steps=config.grpo.steps,
            output_dir=workspace.output_dir,
            stop=stop,
            budget=ErrorBudget(config.metric.error_budget, window),
            is_main=env.is_main,
            metrics=reporting.metrics,
            status=reporting.status,
            validation=validation,
            cost=attempt_ledger(
                config, env.world_size, len(validation.rows) if validation else 0, reporting.status
            ),
            learning=LearningMonitor(Thresholds.of(config.grpo.learning_health)),
            answer_field=config.dataset.answer_field if config.dataset is not None else "answer",
            **tracking_options(config, workspace),
        )
        trainer = build_trainer(config, workspace, args, tokenizer, train_rows, reward, callback, reporting)
        reward.ends = CompletionEnds(
            completion_end_token_ids(trainer, tokenizer.pad_token_id), int(args.max_completion_length)
        )
        resumed_step = restore(trainer, config, env, workspace, reporting)
        train(trainer, config, workspace, resumed_step)
        if callback.not_learning is not None:
            close_status(reporting)
            raise NotLearning(
                f"stopped as grpo.learningHealth.stopWhenUnhealthy asks: {callback.not_learning}"
            )
        code = finish(trainer, env, workspace, stopped_by_signal=callback.stopped_by_signal)
        close_status(reporting)
        return code
    finally:
        client.close()
