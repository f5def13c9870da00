"""Training from groups a client scored (spec.rollouts.source: Client), through TRL's ``rollout_func``.

Each optimizer step k (1-based) trains on the B groups of G the rollout gateway assigned to step k:
rank 0 pulls them (gateway_client.py), broadcasts them to every rank, and each rank's ``rollout_func``
turns its slice of the B*G rollouts (TRL hands rank r the placeholder rows r*n .. r*n+n-1 of the step)
into token ids: the prompt is the rollout's chat messages rendered exactly as the policy server renders
them for sampling (:func:`prompt_ids`); the completion is the tokens the policy server sampled it as, with
their sampling log-probabilities (found in its SampleBook by rank 0 when the groups arrive), or, for a
completion the book does not hold (a client that rewrote the text), the text tokenised plus EOS, trained
without importance-sampling correction (NaN log-probabilities: TRL's ratio 1) and counted. The client's
reward reaches TRL's reward function as an extra field; the advantages are then the project's
(trainer.py), as for metric-service jobs.

The train dataset is S*B placeholder rows: TRL's sampler repeats each G times, so a step's batch has
exactly B*G rows, the shape the client's groups fill.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from grpo_metric.protocol import ScoreResult

from grpo_trainer.gateway_client import GatewayClient, Group, GroupsAnswer
from grpo_trainer.reward import ScoredBatch
from grpo_trainer.sample_book import SampleBook

log = logging.getLogger("grpo_trainer.client_rollouts")

# Extra fields rollout_func returns; TRL merges them into the rows its reward function receives.
REWARD_FIELD = "client_reward"
PROMPT_TEXT_FIELD = "client_prompt"
COMPLETION_TEXT_FIELD = "client_completion"
# Client rewards within this of spec.grpo.formatFailureScore count as format failures: DSPy gives every
# completion its adapter cannot parse exactly format_failure_score.
FORMAT_FAILURE_TOLERANCE = 1e-9


class ClientStop(Exception):
    """Raised on every rank from rollout_func when the run must stop before training this step:
    ``kind`` is "terminate" or "cancel" (the client asked) or "signal" (SIGTERM while waiting for groups)."""

    def __init__(self, kind: str, step: int):
        super().__init__(f"{kind} before step {step}")
        self.kind, self.step = kind, step


def render_prompt_text(
    tokenizer: Any, messages: list[dict[str, Any]], template_kwargs: Mapping[str, Any] | None = None
) -> str:
    """The text the policy is conditioned on for a chat: the model's chat template with the generation
    prompt and ``template_kwargs`` (spec.grpo.chatTemplateKwargs), or, for a model without one, the turns'
    contents separated by blank lines."""
    if getattr(tokenizer, "chat_template", None):
        return str(
            tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True, **(template_kwargs or {})
            )
        )
    return "\n\n".join(str(m.get("content", "")) for m in messages) + "\n\n"


def prompt_ids(
    tokenizer: Any, messages: list[dict[str, Any]], template_kwargs: Mapping[str, Any] | None = None
) -> list[int]:
    """Token ids of a chat prompt; the policy server samples from exactly these, and training uses them
    (both with the same ``template_kwargs``)."""
    return text_ids(tokenizer, render_prompt_text(tokenizer, messages, template_kwargs))


def text_ids(tokenizer: Any, text: str) -> list[int]:
    # The chat template already holds any BOS the model wants; plain prompts get none either way.
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def completion_ids(tokenizer: Any, text: str, max_length: int) -> list[int]:
    """The completion's tokens and EOS, cut to ``max_length`` (grpo.maxCompletionLength): what the policy
    server can have produced for it."""
    ids = [*text_ids(tokenizer, text), int(tokenizer.eos_token_id)]
    return ids[:max_length]


class PolicyLock:
    """Keeps the policy server's sampling out of a training step (and, with the vLLM server, out of TRL's
    weight sync): the training thread holds it from the start of a step to its end, except while it
    waits for the client, who samples from the policy in that time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held = False

    def take(self) -> None:
        if not self._held:
            self._lock.acquire()
            self._held = True

    def give(self) -> None:
        if self._held:
            self._held = False
            self._lock.release()

    @contextmanager
    def released(self) -> Iterator[None]:
        held = self._held
        self.give()
        try:
            yield
        finally:
            if held:
                self.take()

    @contextmanager
    def sampling(self) -> Iterator[None]:
        """Held by the policy server while it samples."""
        with self._lock:
            yield


@dataclass
class GroupFeed:
    """Every rank's view of the steps' groups: rank 0 pulls them from the gateway, the others receive them
    by broadcast. ``waited_seconds`` is the cumulative time spent waiting for the client."""

    client: GatewayClient | None
    world_size: int
    should_stop: Callable[[], bool] = lambda: False
    waited_seconds: float = 0.0
    checkpoint_requested: str | None = None
    last: GroupsAnswer | None = field(default=None, repr=False)
    # Rank 0: finds each rollout's sampled tokens (SampleMatcher) before the groups go to every rank.
    match: Callable[[GroupsAnswer], GroupsAnswer] | None = None
    # The last step's rollouts trained on their sampled tokens, and those tokenised from their text.
    matched: int = 0
    unmatched: int = 0

    def fetch(self, step: int) -> GroupsAnswer:
        answer: GroupsAnswer | None = None
        if self.client is not None:
            started = time.monotonic()
            answer = self.client.groups(step, should_stop=self.should_stop)
            self.waited_seconds += time.monotonic() - started
            if self.match is not None:
                answer = self.match(answer)
        if self.world_size > 1:
            import torch.distributed as dist

            box: list[Any] = [answer]
            dist.broadcast_object_list(box, src=0)
            answer = box[0]
        assert answer is not None, "rank 0 holds no gateway client"
        if answer.checkpoint is not None:
            self.checkpoint_requested = answer.checkpoint.name
        self.last = answer
        return answer


def make_rollout_func(
    feed: GroupFeed,
    tokenizer: Any,
    max_completion_length: int,
    lock: PolicyLock | None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> Callable[[list[Any], Any], dict[str, Any]]:
    """TRL's rollout_func for client groups (see the module docstring); ``template_kwargs`` must be the
    policy server's, so prompts are trained on as they were sampled from."""

    def rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        step = int(trainer.state.global_step) + 1
        if lock is not None:
            with lock.released():
                answer = feed.fetch(step)
        else:
            answer = feed.fetch(step)
        if answer.stop is not None:
            raise ClientStop(answer.stop, step)
        rollouts = [r for group in answer.groups for r in group.rollouts]
        n = len(prompts)
        world = int(trainer.accelerator.num_processes)
        if len(rollouts) != n * world:
            raise RuntimeError(
                f"step {step}: the gateway sent {len(rollouts)} rollouts, the step's batch holds {n * world} "
                "(promptsPerStep x groupSize)"
            )
        start = int(trainer.accelerator.process_index) * n
        mine = rollouts[start : start + n]
        sampled = [r.sampled for r in rollouts]
        feed.matched = sum(s is not None for s in sampled)
        feed.unmatched = len(sampled) - feed.matched
        if feed.unmatched and int(trainer.accelerator.process_index) == 0:
            log.warning(
                "step %d: %d of %d client completions are not what the policy server sampled (rewritten or "
                "unknown text): trained on their text's tokens, without importance-sampling correction",
                step,
                feed.unmatched,
                len(sampled),
            )
        ids: list[list[int]] = []
        logprobs: list[list[float]] = []
        for r in mine:
            if r.sampled is not None:
                tokens = list(r.sampled.ids[:max_completion_length])
                ids.append(tokens)
                logprobs.append(
                    list(r.sampled.logprobs[: len(tokens)])
                    if r.sampled.logprobs is not None
                    else [math.nan] * len(tokens)
                )
            else:
                tokens = completion_ids(tokenizer, r.completion, max_completion_length)
                ids.append(tokens)
                # NaN: no sampling log-probability, so TRL's importance ratio is 1 for these tokens.
                logprobs.append([math.nan] * len(tokens))
        return {
            "prompt_ids": [prompt_ids(tokenizer, r.messages, template_kwargs) for r in mine],
            "completion_ids": ids,
            "logprobs": logprobs,
            REWARD_FIELD: [r.reward for r in mine],
            PROMPT_TEXT_FIELD: [r.messages[-1]["content"] for r in mine],
            COMPLETION_TEXT_FIELD: [r.completion for r in mine],
        }

    return rollout


@dataclass
class SampleMatcher:
    """Rank 0: each rollout of a step's groups with the tokens the policy server sampled it as, looked up
    in its SampleBook by the prompt's ids (rendered as for sampling) and the completion text."""

    book: SampleBook
    tokenizer: Any
    template_kwargs: Mapping[str, Any] | None = None

    def __call__(self, answer: GroupsAnswer) -> GroupsAnswer:
        groups = []
        for group in answer.groups:
            rollouts = []
            for rollout in group.rollouts:
                ids = prompt_ids(self.tokenizer, rollout.messages, self.template_kwargs)
                found = self.book.lookup(ids, rollout.completion)
                rollouts.append(dataclasses.replace(rollout, sampled=found))
            groups.append(Group(group.batch_id, rollouts))
        return dataclasses.replace(answer, groups=groups)


class ClientReward:
    """TRL's reward function for client groups: returns the rewards the client sent (forwarded by
    rollout_func), and records them like MetricReward does for samples.jsonl and the step's counters."""

    __name__ = "client"  # TRL logs rewards/<__name__>/mean

    def __init__(self, format_failure_score: float):
        self.format_failure_score = format_failure_score
        self.last = ScoredBatch()

    def is_format_failure(self, reward: float) -> bool:
        return math.isclose(reward, self.format_failure_score, rel_tol=0.0, abs_tol=FORMAT_FAILURE_TOLERANCE)

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        rewards = [float(r) for r in kwargs[REWARD_FIELD]]
        results = [
            ScoreResult(f"c{i}", "format_failure", reward=r)
            if self.is_format_failure(r)
            else ScoreResult.ok(f"c{i}", r)
            for i, r in enumerate(rewards)
        ]
        self.last = ScoredBatch(list(kwargs[PROMPT_TEXT_FIELD]), list(kwargs[COMPLETION_TEXT_FIELD]), results)
        return list(rewards)
