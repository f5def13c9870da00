"""The demo task's reward in named parts: how a metric answers reward components.

- ``target_share``: the share of the completion made of the example's target character (the reward of
  examples/tiny/metric.py);
- ``finished``: 1 when the completion ended by itself (``finishReason`` "stop"), 0 when it was cut off at
  spec.grpo.maxCompletionLength or the trainer did not say.

The reward the trainer uses is their sum, or their weighted sum under spec.metric.rewardWeights (e.g.
``{target_share: 1.0, finished: 0.1}``); each part's mean is in the job's status.rewards.components,
metrics.jsonl and Prometheus (grpo_reward_component_mean), and `kubectl grpo rewards` shows them.
An empty completion cannot be judged and is a format failure, as in metric.py.
Built with the metric SDK (see docs/metric-contract.md)."""

from __future__ import annotations

from typing import Any

from grpo_metric import FINISH_STOP, FormatFailure, serve


def target_and_finish(
    example: dict[str, Any], completion: str, finish_reason: str | None = None
) -> dict[str, float]:
    if not completion:
        raise FormatFailure("empty completion")
    target = str(example.get("answer", "a"))
    return {
        "target_share": completion.count(target) / len(completion),
        "finished": 1.0 if finish_reason == FINISH_STOP else 0.0,
    }


if __name__ == "__main__":
    serve(target_and_finish)
