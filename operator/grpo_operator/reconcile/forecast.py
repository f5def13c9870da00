"""status.forecast: the GPU-hours projected for the whole run (api/forecast.py has the arithmetic).

Computed on every pass from the spec and what trainer rank 0 reports (status.cost, status.progress), and
written only when it moves by more than api.forecast.REWRITE_SHARE (or its basis changes): the trainer's
status write after each step triggers a reconcile, and the forecast must not answer each with a write of
its own.
"""

from __future__ import annotations

from grpo_operator.api.forecast import forecast, settled
from grpo_operator.api.pricing import Charges
from grpo_operator.builders import Job
from grpo_operator.reconcile.reconcile_pass import ReconcilePass


def forecast_status(rp: ReconcilePass, job: Job, bill: Charges | None) -> None:
    """Set status.forecast (kept as stored while the projection stays within the rewrite share)."""
    rp.new["forecast"] = settled(rp.actual.get("forecast"), forecast(job.spec, rp.old, bill))
