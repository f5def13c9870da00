"""Trainer rank 0's side of the rollout gateway's internal port (JSON over HTTP):

* ``POST /internal/v1/groups`` ``{"step", "count", "attempt", "wait_seconds"}``: the B scored groups the
  client sent for optimizer step ``step`` (a long poll: ``groups`` is empty until all B are there), or a
  ``stop`` ("terminate" | "cancel") when the client asked to end the run. The gateway fixes a step's groups
  once assigned, so asking again after a restart returns the same groups (replay).
* ``POST /internal/v1/progress`` ``{"attempt", "step", "checkpoint", "state"}``: where training is, the
  newest published checkpoint, and whether the trainer is training, finished or cancelled.

Every answer is checked here: a group that does not hold exactly G well-formed items with finite rewards
never reaches training (:class:`GatewayProtocolError` names the field and the item).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from grpo_operator.api.gateway_config import GATEWAY_INTERNAL_TOKEN_ENV

from grpo_trainer.sample_book import SampledTokens

log = logging.getLogger("grpo_trainer.gateway")

GROUPS_PATH = "/internal/v1/groups"
PROGRESS_PATH = "/internal/v1/progress"
# How long one groups request long-polls on the gateway before it answers "nothing yet".
DEFAULT_WAIT_SECONDS = 30.0
# Largest answer read from the gateway (B groups of G chat transcripts).
MAX_ANSWER_BYTES = 256 * 1024 * 1024

# "terminate" and "cancel" come from the client; "signal" is the trainer's own SIGTERM while it waits.
Stop = Literal["terminate", "cancel", "signal"]
State = Literal["training", "finished", "cancelled"]


class GatewayProtocolError(RuntimeError):
    """The gateway answered something the trainer cannot train on (wrong group size, a malformed item, a
    non-finite reward, another step's groups). Exits with ExitCode.TRANSIENT: the gateway refuses such
    groups from the client, so this is a gateway fault and a restart asks again."""


class GatewayUnavailable(RuntimeError):
    """The gateway did not answer for longer than the trainer waits for it; exits with ExitCode.TRANSIENT."""


@dataclass(frozen=True)
class Rollout:
    """One scored completion of a group: the chat the client sampled from, its completion text, its reward,
    and, once rank 0 found it in its policy server's SampleBook, the tokens it was sampled as."""

    messages: list[dict[str, Any]]
    completion: str
    reward: float
    sampled: SampledTokens | None = None


@dataclass(frozen=True)
class Group:
    batch_id: int
    rollouts: list[Rollout]


@dataclass(frozen=True)
class CheckpointRequest:
    """The client asked (route ``checkpoint``) for a checkpoint at the end of this step."""

    name: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GroupsAnswer:
    step: int
    groups: list[Group]
    stop: Stop | None = None
    checkpoint: CheckpointRequest | None = None


def _content_text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content blocks
        parts = [block.get("text") for block in content if isinstance(block, dict)]
        if all(isinstance(p, str) for p in parts):
            return "".join(parts)  # type: ignore[arg-type]
    return None


def parse_rollout(raw: Any, where: str) -> Rollout:
    if not isinstance(raw, dict):
        raise GatewayProtocolError(f"{where} is not an object with messages, completion and reward")
    messages = raw.get("messages")
    if (
        not isinstance(messages, list)
        or not messages
        or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)
        or any(_content_text(m.get("content")) is None for m in messages)
    ):
        raise GatewayProtocolError(f"{where}.messages must be a non-empty list of {{role, content}}")
    completion = raw.get("completion")
    text = (
        _content_text(completion.get("content"))
        if isinstance(completion, dict)
        else _content_text(completion)
    )
    if text is None:
        raise GatewayProtocolError(f"{where}.completion must be {{role: assistant, content: <text>}}")
    reward = raw.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(float(reward)):
        raise GatewayProtocolError(f"{where}.reward must be a finite number, got {reward!r}")
    normalised = [{"role": m["role"], "content": _content_text(m["content"])} for m in messages]
    return Rollout(messages=normalised, completion=text, reward=float(reward))


def parse_groups(body: Any, step: int, count: int, group_size: int) -> GroupsAnswer:
    """The gateway's answer for ``step`` as groups to train on, or GatewayProtocolError naming what is wrong."""
    if not isinstance(body, dict):
        raise GatewayProtocolError(f"the groups answer for step {step} is not a JSON object")
    if body.get("step") != step:
        raise GatewayProtocolError(
            f"asked for the groups of step {step}, the gateway answered step {body.get('step')!r}"
        )
    stop = body.get("stop")
    if stop not in (None, "terminate", "cancel"):
        raise GatewayProtocolError(f"unknown stop {stop!r} in the groups answer (terminate or cancel)")
    raw_groups = body.get("groups") or []
    if not isinstance(raw_groups, list):
        raise GatewayProtocolError(f"groups of step {step} is not a list")
    if raw_groups and len(raw_groups) != count:
        raise GatewayProtocolError(
            f"step {step} needs spec.grpo.promptsPerStep = {count} groups, the gateway sent {len(raw_groups)}"
        )
    groups = []
    for g, raw in enumerate(raw_groups):
        items = raw.get("items") if isinstance(raw, dict) else None
        batch_id = raw.get("batch_id") if isinstance(raw, dict) else None
        if not isinstance(items, list):
            raise GatewayProtocolError(f"group {g} of step {step} has no items list")
        if len(items) != group_size:
            raise GatewayProtocolError(
                f"group {g} (batch_id {batch_id}) of step {step} has {len(items)} items, but "
                f"spec.grpo.groupSize is {group_size}: it is not trained on"
            )
        where = f"group {g} (batch_id {batch_id}) of step {step}, item"
        rollouts = [parse_rollout(item, f"{where} {i}") for i, item in enumerate(items)]
        groups.append(Group(batch_id=int(batch_id) if isinstance(batch_id, int) else g, rollouts=rollouts))
    checkpoint = None
    raw_checkpoint = body.get("checkpoint")
    if isinstance(raw_checkpoint, dict) and isinstance(raw_checkpoint.get("name"), str):
        metadata = raw_checkpoint.get("metadata")
        checkpoint = CheckpointRequest(raw_checkpoint["name"], metadata if isinstance(metadata, dict) else {})
    return GroupsAnswer(step=step, groups=groups, stop=stop, checkpoint=checkpoint)


@dataclass
class GatewayClient:
    """Blocking client of the gateway's internal port. Connection failures are retried (the gateway is a
    Deployment that may be restarting) until ``unreachable_timeout_seconds`` pass without an answer."""

    url: str
    attempt: int
    group_size: int
    prompts_per_step: int
    wait_seconds: float = DEFAULT_WAIT_SECONDS
    unreachable_timeout_seconds: float = 600.0
    # Called with "client" / "gateway" when the trainer starts waiting for it, and None when it stops.
    on_wait: Callable[[str | None], None] | None = None
    sleep: Callable[[float], None] = time.sleep
    # The job's internal secret, which the gateway requires on its internal port when it has one.
    token: str | None = field(default_factory=lambda: os.environ.get(GATEWAY_INTERNAL_TOKEN_ENV) or None)

    def _post(self, path: str, body: dict[str, Any], timeout: float) -> Any:
        headers = {"Content-Type": "application/json"}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(
            self.url.rstrip("/") + path, data=json.dumps(body).encode(), headers=headers, method="POST"
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            data = response.read(MAX_ANSWER_BYTES + 1)
        if len(data) > MAX_ANSWER_BYTES:
            raise GatewayProtocolError(
                f"the gateway's answer to {path} is larger than {MAX_ANSWER_BYTES} bytes"
            )
        return json.loads(data)

    def _post_retrying(self, path: str, body: dict[str, Any], timeout: float) -> Any:
        first_failure: float | None = None
        delay = 0.5
        while True:
            try:
                answer = self._post(path, body, timeout)
            except urllib.error.HTTPError as exc:
                detail = exc.read(2000).decode(errors="replace")
                if exc.code < 500:
                    raise GatewayProtocolError(
                        f"the gateway refused {path} with {exc.code}: {detail}"
                    ) from None
                failure = f"{exc.code} {detail}"
            except (urllib.error.URLError, OSError, TimeoutError) as exc:
                failure = str(getattr(exc, "reason", exc))
            except json.JSONDecodeError as exc:
                raise GatewayProtocolError(f"the gateway's answer to {path} is not JSON: {exc}") from None
            else:
                if first_failure is not None:
                    log.info("the rollout gateway answers again")
                return answer
            now = time.monotonic()
            if first_failure is None:
                first_failure = now
                log.warning("the rollout gateway at %s does not answer (%s); retrying", self.url, failure)
                if self.on_wait is not None:
                    self.on_wait("gateway")
            if now - first_failure > self.unreachable_timeout_seconds:
                raise GatewayUnavailable(
                    f"the rollout gateway at {self.url} has not answered {path} for "
                    f"{self.unreachable_timeout_seconds:.0f} s (last error: {failure}); check the <job>-rollouts "
                    "Deployment and its internal Service"
                )
            self.sleep(delay)
            delay = min(delay * 2, 10.0)

    def groups(self, step: int, should_stop: Callable[[], bool] = lambda: False) -> GroupsAnswer:
        """Block until the gateway has all B groups of ``step`` (or a stop); reports waiting for the client.
        Answers stop "signal" when ``should_stop`` turns true between two polls (SIGTERM)."""
        waiting = False
        try:
            while True:
                if should_stop():
                    return GroupsAnswer(step=step, groups=[], stop="signal")
                body: dict[str, Any] = {
                    "step": step,
                    "count": self.prompts_per_step,
                    "attempt": self.attempt,
                    "wait_seconds": self.wait_seconds,
                }
                raw = self._post_retrying(GROUPS_PATH, body, timeout=self.wait_seconds + 30)
                answer = parse_groups(raw, step, self.prompts_per_step, self.group_size)
                if answer.groups or answer.stop:
                    return answer
                if not waiting:
                    waiting = True
                    log.info(
                        "step %d: waiting for the client's %d scored groups", step, self.prompts_per_step
                    )
                if self.on_wait is not None:
                    self.on_wait("client")
        finally:
            if self.on_wait is not None:
                self.on_wait(None)

    def progress(self, step: int, checkpoint: dict[str, Any] | None, state: State) -> None:
        """Tell the gateway where training is. Best effort: a lost report is healed by the next one, which
        carries the newest checkpoint again."""
        body = {"attempt": self.attempt, "step": step, "checkpoint": checkpoint, "state": state}
        try:
            self._post(PROGRESS_PATH, body, timeout=10)
        except Exception as exc:
            log.warning("progress report to the rollout gateway failed (%s); the next one repeats it", exc)
