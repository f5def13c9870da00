"""The learning-health diagnosis on real trainer processes (CPU, the tiny model): each way of not learning
that a user can set up by mistake is named, with what was seen and the setting to change, and the job keeps
running unless it asked to stop (grpo.learningHealth.stopWhenUnhealthy, exit 9 after a checkpoint)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from grpo_metric import MetricServer

from tests.trainer.toy import fraction_of_target, read_jsonl, start_trainer, trainer_config

pytestmark = pytest.mark.trainer

WINDOW = 3


def run(
    tmp_path: Path,
    model: Path,
    metric_url: str,
    *,
    steps: int,
    grpo: dict[str, Any],
    health: dict[str, Any] | None = None,
    **options: Any,
) -> tuple[int, list[dict[str, Any]], str]:
    config = trainer_config(tmp_path, model, metric_url, steps=steps, every_steps=steps, **options)
    raw = json.loads(config.read_text())
    raw["grpo"].update(grpo)
    raw["grpo"]["learningHealth"] = {"windowSteps": WINDOW, **(health or {})}
    config.write_text(json.dumps(raw))
    process = start_trainer(config, tmp_path / "trainer.log")
    code = process.wait(timeout=900)
    log = (tmp_path / "trainer.log").read_text()
    return code, read_jsonl(tmp_path / "out" / "metrics.jsonl"), log


def reasons(records: list[dict[str, Any]]) -> list[str]:
    return [r["learning_health"] for r in records]


def test_dapo_with_completions_that_always_truncate_is_diagnosed_and_keeps_running(
    tmp_path: Path, tiny_model: Path, toy_metric: MetricServer
) -> None:
    # Two tokens: the tiny model almost never ends that early, so (nearly) every completion is cut off and
    # the dapo preset's maskTruncatedCompletions leaves it out of the loss.
    code, records, log = run(
        tmp_path,
        tiny_model,
        toy_metric.url,
        steps=5,
        grpo={"preset": "dapo", "maxCompletionLength": 2},
        health={"truncatedRatio": 0.8},
    )
    assert code == 0, log[-3000:]
    assert len(records) == 5
    assert all(r["truncated_ratio"] >= 0.8 for r in records), [r["truncated_ratio"] for r in records]
    assert reasons(records)[: WINDOW - 1] == ["Healthy"] * (WINDOW - 1)
    assert reasons(records)[WINDOW - 1 :] == ["CompletionsTruncated"] * (5 - WINDOW + 1)
    assert f"step {WINDOW}: learning health: Not learning (CompletionsTruncated) since step {WINDOW}" in log
    assert "maskTruncatedCompletions: false" in log and "maxCompletionLength" in log


def test_a_learning_rate_too_small_to_move_float32_weights_is_updates_vanishing(
    tmp_path: Path, tiny_model: Path, toy_metric: MetricServer
) -> None:
    # An Adam step of ~1e-12 is below float32's rounding of weights ~0.02 (2^-24 of them: ~1e-9).
    code, records, log = run(tmp_path, tiny_model, toy_metric.url, steps=4, grpo={}, learning_rate=1e-12)
    assert code == 0, log[-3000:]
    assert all(r["updated_fraction"] < 0.01 for r in records), [r["updated_fraction"] for r in records]
    # update_health.py judges after 3 still steps in a row.
    assert reasons(records) == ["Healthy", "Healthy", "UpdatesVanishing", "UpdatesVanishing"]
    assert "Not learning (UpdatesVanishing) since step 3" in log
    assert "raise spec.grpo.learningRate" in log


def constant(example: dict[str, Any], completion: str) -> float:
    return 0.5


def test_a_metric_that_scores_everything_the_same_is_no_signal(tmp_path: Path, tiny_model: Path) -> None:
    with MetricServer(constant) as metric:
        code, records, log = run(tmp_path, tiny_model, metric.url, steps=4, grpo={})
    assert code == 0, log[-3000:]
    assert len(records) == 4 and all(r["zero_std_group_ratio"] == 1.0 for r in records)
    assert reasons(records) == ["Healthy", "Healthy", "NoSignal", "NoSignal"]
    # Never 'Solved': a constant reward is not a learned task.
    assert "Not learning (NoSignal) since step 3: 100% of groups tied" in log
    assert "mostly 0.5" in log and "dynamicSampling" in log


def test_stop_when_unhealthy_checkpoints_and_exits_9_naming_the_diagnosis(
    tmp_path: Path, tiny_model: Path
) -> None:
    with MetricServer(constant) as metric:
        code, records, log = run(
            tmp_path, tiny_model, metric.url, steps=10, grpo={}, health={"stopWhenUnhealthy": True}
        )
    assert code == 9, log[-3000:]
    # Diagnosed at step 3, held for a window (steps 3-5); every rank agrees at the end of the next step.
    assert [r["step"] for r in records] == list(range(1, 7))
    assert (tmp_path / "ckpt" / "step-6").is_dir()
    assert not (tmp_path / "out" / "model").exists()  # a stopped run is not a finished one
    assert "stopWhenUnhealthy: saving a checkpoint at step 6" in log
    assert "stopped as grpo.learningHealth.stopWhenUnhealthy asks: Not learning (NoSignal)" in log


def punish_the_target(example: dict[str, Any], completion: str) -> float:
    return 1.0 - fraction_of_target(example, completion)


def test_a_reward_the_validation_set_punishes_is_validation_falling(tmp_path: Path, tiny_model: Path) -> None:
    # Training rewards the target character; validation rewards everything else: the better the policy
    # games the training reward, the worse it does on validation.
    with MetricServer(fraction_of_target, validation=punish_the_target) as metric:
        code, records, log = run(
            tmp_path,
            tiny_model,
            metric.url,
            steps=12,
            grpo={},
            validation_every=4,
            validation_score_path="/validate",
        )
    assert code == 0, log[-3000:]
    validation = [r["validation_mean"] for r in records if "validation_mean" in r]
    rewards = [r["reward_mean"] for r in records]
    assert validation[-1] < validation[0] and rewards[-1] > rewards[0], (validation, rewards)
    assert "ValidationFalling" in reasons(records), (reasons(records), validation, rewards)
    assert "Not learning (ValidationFalling)" in log and "reward hacking or overfitting" in log
