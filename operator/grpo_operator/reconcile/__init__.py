"""Level-based reconcile: ``reconcile(job, observed, now, settings) -> Plan``. Pure; no I/O, no clock."""

from grpo_operator.reconcile.core import OWNED_STATUS_FIELDS, reconcile
from grpo_operator.reconcile.observed import Observed, PodView, Refusal
from grpo_operator.reconcile.plan import ChildPatch, ChildRef, Event, Plan, Restart

__all__ = [
    "OWNED_STATUS_FIELDS",
    "ChildPatch",
    "ChildRef",
    "Event",
    "Observed",
    "Plan",
    "PodView",
    "Refusal",
    "Restart",
    "reconcile",
]
