"""Episodes (episodes.py) entering TRL through its public ``rollout_func`` hook, and their rewards.

TRL calls ``rollout_func`` on every rank with that rank's rows of the step (each prompt G times, after its
weight sync to vLLM). Only rank 0 talks to vLLM, as in TRL's own server mode: the ranks' prompts and rows are
gathered there, rank 0 runs every episode of the step (``spec.environment.concurrency`` at a time), and each
rank takes its slice back. The episode's completion, ``env_mask`` (model tokens 1, environment tokens 0) and
sampling log-probabilities go to TRL; its reward and outcome ride along as extra fields to
:class:`EnvironmentReward`, TRL's reward function for these jobs, which returns None (NaN: left out of the
group's statistics, advantage 0) for an episode the environment failed. With a metric beside the
environment, the metric scores each episode's final answer (the model's last turn) and the reward is the
environment's plus the metric's, the environment's share kept as the ``environment`` component.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from grpo_metric.protocol import SCORE_PATH, ScoreResult

from grpo_trainer.episodes import Episode, EpisodeRunner, TurnSampler, run_episodes
from grpo_trainer.reward import MetricReward, ScoredBatch

# Extra fields rollout_func returns; TRL merges them into the rows its reward function receives.
REWARD_FIELD = "environment_reward"
OUTCOME_FIELD = "environment_outcome"
REASON_FIELD = "environment_reason"
PROMPT_TEXT_FIELD = "environment_prompt"
EPISODE_TEXT_FIELD = "environment_episode"
FINAL_ANSWER_FIELD = "environment_final_answer"
EPISODE_FIELDS = frozenset(
    {REWARD_FIELD, OUTCOME_FIELD, REASON_FIELD, PROMPT_TEXT_FIELD, EPISODE_TEXT_FIELD, FINAL_ANSWER_FIELD}
)


def sampled_logprobs(
    ids: list[int], logprobs: list[list[float | None]], token_ids: list[list[int]] | None
) -> list[float]:
    """Each sampled token's log-probability from TRL's client answer (one entry per token; with top-k
    alternatives the sampled token's own entry is found by id)."""
    out: list[float] = []
    for i, token in enumerate(ids):
        entries = logprobs[i] if i < len(logprobs) else []
        value: float | None = None
        if token_ids is not None and i < len(token_ids) and token in token_ids[i]:
            value = entries[token_ids[i].index(token)]
        elif entries:
            value = entries[0]
        out.append(math.nan if value is None else float(value))
    return out


def vllm_turn_sampler(trainer: Any, ahead: bool = False) -> TurnSampler:
    """Rank 0: one model turn from the job's vLLM server(s), sampled as TRL samples the job's single-turn
    completions (its sampling parameters), through the client that rides out a replaced server; ``ahead``
    (episodes run by the producer of an asynchronous job) without the ride-out, which pushes weights and so
    belongs to the training thread: a lost server fails those episodes' request, and the step runs them
    again itself."""
    from grpo_trainer.async_generation import sampling_params
    from grpo_trainer.trl_adapter import vllm_client

    client = vllm_client(trainer)
    generate = getattr(trainer.vllm_generation, "raw_generate", client.generate) if ahead else client.generate
    params = sampling_params(trainer.vllm_generation, 1)

    def sample(context_ids: list[int], max_tokens: int) -> tuple[list[int], list[float]]:
        answer = generate(prompts=[context_ids], **{**params, "max_tokens": max_tokens})
        ids = [int(t) for t in answer["completion_ids"][0]]
        token_ids = answer.get("logprob_token_ids")
        return ids, sampled_logprobs(ids, answer["logprobs"][0], token_ids[0] if token_ids else None)

    return sample


@dataclass
class EpisodeStats:
    """The last step's episodes, all ranks' (rank 0's record, broadcast): metrics.jsonl and Prometheus."""

    episodes: int = 0
    turns: int = 0
    model_tokens: int = 0
    episode_tokens: int = 0
    done: int = 0
    truncated: int = 0
    format_failures: int = 0
    environment_errors: int = 0
    step_seconds: list[float] = field(default_factory=list)
    wall_seconds: float = 0.0

    @classmethod
    def of(cls, episodes: list[Episode], wall_seconds: float) -> EpisodeStats:
        outcomes = [e.outcome for e in episodes]
        return cls(
            episodes=len(episodes),
            turns=sum(len([t for t in e.turns if t.ids]) for e in episodes),
            model_tokens=sum(e.model_tokens for e in episodes),
            episode_tokens=sum(len(e.completion_ids) for e in episodes),
            done=outcomes.count("done"),
            truncated=outcomes.count("truncated"),
            format_failures=outcomes.count("format_failure"),
            environment_errors=outcomes.count("environment_error"),
            step_seconds=[s for e in episodes for s in e.step_seconds],
            wall_seconds=wall_seconds,
        )

    def fields(self) -> dict[str, Any]:
        """metrics.jsonl's episode fields."""
        steps = sorted(self.step_seconds)
        n = max(1, self.episodes)
        return {
            "episodes": self.episodes,
            "episode_turns_mean": round(self.turns / n, 4),
            "episode_tokens_mean": round(self.episode_tokens / n, 2),
            "episode_model_tokens_mean": round(self.model_tokens / n, 2),
            "episodes_truncated": self.truncated,
            "episode_format_failures": self.format_failures,
            "environment_errors": self.environment_errors,
            "environment_steps": len(steps),
            "environment_step_seconds_p50": round(steps[len(steps) // 2], 4) if steps else None,
            "environment_step_seconds_max": round(steps[-1], 4) if steps else None,
            "episodes_seconds": round(self.wall_seconds, 4),
        }


@dataclass
class EpisodeBook:
    """What the last step's episodes were, on every rank: the stats, and every rank's episodes of each
    generation round (one, or more when dynamic sampling ran new groups in place of tied ones)."""

    stats: EpisodeStats = field(default_factory=EpisodeStats)
    rounds: list[list[Episode]] = field(default_factory=list)
    total_seconds: float = 0.0
    # Wall time of this step's rounds.
    step_seconds: float = 0.0

    def record(self, round_index: int, episodes: list[Episode], seconds: float) -> None:
        """A round's episodes; round 0 starts the step. The stats cover every round's."""
        if round_index == 0:
            self.rounds, self.step_seconds = [], 0.0
        self.rounds.append(episodes)
        self.step_seconds += seconds
        self.total_seconds += seconds
        self.stats = EpisodeStats.of([e for r in self.rounds for e in r], self.step_seconds)

    @property
    def episodes(self) -> list[Episode]:
        return [e for r in self.rounds for e in r]


def _gather(items: list[Any], world: int) -> list[Any]:
    if world <= 1:
        return items
    from accelerate.utils import gather_object

    return list(gather_object(items))


def broadcast(value: Any, world: int) -> Any:
    if world <= 1:
        return value
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def push_trained_weights(trainer: Any) -> None:
    """Every rank: vLLM gets the weights of the last optimizer step unless it serves them already, as TRL
    pushes them before a generation round (an asynchronous job's push waits between its producer's runs)."""
    asynchronous = getattr(trainer, "grpo_async", None)
    if asynchronous is not None:
        asynchronous.push_if_due()
    elif trainer.state.global_step != trainer._last_loaded_step:
        trainer.vllm_generation.sync_weights()
        trainer._last_loaded_step = trainer.state.global_step


class EpisodeRollouts:
    """TRL's rollout_func for environment jobs (``__call__``), and the step's episodes on rank 0 (``run``),
    which an asynchronous job's producer also runs ahead (async_generation.py). ``runner_for(trainer,
    ahead)`` builds rank 0's EpisodeRunner; ``before_episodes`` runs on rank 0 before each step's episodes
    (waiting for a replaced environment)."""

    def __init__(
        self,
        runner_for: Callable[[Any, bool], EpisodeRunner],
        concurrency: int,
        book: EpisodeBook,
        before_episodes: Callable[[], None] | None = None,
    ) -> None:
        self.runner_for = runner_for
        self.concurrency = concurrency
        self.book = book
        self.before_episodes = before_episodes
        self._runners: dict[tuple[int, bool], EpisodeRunner] = {}

    def run(
        self, trainer: Any, prompts: list[Any], rows: list[dict[str, Any]], ahead: bool = False
    ) -> tuple[list[Episode], float]:
        """Rank 0: every episode of a step, on the weights vLLM serves now."""
        key = (id(trainer), ahead)
        runner = self._runners.get(key)
        if runner is None:
            runner = self._runners[key] = self.runner_for(trainer, ahead)
        if self.before_episodes is not None:
            self.before_episodes()
        return run_episodes(runner, prompts, rows, self.concurrency)

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        rows = list(getattr(trainer, "grpo_current_rows", None) or [{} for _ in prompts])
        if len(rows) != len(prompts):
            raise RuntimeError(f"rollout_func got {len(prompts)} prompts but {len(rows)} rows")
        world = int(trainer.accelerator.num_processes)
        rank = int(trainer.accelerator.process_index)
        all_prompts = _gather(list(prompts), world)
        all_rows = _gather([{k: v for k, v in r.items() if k != "prompt"} for r in rows], world)
        answer: tuple[list[Episode], float, Any] | None = None
        if rank == 0:
            asynchronous = getattr(trainer, "grpo_async", None)
            if asynchronous is not None and asynchronous.episode_source is not None:
                (episodes, seconds), record = asynchronous.take_episodes(
                    all_prompts, all_rows, lambda: self.run(trainer, all_prompts, all_rows)
                )
                version = record.policy_version
                answer = (episodes, seconds, record)
            else:
                # TRL pushed the step's weights just before (version: the optimizer steps they hold).
                version = int(trainer.state.global_step)
                answer = (*self.run(trainer, all_prompts, all_rows), None)
            for episode in answer[0]:
                episode.policy_version = version
        episodes, seconds, record = broadcast(answer, world)
        if record is not None:
            trainer.grpo_async.last = record
        self.book.record(int(getattr(trainer, "grpo_round", 0)), episodes, seconds)
        n = len(prompts)
        mine = episodes[rank * n : rank * n + n]
        return {
            "prompt_ids": [e.prompt_ids for e in mine],
            "completion_ids": [e.completion_ids for e in mine],
            "logprobs": [e.logprobs for e in mine],
            "env_mask": [e.env_mask for e in mine],
            **episode_fields(mine),
        }


def episode_fields(episodes: list[Episode]) -> dict[str, list[Any]]:
    """What EnvironmentReward reads of each episode, by the extra field rollout_func hands TRL."""
    return {
        REWARD_FIELD: [e.reward for e in episodes],
        OUTCOME_FIELD: [e.outcome for e in episodes],
        REASON_FIELD: [e.reason for e in episodes],
        PROMPT_TEXT_FIELD: [e.prompt_text for e in episodes],
        EPISODE_TEXT_FIELD: [e.text() for e in episodes],
        FINAL_ANSWER_FIELD: [e.final_answer for e in episodes],
    }


class EnvironmentReward:
    """TRL's reward function for environment jobs: the environment's reward of each episode (forwarded by
    rollout_func), None for an episode the environment failed; recorded for samples.jsonl and the step's
    counters as MetricReward records a metric's scores. With ``metric``, the metric also scores each scored
    episode's final answer: reward = environment's + metric's; the metric's format failure is the episode's
    (grpo.formatFailureScore), its error leaves the episode unscored and is counted in ``metric_errors``."""

    __name__ = "environment"  # TRL logs rewards/<__name__>/mean

    def __init__(self, metric: MetricReward | None = None) -> None:
        self.metric = metric
        self.last = ScoredBatch()
        # This rank's episodes of the last call the metric failed to score (not the environment's failures).
        self.metric_errors = 0

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        results = self.score(kwargs)
        self.last = ScoredBatch(
            list(kwargs[PROMPT_TEXT_FIELD]),
            list(kwargs[EPISODE_TEXT_FIELD]),
            results,
            environment_errors=sum(r.kind == "error" for r in results) - self.metric_errors,
        )
        return [r.reward if r.kind != "error" else None for r in results]

    def score(self, kwargs: dict[str, Any], path: str = SCORE_PATH) -> list[ScoreResult]:
        """Each episode's result from its fields (``episode_fields``) and dataset columns; ``path``: the
        metric's route (validation may have its own)."""
        results: list[ScoreResult] = []
        for i, (reward, outcome, reason) in enumerate(
            zip(kwargs[REWARD_FIELD], kwargs[OUTCOME_FIELD], kwargs[REASON_FIELD], strict=True)
        ):
            if outcome == "environment_error" or reward is None:
                results.append(ScoreResult.error(f"e{i}", str(reason)))
            elif outcome == "format_failure":
                results.append(
                    ScoreResult(f"e{i}", "format_failure", reward=float(reward), reason=str(reason))
                )
            else:
                results.append(ScoreResult.ok(f"e{i}", float(reward)))
        self.metric_errors = 0
        if self.metric is not None:
            results = self._with_metric(results, kwargs, path)
        return results

    def _with_metric(
        self, results: list[ScoreResult], kwargs: dict[str, Any], path: str
    ) -> list[ScoreResult]:
        metric = self.metric
        assert metric is not None
        scored = [i for i, r in enumerate(results) if r.kind == "reward"]
        if not scored:
            return results
        state = kwargs.get("trainer_state")
        metric.calls += 1
        columns = {
            k: [v[i] for i in scored]
            for k, v in kwargs.items()
            if k not in EPISODE_FIELDS and _per_row(v, results)
        }
        items = metric.build_items(
            [kwargs[PROMPT_TEXT_FIELD][i] for i in scored],
            [kwargs[FINAL_ANSWER_FIELD][i] for i in scored],
            columns,
            tag=f"s{getattr(state, 'global_step', 0)}-c{metric.calls}",
        )
        out = list(results)
        for i, answer in zip(scored, metric.client.score(items, path=path), strict=True):
            environment = float(results[i].reward or 0.0)
            if answer.kind == "reward" and answer.reward is not None:
                components = {"environment": environment, **(answer.components or {})}
                out[i] = ScoreResult.ok(results[i].id, environment + answer.reward, components)
            elif answer.kind == "format_failure":
                out[i] = ScoreResult(
                    results[i].id,
                    "format_failure",
                    reward=metric.format_failure_score,
                    reason=f"the metric found the final answer malformed: {answer.reason}",
                )
            else:
                self.metric_errors += 1
                out[i] = ScoreResult.error(
                    results[i].id, f"the metric service did not score it: {answer.reason}"
                )
        return out


def _per_row(values: Any, results: list[ScoreResult]) -> bool:
    """A dataset column as TRL hands it to reward functions: one value per completion."""
    return isinstance(values, list) and len(values) == len(results)
