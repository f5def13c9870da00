"""Training from groups a client scored (spec.rollouts.source: Client), through TRL's ``rollout_func``.

Each optimizer step k (1-based) trains on the B groups of G the rollout gateway assigned to step k:
rank 0 pulls them (gateway_client.py), broadcasts them to every rank, and each rank's ``rollout_func``
turns its slice of the B*G rollouts (TRL hands rank r the placeholder rows r*n .. r*n+n-1 of the step)
into token ids: the prompt is the rollout's chat messages rendered exactly as the policy server renders
them for sampling (:func:`prompt_ids`), the completion is the client's completion text plus EOS. The
client's reward reaches TRL's reward function as an extra field; the advantages are then the project's
(trainer.py), as for metric-service jobs.

The train dataset is S*B placeholder rows: TRL's sampler repeats each G times, so a step's batch has
exactly B*G rows, the shape the client's groups fill.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from grpo_metric.protocol import ScoreResult

from grpo_trainer.gateway_client import GatewayClient, GroupsAnswer
from grpo_trainer.reward import ScoredBatch

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


def render_prompt_text(tokenizer: Any, messages: list[dict[str, Any]]) -> str:
    """The text the policy is conditioned on for a chat: the model's chat template with the generation
    prompt, or, for a model without one, the turns' contents separated by blank lines."""
    if getattr(tokenizer, "chat_template", None):
        return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    return "\n\n".join(str(m.get("content", "")) for m in messages) + "\n\n"


def prompt_ids(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    """Token ids of a chat prompt; the policy server samples from exactly these, and training uses them."""
    return text_ids(tokenizer, render_prompt_text(tokenizer, messages))


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

    def fetch(self, step: int) -> GroupsAnswer:
        answer: GroupsAnswer | None = None
        if self.client is not None:
            started = time.monotonic()
            answer = self.client.groups(step, should_stop=self.should_stop)
            self.waited_seconds += time.monotonic() - started
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
    feed: GroupFeed, tokenizer: Any, max_completion_length: int, lock: PolicyLock | None
) -> Callable[[list[Any], Any], dict[str, Any]]:
    """TRL's rollout_func for client groups (see the module docstring)."""

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
        return {
            "prompt_ids": [prompt_ids(tokenizer, r.messages) for r in mine],
            "completion_ids": [completion_ids(tokenizer, r.completion, max_completion_length) for r in mine],
            # The client does not send the sampling log-probabilities; TRL's importance-sampling correction
            # is switched off for client jobs (client_loop.py), so none are needed.
            "logprobs": None,
            REWARD_FIELD: [r.reward for r in mine],
            PROMPT_TEXT_FIELD: [r.messages[-1]["content"] for r in mine],
            COMPLETION_TEXT_FIELD: [r.completion for r in mine],
        }

    return rollout


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
