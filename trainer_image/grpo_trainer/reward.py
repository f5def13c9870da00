"""The reward function TRL calls: scores completions through the metric service and maps the protocol's
three outcomes onto TRL's reward list (reward -> float, format failure -> formatFailureScore, error ->
None, which the advantage code leaves out of the group statistics)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grpo_metric.protocol import ScoreItem, ScoreResult

from grpo_trainer.metric_client import MetricClient

# Columns TRL adds to a reward function's kwargs that are not dataset columns.
_TRL_KWARGS = frozenset({"trainer_state", "log_extra", "log_metric", "environments", "completion_ids"})


def text_of(value: Any) -> str:
    """A prompt or completion as text: plain strings as they are, chat messages as their last content."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and isinstance(value[-1], dict):
        content = value[-1].get("content", "")
        if isinstance(content, list):  # content blocks
            return "".join(str(block.get("text", "")) for block in content if isinstance(block, dict))
        return str(content)
    return str(value)


@dataclass
class ScoredBatch:
    """What the last call saw, for sample logging and the step's counters."""

    prompts: list[str] = field(default_factory=list)
    completions: list[str] = field(default_factory=list)
    results: list[ScoreResult] = field(default_factory=list)

    @property
    def format_failures(self) -> int:
        return sum(r.kind == "format_failure" for r in self.results)

    @property
    def errors(self) -> int:
        return sum(r.kind == "error" for r in self.results)


class MetricReward:
    __name__ = "metric"  # TRL logs rewards/<__name__>/mean

    def __init__(self, client: MetricClient, format_failure_score: float, rank: int = 0):
        self.client = client
        self.format_failure_score = format_failure_score
        self.rank = rank
        self.last = ScoredBatch()
        self.calls = 0

    def build_items(
        self, prompts: list[Any], completions: list[Any], columns: dict[str, list[Any]], tag: str
    ) -> list[ScoreItem]:
        items = []
        for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
            example = {key: values[i] for key, values in columns.items() if key not in _TRL_KWARGS}
            example.setdefault("prompt", prompt)
            items.append(ScoreItem(f"{tag}-r{self.rank}-{i}", text_of(prompt), text_of(completion), example))
        return items

    def to_reward(self, result: ScoreResult) -> float | None:
        if result.kind == "reward":
            return result.reward
        if result.kind == "format_failure":
            return self.format_failure_score
        return None

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        state = kwargs.get("trainer_state")
        step = getattr(state, "global_step", 0)
        self.calls += 1
        items = self.build_items(prompts, completions, kwargs, tag=f"s{step}-c{self.calls}")
        results = self.client.score(items)
        self.last = ScoredBatch([i.prompt for i in items], [i.completion for i in items], results)
        return [self.to_reward(r) for r in results]
