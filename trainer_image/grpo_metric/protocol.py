"""The metric HTTP protocol (docs/metric-contract.md), shared by the SDK server and the trainer's client.

    GET  /healthz -> 200 {"status": "ok"}
    POST /score   {"items": [{"id", "prompt", "completion", "example"[, "completionTokens", "finishReason"]}]}
               -> {"results": [{"id", "reward"[, "components"]} | {"id", "components"}
                               | {"id", "formatFailure": true, "reason"} | {"id", "error"}]}

Only the standard library is used so that both sides can import it without extra dependencies.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

HEALTH_PATH = "/healthz"
SCORE_PATH = "/score"
# Where serve(metric, validation=...) scores validation answers: same protocol, another reward.
VALIDATE_PATH = "/validate"
# finishReason values the trainer sends: ended by the model ("stop") or cut off at maxCompletionLength
# ("length"). A service should accept others too: the set may grow, and unknown values are not an error.
FINISH_STOP = "stop"
FINISH_LENGTH = "length"


# Named parts of a reward (e.g. accuracy and format): at most this many per result, each name a short
# identifier, so that they can label Prometheus series and status fields without unbounded cardinality.
MAX_COMPONENTS = 16
COMPONENT_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
COMPONENT_NAME_RULE = "lowercase letters, digits and '_', starting with a letter, at most 32 characters"


class ProtocolError(ValueError):
    """A request or response that does not follow the metric protocol."""


@dataclass(frozen=True)
class ScoreItem:
    id: str
    prompt: str
    completion: str
    example: dict[str, Any] = field(default_factory=dict)
    # Optional (absent from older trainers' requests): the completion's length in tokens and why it ended.
    completion_tokens: int | None = None
    finish_reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "prompt": self.prompt,
            "completion": self.completion,
            "example": self.example,
        }
        if self.completion_tokens is not None:
            out["completionTokens"] = self.completion_tokens
        if self.finish_reason is not None:
            out["finishReason"] = self.finish_reason
        return out


ResultKind = Literal["reward", "format_failure", "error"]


@dataclass(frozen=True)
class ScoreResult:
    """One item's outcome: a reward, a format failure (the policy's fault) or an error (infrastructure)."""

    id: str
    kind: ResultKind
    reward: float | None = None
    reason: str = ""
    # The reward's named parts, when the metric sent them (a reward result only).
    components: Mapping[str, float] | None = None

    @staticmethod
    def ok(item_id: str, reward: float, components: Mapping[str, float] | None = None) -> ScoreResult:
        return ScoreResult(item_id, "reward", reward=reward, components=components)

    @staticmethod
    def format_failure(item_id: str, reason: str) -> ScoreResult:
        return ScoreResult(item_id, "format_failure", reason=reason)

    @staticmethod
    def error(item_id: str, reason: str) -> ScoreResult:
        return ScoreResult(item_id, "error", reason=reason)

    def to_json(self) -> dict[str, Any]:
        if self.kind == "reward":
            out: dict[str, Any] = {"id": self.id, "reward": self.reward}
            if self.components is not None:
                out["components"] = dict(self.components)
            return out
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
        # Optional fields: absent or null means unknown. Other unknown fields are ignored, so a newer
        # trainer can add fields without breaking services built with this SDK.
        tokens, finish = raw.get("completionTokens"), raw.get("finishReason")
        if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0):
            raise ProtocolError(f"items[{index}].completionTokens must be a non-negative integer")
        if finish is not None and not isinstance(finish, str):
            raise ProtocolError(f"items[{index}].finishReason must be a string")
        items.append(ScoreItem(item_id, prompt, completion, example, tokens, finish))
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
    components: dict[str, float] | None = None
    if raw.get("components") is not None:
        try:
            components = parse_components(raw["components"])
        except ProtocolError as exc:
            return ScoreResult.error(item_id, str(exc))
    reward = raw.get("reward")
    if reward is None and components:
        # Components without a reward: their sum (spec.metric.rewardWeights, when set, weighs them instead).
        return ScoreResult.ok(item_id, math.fsum(components.values()), components)
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        return ScoreResult.error(item_id, f"result has no numeric reward: {str(raw)[:200]}")
    if not math.isfinite(float(reward)):
        return ScoreResult.error(item_id, f"reward is not finite: {reward!r}")
    return ScoreResult.ok(item_id, float(reward), components)


def parse_components(raw: Any) -> dict[str, float]:
    """Validate a result's "components" ({name: finite number}); raise ProtocolError saying what is wrong."""
    if not isinstance(raw, dict):
        raise ProtocolError(f'"components" must be an object of name -> number, got {type(raw).__name__}')
    if len(raw) > MAX_COMPONENTS:
        raise ProtocolError(f'"components" has {len(raw)} entries; at most {MAX_COMPONENTS} are accepted')
    out: dict[str, float] = {}
    for name, value in raw.items():
        if not isinstance(name, str) or not COMPONENT_NAME.match(name):
            raise ProtocolError(f"component name {str(name)[:40]!r} is not {COMPONENT_NAME_RULE}")
        number = finite_number(value)
        if number is None:
            raise ProtocolError(f"component {name!r} is {str(value)[:40]!r}, not a finite number")
        out[name] = number
    return out


def finite_number(value: Any) -> float | None:
    """``value`` as a finite float, or None (not a number, a bool, NaN, infinite, or an int past float range):
    JSON allows integers no float holds, and Python's json reads NaN. The kubectl plugin reads the trainer's
    JSON figures with it too (kubectl_plugin/data.py)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


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
