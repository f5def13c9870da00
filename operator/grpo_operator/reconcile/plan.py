"""What one reconcile decided: the actions for the runtime to carry out, in order."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from grpo_operator.api.pricing import Showback

Manifest = dict[str, Any]


@dataclass(frozen=True)
class ChildRef:
    """A child object by kind and name (the namespace is the job's) and the uid it had when observed.

    Writes that name the uid carry it as a precondition, so they can only ever reach that very object,
    never a newer one someone created under the same name since.
    """

    api_version: str
    kind: str
    name: str
    uid: str | None = None


@dataclass(frozen=True)
class ChildPatch:
    """A JSON merge patch of a child's metadata (made before the child is deleted)."""

    ref: ChildRef
    patch: dict[str, Any]


@dataclass(frozen=True)
class SecretCreate:
    """A Secret to create once, under ``manifest``'s generateName: the runtime puts a random value under
    ``key`` when it creates it (reconcile and the builders hold no randomness) and writes the name the API
    server gave it into the record and status field ``status_field``. Never read, never updated: the pods
    that read it keep the value they read."""

    manifest: Manifest
    key: str
    status_field: str


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event on the GRPOJob."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class Restart:
    """A gang restart the plan performs (for events and the operator's metrics)."""

    reason: str
    counted: bool
    message: str


@dataclass
class Plan:
    """The actions of one reconcile, executed by the runtime in this order:

    0. ``secrets`` (POST with generateName: a new object every time, never one someone else made); the
       names they get join the record and the status below. Nothing in the same plan reads them.
       ``record``: the operator's own copy of the status fields it decides from, written to an annotation
       on the job first (the trainer may write the status, never the job's metadata; see record.py).
    1. ``status``: merge patch of the operator's status fields, conditional on the resourceVersion the
       decision was made from. It goes first so that an operator killed half-way re-derives the same
       decision (a restart bumps trainerAttempt before any pod of the new attempt exists, so the old
       pods become stale and the new ones missing — never a second restart).
    2. ``patches`` (metadata of pods about to be deleted), ``deletes`` (with a uid precondition), then
       ``applies`` then ``creates`` (pods). An apply whose manifest has ``metadata.uid`` updates that
       object (server-side apply; the uid makes it fail rather than reach a same-name newer object);
       without it, it creates the object (POST: fails with 409 rather than take over an object someone
       else made).
    3. ``events``, ``delete_job`` (TTL after finishing).
    """

    record: dict[str, Any] | None = None
    status: dict[str, Any] | None = None
    patches: list[ChildPatch] = field(default_factory=list)
    deletes: list[ChildRef] = field(default_factory=list)
    secrets: list[SecretCreate] = field(default_factory=list)
    applies: list[Manifest] = field(default_factory=list)
    creates: list[Manifest] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    delete_job: bool = False
    # Reconcile again after this many seconds even without a watch event (deadlines, TTL).
    requeue_after: float | None = None
    # The phase the job has after this plan (for the operator's jobs-by-phase gauge).
    phase: str | None = None
    # The job's spend, for the showback metrics; None when the pass did not get as far as reading it.
    showback: Showback | None = None
    # The conditions ``status`` changes, as "Type Status (Reason)", for the operator's log of a status write
    # that changes no phase or reason: every write then says in the log what it changed.
    changed_conditions: list[str] = field(default_factory=list)
    restart: Restart | None = None
    # Children the decision took for gone that the runtime is to look up by name (kind, name): pods that
    # lost the labels the operator's watch selects on vanish from it while they still run. The runtime
    # reads each and, if found, decides again knowing them.
    verify: list[tuple[str, str]] = field(default_factory=list)

    def is_empty(self) -> bool:
        """True when the plan changes nothing in the cluster."""
        return not (
            self.record
            or self.status
            or self.secrets
            or self.patches
            or self.deletes
            or self.applies
            or self.creates
            or self.events
            or self.delete_job
        )
