"""What the operator remembers of each job between two reconciles, one record per job, kept in one place.

None of it is the job's state (that is in the cluster, re-derived by every reconcile); it is what spares the
operator work or tells it what the cluster cannot: the job's phase for the phase gauge, the resourceVersion of
its own last write (whose watch event then wakes nobody), what the API server refused in the last plan and
which names it found taken, and the resourceVersions of the ConfigMaps it last wrote or read whole. All of it
is lost on restart and rebuilt by the next reconcile. A record is added when a job is first seen and dropped,
whole, when the job is gone: JobMemories is the only place that does either.

The Controller (runtime/controller.py) makes the one JobMemories and hands it to the parts that use it:

- Wakeups (wakeups.py) adds and drops records (a job seen, deleted, or gone at a resync) and asks
  ``is_own_write`` of each GRPOJob watch event;
- Observer (observe.py) reads ``refusals``, ``taken`` and ``verified`` before reconcile decides;
- PlanExecutor (apply_plan.py) records ``remember_write``, ``remember_outcome`` and ``remember_verified``;
- the Controller's reconcile pass records the phase and what the observation read whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from grpo_operator.api.pricing import Showback
from grpo_operator.reconcile import Refusal

Key = tuple[str, str]
# (kind, name) of one of a job's children.
Ref = tuple[str, str]


@dataclass
class JobMemory:
    # The phase the job was last seen or reconciled in (the operator's grpo_jobs gauge counts them).
    phase: str | None = None
    # The job's spend as of its last reconcile (the showback metrics).
    showback: Showback | None = None
    # The job's resourceVersion after the operator's own last write: the watch event echoing it is ignored.
    written_rv: str | None = None
    # What the API server refused in the last executed plan. A refused child does not exist, so only this
    # says why it is missing; the next reconcile reads it.
    refusals: tuple[Refusal, ...] = ()
    # (kind, name) whose create the API server answered 409 in the last executed plan: the caches hold only
    # what the operator manages, so the next reconcile reads these names before deciding again.
    taken: frozenset[tuple[str, str]] = frozenset()
    # (kind, name) -> the resourceVersion of each metadata-only child (a ConfigMap) when the operator last
    # wrote or read it whole; one whose cached metadata shows another is read again.
    verified: dict[Ref, str] = field(default_factory=dict)


class JobMemories:
    """The records of every job the operator knows, by (namespace, name)."""

    def __init__(self) -> None:
        self._records: dict[Key, JobMemory] = {}

    def know(self, key: Key, phase: str | None = None) -> JobMemory:
        """The job's record, added (with ``phase``) if it is new."""
        record = self._records.get(key)
        if record is None:
            record = self._records[key] = JobMemory(phase=phase)
        return record

    def get(self, key: Key) -> JobMemory | None:
        return self._records.get(key)

    def forget(self, key: Key) -> None:
        """Drop everything remembered of a job that is gone."""
        self._records.pop(key, None)

    def keys(self) -> set[Key]:
        return set(self._records)

    def phases(self) -> dict[Key, str | None]:
        return {key: record.phase for key, record in self._records.items()}

    # --- what the parts of the controller record and read (see the module's docstring) -------------------

    def showbacks(self) -> dict[Key, Showback]:
        return {key: record.showback for key, record in self._records.items() if record.showback is not None}

    def remember_phase(self, key: Key, phase: str | None) -> None:
        self.know(key).phase = phase

    def remember_showback(self, key: Key, showback: Showback | None) -> None:
        """The job's spend from the reconcile just done (kept when the pass did not get as far as reading it)."""
        if showback is not None:
            self.know(key).showback = showback

    def remember_write(self, key: Key, resource_version: str) -> None:
        """The job's resourceVersion after the operator's own write of it."""
        self.know(key).written_rv = resource_version

    def is_own_write(self, key: Key, resource_version: str) -> bool:
        """Whether a watch event of the job at ``resource_version`` is the echo of the operator's own last
        write (adds the record of a job not known yet)."""
        return self.know(key).written_rv == resource_version

    def remember_outcome(self, key: Key, refusals: Iterable[Refusal], taken: Iterable[Ref]) -> None:
        """What the API server refused, and the names it found taken, in the plan just carried out."""
        record = self.know(key)
        record.refusals, record.taken = tuple(refusals), frozenset(taken)

    def remember_verified(self, key: Key, verified: Mapping[Ref, str]) -> None:
        """The resourceVersions of metadata-only children the operator just wrote or read whole."""
        self.know(key).verified.update(verified)

    def refusals(self, key: Key) -> tuple[Refusal, ...]:
        record = self._records.get(key)
        return record.refusals if record is not None else ()

    def taken(self, key: Key) -> frozenset[Ref]:
        record = self._records.get(key)
        return record.taken if record is not None else frozenset()

    def verified(self, key: Key) -> Mapping[Ref, str]:
        record = self._records.get(key)
        return record.verified if record is not None else {}
