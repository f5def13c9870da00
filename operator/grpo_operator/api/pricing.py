"""Prices a platform sets (Helm ``pricing``; the operator setting ``prices``) and what a job's use costs.

The use is what trainer rank 0 reports in ``status.cost`` (GPU-seconds of generation and of training,
metric calls, rollouts), plus the checkpoint claim the operator created, counted from the job's creation.
The price of a GPU-hour is decided from what the job asks for, so it is known before the job runs (the
forecast prices the whole run with it). Every GPU pod of a job (vLLM and trainers) requires the same node
labels and requests the same GPU resource, so one price holds for generation and training:

1. a node label the GPU pods require (the platform's gpuNodeSelector, the job's
   ``spec.scheduling.nodeSelector`` and ``gpuNodeSelector``) that has a price; the highest wins if several do;
2. else the price of the GPU resource the operator requests (the setting gpu_resource, ``nvidia.com/gpu``
   by default; a platform that hands out MIG slices under their own name prices that name);
3. else ``gpuHour.default``.

A price per node label is charged for what the job selects, not for the node it landed on: a platform that
prices node types differently makes jobs select them (its gpuNodeSelector or the job's own).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from pydantic import ConfigDict, Field, ValidationError, model_validator

from grpo_operator.api.base import ApiModel
from grpo_operator.api.budget import finite_count
from grpo_operator.api.quantity import quantity

_CURRENCY = r"^[A-Za-z][A-Za-z0-9_-]{0,15}$"
_LABEL = re.compile(r"^[A-Za-z0-9./_-]{1,316}=[A-Za-z0-9._-]{0,63}$")
SECONDS_PER_MONTH = 30 * 24 * 3600.0
BYTES_PER_GB = Decimal(10**9)
Price = float


class GpuHourPrices(ApiModel):
    """The price of one GPU-hour, by what the GPU pods ask for (see the module docstring for the order)."""

    default: Price = Field(ge=0, description="Any GPU-hour without a more specific price.")
    resources: dict[str, Price] = Field(
        default_factory=dict, description="By extended resource name, e.g. nvidia.com/mig-1g.10gb: 0.5."
    )
    node_labels: dict[str, Price] = Field(
        default_factory=dict,
        description='By a node label the GPU pods require, "key=value", e.g. '
        '"nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3": 4.0.',
    )

    @model_validator(mode="after")
    def _prices(self) -> GpuHourPrices:
        for name, value in {**self.resources, **self.node_labels}.items():
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"the price of {name!r} is {value}: give a number >= 0")
        for label in self.node_labels:
            if not _LABEL.match(label):
                raise ValueError(
                    f"node label {label!r} is not key=value: write it as e.g. cloud.example.com/gpu=h100"
                )
        return self


class PriceTable(ApiModel):
    """Every price of the platform, in one currency."""

    currency: str = Field(pattern=_CURRENCY, description="What the amounts are in, e.g. USD or credits.")
    gpu_hour: GpuHourPrices
    metric_calls_per_thousand: Price = Field(default=0, ge=0, description="1,000 completions scored.")
    environment_episodes_per_thousand: Price = Field(
        default=0, ge=0, description="1,000 episodes of an environment job (status.cost.rollouts)."
    )
    storage_gb_month: Price = Field(
        default=0,
        ge=0,
        description="A GB (10^9 bytes) of checkpoint claim for 30 days, for the claim the operator creates "
        "(spec.checkpoints.volume.size), from the job's creation while the job exists.",
    )


@dataclass(frozen=True)
class GpuRate:
    """The price of a GPU-hour of a job and where it came from."""

    price: float
    basis: str  # e.g. "node label nvidia.com/gpu.product=H100", "nvidia.com/gpu", "default"


@dataclass(frozen=True)
class JobRates:
    """A job's prices: fixed by its spec, so the forecast can use them before it runs."""

    currency: str
    gpu_hour: GpuRate
    metric_call: float  # per call
    episode: float  # per environment episode (0 for other jobs)
    storage_gb: float  # GB of checkpoint claim charged (0: an existing claim, not the operator's)
    storage_gb_second: float

    def describe(self) -> str:
        """ "2.5 USD a GPU-hour (nvidia.com/gpu)"."""
        return f"{self.gpu_hour.price:.6g} {self.currency} a GPU-hour ({self.gpu_hour.basis})"


@dataclass(frozen=True)
class Showback:
    """A job's spend as the operator's showback metrics export it (the operator's observability module), exact on every pass:
    the status is rewritten only when its figures move by a share."""

    training_gpu_seconds: float = 0.0
    generation_gpu_seconds: float = 0.0
    amount: float | None = None  # at the platform's prices; None without prices
    currency: str = ""
    budget_gpu_hours: float | None = None  # the limits that apply (spec.budget or the platform's)
    budget_amount: float | None = None


@dataclass(frozen=True)
class Charges:
    """What a job's use so far costs, by kind, in ``currency``."""

    currency: str
    gpu: float
    calls: float
    storage: float

    @property
    def total(self) -> float:
        return self.gpu + self.calls + self.storage


def gpu_rate(table: PriceTable, labels: Mapping[str, str], gpu_resource: str) -> GpuRate:
    """The price of a GPU-hour on nodes with ``labels`` required, for GPUs named ``gpu_resource``."""
    selected = [
        (price, label)
        for label, price in table.gpu_hour.node_labels.items()
        if labels.get(label.split("=", 1)[0]) == label.split("=", 1)[1]
    ]
    if selected:
        price, label = max(selected)
        return GpuRate(price, f"node label {label}")
    if gpu_resource in table.gpu_hour.resources:
        return GpuRate(table.gpu_hour.resources[gpu_resource], gpu_resource)
    return GpuRate(table.gpu_hour.default, "default")


def job_rates(
    spec: Any, table: PriceTable, gpu_resource: str, platform_labels: Mapping[str, str]
) -> JobRates:
    """The prices of a job with ``spec`` (GRPOJobSpec) under ``table``."""
    scheduling = spec.scheduling
    labels = {**platform_labels, **scheduling.node_selector, **scheduling.gpu_node_selector}
    volume = spec.checkpoints.volume
    storage_gb = 0.0
    if volume.existing_claim is None:
        size = quantity(volume.size)
        storage_gb = float(size / BYTES_PER_GB) if size is not None else 0.0
    return JobRates(
        currency=table.currency,
        gpu_hour=gpu_rate(table, labels, gpu_resource),
        metric_call=table.metric_calls_per_thousand / 1000.0,
        episode=table.environment_episodes_per_thousand / 1000.0 if spec.environment is not None else 0.0,
        storage_gb=storage_gb,
        storage_gb_second=table.storage_gb_month / SECONDS_PER_MONTH,
    )


def charges(rates: JobRates, cost: Any, created: datetime | None, now: datetime) -> Charges:
    """What the use in ``cost`` (status.cost as stored; read defensively, the trainer writes it) and the
    claim's time since ``created`` cost."""
    cost = cost if isinstance(cost, dict) else {}

    def read(key: str) -> float:
        return finite_count(cost.get(key)) or 0.0

    gpu = (read("trainingGpuSeconds") + read("generationGpuSeconds")) / 3600.0 * rates.gpu_hour.price
    calls = read("metricCalls") * rates.metric_call + read("rollouts") * rates.episode
    seconds = max(0.0, (now - created).total_seconds()) if created is not None else 0.0
    storage = rates.storage_gb * rates.storage_gb_second * seconds
    return Charges(rates.currency, _finite(gpu), _finite(calls), _finite(storage))


def _finite(value: float) -> float:
    return value if math.isfinite(value) else 0.0


def format_amount(amount: float, currency: str) -> str:
    """ "12.35 USD": two decimals (three significant digits below 1)."""
    text = f"{amount:.3g}" if 0 < amount < 1 else f"{amount:,.2f}"
    return f"{text} {currency}"


# No control characters: `kubectl grpo status` prints the text.
_NO_CONTROL = r"^[^\x00-\x1f\x7f-\x9f]*$"
# status.spend is rewritten when its amount moves by more than this share (or its prices change): the
# trainer's status write after each step triggers a reconcile, and the spend must not answer each with one.
SPEND_REWRITE_SHARE = 0.01


class SpendStatus(ApiModel):
    """What the job's use so far costs at the platform's prices (written by the operator)."""

    model_config = ConfigDict(strict=False)

    currency: str = Field(
        max_length=16, pattern=_CURRENCY, description="The platform's currency (Helm pricing.currency)."
    )
    amount: float = Field(
        ge=0,
        description="gpu + calls + storage, rewritten when it moves by more than 1 % (the operator's "
        "grpo_job_spend_total metric is exact).",
    )
    gpu: float = Field(ge=0, description="Generation and training GPU-hours (status.cost) at their prices.")
    calls: float = Field(
        ge=0, description="Metric calls and environment episodes (status.cost) at their prices."
    )
    storage: float = Field(
        ge=0,
        description="The checkpoint claim the operator created, its size for the time since the job's creation.",
    )
    prices: str = Field(
        max_length=512, pattern=_NO_CONTROL, description="The GPU-hour prices the job is charged, and why."
    )


def spend_status(rates: JobRates, bill: Charges) -> SpendStatus:
    return SpendStatus(
        currency=bill.currency,
        amount=round(bill.total, 4),
        gpu=round(bill.gpu, 4),
        calls=round(bill.calls, 4),
        storage=round(bill.storage, 4),
        prices=rates.describe(),
    )


def settled_spend(old: Any, new: SpendStatus) -> dict[str, Any]:
    """What status.spend holds after this pass: ``old`` while ``new`` is within SPEND_REWRITE_SHARE of it."""
    fresh = new.model_dump(by_alias=True, mode="json")
    if not isinstance(old, dict):
        return fresh
    try:
        previous = SpendStatus.model_validate(old)
    except ValidationError:
        return fresh
    if (previous.currency, previous.prices) != (new.currency, new.prices):
        return fresh
    if abs(new.amount - previous.amount) > SPEND_REWRITE_SHARE * previous.amount:
        return fresh
    return old
