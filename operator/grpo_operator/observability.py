"""The operator's own observability: Prometheus metrics and the /metrics, /healthz, /readyz server.

Metric names follow the project's rules: prefix ``grpo_``, base units, counters end in ``_total``,
per-job series carry ``namespace`` and ``grpojob`` (never ``job``, which Prometheus reserves for the
scrape job). The trainer's own metrics (rewards, steps) are served by trainer rank 0, not here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from grpo_operator import __version__
from grpo_operator.api.pricing import Showback
from grpo_operator.api.status import PHASES

log = logging.getLogger("grpo_operator.http")


class _JobsByPhase(Collector):
    """grpo_operator_jobs{phase} and grpo_operator_job_phase{namespace,grpojob,phase}: computed at scrape
    time from the operator's view of every job.

    The per-job series lets an alert name the job and require the *same* job to stay in a phase: with
    only the count, "some job Pending for 30m" fires on a busy cluster where each job waits a minute.
    One series per job (the current phase only), gone when the job is.
    """

    def __init__(self, phases: Callable[[], Mapping[tuple[str, str], str | None]]) -> None:
        self._phases = phases

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "grpo_operator_jobs", "GRPOJobs known to the operator, by phase.", labels=["phase"]
        )
        per_job = GaugeMetricFamily(
            "grpo_operator_job_phase",
            "1 for each GRPOJob known to the operator, labelled with its current phase.",
            labels=["namespace", "grpojob", "phase"],
        )
        counts: dict[str, int] = dict.fromkeys(PHASES, 0)
        for (namespace, name), phase in sorted(self._phases().items()):
            key = phase or "Pending"
            counts[key] = counts.get(key, 0) + 1
            per_job.add_metric([namespace, name, key], 1)
        for phase, count in counts.items():
            family.add_metric([phase], count)
        yield family
        yield per_job


class _JobSpend(Collector):
    """Showback: each job's GPU-seconds, its cost at the platform's prices and its limits, computed at scrape
    time from the operator's last reconcile of every job (reconcile/spend.py).

    The GPU-seconds and the amount are cumulative over the job's life (every gang attempt), so they are
    counters: across an operator restart they come back at the same or a higher value, which Prometheus does
    not take for a reset, and ``increase(...[30d])`` is what the job spent in those 30 days. A job deleted
    and applied again under its name starts from 0, which Prometheus does take for a reset.
    """

    def __init__(self, showbacks: Callable[[], Mapping[tuple[str, str], Showback]]) -> None:
        self._showbacks = showbacks

    def collect(self) -> Iterable[Metric]:
        gpu = CounterMetricFamily(
            "grpo_operator_job_gpu_seconds",
            "GPU-seconds a GRPOJob has spent, every gang attempt's (status.cost), by role: training, generation.",
            labels=["namespace", "grpojob", "role"],
        )
        spend = CounterMetricFamily(
            "grpo_operator_job_spend",
            "What a GRPOJob's use has cost at the platform's prices (Helm pricing), in its currency; only "
            "on a platform with prices.",
            labels=["namespace", "grpojob", "currency"],
        )
        budget_hours = GaugeMetricFamily(
            "grpo_operator_job_budget_gpu_seconds",
            "The GPU-seconds a GRPOJob may spend before it is suspended (spec.budget.gpuHours or the "
            "platform's namespace budget); absent without one.",
            labels=["namespace", "grpojob"],
        )
        budget_amount = GaugeMetricFamily(
            "grpo_operator_job_budget_amount",
            "The most a GRPOJob may cost before it is suspended (spec.budget.amount or the platform's "
            "namespace budget), in the platform's currency; absent without one.",
            labels=["namespace", "grpojob", "currency"],
        )
        for (namespace, name), figures in sorted(self._showbacks().items()):
            gpu.add_metric([namespace, name, "training"], figures.training_gpu_seconds)
            gpu.add_metric([namespace, name, "generation"], figures.generation_gpu_seconds)
            if figures.amount is not None:
                spend.add_metric([namespace, name, figures.currency], figures.amount)
            if figures.budget_gpu_hours is not None:
                budget_hours.add_metric([namespace, name], figures.budget_gpu_hours * 3600.0)
            if figures.budget_amount is not None:
                budget_amount.add_metric([namespace, name, figures.currency], figures.budget_amount)
        yield from (gpu, spend, budget_hours, budget_amount)


class OperatorMetrics:
    """All operator metrics, in a registry of their own (several operators can share a process in tests)."""

    def __init__(
        self,
        phases: Callable[[], Mapping[tuple[str, str], str | None]],
        showbacks: Callable[[], Mapping[tuple[str, str], Showback]] = dict,
    ) -> None:
        self.registry = CollectorRegistry()
        self.reconciles = Counter(
            "grpo_operator_reconcile_total",
            "Reconciles by result: success, conflict (status changed meanwhile; retried), error, gone.",
            ["result"],
            registry=self.registry,
        )
        self.reconcile_seconds = Histogram(
            "grpo_operator_reconcile_duration_seconds",
            "Time to observe a job's children, decide and carry out the plan.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.restarts = Counter(
            "grpo_operator_gang_restarts_total",
            "Gang restarts by reason; counted=true ones spend the job's backoffLimit.",
            ["namespace", "grpojob", "reason", "counted"],
            registry=self.registry,
        )
        self.api_errors = Counter(
            "grpo_operator_api_errors_total",
            "Failed Kubernetes API requests made by the reconcile loop, by verb, kind and HTTP status.",
            ["verb", "kind", "code"],
            registry=self.registry,
        )
        self.api_requests = Counter(
            "grpo_operator_api_requests_total",
            "Kubernetes API requests the operator sent, by verb (get, list, watch, create, patch, update, "
            "delete) and resource (with its subresource, e.g. grpojobs/status); a watch counts once, when it "
            "starts.",
            ["verb", "resource"],
            registry=self.registry,
        )
        self.events = Counter(
            "grpo_operator_events_total",
            "Kubernetes events posted on GRPOJobs, by type and reason.",
            ["type", "reason"],
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "grpo_operator_workqueue_depth", "Jobs waiting to be reconciled.", registry=self.registry
        )
        self.info = Gauge(
            "grpo_operator_info", "Operator build information.", ["version"], registry=self.registry
        )
        self.info.labels(version=__version__).set(1)
        self.registry.register(_JobsByPhase(phases))
        self.registry.register(_JobSpend(showbacks))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class HealthState:
    """Liveness: the event loop answers and the reconcile workers are alive. Readiness: the operator has
    listed its jobs once and its last API contact succeeded recently."""

    def __init__(self, stale_after: float) -> None:
        self.ready = False
        self.workers_alive: Callable[[], bool] = lambda: True
        self.last_api_success = 0.0
        self.stale_after = stale_after

    def api_ok(self) -> None:
        self.last_api_success = time.monotonic()

    def live(self) -> tuple[bool, str]:
        if not self.workers_alive():
            return False, "reconcile workers have stopped"
        return True, "ok"

    def readiness(self) -> tuple[bool, str]:
        if not self.ready:
            return False, "initial list of GRPOJobs not done yet"
        age = time.monotonic() - self.last_api_success
        if age > self.stale_after:
            return False, f"no successful Kubernetes API call for {age:.0f}s"
        return True, "ok"


def make_app(metrics: OperatorMetrics, health: HealthState) -> web.Application:
    async def metrics_handler(_: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        ok, why = health.live()
        return web.Response(status=200 if ok else 500, text=why + "\n")

    async def readyz(_: web.Request) -> web.Response:
        ok, why = health.readiness()
        return web.Response(status=200 if ok else 503, text=why + "\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


async def start_http_server(
    metrics: OperatorMetrics, health: HealthState, host: str, port: int
) -> tuple[web.AppRunner, int]:
    """Serve /metrics, /healthz and /readyz; returns the runner and the bound port (port 0 = any)."""
    runner = web.AppRunner(make_app(metrics, health), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = port
    for address in runner.addresses:
        # (host, port) for IPv4, (host, port, flow, scope) for IPv6
        if isinstance(address, tuple) and len(address) >= 2:
            bound = int(address[1])
            break
    log.info("serving /metrics, /healthz and /readyz on http://%s:%d", host, bound)
    return runner, bound
