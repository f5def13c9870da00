"""A real training run on a metric that answers reward components: the reward the advantages use is the
weighted sum spec.metric.rewardWeights defines, and every step logs each component's mean beside it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from grpo_metric import FINISH_STOP, MetricServer

from tests.trainer.toy import read_jsonl, start_trainer, trainer_config

pytestmark = pytest.mark.trainer

WEIGHTS = {"share": 2.0, "finished": -0.5}


def share_finished_and_length(
    example: dict[str, Any], completion: str, finish_reason: str | None = None
) -> dict[str, float]:
    # No format failures: every completion gets all three parts, so the step's reward mean is exactly the
    # weighted sum of the component means ("length" is reported, not weighed).
    share = completion.count(example["answer"]) / len(completion) if completion else 0.0
    return {"share": share, "finished": float(finish_reason == FINISH_STOP), "length": float(len(completion))}


def test_the_reward_is_the_weighted_sum_of_the_components(tmp_path: Path, tiny_model: Path) -> None:
    with MetricServer(share_finished_and_length) as metric:
        config = trainer_config(tmp_path, tiny_model, metric.url, steps=3, every_steps=3)
        rendered = json.loads(config.read_text())
        rendered["metric"]["rewardWeights"] = WEIGHTS
        config.write_text(json.dumps(rendered))
        process = start_trainer(config, tmp_path / "trainer.log")
        assert process.wait(timeout=600) == 0, (tmp_path / "trainer.log").read_text()[-3000:]
    records = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    for record in records:
        parts = record["reward_components"]
        assert set(parts) == {"share", "finished", "length"}
        assert record["metric_error_ratio"] == 0 and record["format_failure_ratio"] == 0
        weighted = sum(weight * parts[name] for name, weight in WEIGHTS.items())
        assert record["reward_mean"] == pytest.approx(weighted, abs=1e-9), record
        assert 0 <= parts["share"] <= 1 and parts["length"] >= 1
