"""Turn ``def metric(example, completion) -> float`` into a server that speaks the metric protocol.

A metric may instead return its reward's named parts, ``{"accuracy": 1.0, "format": 0.5}``: the server
answers them as the result's components; the trainer's reward is their sum, or their weighted sum under
spec.metric.rewardWeights, and each part's mean is reported beside the reward."""

from __future__ import annotations

import asyncio
import inspect
import ipaddress
import json
import logging
import math
import os
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web

from grpo_metric.protocol import (
    HEALTH_PATH,
    SCORE_PATH,
    VALIDATE_PATH,
    ProtocolError,
    ScoreItem,
    ScoreResult,
    parse_components,
    parse_score_request,
)

log = logging.getLogger("grpo_metric")

# ``metric(example, completion)``, optionally taking the keyword arguments in COMPLETION_KWARGS too; it
# returns the reward, or the reward's named components.
Reward = float | dict[str, float]
MetricFn = Callable[..., Reward] | Callable[..., Awaitable[Reward]]

# What a metric may also receive about the completion, as keyword arguments named like the ScoreItem
# fields: its length in tokens and why it ended ("stop" or "length", see protocol.py). A metric gets the
# ones its signature names (or all with **kwargs), so ``metric(example, completion)`` keeps working; the
# value is None when the request did not carry it (an older trainer).
COMPLETION_KWARGS = ("completion_tokens", "finish_reason")

DEFAULT_PORT = 8080
# The operator sets this in the metric container to spec.metric.port; an explicit port= argument wins.
PORT_ENV = "GRPO_METRIC_PORT"
# The address serve() listens on when its caller names none: all interfaces, so the pod's Service reaches it.
HOST_ENV = "GRPO_METRIC_HOST"
DEFAULT_HOST = "0.0.0.0"


class FormatFailure(Exception):
    """Raise from a metric when the completion cannot be parsed; the trainer scores it formatFailureScore."""


def completion_kwargs(metric: MetricFn) -> tuple[str, ...]:
    """The names of COMPLETION_KWARGS that ``metric`` accepts."""
    try:
        parameters = inspect.signature(metric).parameters.values()
    except (TypeError, ValueError):  # builtins and some C callables have no signature: pass nothing
        return ()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return COMPLETION_KWARGS
    names = {p.name for p in parameters if p.kind is not inspect.Parameter.POSITIONAL_ONLY}
    return tuple(name for name in COMPLETION_KWARGS if name in names)


def _call(metric: MetricFn, item: ScoreItem, extras: tuple[str, ...]) -> Any:
    return metric(item.example, item.completion, **{name: getattr(item, name) for name in extras})


def _score_one(metric: MetricFn, item: ScoreItem, extras: tuple[str, ...] = ()) -> ScoreResult:
    try:
        value = _call(metric, item, extras)
        if inspect.isawaitable(value):
            raise TypeError("async metric called from a worker thread")
    except FormatFailure as exc:
        return ScoreResult.format_failure(item.id, str(exc) or "unparseable output")
    except Exception as exc:  # the user's code: any bug is reported per item, never crashes the server
        log.exception("metric raised on item %s", item.id)
        return ScoreResult.error(item.id, f"{type(exc).__name__}: {exc}")
    return _check_reward(item.id, value)


def _check_reward(item_id: str, value: object) -> ScoreResult:
    if isinstance(value, dict):
        try:
            components = parse_components(value)
        except ProtocolError as exc:
            return ScoreResult.error(item_id, f"metric returned bad components: {exc}")
        if not components:
            return ScoreResult.error(item_id, "metric returned no components (an empty dict)")
        return ScoreResult.ok(item_id, math.fsum(components.values()), components)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return ScoreResult.error(
            item_id, f"metric returned {type(value).__name__}, expected a float or a dict of components"
        )
    if not math.isfinite(float(value)):
        return ScoreResult.error(item_id, f"metric returned a non-finite reward {value!r}")
    return ScoreResult.ok(item_id, float(value))


async def _score_one_async(metric: MetricFn, item: ScoreItem, extras: tuple[str, ...] = ()) -> ScoreResult:
    try:
        value = await _call(metric, item, extras)
    except FormatFailure as exc:
        return ScoreResult.format_failure(item.id, str(exc) or "unparseable output")
    except Exception as exc:
        log.exception("metric raised on item %s", item.id)
        return ScoreResult.error(item.id, f"{type(exc).__name__}: {exc}")
    return _check_reward(item.id, value)


def _is_async(metric: MetricFn) -> bool:
    return inspect.iscoroutinefunction(metric) or inspect.iscoroutinefunction(
        getattr(metric, "__call__", None)  # noqa: B004 - callable objects with async __call__
    )


def make_app(
    metric: MetricFn, *, max_workers: int = 4, validation: MetricFn | None = None
) -> web.Application:
    """The aiohttp application: GET /healthz and POST /score, plus POST /validate scored by ``validation``
    when given. Synchronous metrics run on a thread pool so a slow item never blocks health checks; async
    metrics run on the event loop."""
    executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="metric")

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    def scorer(fn: MetricFn) -> Callable[[web.Request], Awaitable[web.Response]]:
        is_async = _is_async(fn)
        extras = completion_kwargs(fn)

        async def score(request: web.Request) -> web.Response:
            try:
                body = await request.json()
                items = parse_score_request(body)
            except (json.JSONDecodeError, ProtocolError) as exc:
                return web.json_response({"error": f"bad request: {exc}"}, status=400)
            if is_async:
                results = await asyncio.gather(*(_score_one_async(fn, item, extras) for item in items))
            else:
                loop = asyncio.get_running_loop()
                results = await asyncio.gather(
                    *(loop.run_in_executor(executor, _score_one, fn, item, extras) for item in items)
                )
            return web.json_response({"results": [r.to_json() for r in results]})

        return score

    async def shutdown_executor(_: web.Application) -> None:
        executor.shutdown(wait=False, cancel_futures=True)

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_get(HEALTH_PATH, healthz)
    app.router.add_post(SCORE_PATH, scorer(metric))
    if validation is not None:
        app.router.add_post(VALIDATE_PATH, scorer(validation))
    app.on_cleanup.append(shutdown_executor)
    return app


def _resolve_port(port: int | None) -> int:
    if port is not None:
        return port
    raw = os.environ.get(PORT_ENV)
    if raw is None:
        return DEFAULT_PORT
    try:
        return int(raw)
    except ValueError:
        raise SystemExit(
            f"{PORT_ENV}={raw!r} is not a port number; set it to an integer such as 8080"
        ) from None


def _resolve_host(host: str | None) -> str:
    if host is not None:
        return host
    raw = os.environ.get(HOST_ENV, "").strip()
    if not raw:
        return DEFAULT_HOST
    try:
        return str(ipaddress.ip_address(raw))
    except ValueError:
        raise SystemExit(
            f"{HOST_ENV}={raw!r} is not an IP address; set it to the address to listen on, such as 127.0.0.1 "
            f"(this pod only), :: or 0.0.0.0 (all interfaces, the default)"
        ) from None


def serve(
    metric: MetricFn,
    port: int | None = None,
    host: str | None = None,
    *,
    max_workers: int = 4,
    validation: MetricFn | None = None,
) -> None:
    """Serve ``metric`` until SIGTERM/SIGINT. ``port`` defaults to $GRPO_METRIC_PORT, else 8080; ``host``
    (the address to listen on) to $GRPO_METRIC_HOST, else 0.0.0.0, all interfaces, which a pod needs for
    its Service to reach it; 127.0.0.1 keeps it to the machine, e.g. behind a sidecar that forwards to it.
    ``validation``: a second reward on POST /validate, for spec.grpo.validation.scorePath: /validate."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    resolved = _resolve_port(port)
    address = _resolve_host(host)
    log.info("serving metric %s on %s:%d", getattr(metric, "__name__", metric), address, resolved)
    web.run_app(
        make_app(metric, max_workers=max_workers, validation=validation),
        host=address,
        port=resolved,
        print=None,
    )


class MetricServer:
    """The same server on a background thread, for tests, benchmarks and notebooks.

    ``start()`` returns once the port is bound; ``stop()`` closes the listener so clients see connection
    errors exactly as they would when a metric pod goes away."""

    def __init__(
        self,
        metric: MetricFn,
        port: int = 0,
        host: str = "127.0.0.1",
        *,
        max_workers: int = 4,
        validation: MetricFn | None = None,
    ):
        self._metric = metric
        self._validation = validation
        self._host = host
        self._requested_port = port
        self._max_workers = max_workers
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self.port = port

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self.port}"

    def start(self) -> MetricServer:
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                runner = web.AppRunner(
                    make_app(self._metric, max_workers=self._max_workers, validation=self._validation)
                )
                loop.run_until_complete(runner.setup())
                site = web.TCPSite(runner, self._host, self._requested_port, reuse_address=True)
                loop.run_until_complete(site.start())
                if self._requested_port == 0:
                    # runner.addresses lists the bound sockets; port 0 asked the kernel to pick one.
                    self.port = int(runner.addresses[0][1])
                self._runner = runner
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, name="metric-server", daemon=True)
        self._thread.start()
        ready.wait(timeout=30)
        if failure:
            raise RuntimeError(
                f"metric server could not listen on {self._host}:{self._requested_port}"
            ) from (failure[0])
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
        self._loop = None
        self._thread = None

    def __enter__(self) -> MetricServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
