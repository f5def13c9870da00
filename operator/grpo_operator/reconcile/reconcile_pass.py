"""The working state of one reconcile pass (``ReconcilePass``, named ``rp`` where it is passed around; a
"step" in this code base is always a training step) and the status fields the operator owns."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from grpo_operator.api.event_reasons import EventReason
from grpo_operator.api.status import GATEWAY_TOKEN_SECRET_FIELD
from grpo_operator.reconcile.conditions import changed_conditions, set_condition, truncate
from grpo_operator.reconcile.plan import Event, Plan
from grpo_operator.reconcile.record import trusted_fields
from grpo_operator.settings import OperatorSettings

# Status fields the operator owns. The trainer owns api.status.TRAINER_STATUS_FIELDS; the operator reads them
# but never writes them (its status patch never names them).
OWNED_STATUS_FIELDS = (
    "phase",
    "reason",
    "message",
    "conditions",
    "restarts",
    "trainerAttempt",
    "generationAttempt",
    "generationKeptAtStep",
    "rollouts",
    "startTime",
    "completionTime",
    "observedGeneration",
    "forecast",
    "spend",
    GATEWAY_TOKEN_SECRET_FIELD,
)

GANG_ROLES = ("trainer", "generation")

_MIN_REQUEUE = 1.0


@dataclass
class ReconcilePass:
    """Mutable working state of one reconcile: the job's status as it was and as it will be."""

    obj: dict[str, Any]
    now: datetime
    settings: OperatorSettings
    # The status the operator decides from: the job's status with the fields the operator owns taken from
    # its own record (the trainer can write the status; see record.py), and ``actual``, the status as stored.
    old: dict[str, Any]
    new: dict[str, Any]
    actual: dict[str, Any] = field(default_factory=dict)
    record: dict[str, Any] | None = None
    plan: Plan = field(default_factory=Plan)
    requeue: list[float] = field(default_factory=list)
    # Objects found under a child's name that are not this job's (see ownership.py): never written.
    foreign: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    # Set when such an object blocks the job: the message, and no pod is created while it is set.
    conflict: str | None = None
    # The job's own pods whose labels were changed (children.split_strays): not the job's gang any more.
    strays: list[Any] = field(default_factory=list)

    @property
    def generation(self) -> int | None:
        value = (self.obj.get("metadata") or {}).get("generation")
        return int(value) if value is not None else None

    @property
    def old_phase(self) -> str | None:
        phase = self.old.get("phase")
        return str(phase) if phase else None

    @property
    def attempt(self) -> int:
        return int(self.new.get("trainerAttempt") or 0)

    @property
    def generation_attempt(self) -> int:
        """The attempt whose vLLM pods the current trainers use: the trainers' own, unless a restart of the
        trainers alone kept them (gang_restart)."""
        return int(self.new.get("generationAttempt") or self.attempt)

    @property
    def restarts(self) -> int:
        return int(self.new.get("restarts") or 0)

    @property
    def checkpoint_path(self) -> str:
        path = (self.old.get("checkpoint") or {}).get("path")
        return path if isinstance(path, str) else ""

    @property
    def checkpoint_step(self) -> int | None:
        rp = (self.old.get("checkpoint") or {}).get("lastStep")
        return rp if isinstance(rp, int) and not isinstance(rp, bool) else None

    def condition(self, type_: str, status: str, reason: str, message: str) -> None:
        conditions = list(self.new.get("conditions") or [])
        self.new["conditions"] = set_condition(
            conditions, type_, status, reason, message, self.now, self.generation
        )

    def drop_condition(self, type_: str) -> None:
        conditions = [c for c in self.new.get("conditions") or [] if c.get("type") != type_]
        self.new["conditions"] = conditions

    def set_phase(self, phase: str, reason: str, message: str) -> None:
        self.new["phase"] = phase
        self.new["reason"] = reason
        self.new["message"] = truncate(message)

    def event(self, reason: EventReason, message: str) -> None:
        self.plan.events.append(Event(reason.type, reason.reason, truncate(message, 1024)))

    def requeue_at(self, moment: datetime) -> None:
        self.requeue.append(max(_MIN_REQUEUE, (moment - self.now).total_seconds()))

    def due(self, moment: datetime) -> bool:
        """Whether ``moment`` has come; when it has not, the job is reconciled again then."""
        if self.now < moment:
            self.requeue_at(moment)
            return False
        return True

    def status_changes(self) -> dict[str, Any]:
        """The status fields this pass writes: those that differ from the status as stored, so a field
        someone else overwrote is written back."""
        return {k: self.new.get(k) for k in OWNED_STATUS_FIELDS if self.new.get(k) != self.actual.get(k)}

    def finish(self) -> Plan:
        patch = self.status_changes()
        self.plan.status = patch or None
        if "conditions" in patch:
            self.plan.changed_conditions = changed_conditions(
                self.actual.get("conditions"), patch["conditions"]
            )
        record = trusted_fields(self.new)
        if record != self.record:
            self.plan.record = record
        self.plan.phase = self.new.get("phase")
        if self.requeue:
            self.plan.requeue_after = min(self.requeue)
        return self.plan


def resume_point(rp: ReconcilePass) -> str:
    if rp.checkpoint_path:
        at = f" (step {rp.checkpoint_step})" if rp.checkpoint_step is not None else ""
        return f"resuming from checkpoint {rp.checkpoint_path}{at}"
    return "starting from scratch (no checkpoint yet)"
