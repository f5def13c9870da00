"""The gateway's protocol state: batch ids, the client's groups, their steps, checkpoints and stop requests.

Pure and synchronous (the aiohttp layer adds waiting). The rules, and why:

* Batch ids. The client learns from ``status.pending_batch_ids`` how many groups to send: one per id
  (DSPy's loop sends exactly one group per announced, unfilled id, and waits while there is none). So
  ids come in windows of exactly B, a new window once the previous one is filled. Ids are never reused,
  not even by a restarted gateway: they are microseconds since the epoch at issue (at least the previous
  id + 1), so a new process starts past every id an earlier one announced.
* Pace. A new window is announced only while the client is less than ``max_steps_ahead`` steps ahead of
  the step the trainer last asked for, and never beyond the S steps of the run: the rollouts the client
  sends are sampled from a policy at most that many steps old, and no group is sent that no step trains.
* Steps. Groups are assigned to optimizer steps in arrival order, B per step, when trainer rank 0 first
  asks for that step; the assignment never changes, so a trainer that restarts and resumes before a step
  gets the same groups again (replay: no client work is lost). A step's groups are dropped once a
  published checkpoint covers it, because a resume never goes back past that checkpoint.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from grpo_operator.api.gateway_config import GatewayConfig

log = logging.getLogger("grpo_gateway")

Group = list[dict[str, Any]]
StopKind = Literal["terminate", "cancel"]
# How many filled ids are remembered, to tell "already filled" from "never announced" in an error.
_FILLED_MEMORY = 65536
# Checkpoints listed in status (the newest): each answered request adds one, so a long run would grow both
# the gateway's memory and every status answer without bound.
_CHECKPOINTS_LISTED = 1024
# Bytes of checkpoint-request metadata held at once, over all requests not yet answered.
MAX_CHECKPOINT_METADATA_BYTES = 1024 * 1024


class ProtocolError(ValueError):
    """A request the gateway refuses; ``status`` is the HTTP status, the message says what to change."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def strip_model_prefix(model: str) -> str:
    """The bare model name, as Arbor's server reads it: without ``openai/`` and ``arbor:``."""
    model = model.removeprefix("openai/")
    return model.removeprefix("arbor:")


def iso_now() -> str:
    return datetime.now(UTC).isoformat()


@dataclass
class CheckpointRequest:
    name: str
    metadata: dict[str, Any] | None
    handed_at_step: int | None = None
    size: int = 0


@dataclass
class GatewayState:
    config: GatewayConfig
    clock: Callable[[], float] = time.time
    pending: list[int] = field(default_factory=list)
    unassigned: deque[Group] = field(default_factory=deque)
    assigned: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    checkpoints: dict[str, dict[str, Any]] = field(default_factory=dict)
    last_checkpoint: str | None = None
    stop: StopKind | None = None
    trainer_state: str | None = None
    trainer_step: int = 0
    asked_step: int = 0
    attempt: int = 0
    initialized: bool = False
    # The client called terminate or cancel: it sends nothing more, so no ids are announced again.
    client_done: bool = False
    groups_received: int = 0
    checkpoint_requests: list[CheckpointRequest] = field(default_factory=list)
    _last_id: int = 0
    _filled: deque[int] = field(default_factory=lambda: deque(maxlen=_FILLED_MEMORY))

    # --- identity -------------------------------------------------------------------------------------------

    @property
    def job_id(self) -> str:
        return f"{self.config.job.namespace}/{self.config.job.name}"

    @property
    def b(self) -> int:
        return self.config.prompts_per_step

    @property
    def g(self) -> int:
        return self.config.group_size

    def check_job(self, job_id: object) -> None:
        """Every route names the job; there is one job here, stable across restarts of either side."""
        if job_id is None or job_id == self.job_id:
            return
        raise ProtocolError(
            f"job {short(job_id)} is not known here: this gateway serves job {self.job_id!r} "
            "(the GRPOJob's namespace/name, as initialize answers)",
            status=404,
        )

    # --- status ---------------------------------------------------------------------------------------------

    @property
    def status_text(self) -> str:
        if self.trainer_state == "cancelled":
            return "cancelled"
        if self.trainer_state == "finished":
            return "succeeded"
        if self.stop == "cancel":
            return "pending_cancel"
        if self.stop == "terminate":
            return "terminating"
        return "running"

    def status(self) -> dict[str, Any]:
        """Arbor's status object; announces the next window of batch ids when the pace allows."""
        self._announce()
        return {
            "job_id": self.job_id,
            "status": self.status_text,
            "current_model": self.config.served_model,
            "checkpoints": self.checkpoints,
            "last_checkpoint": self.last_checkpoint,
            "pending_batch_ids": list(self.pending),
        }

    def _steps_covered(self) -> int:
        """Steps that have their groups: those before the step the trainer asks for (trained, or dropped
        once a checkpoint covered them), those assigned, and those the groups already here will fill. The
        step the trainer is waiting for is not covered: counting it would leave the last step's window
        unannounced whenever the trainer asks for it before the client next polls status, and both would
        wait for ever."""
        trained = max(self.asked_step - 1, 0)
        return max(trained, max(self.assigned, default=0)) + math.ceil(len(self.unassigned) / self.b)

    def _announce(self) -> None:
        if self.pending or self.stop is not None or self.client_done or self.trainer_state == "cancelled":
            return
        if self.trainer_state != "finished":
            if len(self.unassigned) >= self.b * self.config.max_steps_ahead:
                return
            if self._steps_covered() >= self.config.steps:
                return
        # After the run finished by itself a window is still announced, so that a client that wants more
        # steps than spec.grpo.steps sends one and is told why (see add_group), instead of polling forever.
        now = int(self.clock() * 1_000_000)
        for _ in range(self.b):
            self._last_id = max(self._last_id + 1, now)
            self.pending.append(self._last_id)

    # --- client routes --------------------------------------------------------------------------------------

    def initialize(self, body: dict[str, Any]) -> dict[str, Any]:
        model = body.get("model")
        if not isinstance(model, str) or strip_model_prefix(model) != self.config.served_model:
            raise ProtocolError(
                f"model {short(model)} is not this job's model: the GRPOJob trains {self.config.served_model!r} "
                "(spec.model.name); use dspy.LM('openai/arbor:" + self.config.served_model + "', ...)"
            )
        config = body.get("trainer_config")
        if isinstance(config, dict):
            generations = config.get("num_generations")
            if generations is not None and generations != self.g:
                raise ProtocolError(
                    f"trainer_config.num_generations is {short(generations)} but the job's spec.grpo.groupSize is "
                    f"{self.g}: set GRPO(num_rollouts_per_grpo_step={self.g}) or change the GRPOJob"
                )
            ignored = sorted(k for k, v in config.items() if k != "num_generations" and v is not None)
            if ignored:
                log.info(
                    "initialize: trainer_config %s ignored: the GRPOJob's spec decides the training "
                    "(see docs/dspy.md)",
                    ", ".join(f"{k}={config[k]!r}" for k in ignored),
                )
        self.initialized = True
        return self.status()

    def add_group(self, body: dict[str, Any]) -> dict[str, Any]:
        """Arbor's ``step``: one scored group for one announced batch id."""
        self.check_job(body.get("job_id"))
        if self.trainer_state in ("finished", "cancelled") or self.stop is not None:
            raise ProtocolError(
                f"job {self.job_id} is {self.status_text} and takes no more groups: it trains "
                f"spec.grpo.steps = {self.config.steps} steps, so DSPy's num_train_steps must not exceed it",
            )
        batch_id = body.get("batch_id")
        if isinstance(batch_id, bool) or not isinstance(batch_id, int) or batch_id not in self.pending:
            seen = "was filled already" if batch_id in self._filled else "was never announced"
            raise ProtocolError(
                f"batch_id {short(batch_id)} {seen}: send one group for each id in status.pending_batch_ids "
                f"(now {self.pending})"
            )
        group = validate_group(body.get("batch"), self.g, self.config.max_abs_reward)
        self.pending.remove(batch_id)
        self._filled.append(batch_id)
        self.unassigned.append([{**item, "batch_id": batch_id} for item in group])
        self.groups_received += 1
        if isinstance(body.get("metrics"), dict) and body["metrics"]:
            log.debug("step metrics from the client (not used): %s", body["metrics"])
        return self.status()

    def request_checkpoint(self, body: dict[str, Any]) -> dict[str, Any]:
        self.check_job(body.get("job_id"))
        name = body.get("checkpoint_name")
        if not isinstance(name, str) or not name:
            raise ProtocolError("checkpoint_name must be a non-empty string")
        metadata = body.get("metadata")
        metadata = metadata if isinstance(metadata, dict) else None
        limit = self.config.max_checkpoint_requests
        if len(self.checkpoint_requests) >= limit:
            raise ProtocolError(
                f"{limit} checkpoint requests are waiting for a checkpoint already (the gateway holds at "
                "most that many): wait until status lists them, then ask again",
                status=429,
            )
        size = len(name) + len(json.dumps(metadata))
        held = sum(r.size for r in self.checkpoint_requests)
        if held + size > MAX_CHECKPOINT_METADATA_BYTES:
            raise ProtocolError(
                f"this checkpoint request's name and metadata ({size} bytes of JSON) would exceed the "
                f"{MAX_CHECKPOINT_METADATA_BYTES} bytes the gateway holds for waiting requests ({held} held): "
                "send smaller metadata or wait until status lists the earlier checkpoints",
                status=429,
            )
        self.checkpoint_requests.append(CheckpointRequest(name, metadata, size=size))
        return self.status()

    def request_stop(self, kind: StopKind, body: dict[str, Any]) -> dict[str, Any]:
        """terminate (finish: final checkpoint, model saved) or cancel (stop without further training).
        Idempotent; after the run ended either is answered with the final status."""
        self.check_job(body.get("job_id"))
        if self.trainer_state not in ("finished", "cancelled") and self.stop != "cancel":
            self.stop = kind
        self.client_done = True
        self.pending.clear()
        return self.status()

    # --- trainer routes -------------------------------------------------------------------------------------

    def take_groups(self, step: int, attempt: int) -> dict[str, Any] | None:
        """The answer for trainer rank 0 asking for step ``step``'s groups, or None while they are not here."""
        self._note_attempt(attempt)
        self.asked_step = max(self.asked_step, step)
        if self.stop == "cancel":
            return {"step": step, "groups": [], "stop": "cancel"}
        groups = self.assigned.get(step)
        if groups is None and len(self.unassigned) >= self.b:
            groups = [
                {"batch_id": g[0]["batch_id"], "items": [_item(i) for i in g]}
                for g in (self.unassigned.popleft() for _ in range(self.b))
            ]
            self.assigned[step] = groups
        if groups is None:
            if self.stop == "terminate":
                return {"step": step, "groups": [], "stop": "terminate"}
            return None
        answer: dict[str, Any] = {"step": step, "groups": groups}
        request = next((r for r in self.checkpoint_requests if r.handed_at_step is None), None)
        if request is not None:
            request.handed_at_step = step
            answer["checkpoint"] = {"name": request.name, "metadata": request.metadata}
        return answer

    def record_progress(self, body: dict[str, Any]) -> None:
        attempt = _int(body.get("attempt"), "attempt")
        if attempt < self.attempt:
            log.info("progress from attempt %s ignored: attempt %s is newer", attempt, self.attempt)
            return
        self._note_attempt(attempt)
        self.trainer_step = _int(body.get("step"), "step")
        state = body.get("state")
        if state in ("training", "finished", "cancelled"):
            self.trainer_state = state
        checkpoint = body.get("checkpoint")
        if isinstance(checkpoint, dict):
            self._record_checkpoint(checkpoint)

    def _record_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        step = _int(checkpoint.get("step"), "checkpoint.step")
        name = str(checkpoint.get("name") or f"step-{step}")
        entry = {
            "checkpoint_name": name,
            "checkpoint_dir": checkpoint.get("dir"),
            "global_step": step,
            "requested": False,
            "metadata": None,
            "timestamp": checkpoint.get("time") or iso_now(),
        }
        self.checkpoints[name] = entry
        self.last_checkpoint = name
        for request in list(self.checkpoint_requests):
            if request.handed_at_step is not None and step >= request.handed_at_step:
                self.checkpoints[request.name] = {
                    **entry,
                    "checkpoint_name": request.name,
                    "requested": True,
                    "metadata": request.metadata,
                }
                self.last_checkpoint = request.name
                self.checkpoint_requests.remove(request)
        for name in list(self.checkpoints)[: max(0, len(self.checkpoints) - _CHECKPOINTS_LISTED)]:
            del self.checkpoints[name]
        # A resume never goes back past a published checkpoint: its steps can never be asked for again.
        for old in [s for s in self.assigned if s <= step]:
            del self.assigned[old]

    def _note_attempt(self, attempt: int) -> None:
        if attempt > self.attempt:
            if self.attempt:
                log.info("trainer attempt %s replaces attempt %s", attempt, self.attempt)
            self.attempt = attempt


def _item(item: dict[str, Any]) -> dict[str, Any]:
    return {"messages": item["messages"], "completion": item["completion"], "reward": item["reward"]}


def _int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ProtocolError(f"{name} must be a non-negative integer, got {short(value)}")
    return value


def validate_group(batch: object, group_size: int, max_abs_reward: float) -> Group:
    """A group as the client sends it: exactly G items of {messages, completion, reward}, every reward finite
    and within ``max_abs_reward`` (beyond it the trainer's advantages are not trustworthy: the metric path
    refuses such rewards too)."""
    if not isinstance(batch, list):
        raise ProtocolError(
            f"batch must be a list of {group_size} scored completions, got {type(batch).__name__}"
        )
    if len(batch) != group_size:
        raise ProtocolError(
            f"batch has {len(batch)} completions but spec.grpo.groupSize (G) is {group_size}: send groups of "
            f"exactly G scored completions (DSPy: GRPO(num_rollouts_per_grpo_step={group_size}))"
        )
    for index, item in enumerate(batch):
        where = f"batch[{index}]"
        if not isinstance(item, dict):
            raise ProtocolError(f"{where} must be an object with messages, completion and reward")
        messages = item.get("messages")
        if not isinstance(messages, list) or not messages or not all(_is_message(m) for m in messages):
            raise ProtocolError(
                f"{where}.messages must be a non-empty list of {{role, content}} chat messages"
            )
        completion = item.get("completion")
        if not _is_message(completion):
            raise ProtocolError(
                f"{where}.completion must be a {{role, content}} message (the model's answer)"
            )
        reward = item.get("reward")
        # No math.isfinite on an int: one of 400 digits overflows float conversion.
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            raise ProtocolError(f"{where}.reward must be a finite number, got {short(reward)}")
        if isinstance(reward, float) and not math.isfinite(reward):
            raise ProtocolError(f"{where}.reward must be a finite number, got {short(reward)}")
        if abs(reward) > max_abs_reward:
            raise ProtocolError(
                f"{where}.reward is {short(reward)}, beyond the job's bound |reward| <= {max_abs_reward:g} (the "
                "metric path's maxAbsReward): scale your metric's scores into that range; the group was "
                "not taken, send it again with bounded rewards"
            )
    return [dict(item) for item in batch]


def short(value: object, limit: int = 40) -> str:
    """A value for an error message: long numbers and strings cut, so the message stays readable."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit // 2]}...{text[-8:]} ({len(text)} characters)"


def _is_message(value: object) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("role"), str)
        and isinstance(value.get("content"), str)
    )
