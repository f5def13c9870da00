"""The metric SDK over real HTTP: protocol shape, format failures, errors, bad requests."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from grpo_metric import FormatFailure, MetricServer, ScoreItem
from grpo_metric.protocol import ProtocolError, parse_score_request, parse_score_response


def exact(example: dict[str, Any], completion: str) -> float:
    if not completion.strip():
        raise FormatFailure("empty completion")
    if completion == "boom":
        raise RuntimeError("metric bug")
    if completion == "nan":
        return float("nan")
    return 1.0 if completion.strip() == str(example["answer"]) else 0.0


def post(url: str, body: Any) -> tuple[int, Any]:
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture
def server() -> Any:
    with MetricServer(exact) as running:
        yield running


def test_healthz(server: MetricServer) -> None:
    with urllib.request.urlopen(server.url + "/healthz", timeout=10) as response:
        assert response.status == 200
        assert json.loads(response.read()) == {"status": "ok"}


def test_score_returns_one_result_per_item_with_the_same_ids(server: MetricServer) -> None:
    items = [
        {"id": "a", "prompt": "p", "completion": "42", "example": {"answer": 42}},
        {"id": "b", "prompt": "p", "completion": "41", "example": {"answer": 42}},
        {"id": "c", "prompt": "p", "completion": "  ", "example": {"answer": 42}},
        {"id": "d", "prompt": "p", "completion": "boom", "example": {"answer": 42}},
        {"id": "e", "prompt": "p", "completion": "nan", "example": {"answer": 42}},
    ]
    status, body = post(server.url + "/score", {"items": items})
    assert status == 200
    results = body["results"]
    assert [r["id"] for r in results] == ["a", "b", "c", "d", "e"]
    assert results[0] == {"id": "a", "reward": 1.0}
    assert results[1] == {"id": "b", "reward": 0.0}
    assert results[2] == {"id": "c", "formatFailure": True, "reason": "empty completion"}
    assert results[3] == {"id": "d", "error": "RuntimeError: metric bug"}
    assert "non-finite" in results[4]["error"]


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({}, '"items"'),
        ({"items": [{"id": "", "prompt": "p", "completion": "c"}]}, "id must be"),
        ({"items": [{"id": "x", "prompt": 1, "completion": "c"}]}, "must be strings"),
        ({"items": [{"id": "x", "prompt": "p", "completion": "c", "example": []}]}, "example must be"),
        (
            {
                "items": [
                    {"id": "x", "prompt": "p", "completion": "c"},
                    {"id": "x", "prompt": "p", "completion": "c"},
                ]
            },
            "repeated",
        ),
    ],
)
def test_bad_requests_get_400_with_a_reason(server: MetricServer, body: Any, fragment: str) -> None:
    status, answer = post(server.url + "/score", body)
    assert status == 400
    assert fragment in answer["error"]


def test_async_metric_is_supported() -> None:
    async def slow_len(example: dict[str, Any], completion: str) -> float:
        await asyncio.sleep(0.01)
        return float(len(completion))

    with MetricServer(slow_len) as running:
        status, body = post(
            running.url + "/score", {"items": [{"id": "1", "prompt": "", "completion": "abc", "example": {}}]}
        )
    assert status == 200 and body["results"] == [{"id": "1", "reward": 3.0}]


def test_request_parser_and_response_matcher() -> None:
    items = parse_score_request({"items": [{"id": "1", "prompt": "p", "completion": "c"}]})
    assert items == [ScoreItem("1", "p", "c", {})]
    results = parse_score_response(
        {"results": [{"id": "2", "formatFailure": True, "reason": "x"}, {"id": "1", "reward": 0.5}]},
        ["1", "2", "3"],
    )
    assert [(r.id, r.kind, r.reward) for r in results] == [
        ("1", "reward", 0.5),
        ("2", "format_failure", None),
        ("3", "error", None),
    ]
    assert parse_score_response({"results": [{"id": "1", "reward": True}]}, ["1"])[0].kind == "error"
    with pytest.raises(ProtocolError):
        parse_score_response({"nope": []}, ["1"])
