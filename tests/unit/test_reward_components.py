"""Reward components: a metric may answer its reward's named parts; the trainer sums them, or weighs them by
spec.metric.rewardWeights, refuses malformed or out-of-bound ones per item, and reports a bounded set."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from grpo_metric import FormatFailure, MetricServer, ScoreItem
from grpo_metric.protocol import MAX_COMPONENTS, parse_result
from grpo_operator.api.spec import GRPOJobSpec
from grpo_operator.api.trainer_config import TrainerConfig
from grpo_trainer.metric_client import ClientSettings, MetricClient
from grpo_trainer.reported_components import MAX_REPORTED_COMPONENTS, ComponentNames
from grpo_trainer.reward import ScoredBatch
from pydantic import ValidationError

from tests.unit.manifests import with_changes
from tests.unit.test_metric_sdk import post


def test_components_without_a_reward_sum_to_the_reward() -> None:
    result = parse_result({"id": "a", "components": {"accuracy": 1.0, "format": 0.25}})
    assert result.kind == "reward" and result.reward == 1.25
    assert result.components == {"accuracy": 1.0, "format": 0.25}


def test_a_reward_sent_with_components_is_the_reward() -> None:
    result = parse_result({"id": "a", "reward": 0.5, "components": {"accuracy": 1.0}})
    assert result.reward == 0.5 and result.components == {"accuracy": 1.0}
    # Old single-number answers are unchanged.
    plain = parse_result({"id": "b", "reward": 0.7})
    assert plain.reward == 0.7 and plain.components is None
    assert plain.to_json() == {"id": "b", "reward": 0.7}


@pytest.mark.parametrize(
    ("components", "fragment"),
    [
        ([1, 2], "must be an object"),
        ({"Accuracy": 1.0}, "is not lowercase letters"),
        ({"a" * 33: 1.0}, "is not lowercase letters"),
        ({"accuracy": "1"}, "not a finite number"),
        ({"accuracy": True}, "not a finite number"),
        ({"accuracy": float("nan")}, "not a finite number"),
        ({"accuracy": 10**400}, "not a finite number"),
        ({f"c{i}": 0.0 for i in range(MAX_COMPONENTS + 1)}, f"at most {MAX_COMPONENTS}"),
    ],
)
def test_malformed_components_make_that_item_an_error(components: Any, fragment: str) -> None:
    result = parse_result({"id": "a", "reward": 1.0, "components": components})
    assert result.kind == "error" and fragment in result.reason, result.reason


def components_metric(example: dict[str, Any], completion: str) -> Any:
    if completion == "":
        raise FormatFailure("empty")
    if completion == "no-format":
        return {"accuracy": 1.0}
    if completion == "huge":
        return {"accuracy": 1e9, "format": 0.0}
    return {"accuracy": float(completion == example["answer"]), "format": 0.5}


def test_the_sdk_answers_a_dict_as_components_and_their_sum() -> None:
    with MetricServer(components_metric) as server:
        status, body = post(
            f"{server.url}/score",
            {"items": [{"id": "a", "prompt": "p", "completion": "42", "example": {"answer": "42"}}]},
        )
    assert status == 200
    assert body["results"] == [{"id": "a", "reward": 1.5, "components": {"accuracy": 1.0, "format": 0.5}}]


def scored(completions: list[str], **settings: Any) -> list[Any]:
    with MetricServer(components_metric) as server:
        client = MetricClient(ClientSettings(url=server.url, timeout_seconds=5.0, **settings))
        try:
            items = [ScoreItem(f"i{n}", "p", c, {"answer": "42"}) for n, c in enumerate(completions)]
            return client.score(items)
        finally:
            client.close()


def test_reward_weights_weigh_the_components_and_a_missing_one_is_an_error() -> None:
    right, wrong, unformatted, empty = scored(
        ["42", "41", "no-format", ""], reward_weights={"accuracy": 2.0, "format": -1.0}
    )
    assert right.kind == "reward" and right.reward == pytest.approx(2.0 * 1.0 - 1.0 * 0.5)
    assert wrong.reward == pytest.approx(-0.5)
    assert unformatted.kind == "error"
    assert "no component 'format'" in unformatted.reason and "spec.metric.rewardWeights" in unformatted.reason
    # A format failure keeps its meaning: it is scored formatFailureScore, not weighed.
    assert empty.kind == "format_failure"


def test_a_component_beyond_max_abs_reward_is_an_error_even_when_weighted_to_nothing() -> None:
    (huge,) = scored(["huge"], max_abs_reward=100.0, reward_weights={"format": 1.0})
    assert huge.kind == "error" and "component 'accuracy'" in huge.reason and "maxAbsReward" in huge.reason


def test_component_means_skip_format_failures_and_errors() -> None:
    results = scored(["42", "41", "", "no-format"])
    totals = ScoredBatch(results=results).component_totals()
    assert totals == {"accuracy": (2.0, 3), "format": (1.0, 2)}


def test_a_job_reports_at_most_sixteen_component_names(caplog: pytest.LogCaptureFixture) -> None:
    names = ComponentNames()
    first = {f"c{i:02d}": float(i) for i in range(MAX_REPORTED_COMPONENTS)}
    assert names.reported(first) == first
    with caplog.at_level(logging.WARNING, logger="grpo_trainer.progress"):
        later = names.reported({"c00": 1.0, "fresh": 2.0})
    assert later == {"c00": 1.0}
    assert "more than 16 distinct reward component names" in caplog.text


def test_reward_weights_reach_trainer_json_and_bad_names_are_refused() -> None:
    manifest = with_changes({"spec.metric.rewardWeights": {"accuracy": 1.0, "format": 0.2}})
    spec = GRPOJobSpec.model_validate(manifest["spec"])
    config = TrainerConfig.from_spec(
        "ns", "job", None, spec, metric_url="http://job-metric:8080", generation_host="job-gen"
    )
    assert config.metric is not None and config.metric.reward_weights == {"accuracy": 1.0, "format": 0.2}
    with pytest.raises(ValidationError, match="rewardWeights keys must be names"):
        GRPOJobSpec.model_validate(with_changes({"spec.metric.rewardWeights": {"Accuracy": 1.0}})["spec"])
    with pytest.raises(ValidationError):
        GRPOJobSpec.model_validate(with_changes({"spec.metric.rewardWeights": {}})["spec"])
    with pytest.raises(ValidationError):
        GRPOJobSpec.model_validate(with_changes({"spec.metric.rewardWeights": {"accuracy": 1e7}})["spec"])
