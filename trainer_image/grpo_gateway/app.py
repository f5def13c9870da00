"""The gateway's two aiohttp applications: the client port (Arbor + OpenAI routes) and the internal port
(trainer rank 0). One asyncio loop runs both, so the state needs no lock; ``changed`` wakes long polls."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import json
import logging
import math
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import ClientSession, ClientTimeout, web
from grpo_operator.api.gateway_config import GATEWAY_INTERNAL_TOKEN_ENV, GatewayConfig

from grpo_gateway.forward import Forwarder
from grpo_gateway.state import GatewayState, ProtocolError, iso_now, short, strip_model_prefix

log = logging.getLogger("grpo_gateway")

# JSON bodies up to this size are parsed on the event loop; larger ones on a worker thread, so /healthz
# (probe timeout 1 s) and the long polls stay answered while a group is parsed.
PARSE_INLINE_BYTES = 64 * 1024
# Large bodies parsed at once: parsing turns JSON into Python objects several times its size, so this bounds
# the gateway's peak memory (with the per-route body limits) whatever many clients send together.
LARGE_PARSES_AT_ONCE = 2
# Deeper nesting is refused: no message, transcript or metadata needs it, and json's recursion fails at ~1000.
MAX_JSON_DEPTH = 32
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
    internal_token: str | None = None
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    forwarder: Forwarder | None = None
    large_parses: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(LARGE_PARSES_AT_ONCE))

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


def _too_large(request: web.Request, limit: int, what: str) -> ProtocolError:
    return ProtocolError(
        f"the body of {request.method} {request.path} is larger than this route's limit of {limit} bytes "
        f"({what}); send a smaller body",
        status=413,
    )


async def read_body(request: web.Request, limit: int, what: str) -> bytes:
    """The body, refused with 413 before it is read when Content-Length exceeds ``limit``, and as soon as a
    chunked body passes it: at most ``limit`` bytes are ever held."""
    if request.content_length is not None and request.content_length > limit:
        raise _too_large(request, limit, what)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise _too_large(request, limit, what)
        chunks.append(chunk)
    return b"".join(chunks)


def _depth(body: object) -> int:
    """Nesting depth of parsed JSON, without recursion."""
    deepest = 0
    stack: list[tuple[object, int]] = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_JSON_DEPTH:
            return depth
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
    return deepest


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Python code per JSON object: json's C parser never releases the GIL by itself, and a worker thread
    # parsing a large body would hold it (and stall the event loop) until done. Running bytecode lets the
    # interpreter hand the GIL back to the loop every few milliseconds.
    return dict(pairs)


def parse_object(raw: bytes, yielding: bool = False) -> dict[str, Any]:
    """A JSON object, or ProtocolError (400) saying what is wrong with the body. ``yielding``: parsed off
    the event loop, letting it run meanwhile."""
    try:
        body = json.loads(raw, object_pairs_hook=_object) if yielding else json.loads(raw)
    except RecursionError:
        raise ProtocolError(f"the request body is nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:  # also JSONDecodeError, UnicodeDecodeError and Python's int-digits limit
        if "integer string conversion" in str(exc):
            raise ProtocolError(
                f"the request body holds a number of more than {sys.get_int_max_str_digits()} digits"
            ) from None
        raise ProtocolError(f"the request body is not JSON: {str(exc)[:200]}") from None
    if not isinstance(body, dict):
        raise ProtocolError(f"the request body must be a JSON object, got {type(body).__name__}")
    if _depth(body) > MAX_JSON_DEPTH:
        raise ProtocolError(f"the request body is nested deeper than {MAX_JSON_DEPTH} levels")
    return body


async def _parse(gateway: Gateway, raw: bytes) -> dict[str, Any]:
    if len(raw) <= PARSE_INLINE_BYTES:
        return parse_object(raw)
    async with gateway.large_parses:
        return await asyncio.to_thread(parse_object, raw, True)


def _gateway(request: web.Request) -> Gateway:
    return request.app[GATEWAY_KEY]


async def _json(request: web.Request) -> dict[str, Any]:
    """A control route's body: no group, no transcript, so the small limit."""
    gateway = _gateway(request)
    limit = gateway.config.max_control_body_bytes
    return await _parse(gateway, await read_body(request, limit, "maxControlBodyBytes: a control body"))


# --- client port ----------------------------------------------------------------------------------------------


async def _arbor(request: web.Request) -> web.Response:
    gateway = _gateway(request)
    state = gateway.state
    route = request.match_info["route"]
    if route == "step":
        limit = gateway.config.max_step_body_bytes
        raw = await read_body(request, limit, f"one group: G = {gateway.config.group_size} transcripts")
        body = await _parse(gateway, raw)
    else:
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


def presented_token(request: web.Request) -> str | None:
    """The token a request carries: in its path (``/t/<token>/v1/...``: Arbor's provider sends no headers of
    its own, so an api_base of http://host:7453/t/<token>/v1/ is how DSPy carries it on every route),
    ``Authorization: Bearer <token>`` (the OpenAI client's api_key) or the password of HTTP basic auth."""
    if "token" in request.match_info:
        return request.match_info["token"]
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        return value.strip()
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode()
        except (ValueError, UnicodeDecodeError):
            return None
        return decoded.partition(":")[2]
    return None


def _token_matches(request: web.Request, token: str) -> bool:
    given = presented_token(request)
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


_UNAUTHENTICATED = frozenset({"/healthz"})


@web.middleware
async def _client_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every client route needs the job's token when it has one; /healthz (the probes) does not. Checked
    before any body is read."""
    token = _gateway(request).token
    if token is not None and request.path not in _UNAUTHENTICATED and not _token_matches(request, token):
        raise ProtocolError(
            "this job's gateway requires the token of spec.rollouts.client.tokenSecretRef on every route: "
            "in the path (DSPy: dspy.LM(..., api_base='http://<host>:7453/t/<token>/v1/'), which Arbor's "
            "fine-tuning routes need), as Authorization: Bearer <token> or as basic auth",
            status=401,
        )
    return await handler(request)


@web.middleware
async def _internal_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The internal port hands out the client's groups and takes the trainer's progress: only holders of
    the job's internal secret (trainer rank 0) may call it."""
    token = _gateway(request).internal_token
    if token is not None and request.path not in _UNAUTHENTICATED and not _token_matches(request, token):
        raise ProtocolError(
            f"the internal port requires Authorization: Bearer <${GATEWAY_INTERNAL_TOKEN_ENV}>, the job's "
            "internal secret that only trainer rank 0 and the gateway hold",
            status=403,
        )
    return await handler(request)


async def _completions(request: web.Request) -> web.StreamResponse:
    gateway = _gateway(request)
    assert gateway.forwarder is not None
    limit = gateway.config.max_transcript_bytes
    raw = await read_body(request, limit, "maxTranscriptBytes: one chat transcript")
    # Counted before the body is parsed: a request over the cap costs no parsing.
    with gateway.forwarder.holding(len(raw)):
        return await _forward_completion(request, gateway, raw)


async def _forward_completion(request: web.Request, gateway: Gateway, raw: bytes) -> web.StreamResponse:
    body = await _parse(gateway, raw)
    model = body.get("model")
    if not isinstance(model, str) or strip_model_prefix(model) != gateway.config.served_model:
        raise ProtocolError(
            f"model {short(model)} is not served here: this job serves {gateway.config.served_model!r} "
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
    model = _gateway(request).config.served_model
    return web.json_response(
        {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "grpo-operator"}]}
    )


async def _healthz(_: web.Request) -> web.Response:
    return web.json_response({"ok": True})


def client_app(gateway: Gateway) -> web.Application:
    # The handlers read bodies themselves, each with its route's limit; this is only a backstop.
    limit = gateway.config.max_step_body_bytes
    app = web.Application(middlewares=[_errors, _client_auth], client_max_size=limit)
    app[GATEWAY_KEY] = gateway
    # Both /v1/<route> and /<route>: the provider joins routes to api_base with urljoin, and a base
    # without a trailing slash loses its /v1.
    # /t/<token>/...: the token in api_base, for clients that can send no header (see presented_token).
    for prefix in ("/v1", "", "/t/{token}/v1", "/t/{token}"):
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
        raise ProtocolError(
            f"step must be a positive integer (the optimizer step to train), got {short(step)}"
        )
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0:
        raise ProtocolError(f"attempt must be a non-negative integer, got {short(attempt)}")
    count = body.get("count", gateway.config.prompts_per_step)
    if count != gateway.config.prompts_per_step:
        raise ProtocolError(
            f"count is {short(count)} but this gateway hands out spec.grpo.promptsPerStep = "
            f"{gateway.config.prompts_per_step} groups per step: the trainer and the gateway were rendered "
            "from different specs"
        )
    wait = body.get("wait_seconds", 30)
    if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait < math.inf:
        raise ProtocolError(f"wait_seconds must be a non-negative number of seconds, got {short(wait)}")
    wait = float(min(wait, MAX_WAIT_SECONDS))
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
    limit = gateway.config.max_control_body_bytes
    app = web.Application(middlewares=[_errors, _internal_auth], client_max_size=limit)
    app[GATEWAY_KEY] = gateway
    app.router.add_post("/internal/v1/groups", _groups)
    app.router.add_post("/internal/v1/progress", _progress)
    app.router.add_get("/healthz", _healthz)
    return app


# --- running --------------------------------------------------------------------------------------------------


def _token_from_env(name: str | None, what: str) -> str | None:
    """The token in env var ``name`` (None when the config names none); an empty one stops the gateway."""
    if not name:
        return None
    token = os.environ.get(name) or None
    if token is None:
        raise SystemExit(f"{name} is empty: {what}")
    return token


def make_gateway(config: GatewayConfig) -> Gateway:
    token = _token_from_env(
        config.token_env,
        "the Secret key named by spec.rollouts.client.tokenSecretRef must hold the bearer token",
    )
    internal_token = _token_from_env(
        config.internal_token_env,
        f"it must hold the job's internal secret, which trainer rank 0 sends as ${GATEWAY_INTERNAL_TOKEN_ENV}",
    )
    return Gateway(config=config, state=GatewayState(config), token=token, internal_token=internal_token)


async def start(gateway: Gateway, host: str = "0.0.0.0") -> list[web.AppRunner]:
    """Serve both ports; returns the runners (``cleanup()`` each to stop)."""
    session = ClientSession(timeout=ClientTimeout(total=None, sock_connect=5))
    gateway.forwarder = Forwarder(
        session,
        gateway.config.trainer_url,
        gateway.config.completion_wait_seconds,
        max_held=gateway.config.max_held_completions,
        max_held_bytes=gateway.config.max_held_completion_bytes,
        max_answer_bytes=gateway.config.max_step_body_bytes,
    )
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
