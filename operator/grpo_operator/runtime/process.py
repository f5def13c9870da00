"""The operator process's lifecycle, run by kopf: login, startup, cleanup, signals; nothing is decided here.

kopf delivers no watch events to this operator: no resource handler is registered, so kopf opens no
watch on GRPOJobs or their children. It logs in, runs ``startup`` (which starts the runtime's own
informers, workers and /metrics server) and ``cleanup`` on SIGINT/SIGTERM, and applies the settings in
``kopf_settings``. The only streams kopf itself watches are its cluster scanning (CRDs, and namespaces
when a list of namespaces is watched).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import kopf
from aiohttp import web

from grpo_operator.observability import start_http_server
from grpo_operator.runtime import kopf_settings
from grpo_operator.runtime.controller import Controller
from grpo_operator.runtime.kube_client import Kube, load_api_client
from grpo_operator.settings import OperatorSettings

log = logging.getLogger("grpo_operator")


def build_registry(controller: Controller) -> kopf.OperatorRegistry:
    """A fresh kopf registry per operator, so several can run in one process (tests) without sharing
    lifecycle handlers."""

    def start() -> None:
        controller.start()
        scope = (
            "all namespaces" if controller.settings.clusterwide else ", ".join(controller.settings.namespaces)
        )
        log.info(
            "grpo-operator started: watching GRPOJobs in %s with %d workers, resync every %.0fs",
            scope,
            controller.settings.workers,
            controller.settings.resync_seconds,
        )

    # No kopf resource handlers: the controller's own informers (runtime/informer.py) watch GRPOJobs,
    # every child kind and nodes into caches that reconcile reads from. kopf's per-object handler
    # machinery would watch the same streams a second time and cost CPU per event for nothing
    # (docs/scaling.md, "kopf's own watching vs the runtime's informers", has the figures).
    return lifecycle_registry(controller, lambda settings, _: kopf_settings.configure(settings), start)


def lifecycle_registry(
    controller: Controller,
    prepare: Callable[[kopf.OperatorSettings, dict[str, Any]], None],
    start: Callable[[], None],
) -> kopf.OperatorRegistry:
    """A fresh kopf registry with the operator's lifecycle: login; startup (``prepare`` with kopf's settings
    and the startup handler's arguments, the HTTP server, then ``start``); cleanup. bench/kopf_watching.py
    builds its variant of the operator on it."""
    registry = kopf.OperatorRegistry()
    runner: list[web.AppRunner] = []

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # A fresh registry has none of kopf's default login handlers: use the same credentials as the
        # reconcile loop (in-cluster ServiceAccount, else $KUBECONFIG).
        return kopf.login_via_client(**kwargs)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **kwargs: Any) -> None:
        prepare(settings, kwargs)
        await serve_http(controller, runner)
        start()

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        await stop_serving(controller, runner)

    return registry


async def serve_http(controller: Controller, runner: list[web.AppRunner]) -> None:
    """The operator's HTTP server (/metrics, /healthz, /readyz), its runner kept in ``runner`` for the stop."""
    app_runner, port = await start_http_server(
        controller.metrics, controller.health, controller.settings.http_host, controller.settings.http_port
    )
    runner.append(app_runner)
    controller.http_port = port


async def stop_serving(controller: Controller, runner: list[web.AppRunner]) -> None:
    log.info("grpo-operator stopping")
    await controller.stop()
    for app_runner in runner:
        await app_runner.cleanup()


def make_controller(settings: OperatorSettings, kubeconfig: str | None = None) -> Controller:
    # One connection per thread that can call the API: 4 per worker for children, 1 for the job's own writes.
    api = load_api_client(kubeconfig, pool_size=5 * settings.workers)
    kube = Kube(api, field_manager=settings.component, timeout=settings.api_timeout_seconds)
    return Controller(settings, kube)


async def run_operator(
    controller: Controller,
    stop_flag: asyncio.Event | None = None,
    *,
    registry: kopf.OperatorRegistry | None = None,
    configure: Callable[[kopf.OperatorSettings], None] = kopf_settings.configure,
) -> None:
    """Run until SIGINT/SIGTERM (or ``stop_flag``); ``registry`` and ``configure`` are the operator's unless
    given (bench/kopf_watching.py gives its own)."""
    kopf_config = kopf.OperatorSettings()
    configure(kopf_config)
    settings = controller.settings
    await kopf.operator(
        registry=registry if registry is not None else build_registry(controller),
        settings=kopf_config,
        clusterwide=settings.clusterwide,
        namespaces=() if settings.clusterwide else list(settings.namespaces),
        standalone=True,
        stop_flag=stop_flag,
    )
