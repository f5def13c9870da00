"""A separate validation reward: with spec.grpo.validation.scorePath: /validate the trainer scores its
validation answers on the metric service's /validate route (the SDK's serve(metric, validation=...)),
never with the training reward, so validation can disagree with a training reward the policy games."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from grpo_metric import MetricServer

from tests.trainer.toy import fraction_of_target, read_jsonl, start_trainer, trainer_config

pytestmark = pytest.mark.trainer

# 7/16: the toy training reward is a fraction k/n of at most 8 characters (or the failure scores), so it can
# never take this value and any mix-up of the two rewards shows.
HELD_OUT_SCORE = 0.4375


def held_out_judge(example: dict[str, Any], completion: str) -> float:
    return HELD_OUT_SCORE


def post(url: str, completion: str) -> Any:
    body = {"items": [{"id": "x", "prompt": "p", "completion": completion, "example": {"target": "a"}}]}
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())["results"][0]


def test_the_sdk_serves_a_second_reward_on_validate_only_when_given() -> None:
    with MetricServer(fraction_of_target, validation=held_out_judge) as server:
        assert post(server.url + "/validate", "aaaa")["reward"] == HELD_OUT_SCORE
        assert post(server.url + "/score", "aaaa")["reward"] != HELD_OUT_SCORE
    with MetricServer(fraction_of_target) as server, pytest.raises(urllib.error.HTTPError, match="404"):
        post(server.url + "/validate", "aaaa")


def test_validation_answers_are_scored_by_the_validation_route(tmp_path: Path, tiny_model: Path) -> None:
    with MetricServer(fraction_of_target, validation=held_out_judge) as metric:
        config = trainer_config(
            tmp_path,
            tiny_model,
            metric.url,
            steps=2,
            every_steps=2,
            validation_every=1,
            validation_score_path="/validate",
        )
        process = start_trainer(config, tmp_path / "trainer.log")
        assert process.wait(timeout=600) == 0, (tmp_path / "trainer.log").read_text()[-3000:]
    records = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert [r["validation_mean"] for r in records] == [HELD_OUT_SCORE, HELD_OUT_SCORE]
    samples = read_jsonl(tmp_path / "out" / "samples.jsonl")
    validation = [s["reward"] for s in samples if s["split"] == "validation"]
    assert validation and set(validation) == {HELD_OUT_SCORE}
    assert all(s["reward"] != HELD_OUT_SCORE for s in samples if s["split"] == "train")
