"""The trainer's side of asynchronous GRPO (async_rollouts.py has the rules): which prompts are coming,
the producer on rank 0, and what each step got from it.

The prompts of the next steps come from transformers' own data iterator: at every optimizer step the
trainer pulls the batches of up to η steps ahead (GRPOTrainer's sampler repeats each step's generation
batch once per accumulation micro-step, so a step's first batch holds its prompts) and keeps them for
the steps they belong to. The order of the data does not change; only when it is read.

Environment jobs (a rollout_func) sample episodes ahead the same way: the producer runs a step's episodes
(``episode_source``, set by the environment loop) with the weights it started them on, and every episode
of the step is stamped with that version; the step's weight push waits for episodes in flight.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from grpo_trainer.async_rollouts import RolloutProducer, Taken
from grpo_trainer.group_sampling import GroupResult, GroupSampler, SampledStep, StepRequest
from grpo_trainer.single_turn import tokenize_prompts

log = logging.getLogger("grpo_trainer.async_generation")

# Groups of a step the producer has in flight at once: vLLM batches concurrent requests as it batches the
# prompts of one, and a bound keeps a very large step from opening hundreds of connections.
MAX_GROUPS_IN_FLIGHT = 64
# "0" turns off scoring groups as they are sampled, and pushes that interrupt the groups in flight
# (bench/async_overlap.py compares with and without; a job has no reason to set them).
STREAMED_SCORING_ENV = "GRPO_ASYNC_STREAMED_SCORING"
PUSH_INTERRUPTS_ENV = "GRPO_ASYNC_PUSH_INTERRUPTS"


@dataclass
class RolloutStep:
    """What one optimizer step's groups were (rank 0; metrics.jsonl, Prometheus, the status)."""

    step: int
    policy_version: int
    staleness: int
    groups: int
    waited_seconds: float
    # Why the groups sampled ahead were dropped (prom.DROP_REASONS), and in words; None: not dropped.
    dropped: str | None
    detail: str
    overlap_seconds: float = 0.0
    # Single-turn steps (group_sampling.py): the newest version among its groups (groups a push
    # interrupted are sampled again on the newer weights), how many were, how many arrived scored.
    newest_version: int | None = None
    group_versions: list[int] | None = None
    groups_resampled: int = 0
    groups_scored_ahead: int = 0
    # Seconds the step's weight push waited for the producer's request in flight.
    push_waited_seconds: float = 0.0

    def sampling_fields(self) -> dict[str, Any]:
        """metrics.jsonl fields of how the step's groups were sampled (docs/metrics.md)."""
        return {
            "policy_version_newest": self.newest_version,
            # Each group's version, in the step's group order (samples.jsonl's answers come G per group).
            "group_versions": self.group_versions,
            "groups_resampled": self.groups_resampled,
            "groups_scored_ahead": self.groups_scored_ahead,
            "push_wait_seconds": round(self.push_waited_seconds, 4),
        }


def sampling_params(vllm_generation: Any, num_generations: int) -> dict[str, Any]:
    """The sampling parameters of TRL 1.16's VLLMGeneration.generate in server mode (trl_adapter.py records
    the dependency), so that groups sampled ahead are sampled exactly as the step itself would."""
    g = vllm_generation
    return {
        "n": num_generations,
        "repetition_penalty": g.repetition_penalty,
        "temperature": g.temperature,
        "top_p": g.top_p,
        "top_k": g.top_k,
        "min_p": 0.0 if g.min_p is None else g.min_p,
        "max_tokens": g.max_completion_length,
        "logprobs": g.logprobs,
        "structured_outputs_regex": g.structured_outputs_regex,
        "generation_kwargs": g.generation_kwargs,
    }


class AsyncGeneration:
    """Look-ahead of the data, the producer, and each step's take, for one ProjectGRPOTrainer."""

    def __init__(self, trainer: Any, max_staleness: int) -> None:
        self.trainer = trainer
        self.max_staleness = max_staleness
        self._buffer: deque[Any] = deque()
        self._iterator: Iterator[Any] | None = None
        self._submitted_upto = 0
        self._producer: RolloutProducer | None = None
        self.sampler: GroupSampler | None = None
        self.last: RolloutStep | None = None
        # Seconds the last weight push waited for the producer's request in flight (rank 0).
        self.push_waited = 0.0
        # Environment jobs: runs a step's episodes on rank 0 from every rank's (prompts, rows), gathered.
        self.episode_source: Callable[[list[Any], list[dict[str, Any]]], Any] | None = None

    # -- the data -------------------------------------------------------------------------------------------

    def batch_samples(self, epoch_iterator: Iterator[Any], num_batches: int) -> list[Any]:
        """transformers' get_batch_samples for step global_step + 1, reading up to η steps ahead and
        queueing their prompts (every rank, in step: the prompts are gathered to rank 0)."""
        t = self.trainer
        step = t.state.global_step + 1
        if epoch_iterator is not self._iterator:
            # A new epoch's iterator: what was read ahead belonged to the last epoch and was all used.
            self._iterator = epoch_iterator
            self._buffer.clear()
            self._submitted_upto = step - 1
            if self._producer is not None:
                self._producer.discard_after(step - 1)
        items = [self._buffer.popleft() for _ in range(min(num_batches, len(self._buffer)))]
        items += self._pull(epoch_iterator, num_batches - len(items))
        if self._submitted_upto < step and items:
            self._submit(step, items[0])
        last = min(step + self.max_staleness, int(t.state.max_steps or step))
        while self._submitted_upto < last:
            ahead = self._pull(epoch_iterator, num_batches)
            if not ahead:
                break  # the epoch ends: the next one's first step is sampled when it starts
            self._buffer.extend(ahead)
            self._submit(self._submitted_upto + 1, ahead[0])
        return items

    @staticmethod
    def _pull(iterator: Iterator[Any], count: int) -> list[Any]:
        out: list[Any] = []
        for _ in range(count):
            try:
                out.append(next(iterator))
            except StopIteration:
                break
        return out

    def _submit(self, step: int, batch: list[dict[str, Any]]) -> None:
        from accelerate.utils import gather_object

        t = self.trainer
        if self.episode_source is not None:
            prompts_everywhere = gather_object(copy.deepcopy([x["prompt"] for x in batch]))
            rows_everywhere = gather_object([without_prompt(x) for x in batch])
            self._submitted_upto = step
            if t.accelerator.is_main_process:
                key = episode_keys(prompts_everywhere, rows_everywhere)
                self.producer().submit(step, key, request=(prompts_everywhere, rows_everywhere))
            return
        # As the step's own rollout_func tokenizes them (single_turn.py).
        prompts = copy.deepcopy([x["prompt"] for x in batch])
        prompt_ids = tokenize_prompts(t, prompts)
        everyone = gather_object(prompt_ids)
        streamed = metric_reward(t) is not None
        # For scoring each group as it is sampled: every completion row's prompt and dataset row.
        row_prompts = gather_object(prompts) if streamed else None
        rows = gather_object([without_prompt(x) for x in batch]) if streamed else None
        self._submitted_upto = step
        if t.accelerator.is_main_process:
            groups = [list(p) for p in everyone[:: t.num_generations]]
            self.producer().submit(step, groups, request=StepRequest(groups, row_prompts, rows))

    # -- the producer ---------------------------------------------------------------------------------------

    def producer(self) -> RolloutProducer:
        if self._producer is None and self.episode_source is not None:
            source = self.episode_source

            def episodes(request: tuple[list[Any], list[dict[str, Any]]]) -> Any:
                return source(*request)

            self._producer = RolloutProducer(episodes, self.max_staleness)
        if self._producer is None:
            vg = self.trainer.vllm_generation
            client = vg.vllm_client
            # The client's request without the ride-out of a replaced server (weight_sync.py): recovering
            # pushes weights, which only the training thread may do.
            raw_generate = getattr(vg, "raw_generate", client.generate)
            num_generations = int(self.trainer.num_generations)

            def generate_one(prompt: list[int]) -> dict[str, Any]:
                out: dict[str, Any] = raw_generate(
                    prompts=[prompt], features=None, **sampling_params(vg, num_generations)
                )
                return out

            def server_urls() -> list[str]:
                replicas = getattr(client, "serving", None)
                return [r.base_url for r in replicas()] if callable(replicas) else [str(client.base_url)]

            reward = metric_reward(self.trainer)
            metric = getattr(reward, "client", None)
            if os.environ.get(STREAMED_SCORING_ENV, "1") == "0":
                reward = None
            self.sampler = GroupSampler(
                generate_one,
                version=lambda: self._producer.version if self._producer is not None else None,
                server_urls=server_urls,
                concurrency=MAX_GROUPS_IN_FLIGHT,
                score_group=self._score_group if reward is not None else None,
                score_concurrency=int(metric.settings.concurrency) if metric is not None else 1,
            )
            interrupt = None if os.environ.get(PUSH_INTERRUPTS_ENV, "1") == "0" else self.sampler.interrupt
            self._producer = RolloutProducer(self.sampler, self.max_staleness, interrupt=interrupt)
        return self._producer

    def _score_group(self, request: StepRequest, group: int, result: GroupResult) -> list[Any]:
        """The producer's streamed scoring of one group: its completions decoded as TRL decodes them, with
        their prompts and dataset rows, each score keyed by the item it was computed from."""
        from trl.data_utils import is_conversational

        reward = metric_reward(self.trainer)
        assert reward is not None and request.rows is not None and request.row_prompts is not None
        g = len(result.completion_ids)
        rows = request.rows[group * g : (group + 1) * g]
        prompts = request.row_prompts[group * g : (group + 1) * g]
        texts = self.trainer.processing_class.batch_decode(result.completion_ids, skip_special_tokens=True)
        completions: list[Any] = (
            [[{"role": "assistant", "content": t}] for t in texts]
            if is_conversational({"prompt": prompts[0]})
            else list(texts)
        )
        columns = {
            k: [row.get(k) for row in rows] for k in rows[0] if k not in ("completion", "completion_ids")
        }
        scored: list[Any] = reward.prescore(
            prompts, completions, columns, result.completion_ids, tag=f"ahead-g{group}"
        )
        return scored

    # -- the step -------------------------------------------------------------------------------------------

    def generate_single_turn(self, prompt_ids: list[list[int]], images: Any, num_generations: int) -> Any:
        """A training step's single-turn completions (single_turn.SingleTurnRollouts): the weight push of a new
        step, then the step's groups from the producer, or sampled on the spot when they were dropped. Every
        rank calls it."""
        from accelerate.utils import broadcast_object_list, gather_object

        t = self.trainer
        main = t.accelerator.is_main_process
        step = t.state.global_step + 1
        waited_push = self.push_if_due()
        everyone = gather_object(prompt_ids)
        decision: list[Any] = [None]
        if main:
            taken = self.producer().take(step, [list(p) for p in everyone[::num_generations]])
            sampled = taken.rollout.payload if taken.rollout else None
            if isinstance(sampled, SampledStep):
                # The trainer's own wait for the metric: the streamed scores not yet back.
                waited = sampled.finish_scoring()
                reward = metric_reward(t)
                if reward is not None:
                    reward.client.stats.seconds_in_score += waited
            decision = [(sampled, self._describe(step, taken))]
        broadcast_object_list(decision, from_process=0)
        sampled, record = decision[0]
        payload = sampled.payload if isinstance(sampled, SampledStep) else sampled
        if payload is None:
            if main and record.dropped:
                log.warning("step %d: its groups sampled ahead were dropped (%s); sampling them now", step,
                            record.detail)  # fmt: skip
            with self.producer().pushing() if main else nullcontext():
                _, completion_ids, logprobs, _ = t.vllm_generation.generate(
                    prompts=prompt_ids, images=images, num_generations=num_generations
                )
        else:
            all_prompt_ids, all_completion_ids, all_logprobs, _ = payload
            del all_prompt_ids
            rank = t.accelerator.process_index
            local = slice(rank * len(prompt_ids), (rank + 1) * len(prompt_ids))
            completion_ids = all_completion_ids[local]
            logprobs = all_logprobs[local] if all_logprobs is not None else None
            reward = metric_reward(t)
            if reward is not None and isinstance(sampled, SampledStep):
                reward.prescored = {key: result for key, result in filter(None, sampled.scores[local])}
        record.waited_seconds += waited_push
        record.groups = len(everyone) // num_generations
        self.last = record
        if logprobs is None:
            return completion_ids, None
        return completion_ids, [[lp[0] for lp in seq] for seq in logprobs]

    def take_episodes(
        self, prompts: list[Any], rows: list[dict[str, Any]], run_now: Callable[[], Any]
    ) -> tuple[Any, RolloutStep]:
        """Rank 0, in a step of an environment job: the step's episodes sampled ahead, or, when they were
        dropped (or never sampled ahead), ``run_now()`` between two of the producer's requests; and the
        step's record (policy version, staleness, why dropped)."""
        step = self.trainer.state.global_step + 1
        taken = self.producer().take(step, episode_keys(prompts, rows))
        record = self._describe(step, taken)
        record.groups = len(prompts) // max(1, int(self.trainer.num_generations))
        record.waited_seconds += self.push_waited
        if taken.rollout is not None:
            return taken.rollout.payload, record
        if record.dropped:
            log.warning(
                "step %d: its episodes run ahead were dropped (%s); running them now", step, record.detail
            )
        with self.producer().pushing():
            return run_now(), record

    def push_if_due(self) -> float:
        """TRL's weight push when the trainer's step moved since the last one, between two of the producer's
        requests; returns the seconds spent waiting for the request in flight. Every rank calls it (the
        push gathers sharded weights). Validation samples through here too: its push is the next step's."""
        t = self.trainer
        if t.state.global_step == t._last_loaded_step:
            return 0.0
        main = t.accelerator.is_main_process
        started = time.monotonic()
        waited = 0.0
        version = int(t.state.global_step)
        producer = self.producer() if main else None
        vg = t.vllm_generation
        # Sampling resumes as soon as the weights are in, while the served-model probe runs.
        vg.on_pushed = (lambda: producer.pushed(version)) if producer is not None else None
        try:
            with producer.pushing(version=version) if producer is not None else nullcontext():
                waited = time.monotonic() - started
                vg.sync_weights()
        finally:
            vg.on_pushed = None
        t._last_loaded_step = t.state.global_step
        self.push_waited = waited
        return waited

    def _describe(self, step: int, taken: Taken) -> RolloutStep:
        rollout = taken.rollout
        sampled = rollout.payload if rollout is not None else None
        versions = sampled.versions if isinstance(sampled, SampledStep) else []
        return RolloutStep(
            step=step,
            policy_version=rollout.version if rollout is not None else step - 1,
            staleness=taken.staleness if rollout is not None else 0,
            groups=0,  # every group of the step, counted by the caller once the prompts are gathered
            waited_seconds=taken.waited_seconds,
            dropped=taken.dropped,
            detail=taken.detail,
            newest_version=max(versions) if versions else None,
            group_versions=versions or None,
            groups_resampled=sampled.resampled if isinstance(sampled, SampledStep) else 0,
            groups_scored_ahead=sum(s is not None for s in sampled.scores)
            if isinstance(sampled, SampledStep)
            else 0,
            push_waited_seconds=self.push_waited,
        )

    def step_ended(self, step_started: float) -> RolloutStep | None:
        """The step's record, with the seconds of it in which the producer sampled while the trainer was not
        waiting for it (rank 0; None before the first step or elsewhere)."""
        record = self.last
        if record is None or self._producer is None:
            return record
        now = time.monotonic()
        busy = self._producer.clock.overlap(step_started, now)
        record.overlap_seconds = max(0.0, busy - record.waited_seconds)
        return record


def metric_reward(trainer: Any) -> Any:
    """The job's metric reward function among the trainer's reward functions (reward.MetricReward), or
    None (a job whose rewards come from elsewhere)."""
    from grpo_trainer.reward import MetricReward

    return next((f for f in getattr(trainer, "reward_funcs", []) if isinstance(f, MetricReward)), None)


def without_prompt(item: dict[str, Any]) -> dict[str, Any]:
    """A dataset row as an episode's reset gets it: every column but the prompt."""
    return {k: v for k, v in item.items() if k != "prompt"}


def episode_keys(prompts: list[Any], rows: list[dict[str, Any]]) -> list[str]:
    """What identifies a step's episodes: each one's prompt and row, as JSON (the same on both sides of the
    producer, whatever the columns hold)."""
    return [json.dumps([p, r], sort_keys=True, default=str) for p, r in zip(prompts, rows, strict=True)]
