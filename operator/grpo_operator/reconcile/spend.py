"""status.spend: what the job's use so far costs at the platform's prices (api/pricing.py has the arithmetic).

Computed on every pass from the spec, the price table (operator settings: Helm pricing) and what trainer
rank 0 reports in status.cost, plus the checkpoint claim's time since the job's creation; written only when
the amount moves by more than api.pricing.SPEND_REWRITE_SHARE (or the prices change). The exact figures go
to the plan for the operator's showback metrics, which need no status write.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from grpo_operator.api.budget import COUNTED_COST_FIELDS, finite_count
from grpo_operator.api.pricing import Charges, Showback, charges, job_rates, settled_spend, spend_status
from grpo_operator.builders import Job
from grpo_operator.reconcile.reconcile_pass import ReconcilePass


def _created(rp: ReconcilePass) -> datetime | None:
    stamp = (rp.obj.get("metadata") or {}).get("creationTimestamp")
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None


def job_charges(rp: ReconcilePass, job: Job) -> Charges | None:
    """What the job's use so far costs; None on a platform without prices. Sets status.spend (kept as
    stored while within the rewrite share) and the plan's showback figures."""
    table = rp.settings.price_table
    cost = rp.old.get("cost")
    seconds = {
        key: finite_count(cost.get(key)) if isinstance(cost, dict) else None for key in COUNTED_COST_FIELDS
    }
    rp.plan.showback = Showback(
        training_gpu_seconds=seconds["trainingGpuSeconds"] or 0.0,
        generation_gpu_seconds=seconds["generationGpuSeconds"] or 0.0,
    )
    if table is None:
        if "spend" in rp.old:
            rp.new["spend"] = None
        return None
    rates = job_rates(job.spec, table, rp.settings.gpu_resource, rp.settings.gpu_node_selector)
    bill = charges(rates, cost, _created(rp), rp.now)
    rp.plan.showback = replace(rp.plan.showback, amount=bill.total, currency=bill.currency)
    rp.new["spend"] = settled_spend(rp.actual.get("spend"), spend_status(rates, bill))
    return bill
