"""What the operator remembers of each job between two reconciles, one record per job, kept in one place.

None of it is the job's state (that is in the cluster, re-derived by every reconcile); it is what spares the
operator work or tells it what the cluster cannot: the job's phase for the phase gauge, the resourceVersion of
its own last write (whose watch event then wakes nobody), what the API server refused in the last plan and
which names it found taken, and the resourceVersions of the ConfigMaps it last wrote or read whole. All of it
is lost on restart and rebuilt by the next reconcile. A record is added when a job is first seen and dropped,
whole, when the job is gone: JobMemories is the only place that does either.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grpo_operator.reconcile import Refusal

Key = tuple[str, str]


@dataclass
class JobMemory:
    # The phase the job was last seen or reconciled in (the operator's grpo_jobs gauge counts them).
    phase: str | None = None
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
    verified: dict[tuple[str, str], str] = field(default_factory=dict)


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
