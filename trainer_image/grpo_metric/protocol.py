"""The metric HTTP protocol (docs/metric-contract.md), shared by the SDK server and the trainer's client.

    GET  /healthz -> 200 {"status": "ok"}
    POST /score   {"items": [{"id", "prompt", "completion", "example"}]}
               -> {"results": [{"id", "reward"} | {"id", "formatFailure": true, "reason"} | {"id", "error"}]}

Only the standard library is used so that both sides can import it without extra dependencies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

HEALTH_PATH = "/healthz"
SCORE_PATH = "/score"
# Where serve(metric, validation=...) scores validation answers: same protocol, another reward.
VALIDATE_PATH = "/validate"


class ProtocolError(ValueError):
    """A request or response that does not follow the metric protocol."""


@dataclass(frozen=True)
class ScoreItem:
    id: str
    prompt: str
    completion: str
    example: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "prompt": self.prompt, "completion": self.completion, "example": self.example}


ResultKind = Literal["reward", "format_failure", "error"]


@dataclass(frozen=True)
class ScoreResult:
    """One item's outcome: a reward, a format failure (the policy's fault) or an error (infrastructure)."""

    id: str
    kind: ResultKind
    reward: float | None = None
    reason: str = ""

    @staticmethod
    def ok(item_id: str, reward: float) -> ScoreResult:
        return ScoreResult(item_id, "reward", reward=reward)

    @staticmethod
    def format_failure(item_id: str, reason: str) -> ScoreResult:
        return ScoreResult(item_id, "format_failure", reason=reason)

    @staticmethod
    def error(item_id: str, reason: str) -> ScoreResult:
        return ScoreResult(item_id, "error", reason=reason)

    def to_json(self) -> dict[str, Any]:
        if self.kind == "reward":
            return {"id": self.id, "reward": self.reward}
        if self.kind == "format_failure":
            return {"id": self.id, "formatFailure": True, "reason": self.reason}
        return {"id": self.id, "error": self.reason}


def parse_score_request(body: Any) -> list[ScoreItem]:
    """Validate a decoded POST /score body; raise ProtocolError saying what is wrong."""
    if not isinstance(body, dict) or not isinstance(body.get("items"), list):
        raise ProtocolError('request body must be a JSON object with a list "items"')
    items: list[ScoreItem] = []
    seen: set[str] = set()
    for index, raw in enumerate(body["items"]):
        if not isinstance(raw, dict):
            raise ProtocolError(f"items[{index}] must be an object")
        item_id, prompt, completion = raw.get("id"), raw.get("prompt"), raw.get("completion")
        example = raw.get("example", {})
        if not isinstance(item_id, str) or not item_id:
            raise ProtocolError(f"items[{index}].id must be a non-empty string")
        if item_id in seen:
            raise ProtocolError(f"items[{index}].id {item_id!r} is repeated; ids must be unique in a batch")
        seen.add(item_id)
        if not isinstance(prompt, str) or not isinstance(completion, str):
            raise ProtocolError(f"items[{index}].prompt and .completion must be strings")
        if not isinstance(example, dict):
            raise ProtocolError(f"items[{index}].example must be an object (the dataset row)")
        items.append(ScoreItem(item_id, prompt, completion, example))
    return items


def parse_result(raw: Any) -> ScoreResult:
    """Decode one entry of a /score response. A malformed entry becomes an error result, not an exception,
    so one bad item cannot poison the rest of its batch."""
    if not isinstance(raw, dict) or not isinstance(raw.get("id"), str):
        raise ProtocolError('every result must be an object with a string "id"')
    item_id: str = raw["id"]
    if "error" in raw:
        return ScoreResult.error(item_id, str(raw["error"]))
    if raw.get("formatFailure") is True:
        return ScoreResult.format_failure(item_id, str(raw.get("reason", "")))
    reward = raw.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        return ScoreResult.error(item_id, f"result has no numeric reward: {raw!r}")
    if not math.isfinite(float(reward)):
        return ScoreResult.error(item_id, f"reward is not finite: {reward!r}")
    return ScoreResult.ok(item_id, float(reward))


def parse_score_response(body: Any, expected_ids: list[str]) -> list[ScoreResult]:
    """Match a /score response to the request's ids, in request order. Missing ids become errors."""
    if not isinstance(body, dict) or not isinstance(body.get("results"), list):
        raise ProtocolError('response body must be a JSON object with a list "results"')
    by_id: dict[str, ScoreResult] = {}
    for raw in body["results"]:
        result = parse_result(raw)
        by_id[result.id] = result
    return [
        by_id.get(item_id) or ScoreResult.error(item_id, "metric service returned no result for this id")
        for item_id in expected_ids
    ]
