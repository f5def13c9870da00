"""(a) the toy task is learned end to end with the metric served over HTTP by the SDK, and
(d) unparseable outputs are scored formatFailureScore on the training path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from grpo_metric import FormatFailure, MetricServer

from tests.trainer.toy import TARGET, read_jsonl, start_trainer, trainer_config

pytestmark = pytest.mark.trainer


def test_toy_task_reward_rises_from_below_0_3_to_at_least_0_8(
    tmp_path: Path, tiny_model: Path, toy_metric: MetricServer
) -> None:
    config = trainer_config(
        tmp_path, tiny_model, toy_metric.url, steps=25, every_steps=25, validation_every=5
    )
    process = start_trainer(config, tmp_path / "trainer.log")
    assert process.wait(timeout=600) == 0, (tmp_path / "trainer.log").read_text()[-3000:]

    records = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 26))
    rewards = [r["reward_mean"] for r in records]
    assert rewards[0] < 0.3, rewards
    assert max(rewards[-5:]) >= 0.8, rewards
    validation = [r["validation_mean"] for r in records if "validation_mean" in r]
    assert len(validation) == 5 and validation[-1] >= 0.8, validation
    # Every step reports its rollouts (B*G) and its tied-group bookkeeping.
    assert all(r["rollouts"] == 32 and r["groups"] == 4 for r in records)
    assert any(r["tied_groups"] > 0 for r in records[-5:])  # converged groups are all 1.0: no diversity
    # Every optimizer step changes the float32 weights (update_health.py): nearly every sampled element
    # moves at the toy's learning rate, by a ratio to the weights that the decaying rate shrinks.
    assert all(0.9 < r["updated_fraction"] <= 1.0 for r in records[:5]), [
        r["updated_fraction"] for r in records
    ]
    assert all(0.0 < r["update_ratio"] < 10.0 for r in records), [r["update_ratio"] for r in records]
    assert "changed almost none of the sampled weights" not in (tmp_path / "trainer.log").read_text()
    # No false alarm: a run that learns is diagnosed Healthy at every step, then Solved once most groups
    # tie at the top reward (the task is learned), never as not learning.
    health = [r["learning_health"] for r in records]
    assert set(health) <= {"Healthy", "Solved"} and health[0] == "Healthy", health
    assert "Not learning" not in (tmp_path / "trainer.log").read_text()
    samples = read_jsonl(tmp_path / "out" / "samples.jsonl")
    assert {s["split"] for s in samples} == {"train", "validation"}
    assert (tmp_path / "out" / "model" / "config.json").is_file()


def strict_metric(example: dict[str, Any], completion: str) -> float:
    if "a" not in completion:
        raise FormatFailure("no 'a' in the answer")
    return completion.count("a") / len(completion)


def test_unparseable_outputs_score_format_failure_score(tmp_path: Path, tiny_model: Path) -> None:
    with MetricServer(strict_metric) as metric:
        config = trainer_config(tmp_path, tiny_model, metric.url, steps=2, every_steps=2, learning_rate=1e-6)
        config.write_text(
            config.read_text().replace(
                '"maxPromptLength": 16', '"maxPromptLength": 16, "formatFailureScore": -2.5'
            )
        )
        process = start_trainer(config, tmp_path / "trainer.log")
        assert process.wait(timeout=600) == 0, (tmp_path / "trainer.log").read_text()[-3000:]
    records = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    # An untrained model rarely writes an 'a', so most answers are format failures.
    assert all(r["format_failure_ratio"] > 0.5 for r in records), records
    samples = [s for s in read_jsonl(tmp_path / "out" / "samples.jsonl") if s["split"] == "train"]
    failures = [s for s in samples if s["formatFailure"]]
    assert failures and all(s["reward"] == -2.5 for s in failures)
    assert all(s["reward"] >= 0 for s in samples if not s["formatFailure"])
    # What `kubectl grpo samples` shows beside each: the row's reference answer and why the completion ended.
    assert all(s["answer"] == TARGET for s in samples)
    assert {s["finishReason"] for s in samples} <= {"stop", "length"} and "components" not in samples[0]


def test_invalid_config_exits_2_with_a_reason(tmp_path: Path, tiny_model: Path) -> None:
    config = trainer_config(tmp_path, tiny_model, "http://127.0.0.1:9", prompts_per_step=3, group_size=2)
    config.write_text(config.read_text().replace('"perDeviceBatchSize": 2', '"perDeviceBatchSize": 4'))
    result = subprocess.run(
        [sys.executable, "-m", "grpo_trainer"],
        env={"GRPO_CONFIG": str(config), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2
    assert "cannot split B*G = 3*2 = 6 completions" in result.stderr
    assert "perDeviceBatchSize" in result.stderr
