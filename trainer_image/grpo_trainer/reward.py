"""The reward function TRL calls: scores completions through the metric service and maps the protocol's
three outcomes onto TRL's reward list (reward -> float, format failure -> formatFailureScore, error ->
None, which the advantage code leaves out of the group statistics)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from grpo_metric.protocol import FINISH_LENGTH, FINISH_STOP, ScoreItem, ScoreResult

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


@dataclass(frozen=True)
class CompletionEnds:
    """How to tell why a completion ended from its token ids, as TRL tells a truncated completion
    (``completions/clipped_ratio``, ``mask_truncated_completions``): one whose last token is neither an
    end-of-sequence nor the pad token did not end by itself."""

    end_token_ids: frozenset[int]
    max_completion_length: int

    def finish_reason(self, ids: Sequence[int]) -> str:
        # A completion that stopped early without an end token (a stop string, a client's own limit) was
        # not cut off at maxCompletionLength: only one that used the whole budget is "length".
        if ids and ids[-1] not in self.end_token_ids and len(ids) >= self.max_completion_length:
            return FINISH_LENGTH
        return FINISH_STOP


@dataclass
class ScoredBatch:
    """What the last call saw, for sample logging and the step's counters."""

    prompts: list[str] = field(default_factory=list)
    completions: list[str] = field(default_factory=list)
    results: list[ScoreResult] = field(default_factory=list)
    # The items as sent: their dataset row (the reference answer among its columns) and why each ended.
    items: list[ScoreItem] = field(default_factory=list)
    # Of the errors, those that are not the metric's (an environment that failed the episode): counted apart
    # (grpo_episodes_total, environment_errors) and against the environment's own budget.
    environment_errors: int = 0

    @property
    def format_failures(self) -> int:
        return sum(r.kind == "format_failure" for r in self.results)

    @property
    def errors(self) -> int:
        return sum(r.kind == "error" for r in self.results)

    @property
    def metric_errors(self) -> int:
        """What the metric service failed to score: the step's metric_error_ratio, grpo_metric_errors_total,
        spec.metric.errorBudget and the MetricErrors diagnosis."""
        return self.errors - self.environment_errors

    def component_totals(self) -> dict[str, tuple[float, int]]:
        """Each reward component's (sum, count) over the scored completions (format failures and errors
        have none)."""
        totals: dict[str, tuple[float, int]] = {}
        for result in self.results:
            if result.kind != "reward" or not result.components:
                continue
            for name, value in result.components.items():
                total, count = totals.get(name, (0.0, 0))
                totals[name] = (total + value, count + 1)
        return totals


def item_key(item: ScoreItem) -> str:
    """What a score was computed from: every field of the item but its id."""
    fields = [item.prompt, item.completion, item.example, item.completion_tokens, item.finish_reason]
    return json.dumps(fields, sort_keys=True, default=str)


class MetricReward:
    __name__ = "metric"  # TRL logs rewards/<__name__>/mean

    def __init__(self, client: MetricClient, format_failure_score: float, rank: int = 0):
        self.client = client
        self.format_failure_score = format_failure_score
        self.rank = rank
        self.last = ScoredBatch()
        self.calls = 0
        # Set once the trainer knows its tokenizer's end tokens (metric_loop.py); until then, and for a
        # call without token ids, items carry no finishReason.
        self.ends: CompletionEnds | None = None
        # Scores of this step's completions streamed while they were sampled ahead (group_sampling.py), by
        # item_key; the next call uses those whose item it would send is the one scored, and clears them.
        self.prescored: dict[str, ScoreResult] = {}
        # Of the last call's completions, how many had a streamed score.
        self.last_prescored = 0

    def prescore(
        self,
        prompts: list[Any],
        completions: list[Any],
        columns: dict[str, list[Any]],
        completion_ids: Sequence[Sequence[int]],
        tag: str,
    ) -> list[tuple[str, ScoreResult]]:
        """Score completions ahead of their step (any thread): each one's item_key and result."""
        items = self.build_items(prompts, completions, columns, tag=tag, completion_ids=completion_ids)
        results = self.client.score(items, streamed=True)
        return [(item_key(item), result) for item, result in zip(items, results, strict=True)]

    def build_items(
        self,
        prompts: list[Any],
        completions: list[Any],
        columns: dict[str, list[Any]],
        tag: str,
        completion_ids: Sequence[Sequence[int]] | None = None,
    ) -> list[ScoreItem]:
        items = []
        for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
            example = {key: values[i] for key, values in columns.items() if key not in _TRL_KWARGS}
            example.setdefault("prompt", prompt)
            ids = completion_ids[i] if completion_ids is not None else None
            items.append(
                ScoreItem(
                    f"{tag}-r{self.rank}-{i}",
                    text_of(prompt),
                    text_of(completion),
                    example,
                    completion_tokens=len(ids) if ids is not None else None,
                    finish_reason=self.ends.finish_reason(ids) if ids is not None and self.ends else None,
                )
            )
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
        # TRL passes each completion's token ids (the end token included when the model emitted one).
        items = self.build_items(
            prompts,
            completions,
            kwargs,
            tag=f"s{step}-c{self.calls}",
            completion_ids=kwargs.get("completion_ids"),
        )
        results = self._scores(items)
        self.last = ScoredBatch([i.prompt for i in items], [i.completion for i in items], results, items)
        return [self.to_reward(r) for r in results]

    def _scores(self, items: list[ScoreItem]) -> list[ScoreResult]:
        """Each item's score: streamed ahead where it was, from the metric service now for the rest."""
        ahead, self.prescored = self.prescored, {}
        found: list[ScoreResult | None] = [ahead.get(item_key(item)) for item in items]
        # A streamed error is not final: the service may answer now (an error is never cached).
        found = [r if r is not None and r.kind != "error" else None for r in found]
        missing = [i for i, r in enumerate(found) if r is None]
        now = self.client.score([items[i] for i in missing]) if missing else []
        for i, result in zip(missing, now, strict=True):
            found[i] = result
        self.last_prescored = len(items) - len(missing)
        return [r for r in found if r is not None]
