"""What the metric learns about each completion besides its text: its token count and finish reason
(``completionTokens``, ``finishReason``), from the trainer's reward function through the client and a
real SDK server to the user's metric, and the SDK's handling of requests with and without them."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from grpo_metric import FINISH_LENGTH, FINISH_STOP, MetricServer, ScoreItem
from grpo_metric.protocol import ProtocolError, parse_score_request
from grpo_metric.server import completion_kwargs
from grpo_trainer.metric_client import ClientSettings, MetricClient
from grpo_trainer.reward import CompletionEnds, MetricReward

from tests.unit.test_metric_sdk import post

EOS, PAD = 2, 0


class Recorder:
    """A metric that keeps what it was called with, by completion text."""

    def __init__(self) -> None:
        self.seen: dict[str, tuple[int | None, str | None]] = {}
        self.lock = threading.Lock()

    def __call__(
        self,
        example: dict[str, Any],
        completion: str,
        *,
        completion_tokens: int | None = None,
        finish_reason: str | None = None,
    ) -> float:
        with self.lock:
            self.seen[completion] = (completion_tokens, finish_reason)
        return 0.0 if finish_reason == FINISH_LENGTH else 1.0


@pytest.fixture
def recorder() -> Iterator[tuple[Recorder, MetricServer]]:
    metric = Recorder()
    with MetricServer(metric) as server:
        yield metric, server


def test_the_reward_function_sends_token_counts_and_finish_reasons(
    recorder: tuple[Recorder, MetricServer],
) -> None:
    metric, server = recorder
    client = MetricClient(ClientSettings(url=server.url, timeout_seconds=10))
    try:
        reward = MetricReward(client, format_failure_score=-1.0)
        reward.ends = CompletionEnds(frozenset({EOS, PAD}), max_completion_length=4)
        # As TRL calls it: the completions' token ids, the end token included when the model emitted one.
        completion_ids = [
            [5, 6, EOS],  # ended by the model
            [5, 6, 7, 8],  # the whole budget, no end token: cut off
            [5, 6, 7, EOS],  # the whole budget, ending on EOS: finished
            [5, 6],  # short without an end token (a stop string): not cut off at the limit
            [5, 6, 7, PAD],  # TRL counts the pad token as an end too
        ]
        completions = ["stopped", "cut", "full-eos", "stop-string", "pad"]
        rewards = reward(
            prompts=["p"] * 5, completions=completions, completion_ids=completion_ids, answer=["a"] * 5
        )
    finally:
        client.close()
    assert metric.seen == {
        "stopped": (3, FINISH_STOP),
        "cut": (4, FINISH_LENGTH),
        "full-eos": (4, FINISH_STOP),
        "stop-string": (2, FINISH_STOP),
        "pad": (4, FINISH_STOP),
    }
    assert rewards == [1.0, 0.0, 1.0, 1.0, 1.0]


def test_without_token_ids_or_end_tokens_the_fields_are_left_out() -> None:
    reward = MetricReward(client=None, format_failure_score=-1.0)  # type: ignore[arg-type]
    no_ids = reward.build_items(["p"], ["c"], {}, tag="t")[0]
    assert (no_ids.completion_tokens, no_ids.finish_reason) == (None, None)
    assert set(no_ids.to_json()) == {"id", "prompt", "completion", "example"}
    no_ends = reward.build_items(["p"], ["c"], {}, tag="t", completion_ids=[[1, 2]])[0]
    assert no_ends.to_json()["completionTokens"] == 2 and "finishReason" not in no_ends.to_json()
    # TRL's completion_ids column is no dataset column: it must not reach the metric's example.
    assert (
        "completion_ids"
        not in reward.build_items(["p"], ["c"], {"completion_ids": [[1]]}, tag="t")[0].example
    )


def test_the_sdk_passes_only_what_the_metric_takes() -> None:
    def two(example: dict[str, Any], completion: str) -> float:
        return 1.0

    def finish_only(example: dict[str, Any], completion: str, finish_reason: str | None = None) -> float:
        return 1.0

    def anything(example: dict[str, Any], completion: str, **kwargs: Any) -> float:
        return 1.0

    assert completion_kwargs(two) == ()
    assert completion_kwargs(finish_only) == ("finish_reason",)
    assert completion_kwargs(anything) == ("completion_tokens", "finish_reason")


@pytest.mark.parametrize(
    "fields",
    [{}, {"completionTokens": 7, "finishReason": "length", "newerField": [1]}],
    ids=["an older trainer's request", "new fields and one this SDK does not know"],
)
def test_two_argument_and_keyword_metrics_accept_requests_with_and_without_the_fields(
    fields: dict[str, Any],
) -> None:
    seen: list[dict[str, Any]] = []

    def two(example: dict[str, Any], completion: str) -> float:
        return 0.5

    def keywords(example: dict[str, Any], completion: str, **kwargs: Any) -> float:
        seen.append(kwargs)
        return 0.25

    item = {"id": "a", "prompt": "p", "completion": "c", "example": {}, **fields}
    for metric, expected in ((two, 0.5), (keywords, 0.25)):
        with MetricServer(metric) as server:
            status, body = post(server.url + "/score", {"items": [item]})
        assert status == 200 and body == {"results": [{"id": "a", "reward": expected}]}
    assert seen == [
        {
            "completion_tokens": fields.get("completionTokens"),
            "finish_reason": fields.get("finishReason"),
        }
    ]


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"completionTokens": -1}, "completionTokens must be a non-negative integer"),
        ({"completionTokens": 1.5}, "completionTokens must be a non-negative integer"),
        ({"completionTokens": True}, "completionTokens must be a non-negative integer"),
        ({"finishReason": 3}, "finishReason must be a string"),
    ],
)
def test_malformed_fields_are_refused(fields: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ProtocolError, match=fragment):
        parse_score_request({"items": [{"id": "a", "prompt": "p", "completion": "c", **fields}]})


def test_fields_round_trip_and_unknown_finish_reasons_pass() -> None:
    item = ScoreItem("a", "p", "c", {}, completion_tokens=3, finish_reason="tool_calls")
    assert parse_score_request({"items": [item.to_json()]}) == [item]
    nulls = {"id": "a", "prompt": "p", "completion": "c", "completionTokens": None, "finishReason": None}
    assert parse_score_request({"items": [nulls]}) == [ScoreItem("a", "p", "c")]
