"""One episode's session with the job's environment service (spec.environment): OpenEnv's WebSocket protocol.

OpenEnv's server gives each WebSocket connection at ``/ws`` an environment instance of its own, so an
episode is one connection: ``reset`` with the dataset row, ``step`` per model turn, ``close``. Whatever the
server sends back is the tenant's code talking: every answer is bounded (``max_message_bytes``, one
``timeout_seconds`` per exchange) and checked (JSON object, the ``observation`` type, a finite numeric reward,
a boolean ``done``); anything else raises :class:`EnvironmentFailure`, which fails the episode on the
environment's side (never a reward of 0 for the model).
"""

from __future__ import annotations

import contextlib
import json
import math
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

# Longest environment error text kept for logs and samples.
MAX_REASON_CHARS = 300
# A reward beyond this magnitude is the environment breaking the contract, as for the metric service.
MAX_ABS_REWARD = 1e6


class EnvironmentFailure(Exception):
    """The environment could not carry the episode (an error it reported, a timeout, a lost connection, an
    answer outside the protocol): the episode is failed, not scored."""


@dataclass(frozen=True)
class Observation:
    """What one reset or step returned."""

    observation: dict[str, Any]
    reward: float | None
    done: bool
    seconds: float = 0.0


def ws_url(base_url: str) -> str:
    """``http://host:port`` -> ``ws://host:port/ws`` (https -> wss)."""
    parts = urllib.parse.urlsplit(base_url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    path = parts.path.rstrip("/") + "/ws"
    return urllib.parse.urlunsplit((scheme, parts.netloc, path, "", ""))


def healthy(base_url: str, timeout: float = 2.0) -> bool:
    """Whether the environment server answers ``GET /health`` with 200."""
    try:
        with urllib.request.urlopen(f"{base_url.rstrip('/')}/health", timeout=timeout) as response:
            return int(response.status) == 200
    except (OSError, urllib.error.URLError, ValueError):
        return False


def short(text: object) -> str:
    """An untrusted text made safe for a log line: one line, printable, bounded."""
    flat = "".join(ch if ch.isprintable() else " " for ch in str(text))
    return flat[:MAX_REASON_CHARS]


def parse_answer(raw: str | bytes) -> Observation:
    """An observation from one server message, or EnvironmentFailure saying what was wrong with it."""
    try:
        message = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise EnvironmentFailure(f"the environment sent a message that is not JSON ({short(exc)})") from None
    if not isinstance(message, dict):
        raise EnvironmentFailure("the environment sent a JSON message that is not an object")
    kind = message.get("type")
    data = message.get("data")
    if kind == "error":
        detail = data.get("message") if isinstance(data, dict) else data
        raise EnvironmentFailure(f"the environment reported an error: {short(detail)}")
    if kind != "observation" or not isinstance(data, dict):
        raise EnvironmentFailure(
            f"the environment sent a message of type {short(kind)!r}, not an observation"
        )
    observation = data.get("observation", {})
    if not isinstance(observation, dict):
        raise EnvironmentFailure("the environment's observation is not a JSON object")
    reward = data.get("reward")
    if reward is not None:
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            raise EnvironmentFailure(f"the environment's reward is not a number: {short(reward)!r}")
        reward = float(reward)
        if not math.isfinite(reward) or abs(reward) > MAX_ABS_REWARD:
            raise EnvironmentFailure(
                f"the environment's reward {reward!r} is not finite or beyond ±{MAX_ABS_REWARD:g}"
            )
    done = data.get("done", False)
    if not isinstance(done, bool):
        raise EnvironmentFailure(f"the environment's done flag is not a boolean: {short(done)!r}")
    return Observation(observation, reward, done)


@dataclass
class EnvironmentSession:
    """One WebSocket session (one environment instance): use as a context manager."""

    base_url: str
    timeout_seconds: float
    max_message_bytes: int
    _ws: Any = field(default=None, repr=False)

    def __enter__(self) -> EnvironmentSession:
        from websockets.exceptions import WebSocketException
        from websockets.sync.client import connect

        try:
            self._ws = connect(
                ws_url(self.base_url),
                open_timeout=self.timeout_seconds,
                close_timeout=2,
                max_size=self.max_message_bytes,
                # Nothing proxies this cluster-internal connection.
                proxy=None,
            )
        except (OSError, TimeoutError, WebSocketException) as exc:
            raise EnvironmentFailure(
                f"could not open a session with the environment at {self.base_url}: {short(exc)}"
            ) from None
        return self

    def __exit__(self, *exc: object) -> None:
        ws, self._ws = self._ws, None
        if ws is None:
            return
        # A session that is already gone needs no close.
        with contextlib.suppress(Exception):
            ws.send(json.dumps({"type": "close"}))
        with contextlib.suppress(Exception):
            ws.close()

    def _exchange(self, message: dict[str, Any], what: str) -> Observation:
        import time

        from websockets.exceptions import ConnectionClosed, PayloadTooBig, WebSocketException

        if self._ws is None:
            raise EnvironmentFailure("the environment session is not open")
        started = time.monotonic()
        try:
            self._ws.send(json.dumps(message))
            raw = self._ws.recv(timeout=self.timeout_seconds)
        except TimeoutError:
            raise EnvironmentFailure(
                f"the environment did not answer a {what} within {self.timeout_seconds:g}s "
                "(spec.environment.timeoutSeconds)"
            ) from None
        except PayloadTooBig:
            raise EnvironmentFailure(
                f"the environment's answer to a {what} is over {self.max_message_bytes} bytes "
                "(spec.environment.maxMessageBytes)"
            ) from None
        except ConnectionClosed as exc:
            # websockets reports an oversized frame by closing with 1009 (message too big).
            code = getattr(getattr(exc, "sent", None), "code", None)
            if code == 1009:
                raise EnvironmentFailure(
                    f"the environment's answer to a {what} is over {self.max_message_bytes} bytes "
                    "(spec.environment.maxMessageBytes)"
                ) from None
            raise EnvironmentFailure(
                f"the environment closed the session during a {what}: {short(exc)}"
            ) from None
        except (OSError, WebSocketException) as exc:
            raise EnvironmentFailure(f"the environment session broke during a {what}: {short(exc)}") from None
        answer = parse_answer(raw)
        return Observation(answer.observation, answer.reward, answer.done, time.monotonic() - started)

    def reset(self, row: dict[str, Any]) -> Observation:
        """Start the episode; the environment's ``reset`` receives the row's fields it declares."""
        return self._exchange({"type": "reset", "data": row}, "reset")

    def step(self, action: dict[str, Any]) -> Observation:
        return self._exchange({"type": "step", "data": action}, "step")
