"""``kubectl grpo status``'s GPU-hours lines: spent (status.cost), projected (status.forecast, the operator's)
and the budget (spec.budget.gpuHours); and on a platform with prices the cost line: spent (status.spend),
projected (status.forecast.amount) and spec.budget.amount. Every figure is read as hostile: the tenant's trainer can write the
status, so a value that is not a finite non-negative number is shown as '-', never crashes the command, and
a huge one is printed in three significant digits, not three hundred."""

from __future__ import annotations

import re
from typing import Any

from grpo_operator.api.budget import format_gpu_hours, spent_gpu_hours
from grpo_operator.kubectl_plugin.data import as_float

LABEL = 16
_HUGE = 1e6


def hours(value: Any) -> str:
    """GPU-hours as the budget's messages show them; '-' for anything but a finite non-negative number."""
    known = as_float(value)
    if known is None or known < 0:
        return "-"
    return f"{known:.3g}" if known >= _HUGE else format_gpu_hours(known)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**12 else None


_CURRENCY = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,15}")


def budget_of(job: dict[str, Any], key: str = "gpuHours") -> float | None:
    """spec.budget.<key> of the job as read from the API server (None when unset or not a number)."""
    budget = ((job.get("spec") or {}).get("budget")) or {}
    value = as_float(budget.get(key)) if isinstance(budget, dict) else None
    return value if value is not None and value > 0 else None


def _money(value: float, currency: str) -> str:
    text = f"{value:.3g}" if value >= _HUGE else f"{value:,.2f}"
    return f"{text} {currency}"


def spend_lines(status: dict[str, Any], budget: Any = None) -> list[str]:
    """'Cost  131.62 USD spent of 1,320.00 USD projected; budget 500.00 USD (26 % spent)', from status.spend
    (the operator's); nothing on a platform without prices."""
    raw = status.get("spend")
    spend: dict[str, Any] = raw if isinstance(raw, dict) else {}
    currency = spend.get("currency")
    amount = as_float(spend.get("amount"))
    if not isinstance(currency, str) or not _CURRENCY.fullmatch(currency) or amount is None or amount < 0:
        return []
    text = f"{_money(amount, currency)} spent"
    forecast = status.get("forecast") if isinstance(status.get("forecast"), dict) else {}
    projected = as_float((forecast or {}).get("amount"))
    if projected is not None and projected >= 0 and (forecast or {}).get("currency") == currency:
        text += f" of {_money(projected, currency)} projected"
    limit = as_float(budget)
    if limit is not None and limit > 0:
        text += f"; budget {_money(limit, currency)} ({100 * amount / limit:.0f} % spent)"
    prices = spend.get("prices")
    lines = [f"{'Cost':<{LABEL}}{text}"]
    if isinstance(prices, str) and prices.isprintable() and len(prices) <= 512:
        lines.append(f"{'':<{LABEL}}at {prices}")
    return lines


def gpu_hours_lines(status: dict[str, Any], budget: Any = None) -> list[str]:
    """'GPU-hours  2 spent of 20 projected (19.3-20.7, from 50 steps run); budget 25', and a WARNING line when
    the projection is above the budget. Nothing when there is neither a spend, a forecast nor a budget."""
    spent = spent_gpu_hours(status.get("cost"))
    raw = status.get("forecast")
    forecast: dict[str, Any] = raw if isinstance(raw, dict) else {}
    limit = as_float(budget)
    limit = limit if limit is not None and limit > 0 else None
    projected = as_float(forecast.get("gpuHours"))
    projected = projected if projected is not None and projected >= 0 else None
    if spent is None and not forecast and limit is None:
        return []
    parts = [f"{hours(spent)} spent" if spent is not None else "none spent yet"]
    if projected is not None:
        low, high = as_float(forecast.get("gpuHoursLow")), as_float(forecast.get("gpuHoursHigh"))
        spread = f"{hours(low)}-{hours(high)}, " if low is not None and high is not None else ""
        run = _count(forecast.get("fromSteps"))
        parts[0] += (
            f" of {hours(projected)} projected ({spread}from {run if run is not None else '-'} steps run)"
        )
    elif forecast:
        gpus, training, generation = (
            _count(forecast.get(k)) for k in ("gpus", "trainingGpus", "generationGpus")
        )
        counted = (
            f"; {gpus} GPUs counted ({training} training + {generation} generation)"
            if gpus is not None
            else ""
        )
        parts[0] += f", projected once the first steps have run{counted}"
    if limit is not None:
        share = f" ({100 * spent / limit:.0f} % spent)" if spent is not None and spent / limit < _HUGE else ""
        parts.append(f"budget {hours(limit)}{share}")
    lines = [f"{'GPU-hours':<{LABEL}}{'; '.join(parts)}"]
    if limit is not None and projected is not None and projected > limit:
        lines.append(
            f"{'':<{LABEL}}WARNING: projected above the budget: the job will be suspended at {hours(limit)} "
            "GPU-hours unless spec.budget.gpuHours is raised"
        )
    return lines
