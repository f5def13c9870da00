"""Status conditions in the metav1.Condition style, and timestamps as the API writes them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

# Condition types the operator maintains (docs/operations.md explains each).
SCHEDULED = "Scheduled"
RUNNING = "Running"
SUSPENDED = "Suspended"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
METRIC_READY = "MetricReady"
# The environment server of a job with spec.environment (its counterpart of MetricReady).
ENVIRONMENT_READY = "EnvironmentReady"
# The rollout gateway of a client-rollout job (its counterpart of MetricReady).
GATEWAY_READY = "GatewayReady"
# An object with a child's name exists that the operator did not create for this job.
CONFLICT = "Conflict"
PLATFORM_POLICY = "PlatformPolicy"
# Whether vLLM serves the weights the trainer trains (trainer rank 0's probe, status.servedModel).
SERVED_MODEL_IN_SYNC = "ServedModelInSync"
# Whether the optimizer steps change the weights (trainer rank 0's sample of them, status.updates).
UPDATES_EFFECTIVE = "UpdatesEffective"
# Whether the job learns: trainer rank 0's diagnosis over its last steps (status.learning).
LEARNING_HEALTHY = "LearningHealthy"
# Whether the job's spend (status.cost) is under spec.budget.gpuHours (reconcile/budget.py).
WITHIN_BUDGET = "WithinBudget"
CONDITION_ORDER = (
    SCHEDULED,
    RUNNING,
    METRIC_READY,
    ENVIRONMENT_READY,
    GATEWAY_READY,
    SERVED_MODEL_IN_SYNC,
    UPDATES_EFFECTIVE,
    LEARNING_HEALTHY,
    WITHIN_BUDGET,
    SUSPENDED,
    SUCCEEDED,
    FAILED,
    CONFLICT,
    PLATFORM_POLICY,
)

MAX_MESSAGE = 4096


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC with second precision, the way the API server writes metav1.Time."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def truncate(message: str, limit: int = MAX_MESSAGE) -> str:
    return message if len(message) <= limit else message[: limit - 3] + "..."


def set_condition(
    conditions: list[dict[str, Any]],
    type_: str,
    status: str,
    reason: str,
    message: str,
    now: datetime,
    generation: int | None,
) -> list[dict[str, Any]]:
    """A new list with condition ``type_`` set; lastTransitionTime moves only when status changes."""
    previous = next((c for c in conditions if c.get("type") == type_), None)
    transition = (
        previous["lastTransitionTime"]
        if previous is not None and previous.get("status") == status and previous.get("lastTransitionTime")
        else format_time(now)
    )
    updated: dict[str, Any] = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": truncate(message),
        "lastTransitionTime": transition,
    }
    if generation is not None:
        updated["observedGeneration"] = generation
    others = [c for c in conditions if c.get("type") != type_]
    merged = [*others, updated]
    order = {t: i for i, t in enumerate(CONDITION_ORDER)}
    return sorted(merged, key=lambda c: order.get(str(c.get("type")), len(order)))


def get_condition(conditions: list[dict[str, Any]], type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions if c.get("type") == type_), None)


def changed_conditions(before: Any, after: Any) -> list[str]:
    """The conditions whose status or reason differ between two lists, as "Type Status (Reason)"; one that
    was dropped as "Type removed"."""

    # ``before`` is the status as stored, which anyone allowed to write it may have filled with garbage.
    def by_type(conditions: Any) -> dict[str, tuple[Any, Any]]:
        if not isinstance(conditions, list):
            return {}
        return {
            str(c.get("type")): (c.get("status"), c.get("reason")) for c in conditions if isinstance(c, dict)
        }

    old, new = by_type(before), by_type(after)
    changed = [f"{t} {s} ({r})" for t, (s, r) in new.items() if old.get(t) != (s, r)]
    return changed + [f"{t} removed" for t in old if t not in new]
