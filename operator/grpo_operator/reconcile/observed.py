"""The job's children as read from the API server, and what a pod's status says about it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from grpo_operator.builders.common import (
    ANNOTATION_HASH,
    ANNOTATION_RESUME_FROM,
    LABEL_ATTEMPT,
    LABEL_NODE_RANK,
    LABEL_ROLE,
)
from grpo_operator.builders.storage import ANNOTATION_BIND_COMPLETED
from grpo_operator.reconcile.restart_policy import (
    DISRUPTION_STATUS_REASONS,
    EVICTED_BY_KUEUE,
    NODE_LOST,
    OTHER_DISRUPTION,
    POD_DELETED,
    PREEMPTED,
)

Obj = dict[str, Any]

# The pod condition Kueue sets on the pods of a workload it evicts, before it deletes them.
KUEUE_TERMINATION_CONDITION = "TerminationTarget"


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 timestamp from the API (always UTC, 'Z' suffix) as an aware datetime."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


@dataclass(frozen=True)
class Refusal:
    """The API server refused to create or update a child (quota, Pod Security, an admission policy):
    an HTTP 4xx answer and its message, word for word."""

    kind: str
    name: str
    code: int
    message: str


@dataclass(frozen=True)
class StorageClasses:
    """The cluster's StorageClasses as far as a claim's binding goes: each class's volumeBindingMode and
    the default class (the one a claim without storageClassName gets)."""

    binding_modes: tuple[tuple[str, str], ...] = ()
    default: str | None = None

    def binds_immediately(self, name: str | None) -> bool:
        """Whether a claim of class ``name`` (None: the default class) is bound before any pod uses it.
        False when the class is not known: then nothing can be said, and nothing may wait for it."""
        name = name or self.default
        return name is not None and dict(self.binding_modes).get(name) == "Immediate"


@dataclass(frozen=True)
class Observed:
    """What was found of one job's children: the objects labelled grpo.dev/job=<job> in its namespace and
    any object found under a child's name, each with its ``kind`` set (reconcile tells the job's own from
    the rest, see ownership.py), plus the names of the cluster's nodes when known (None: not checked), and
    the refusals the API server answered the operator's last writes of the job's children with (a refused
    child does not exist, so only the answer tells why it is missing)."""

    objects: tuple[Obj, ...] = ()
    nodes: frozenset[str] | None = None
    refusals: tuple[Refusal, ...] = ()
    # None: the StorageClasses are not known (not watched, or not allowed to be).
    storage_classes: StorageClasses | None = None
    # (kind, name) of the objects of which only the metadata was read (kinds watched metadata-only):
    # their bodies cannot be compared with what the operator builds.
    metadata_only: frozenset[tuple[str, str]] = frozenset()

    def waits_for_binding(self, claim: str, storage_class: str | None) -> bool:
        """Whether the pods of claim ``claim`` (class ``storage_class``, None: the default) are to wait
        for it to be bound: its class binds immediately and the claim, created or about to be, is not
        bound yet. False for a class that binds only for a claim's first pod, and for a class not known:
        their pods must exist for the claim to be bound at all."""
        if self.storage_classes is None or not self.storage_classes.binds_immediately(storage_class):
            return False
        found = self.get("PersistentVolumeClaim", claim)
        annotations = ((found or {}).get("metadata") or {}).get("annotations") or {}
        return annotations.get(ANNOTATION_BIND_COMPLETED) != "yes"

    def of_kind(self, kind: str) -> list[Obj]:
        return [o for o in self.objects if o.get("kind") == kind]

    def get(self, kind: str, name: str) -> Obj | None:
        for obj in self.objects:
            if obj.get("kind") == kind and (obj.get("metadata") or {}).get("name") == name:
                return obj
        return None

    def pods(self) -> list[PodView]:
        return [PodView(p) for p in self.of_kind("Pod")]

    def kueue_wait(self, group: str) -> str | None:
        """Kueue's own words for why it has not admitted the pod group ``group`` (its Workload's
        QuotaReserved or Admitted condition), or None when the Workload is not known or is admitted."""
        workload = self.get("Workload", group)
        if workload is None:
            return None
        conditions = {c.get("type"): c for c in (workload.get("status") or {}).get("conditions") or []}
        for type_ in ("QuotaReserved", "Admitted"):
            cond = conditions.get(type_)
            if cond is not None and cond.get("status") == "False" and cond.get("message"):
                return str(cond["message"])
        return None


@dataclass(frozen=True)
class Termination:
    """How a pod's main container ended."""

    exit_code: int | None
    reason: str
    message: str


class PodView:
    """Read-only interpretation of one pod of the gang."""

    def __init__(self, obj: Obj) -> None:
        self.obj = obj
        self.meta: Obj = obj.get("metadata") or {}
        self.spec: Obj = obj.get("spec") or {}
        self.status: Obj = obj.get("status") or {}

    @property
    def name(self) -> str:
        return str(self.meta.get("name", ""))

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.meta.get("labels") or {})

    @property
    def annotations(self) -> dict[str, str]:
        return dict(self.meta.get("annotations") or {})

    @property
    def role(self) -> str | None:
        return self.labels.get(LABEL_ROLE)

    @property
    def attempt(self) -> int | None:
        return _int(self.labels.get(LABEL_ATTEMPT))

    @property
    def node_rank(self) -> int | None:
        return _int(self.labels.get(LABEL_NODE_RANK))

    @property
    def spec_hash(self) -> str | None:
        return self.annotations.get(ANNOTATION_HASH)

    @property
    def resume_from(self) -> str | None:
        return self.annotations.get(ANNOTATION_RESUME_FROM)

    @property
    def phase(self) -> str:
        return str(self.status.get("phase") or "Pending")

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def created(self) -> datetime | None:
        return parse_time(self.meta.get("creationTimestamp"))

    @property
    def started(self) -> datetime | None:
        """When the kubelet accepted the pod (status.startTime): after scheduling, before image pulls."""
        return parse_time(self.status.get("startTime"))

    @property
    def ready(self) -> bool:
        cond = self.condition("Ready")
        return bool(cond and cond.get("status") == "True")

    @property
    def ready_since(self) -> datetime | None:
        """When the pod last became Ready (None while it is not)."""
        cond = self.condition("Ready")
        if not cond or cond.get("status") != "True":
            return None
        return parse_time(cond.get("lastTransitionTime"))

    @property
    def terminating(self) -> bool:
        return bool(self.meta.get("deletionTimestamp"))

    @property
    def node_name(self) -> str | None:
        value = self.spec.get("nodeName")
        return str(value) if value else None

    def condition(self, type_: str) -> Obj | None:
        for cond in self.status.get("conditions") or []:
            if cond.get("type") == type_:
                return dict(cond)
        return None

    def disruption(self, nodes: frozenset[str] | None) -> str | None:
        """Why the platform stopped this pod, or None if it was not stopped from outside.

        Disruptions are not the job's fault and never count against backoffLimit: an eviction (API or
        node pressure), a preemption, a taint-manager or pod-GC deletion, a node that disappeared, or
        any deletion of a pod the operator did not delete itself.
        """
        # Kueue marks each pod of a workload it evicts (preemption, pods-ready timeout, deactivation)
        # before deleting it; the message says which.
        stopped = self.condition(KUEUE_TERMINATION_CONDITION)
        if stopped and stopped.get("status") == "True":
            message = str(stopped.get("message") or "")
            return PREEMPTED.reason if "preempt" in message.lower() else EVICTED_BY_KUEUE.reason
        target = self.condition("DisruptionTarget")
        if target and target.get("status") == "True":
            return str(target.get("reason") or OTHER_DISRUPTION.reason)
        reason = self.status.get("reason")
        if reason in DISRUPTION_STATUS_REASONS:
            return str(reason)
        if nodes is not None and self.node_name and self.node_name not in nodes:
            return NODE_LOST.reason
        if self.terminating:
            return POD_DELETED.reason
        return None

    def unschedulable(self) -> tuple[str, str] | None:
        """(reason, scheduler message) when the scheduler could not place the pod (or it is gated)."""
        cond = self.condition("PodScheduled")
        if cond and cond.get("status") == "False":
            return str(cond.get("reason") or "Unschedulable"), str(cond.get("message") or "")
        if self.spec.get("schedulingGates"):
            gates = ", ".join(str(g.get("name")) for g in self.spec["schedulingGates"])
            return "SchedulingGated", f"waiting for scheduling gates to be removed: {gates}"
        return None

    @property
    def scheduled(self) -> bool:
        cond = self.condition("PodScheduled")
        return bool(self.node_name) or bool(cond and cond.get("status") == "True")

    def waiting(self) -> tuple[str, str] | None:
        """(reason, message) of a container that waits, e.g. ImagePullBackOff."""
        for status in self.status.get("containerStatuses") or []:
            waiting = (status.get("state") or {}).get("waiting")
            if waiting and waiting.get("reason"):
                return str(waiting["reason"]), str(waiting.get("message") or "")
        return None

    def termination(self) -> Termination | None:
        """How the pod's first terminated container ended (its termination message is the trainer's
        one-line failure reason)."""
        for status in self.status.get("containerStatuses") or []:
            term = (status.get("state") or {}).get("terminated")
            if term:
                code = term.get("exitCode")
                return Termination(
                    exit_code=int(code) if code is not None else None,
                    reason=str(term.get("reason") or ""),
                    message=str(term.get("message") or "").strip(),
                )
        return None

    def failure_summary(self) -> str:
        """One line for status.message and events: which pod failed and why."""
        term = self.termination()
        what = f"{self.role or 'pod'} pod {self.name} failed"
        if term is None:
            reason = self.status.get("reason") or "unknown reason"
            detail = self.status.get("message") or ""
            return f"{what}: {reason}{': ' + str(detail) if detail else ''}"
        parts = [f"exit code {term.exit_code}" if term.exit_code is not None else "no exit code"]
        if term.reason and term.reason not in ("Error", "Completed"):
            parts.append(term.reason)
        if term.message:
            parts.append(_one_line(term.message))
        return f"{what}: {'; '.join(parts)}"


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


# The last line of a Python traceback, "SomeError: what happened", possibly behind a process prefix such as
# vLLM's "(EngineCore pid=12)".
_EXCEPTION_LINE = re.compile(r"\b[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b: \S")


def _one_line(text: str, limit: int = 512) -> str:
    """The line of a termination message that says what went wrong. FallbackToLogsOnError puts a log's
    tail here (vLLM's, when it crashes): its first exception line is the cause (a crashing server logs its
    shutdown after it); without one, the last non-empty line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if _EXCEPTION_LINE.search(line)]
    line = errors[0] if errors else lines[-1] if lines else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."
