"""The gateway's two aiohttp applications: the client port (Arbor + OpenAI routes) and the internal port
(trainer rank 0). One asyncio loop runs both, so the state needs no lock; ``changed`` wakes long polls."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import ClientSession, ClientTimeout, web
from grpo_operator.api.gateway_config import GatewayConfig

from grpo_gateway.forward import Forwarder
from grpo_gateway.state import GatewayState, ProtocolError, iso_now, strip_model_prefix

log = logging.getLogger("grpo_gateway")

# The longest request body read: a group of G <= 256 chat transcripts fits comfortably.
MAX_BODY_BYTES = 64 * 1024 * 1024
# The longest a trainer's groups request is held open, whatever it asks for.
MAX_WAIT_SECONDS = 120.0
ARBOR_ROUTES = ("initialize", "step", "status", "checkpoint", "cancel", "terminate")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def arbor_error(exc: Exception, status: int) -> web.Response:
    """Arbor's error body: {type, message, timestamp}."""
    body = {"type": type(exc).__name__, "message": str(exc), "timestamp": iso_now()}
    return web.json_response(body, status=status)


@dataclass
class Gateway:
    config: GatewayConfig
    state: GatewayState
    token: str | None = None
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    forwarder: Forwarder | None = None

    async def notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()


GATEWAY_KEY: web.AppKey[Gateway] = web.AppKey("gateway", Gateway)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ProtocolError as exc:
        log.info("%s %s refused: %s", request.method, request.path, exc)
        return arbor_error(exc, exc.status)
    except web.HTTPException:
        raise
    except Exception as exc:  # a bug must answer, not drop the connection: the client does not retry
        log.exception("%s %s failed", request.method, request.path)
        return arbor_error(exc, 500)


async def _json(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"the request body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ProtocolError("the request body must be a JSON object")
    return body


def _gateway(request: web.Request) -> Gateway:
    return request.app[GATEWAY_KEY]


# --- client port ----------------------------------------------------------------------------------------------


async def _arbor(request: web.Request) -> web.Response:
    gateway = _gateway(request)
    state = gateway.state
    route = request.match_info["route"]
    body = await _json(request)
    if route == "initialize":
        answer = state.initialize(body)
    elif route == "status":
        state.check_job(body.get("job_id"))
        answer = state.status()
    elif route == "step":
        answer = state.add_group(body)
    elif route == "checkpoint":
        answer = state.request_checkpoint(body)
    elif route in ("terminate", "cancel"):
        answer = state.request_stop("terminate" if route == "terminate" else "cancel", body)
        log.info("the client asked to %s job %s", route, state.job_id)
    else:
        raise web.HTTPNotFound()
    await gateway.notify()
    return web.json_response(answer)


def _authorized(request: web.Request) -> None:
    token = _gateway(request).token
    if token is None:
        return
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise ProtocolError(
            "this job's completion routes require Authorization: Bearer <token> with the value of "
            "spec.rollouts.client.tokenSecretRef (DSPy: dspy.LM(..., api_key=<token>))",
            status=401,
        )


async def _completions(request: web.Request) -> web.StreamResponse:
    _authorized(request)
    gateway = _gateway(request)
    raw = await request.read()
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"the request body is not JSON: {exc}") from None
    model = body.get("model") if isinstance(body, dict) else None
    if not isinstance(model, str) or strip_model_prefix(model) != gateway.config.served_model:
        raise ProtocolError(
            f"model {model!r} is not served here: this job serves {gateway.config.served_model!r} "
            f"(as 'arbor:{gateway.config.served_model}' or the bare name)",
            status=404,
        )
    assert gateway.forwarder is not None
    path = "/v1/chat/completions" if request.path.endswith("chat/completions") else "/v1/completions"

    def client_waiting() -> bool:
        return request.transport is not None and not request.transport.is_closing()

    status, content_type, payload = await gateway.forwarder.forward(path, raw, client_waiting)
    return web.Response(status=status, body=payload, content_type=content_type)


async def _models(request: web.Request) -> web.Response:
    _authorized(request)
    model = _gateway(request).config.served_model
    return web.json_response(
        {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "grpo-operator"}]}
    )


async def _healthz(_: web.Request) -> web.Response:
    return web.json_response({"ok": True})


def client_app(gateway: Gateway) -> web.Application:
    app = web.Application(middlewares=[_errors], client_max_size=MAX_BODY_BYTES)
    app[GATEWAY_KEY] = gateway
    # Both /v1/<route> and /<route>: the provider joins routes to api_base with urljoin, and a base
    # without a trailing slash loses its /v1.
    for prefix in ("/v1", ""):
        app.router.add_post(prefix + "/fine_tuning/grpo/{route}", _arbor)
        app.router.add_post(prefix + "/chat/completions", _completions)
        app.router.add_post(prefix + "/completions", _completions)
        app.router.add_get(prefix + "/models", _models)
    app.router.add_get("/healthz", _healthz)
    return app


# --- internal port --------------------------------------------------------------------------------------------


async def _groups(request: web.Request) -> web.Response:
    gateway = _gateway(request)
    body = await _json(request)
    step, attempt = body.get("step"), body.get("attempt", 0)
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ProtocolError(f"step must be a positive integer (the optimizer step to train), got {step!r}")
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0:
        raise ProtocolError(f"attempt must be a non-negative integer, got {attempt!r}")
    count = body.get("count", gateway.config.prompts_per_step)
    if count != gateway.config.prompts_per_step:
        raise ProtocolError(
            f"count is {count!r} but this gateway hands out spec.grpo.promptsPerStep = "
            f"{gateway.config.prompts_per_step} groups per step: the trainer and the gateway were rendered "
            "from different specs"
        )
    wait = body.get("wait_seconds", 30)
    wait = min(float(wait), MAX_WAIT_SECONDS) if isinstance(wait, int | float) else 30.0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(0.0, wait)
    while True:
        answer = gateway.state.take_groups(step, attempt)
        if answer is not None:
            break
        remaining = deadline - loop.time()
        if remaining <= 0:
            answer = {"step": step, "groups": []}
            break
        async with gateway.changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(gateway.changed.wait(), timeout=remaining)
    if answer["groups"] or answer.get("stop"):
        log.info(
            "step %s for attempt %s: %s groups%s",
            step,
            attempt,
            len(answer["groups"]),
            f", stop: {answer['stop']}" if answer.get("stop") else "",
        )
    return web.json_response(answer)


async def _progress(request: web.Request) -> web.Response:
    gateway = _gateway(request)
    body = await _json(request)
    gateway.state.record_progress(body)
    await gateway.notify()
    return web.json_response({"ok": True, "status": gateway.state.status_text})


def internal_app(gateway: Gateway) -> web.Application:
    app = web.Application(middlewares=[_errors], client_max_size=MAX_BODY_BYTES)
    app[GATEWAY_KEY] = gateway
    app.router.add_post("/internal/v1/groups", _groups)
    app.router.add_post("/internal/v1/progress", _progress)
    app.router.add_get("/healthz", _healthz)
    return app


# --- running --------------------------------------------------------------------------------------------------


def make_gateway(config: GatewayConfig) -> Gateway:
    token = None
    if config.token_env:
        token = os.environ.get(config.token_env) or None
        if token is None:
            raise SystemExit(
                f"{config.token_env} is empty: the Secret key named by spec.rollouts.client.tokenSecretRef "
                "must hold the bearer token"
            )
    return Gateway(config=config, state=GatewayState(config), token=token)


async def start(gateway: Gateway, host: str = "0.0.0.0") -> list[web.AppRunner]:
    """Serve both ports; returns the runners (``cleanup()`` each to stop)."""
    session = ClientSession(timeout=ClientTimeout(total=None, sock_connect=5))
    gateway.forwarder = Forwarder(session, gateway.config.trainer_url, gateway.config.completion_wait_seconds)
    client, internal = client_app(gateway), internal_app(gateway)

    async def close_session(_: web.Application) -> None:
        await session.close()

    client.on_cleanup.append(close_session)
    runners = []
    for app, port in ((client, gateway.config.client_port), (internal, gateway.config.internal_port)):
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        runners.append(runner)
    return runners
