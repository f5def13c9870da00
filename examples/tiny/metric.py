"""The demo job's metric: the share of the completion made of the example's target character.

A freshly initialised tiny model writes each character about equally often, so the reward starts
near 1/60 and GRPO can raise it within tens of steps on a CPU: a task small enough to watch learn.
An empty completion cannot be judged and is a format failure (scored formatFailureScore).
Built with the metric SDK, like any metric image (see docs/metric-contract.md)."""

from __future__ import annotations

from typing import Any

from grpo_metric import FormatFailure, serve


def target_fraction(example: dict[str, Any], completion: str) -> float:
    if not completion:
        raise FormatFailure("empty completion")
    target = str(example.get("answer", "a"))
    return completion.count(target) / len(completion)


if __name__ == "__main__":
    serve(target_fraction)
