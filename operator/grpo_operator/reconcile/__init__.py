"""Level-based reconcile: ``reconcile(job, observed, now, settings) -> Plan``. Pure; no I/O, no clock."""

from grpo_operator.reconcile.observed import Observed, PodView, Refusal
from grpo_operator.reconcile.plan import ChildPatch, ChildRef, Event, Plan, Restart
from grpo_operator.reconcile.reconcile_job import reconcile
from grpo_operator.reconcile.reconcile_pass import OWNED_STATUS_FIELDS

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
