"""The two example metric images: their metric functions and their servers, over real HTTP."""

from __future__ import annotations

import importlib.util
import json
import re
import urllib.request
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from grpo_metric import FormatFailure, MetricServer

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "metrics"

GSM8K_ROW = {
    "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72",
}


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / name / "metric.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def math() -> ModuleType:
    return load("math_partial_credit")


@pytest.fixture(scope="module")
def exact() -> ModuleType:
    return load("exact_match")


@pytest.mark.parametrize(
    ("completion", "reward"),
    [
        ("In May she sold 48/2 = 24. Total 48 + 24 = 72.\n#### 72", 1.0),
        ("She sold 72 clips. Answer: 72", 1.0 - 0.4 * 0.5),  # right answer, half the working shown
        ("Half of 48 is 24, so 24 + 48 = 73.\n#### 73", 0.4 * 0.5),  # wrong answer, some working
        ("#### 72", 0.6),  # right answer, no working
        ("I think it is #### 10", 0.0),  # wrong, no working: the failureScore
        ("#### 1,000", 0.0),
    ],
)
def test_math_partial_credit(math: ModuleType, completion: str, reward: float) -> None:
    assert math.metric(GSM8K_ROW, completion) == pytest.approx(reward)


def test_math_unparseable_is_a_format_failure(math: ModuleType) -> None:
    with pytest.raises(FormatFailure, match="no final answer"):
        math.metric(GSM8K_ROW, "Natalia sold many clips.")


def test_math_plain_numeric_reference(math: ModuleType) -> None:
    assert math.metric({"answer": 12}, "so #### 12") == 1.0
    assert math.metric({"answer": "12"}, "Answer: $12") == 1.0
    assert math.metric({"answer": 12}, "#### 13") == 0.0


def test_math_orders_rewards_like_the_seed_example(math: ModuleType) -> None:
    # Better working and the right answer rank higher: the spread GRPO needs inside a group.
    completions = [
        "48/2 = 24; 48 + 24 = 72 #### 72",
        "So 72 in total #### 72",
        "48/2 = 24, 24 + 40 = 64 #### 64",
        "#### 64",
    ]
    rewards = [math.metric(GSM8K_ROW, c) for c in completions]
    assert rewards == sorted(rewards, reverse=True) and len(set(rewards)) == 4


def test_exact_match(exact: ModuleType) -> None:
    assert exact.metric({"answer": "Paris"}, "Answer: paris.") == 1.0
    assert exact.metric({"answer": "Paris"}, "  Paris ") == 1.0
    assert exact.metric({"answer": "Paris"}, "Answer: Lyon") == 0.0
    with pytest.raises(FormatFailure):
        exact.metric({"answer": "Paris"}, "Answer:   ")


@pytest.mark.parametrize("name", ["exact_match", "math_partial_credit"])
def test_example_serves_the_protocol(name: str) -> None:
    module = load(name)
    items: list[dict[str, Any]] = [
        # What the trainer sends now, plus a field no trainer sends yet: the examples must ignore both.
        {
            "id": "ok",
            "prompt": "q",
            "completion": "Answer: 72",
            "example": {"answer": "72"},
            "completionTokens": 5,
            "finishReason": "stop",
            "someFutureField": {"x": 1},
        },
        {"id": "bad", "prompt": "q", "completion": "", "example": {"answer": "72"}},
        {"id": "broken", "prompt": "q", "completion": "Answer: 72", "example": {}},
    ]
    with MetricServer(module.metric) as server:
        request = urllib.request.Request(
            server.url + "/score",
            data=json.dumps({"items": items}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            results = json.loads(response.read())["results"]
    assert results[0] == {"id": "ok", "reward": 1.0}
    assert results[1]["formatFailure"] is True
    assert "no 'answer' column" in results[2]["error"]


@pytest.mark.parametrize("name", ["exact_match", "math_partial_credit"])
def test_example_dockerfile_copies_what_it_runs(name: str) -> None:
    dockerfile = (EXAMPLES / name / "Dockerfile").read_text()
    assert f"COPY examples/metrics/{name}/metric.py /app/metric.py" in dockerfile
    # The SDK is installed as its package (trainer_image/grpo_metric/pyproject.toml), not copied as source.
    assert "COPY trainer_image/grpo_metric /tmp/grpo-metric" in dockerfile
    assert "RUN pip install /tmp/grpo-metric" in dockerfile
    assert re.search(r'CMD \["python", "/app/metric.py"\]', dockerfile)
    assert 'if __name__ == "__main__":\n    serve(metric)' in (EXAMPLES / name / "metric.py").read_text()
