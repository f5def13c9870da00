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
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from grpo_trainer.async_rollouts import Payload, RolloutProducer, Taken
from grpo_trainer.single_turn import tokenize_prompts

log = logging.getLogger("grpo_trainer.async_generation")


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
        self._submitted_upto = step
        if t.accelerator.is_main_process:
            self.producer().submit(step, [list(p) for p in everyone[:: t.num_generations]])

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

            def generate(prompts: list[list[int]]) -> Payload:
                output = raw_generate(prompts=prompts, features=None, **sampling_params(vg, num_generations))
                return (
                    output["prompt_ids"],
                    output["completion_ids"],
                    output["logprobs"],
                    output.get("logprob_token_ids"),
                )

            self._producer = RolloutProducer(generate, self.max_staleness)
        return self._producer

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
            decision = [(taken.rollout.payload if taken.rollout else None, self._describe(step, taken))]
        broadcast_object_list(decision, from_process=0)
        payload, record = decision[0]
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
        with self.producer().pushing(version=t.state.global_step) if main else nullcontext():
            waited = time.monotonic() - started
            t.vllm_generation.sync_weights()
        t._last_loaded_step = t.state.global_step
        self.push_waited = waited
        return waited

    def _describe(self, step: int, taken: Taken) -> RolloutStep:
        rollout = taken.rollout
        return RolloutStep(
            step=step,
            policy_version=rollout.version if rollout is not None else step - 1,
            staleness=taken.staleness if rollout is not None else 0,
            groups=0,  # every group of the step, counted by the caller once the prompts are gathered
            waited_seconds=taken.waited_seconds,
            dropped=taken.dropped,
            detail=taken.detail,
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


def without_prompt(item: dict[str, Any]) -> dict[str, Any]:
    """A dataset row as an episode's reset gets it: every column but the prompt."""
    return {k: v for k, v in item.items() if k != "prompt"}


def episode_keys(prompts: list[Any], rows: list[dict[str, Any]]) -> list[str]:
    """What identifies a step's episodes: each one's prompt and row, as JSON (the same on both sides of the
    producer, whatever the columns hold)."""
    return [json.dumps([p, r], sort_keys=True, default=str) for p, r in zip(prompts, rows, strict=True)]
