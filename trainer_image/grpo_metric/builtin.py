"""The stock metric image's server (``python -m grpo_metric.builtin``): rewards without building an image.

It serves, as any metric image does, one of two things the operator puts in its environment from the
job's spec.metric:

- ``GRPO_METRIC_REWARDS`` (spec.metric.rewards, as JSON): built-in rewards, each answered as a reward
  component under its name (the trainer sums them, or weighs them by spec.metric.rewardWeights):
  ``exactMatch`` against a dataset column, ``mathAnswer`` (math equivalence, HuggingFace's math-verify),
  ``regex`` (a format the completion must contain) and ``length`` (a penalty past maxTokens);
- ``GRPO_METRIC_FUNCTION_SOURCE`` and ``GRPO_METRIC_FUNCTION_NAME`` (spec.metric.function): the user's
  own Python source, from their ConfigMap, and the function in it to serve.

A configuration it cannot use (invalid JSON, an unknown type, a pattern that is not a regular expression,
source that does not define the function) stops it at start with one line naming the field: the metric
pod then fails, and ``kubectl grpo logs JOB --role metric`` shows why. The names and defaults repeat
operator/grpo_operator/api/builtin_rewards.py, which this package does not import (a metric image needs
only grpo_metric and aiohttp; math-verify for mathAnswer).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grpo_metric.server import FormatFailure, MetricFn, serve

REWARDS_ENV = "GRPO_METRIC_REWARDS"
FUNCTION_SOURCE_ENV = "GRPO_METRIC_FUNCTION_SOURCE"
FUNCTION_NAME_ENV = "GRPO_METRIC_FUNCTION_NAME"
DEFAULT_NAMES = {
    "exactMatch": "exact_match",
    "mathAnswer": "math_answer",
    "regex": "format",
    "length": "length",
}
DEFAULT_ANSWER_FIELD = "answer"


class ConfigError(ValueError):
    """The stock image was given a configuration it cannot serve; the message names the field."""


@dataclass(frozen=True)
class Reward:
    """One built-in reward: its component name and how it scores one completion."""

    name: str
    score: Callable[[dict[str, Any], str, int | None], float]


def _normalise(text: str) -> str:
    return " ".join(text.split()).casefold()


def _reference(example: dict[str, Any], column: str) -> str:
    if column not in example:
        # The dataset's fault, not the policy's: an error for the item, counted against the error budget.
        raise KeyError(f"the dataset row has no {column!r} column (spec.metric.rewards[].field)")
    return str(example[column])


def exact_match(
    column: str, pattern: re.Pattern[str] | None
) -> Callable[[dict[str, Any], str, int | None], float]:
    def score(example: dict[str, Any], completion: str, _tokens: int | None) -> float:
        reference = _reference(example, column)
        answer = completion
        if pattern is not None:
            found = pattern.search(completion)
            if found is None:
                raise FormatFailure(
                    f"no answer where spec.metric.rewards[].pattern {pattern.pattern!r} looks"
                )
            answer = found.group(1) if found.groups() else found.group(0)
        return 1.0 if _normalise(answer) == _normalise(reference) else 0.0

    return score


def math_answer(column: str) -> Callable[[dict[str, Any], str, int | None], float]:
    # Imported here: only jobs with a mathAnswer reward need it (and its sympy).
    from math_verify import parse, verify

    # math-verify times out through signal.alarm, which works only on the main thread; the server scores on
    # worker threads, so its timeout is off and the trainer's request timeout bounds a slow item instead.
    logging.getLogger("math_verify").setLevel(logging.ERROR)

    def score(example: dict[str, Any], completion: str, _tokens: int | None) -> float:
        gold = parse(_reference(example, column), parsing_timeout=None)  # type: ignore[arg-type]
        if not gold:
            raise ValueError(
                f"the reference answer {example[column]!r} is not a math answer math-verify reads"
            )
        predicted = parse(completion, parsing_timeout=None)  # type: ignore[arg-type]
        if not predicted:
            raise FormatFailure("no final math answer found (e.g. \\boxed{...} or a last number)")
        return 1.0 if verify(gold, predicted, timeout_seconds=None) else 0.0

    return score


def regex(pattern: re.Pattern[str]) -> Callable[[dict[str, Any], str, int | None], float]:
    def score(_example: dict[str, Any], completion: str, _tokens: int | None) -> float:
        return 1.0 if pattern.search(completion) else 0.0

    return score


def length(max_tokens: int) -> Callable[[dict[str, Any], str, int | None], float]:
    def score(_example: dict[str, Any], completion: str, tokens: int | None) -> float:
        # The trainer sends the token count; an older one does not, and words stand in for tokens.
        n = tokens if tokens is not None else len(completion.split())
        return -min(1.0, max(0, n - max_tokens) / max_tokens)

    return score


def _compile(text: object, where: str) -> re.Pattern[str]:
    if not isinstance(text, str):
        raise ConfigError(f"{where}: a pattern must be a string")
    try:
        return re.compile(text, re.DOTALL)
    except re.error as exc:
        raise ConfigError(f"{where} {text!r} is not a Python regular expression: {exc}") from exc


def build_rewards(config: object) -> list[Reward]:
    """The rewards of spec.metric.rewards (its JSON), checked the way the API checks them."""
    if not isinstance(config, list) or not config:
        raise ConfigError("spec.metric.rewards must be a non-empty list")
    rewards: list[Reward] = []
    for i, entry in enumerate(config):
        where = f"spec.metric.rewards[{i}]"
        if not isinstance(entry, dict) or entry.get("type") not in DEFAULT_NAMES:
            raise ConfigError(f"{where}.type must be one of {', '.join(DEFAULT_NAMES)}")
        kind = entry["type"]
        column = str(entry.get("field") or DEFAULT_ANSWER_FIELD)
        if kind == "exactMatch":
            pattern = entry.get("pattern")
            score = exact_match(
                column, _compile(pattern, f"{where}.pattern") if pattern is not None else None
            )
        elif kind == "mathAnswer":
            score = math_answer(column)
        elif kind == "regex":
            score = regex(_compile(entry.get("pattern"), f"{where}.pattern"))
        else:
            max_tokens = entry.get("maxTokens")
            if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
                raise ConfigError(f"{where}.maxTokens must be a positive integer")
            score = length(max_tokens)
        rewards.append(Reward(str(entry.get("name") or DEFAULT_NAMES[kind]), score))
    if len({r.name for r in rewards}) != len(rewards):
        raise ConfigError("spec.metric.rewards[] must have distinct names")
    return rewards


def rewards_metric(rewards: list[Reward]) -> MetricFn:
    """One metric answering every reward as a component of its own."""

    def metric(
        example: dict[str, Any], completion: str, completion_tokens: int | None = None
    ) -> dict[str, float]:
        return {r.name: r.score(example, completion, completion_tokens) for r in rewards}

    metric.__name__ = "+".join(r.name for r in rewards)
    return metric


def load_function(source: str, name: str) -> MetricFn:
    """The function ``name`` defined by ``source`` (spec.metric.function's ConfigMap key), run as a module
    named ``user_metric``; its ``if __name__ == "__main__"`` block, if any, does not run."""
    module = types.ModuleType("user_metric")
    module.__file__ = "<spec.metric.function>"
    sys.modules["user_metric"] = module
    try:
        exec(compile(source, "<spec.metric.function>", "exec"), module.__dict__)
    except Exception as exc:
        raise ConfigError(
            f"spec.metric.function: the source failed to load: {type(exc).__name__}: {exc}"
        ) from exc
    fn = module.__dict__.get(name)
    if not callable(fn):
        raise ConfigError(f"spec.metric.function.name {name!r}: the source defines no function of that name")
    return fn  # type: ignore[no-any-return]


def configured_metric(env: dict[str, str]) -> MetricFn:
    """What the environment asks the stock image to serve."""
    if FUNCTION_SOURCE_ENV in env:
        return load_function(env[FUNCTION_SOURCE_ENV], env.get(FUNCTION_NAME_ENV) or "metric")
    if REWARDS_ENV in env:
        try:
            config = json.loads(env[REWARDS_ENV])
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{REWARDS_ENV} is not JSON: {exc}") from exc
        return rewards_metric(build_rewards(config))
    raise ConfigError(
        "nothing to serve: the stock metric image computes spec.metric.rewards or runs spec.metric.function; "
        "set one of them in the GRPOJob"
    )


def main() -> int:
    try:
        metric = configured_metric(dict(os.environ))
    except ConfigError as exc:
        print(f"grpo-metric: {exc}", file=sys.stderr)
        return 2
    serve(metric)
    return 0


if __name__ == "__main__":
    sys.exit(main())
