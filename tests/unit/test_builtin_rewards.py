"""Rewards without building an image: the stock metric image's built-in rewards and the user's function
from a ConfigMap (trainer_image/grpo_metric/builtin.py), scored through the SDK server as the trainer calls
it, and the operator's side: what spec.metric.rewards and spec.metric.function put in the metric pod."""

from __future__ import annotations

import json
from typing import Any

import pytest
from grpo_metric import MetricServer, ScoreItem
from grpo_metric import builtin as stock
from grpo_operator.api import builtin_rewards as api
from grpo_operator.builders import job_from_object
from grpo_operator.builders.metric import metric_deployment
from grpo_operator.settings import OperatorSettings
from grpo_trainer.metric_client import ClientSettings, MetricClient

from tests.unit.reconcile_world import job_object


def test_the_stock_server_and_the_api_use_the_same_names() -> None:
    assert (stock.REWARDS_ENV, stock.FUNCTION_SOURCE_ENV, stock.FUNCTION_NAME_ENV) == (
        api.REWARDS_ENV,
        api.FUNCTION_SOURCE_ENV,
        api.FUNCTION_NAME_ENV,
    )
    assert stock.DEFAULT_NAMES == api.DEFAULT_NAMES


def metric_of(rewards: list[dict[str, Any]]) -> Any:
    return stock.configured_metric({stock.REWARDS_ENV: json.dumps(rewards)})


def test_math_answers_are_equal_as_math_not_as_text() -> None:
    metric = metric_of([{"type": "mathAnswer"}])
    example = {"answer": "\\frac{1}{2}"}
    assert metric(example, "So the result is $0.5$.") == {"math_answer": 1.0}
    assert metric(example, "Halve it: \\boxed{\\frac{2}{4}}") == {"math_answer": 1.0}
    assert metric(example, "The answer is \\boxed{2}") == {"math_answer": 0.0}
    # The column named by field, and the token count the trainer sends, are what it reads.
    metric = metric_of([{"type": "mathAnswer", "field": "solution"}])
    assert metric({"solution": "72"}, "She has 72 apples. #### 72", completion_tokens=9) == {
        "math_answer": 1.0
    }


def test_exact_match_format_and_length_are_components_of_one_reward() -> None:
    metric = metric_of(
        [
            {"type": "exactMatch", "field": "label", "pattern": r"Answer:\s*(\w+)"},
            {"type": "regex", "pattern": r"^<think>.*</think>"},
            {"type": "length", "maxTokens": 10},
        ]
    )
    good = "<think>cats purr\nand meow</think> Answer: CAT"
    assert metric({"label": " cat "}, good, completion_tokens=10) == {
        "exact_match": 1.0,
        "format": 1.0,
        "length": 0.0,
    }
    assert metric({"label": "dog"}, "Answer: cat", completion_tokens=15) == {
        "exact_match": 0.0,
        "format": 0.0,
        "length": -0.5,
    }
    assert metric({"label": "dog"}, "Answer: dog", completion_tokens=40)["length"] == -1.0


def test_through_the_server_a_missing_answer_is_a_format_failure_and_a_missing_column_an_error() -> None:
    metric = metric_of(
        [{"type": "mathAnswer", "field": "solution"}, {"type": "regex", "pattern": "x", "name": "has_x"}]
    )
    items = [
        ScoreItem("ok", "p", "x = \\boxed{3}", {"solution": "3"}),
        ScoreItem("no-answer", "p", "I do not know.", {"solution": "3"}),
        ScoreItem("no-column", "p", "\\boxed{3}", {"answer": "3"}),
    ]
    with MetricServer(metric) as server:
        results = {r.id: r for r in MetricClient(ClientSettings(url=server.url, max_retries=0)).score(items)}
    assert results["ok"].kind == "reward" and dict(results["ok"].components or {}) == {
        "math_answer": 1.0,
        "has_x": 1.0,
    }
    assert results["no-answer"].kind == "format_failure"
    assert results["no-column"].kind == "error" and "'solution' column" in results["no-column"].reason


def test_a_function_from_a_configmap_is_served_without_its_main_block() -> None:
    source = (
        "from grpo_metric import FormatFailure, serve\n"
        "def score(example, completion, finish_reason=None):\n"
        "    if finish_reason == 'length':\n"
        "        raise FormatFailure('cut off')\n"
        "    return {'accuracy': float(completion.strip() == example['answer']), 'brevity': -len(completion) / 100}\n"
        "if __name__ == '__main__':\n"
        "    serve(score)\n"
    )
    metric = stock.configured_metric({stock.FUNCTION_SOURCE_ENV: source, stock.FUNCTION_NAME_ENV: "score"})
    assert metric({"answer": "4"}, "4") == {"accuracy": 1.0, "brevity": -0.01}


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({}, "nothing to serve"),
        ({stock.REWARDS_ENV: "[{"}, "GRPO_METRIC_REWARDS is not JSON"),
        ({stock.REWARDS_ENV: '[{"type": "fuzzy"}]'}, "spec.metric.rewards[0].type must be one of"),
        (
            {stock.REWARDS_ENV: '[{"type": "regex", "pattern": "("}]'},
            "spec.metric.rewards[0].pattern '(' is not",
        ),
        ({stock.FUNCTION_SOURCE_ENV: "def metric(:"}, "spec.metric.function: the source failed to load"),
        ({stock.FUNCTION_SOURCE_ENV: "x = 1", stock.FUNCTION_NAME_ENV: "reward"}, "defines no function"),
    ],
)
def test_a_configuration_it_cannot_serve_stops_it_naming_the_field(
    env: dict[str, str], said: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in (stock.REWARDS_ENV, stock.FUNCTION_SOURCE_ENV, stock.FUNCTION_NAME_ENV):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert stock.main() == 2
    assert said in capsys.readouterr().err


def _container(metric: dict[str, Any]) -> dict[str, Any]:
    job = job_from_object(job_object(metric=metric))
    return metric_deployment(job, OperatorSettings())["spec"]["template"]["spec"]["containers"][0]  # type: ignore[no-any-return]


def test_the_metric_pod_gets_the_rewards_or_the_functions_configmap_key() -> None:
    env = {
        e["name"]: e
        for e in _container({"image": api.STOCK_METRIC_IMAGE, "rewards": [{"type": "mathAnswer"}]})["env"]
    }
    # A reward that compares with a reference reads spec.dataset.answerField unless it names a column.
    assert json.loads(env[api.REWARDS_ENV]["value"]) == [{"type": "mathAnswer", "field": "answer"}]
    rewards = [
        {"type": "exactMatch"},
        {"type": "mathAnswer", "field": "final"},
        {"type": "regex", "pattern": "x"},
    ]
    job = job_from_object(
        job_object(
            metric={"image": api.STOCK_METRIC_IMAGE, "rewards": rewards},
            dataset={"train": "hf://a/b", "answerField": "solution"},
        )
    )
    container = metric_deployment(job, OperatorSettings())["spec"]["template"]["spec"]["containers"][0]
    (sent,) = [e["value"] for e in container["env"] if e["name"] == api.REWARDS_ENV]
    assert json.loads(sent) == [
        {"type": "exactMatch", "field": "solution"},
        {"type": "mathAnswer", "field": "final"},
        {"type": "regex", "pattern": "x"},
    ]
    container = _container(
        {
            "image": api.STOCK_METRIC_IMAGE,
            "function": {"configMap": "my-reward"},
            "env": [{"name": api.REWARDS_ENV, "value": "x"}],
        }
    )
    env = {e["name"]: e for e in container["env"]}
    assert env[api.FUNCTION_SOURCE_ENV]["valueFrom"] == {
        "configMapKeyRef": {"name": "my-reward", "key": "metric.py"}
    }
    assert env[api.FUNCTION_NAME_ENV]["value"] == "metric"
    assert api.REWARDS_ENV not in env  # the user's env does not name what the stock image serves
