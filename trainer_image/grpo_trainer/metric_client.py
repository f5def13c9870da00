"""Client for the user's metric service: batched, concurrent, with timeouts, retries with backoff and a
circuit breaker. It never raises for an unreachable service: every item it could not get scored comes back
as an ``error`` result, which the trainer leaves out of the group statistics and counts against the error
budget (see ErrorBudget).

The service runs the tenant's code, so its answers are treated as hostile: redirects are not followed,
bodies are read incrementally up to a cap, JSON nesting and numbers are bounded, rewards must be finite
and within ``max_abs_reward``, and every request has a total timeout. Any answer that breaks one of these
turns into error results for the items it should have scored, never into an exception, a hang or
unbounded memory in the trainer."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
import threading
import time
from collections import deque
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
from grpo_metric.protocol import (
    HEALTH_PATH,
    SCORE_PATH,
    ProtocolError,
    ScoreItem,
    ScoreResult,
    parse_score_response,
)

log = logging.getLogger("grpo_trainer.metric")

T = TypeVar("T")

# Statuses worth retrying: the service is restarting, overloaded or behind a proxy that timed out.
RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})

DEFAULT_MAX_RESPONSE_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_ABS_REWARD = 1e6
# A conforming response nests three levels ({"results": [{...}]}); the slack is for structured "error"
# values. The cap keeps str() of a result and the decoder itself far from Python's recursion limit.
MAX_JSON_DEPTH = 32
# How much of a non-200 body is read and quoted, and how long an item's error reason may be: reasons end
# up in logs and samples.jsonl, so a service cannot fill those either.
ERROR_BODY_BYTES = 300
MAX_REASON_CHARS = 500
_READ_CHUNK_BYTES = 64 * 1024


def weigh(result: ScoreResult, weights: Mapping[str, float]) -> ScoreResult:
    """The reward as spec.metric.rewardWeights defines it: the weighted sum of the result's components. A
    result without one of the weighted components is an error for its item (the metric broke its side of
    the job's contract; scoring it as 0 would teach the policy something the user never asked for)."""
    components = result.components or {}
    missing = sorted(name for name in weights if name not in components)
    if missing:
        return ScoreResult.error(
            result.id,
            f"the metric's answer has no component {', '.join(map(repr, missing))}, which "
            "spec.metric.rewardWeights weighs; it sent "
            + (", ".join(map(repr, sorted(components))) if components else "none"),
        )
    reward = math.fsum(weight * components[name] for name, weight in weights.items())
    return ScoreResult.ok(result.id, reward, components)


class MetricServiceUnavailable(RuntimeError):
    """The metric service did not become healthy in time, or errors exceeded the configured budget."""


@dataclass(frozen=True)
class ClientSettings:
    url: str
    batch_size: int = 32
    concurrency: int = 4
    timeout_seconds: float = 30.0
    max_retries: int = 3
    backoff_base_seconds: float = 0.5
    backoff_max_seconds: float = 8.0
    # Consecutive failed batches (after their retries) that open the breaker, and how long it stays open.
    breaker_threshold: int = 3
    breaker_cooldown_seconds: float = 5.0
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    max_abs_reward: float = DEFAULT_MAX_ABS_REWARD
    # spec.metric.rewardWeights: the reward is the weighted sum of these components (see weigh()).
    reward_weights: Mapping[str, float] | None = None


@dataclass
class ClientStats:
    requests: int = 0
    retries: int = 0
    failed_batches: int = 0
    short_circuited_batches: int = 0
    # The trainer's wait for scores (scoring that ran beside training, ``streamed``, is not counted).
    seconds_in_score: float = 0.0


class CircuitBreaker:
    """Closed -> open after ``threshold`` consecutive failures; open fails fast for ``cooldown`` seconds;
    then half-open lets one batch through, which closes it on success or reopens it on failure. While open,
    the trainer does not spend retries and timeouts on a service that is known to be down."""

    def __init__(self, threshold: int, cooldown_seconds: float, clock: Any = time.monotonic):
        self.threshold = max(1, threshold)
        self.cooldown = cooldown_seconds
        self._clock = clock
        self._failures = 0
        self._opened_at: float | None = None
        self._probe_in_flight = False
        self._lock = threading.Lock()

    @property
    def state(self) -> str:
        with self._lock:
            return self._state_locked()

    def _state_locked(self) -> str:
        if self._opened_at is None:
            return "closed"
        if self._clock() - self._opened_at >= self.cooldown:
            return "half-open"
        return "open"

    def allow(self) -> bool:
        with self._lock:
            state = self._state_locked()
            if state == "closed":
                return True
            if state == "half-open" and not self._probe_in_flight:
                self._probe_in_flight = True
                return True
            return False

    def record_success(self) -> None:
        with self._lock:
            self._failures = 0
            self._opened_at = None
            self._probe_in_flight = False

    def record_failure(self) -> None:
        with self._lock:
            self._failures += 1
            if self._probe_in_flight or self._failures >= self.threshold:
                self._opened_at = self._clock()
            self._probe_in_flight = False


class MetricClient:
    """Thread-safe synchronous facade over an asyncio client running on its own daemon thread, so it can
    be called from TRL's training thread (or anywhere else) without sharing an event loop."""

    def __init__(self, settings: ClientSettings):
        if settings.batch_size < 1 or settings.concurrency < 1:
            raise ValueError("metric batch_size and concurrency must be at least 1")
        if settings.max_response_bytes < 1 or not settings.max_abs_reward > 0:
            raise ValueError("metric max_response_bytes and max_abs_reward must be positive")
        self.settings = settings
        self.base_url = settings.url.rstrip("/")
        self.breaker = CircuitBreaker(settings.breaker_threshold, settings.breaker_cooldown_seconds)
        self.stats = ClientStats()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="metric-client", daemon=True)
        self._thread.start()
        self._session: aiohttp.ClientSession | None = None
        self._semaphore: asyncio.Semaphore | None = None
        self._rng = random.Random()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            # The total timeout bounds every attempt end to end, a body that trickles in included.
            # Compressed bodies are refused (we ask for identity and do not inflate) so that the size cap
            # applies to what is held in memory, not to what crossed the wire.
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.settings.timeout_seconds),
                connector=aiohttp.TCPConnector(limit=self.settings.concurrency * 2),
                auto_decompress=False,
                headers={"Accept-Encoding": "identity"},
            )
            self._semaphore = asyncio.Semaphore(self.settings.concurrency)
        return self._session

    # -- health -----------------------------------------------------------------------------------------

    def healthy(self) -> bool:
        return self._run(self._healthy())

    async def _healthy(self) -> bool:
        session = await self._ensure_session()
        try:
            async with session.get(self.base_url + HEALTH_PATH, allow_redirects=False) as response:
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    def wait_ready(self, timeout_seconds: float, poll_seconds: float = 1.0) -> None:
        """Block until GET /healthz answers 200, or raise MetricServiceUnavailable saying where we looked."""
        deadline = time.monotonic() + timeout_seconds
        while True:
            if self.healthy():
                return
            if time.monotonic() >= deadline:
                raise MetricServiceUnavailable(
                    f"metric service at {self.base_url} did not answer GET {HEALTH_PATH} with 200 within "
                    f"{timeout_seconds:.0f}s; check that the metric pod is running and listens on the port "
                    "given in spec.metric.port"
                )
            time.sleep(poll_seconds)

    # -- scoring ----------------------------------------------------------------------------------------

    def score(
        self, items: Sequence[ScoreItem], path: str = SCORE_PATH, streamed: bool = False
    ) -> list[ScoreResult]:
        """Score ``items`` in batches of ``batch_size``, at most ``concurrency`` batches in flight, by POST to
        ``path`` (validation may use another route). Returns one result per item, in order. ``streamed``:
        scored beside training, its seconds not counted as the trainer's wait for the metric."""
        if not items:
            return []
        started = time.perf_counter()
        try:
            return self._run(self._score_all(list(items), path))
        finally:
            if not streamed:
                self.stats.seconds_in_score += time.perf_counter() - started

    async def _score_all(self, items: list[ScoreItem], path: str) -> list[ScoreResult]:
        await self._ensure_session()
        size = self.settings.batch_size
        batches = [items[i : i + size] for i in range(0, len(items), size)]
        outcomes = await asyncio.gather(*(self._score_batch(batch, path) for batch in batches))
        return [result for outcome in outcomes for result in outcome]

    async def _score_batch(self, batch: list[ScoreItem], path: str) -> list[ScoreResult]:
        assert self._semaphore is not None
        async with self._semaphore:
            if not self.breaker.allow():
                self.stats.short_circuited_batches += 1
                return [
                    ScoreResult.error(item.id, f"circuit open: metric service at {self.base_url} is failing")
                    for item in batch
                ]
            results, failure = await self._post_with_retries(batch, path)
            if failure is None:
                self.breaker.record_success()
                assert results is not None
                return [self._bounded(result) for result in results]
            self.breaker.record_failure()
            self.stats.failed_batches += 1
            log.warning("metric batch of %d items failed: %s", len(batch), failure)
            reason = _clip(failure)
            return [ScoreResult.error(item.id, reason) for item in batch]

    def _bounded(self, result: ScoreResult) -> ScoreResult:
        """Weigh the components (spec.metric.rewardWeights), apply the reward bound and clip reasons. A
        reward of 1e300 is finite, but a group of them overflows the group statistics to inf/NaN and a huge
        one swamps every other group's advantage; a component beyond the bound is refused the same way."""
        limit = self.settings.max_abs_reward
        if result.kind == "reward":
            for name, value in (result.components or {}).items():
                if not abs(value) <= limit:
                    return ScoreResult.error(
                        result.id,
                        f"component {name!r} {value!r} is outside [-{limit:g}, {limit:g}] "
                        "(spec.metric.maxAbsReward)",
                    )
            if self.settings.reward_weights is not None:
                result = weigh(result, self.settings.reward_weights)
        if result.kind == "reward" and result.reward is not None and not abs(result.reward) <= limit:
            return ScoreResult.error(
                result.id,
                f"reward {result.reward!r} is outside [-{limit:g}, {limit:g}] (spec.metric.maxAbsReward)",
            )
        if len(result.reason) > MAX_REASON_CHARS:
            return ScoreResult(result.id, result.kind, result.reward, _clip(result.reason), result.components)
        return result

    async def _post_with_retries(
        self, batch: list[ScoreItem], path: str
    ) -> tuple[list[ScoreResult] | None, str | None]:
        session = await self._ensure_session()
        payload = {"items": [item.to_json() for item in batch]}
        ids = [item.id for item in batch]
        failure = "no attempt made"
        for attempt in range(self.settings.max_retries + 1):
            if attempt:
                self.stats.retries += 1
                delay = min(
                    self.settings.backoff_max_seconds, self.settings.backoff_base_seconds * 2 ** (attempt - 1)
                )
                # Full jitter spreads the retries of W trainer ranks that all failed at the same moment.
                await asyncio.sleep(delay * (0.5 + self._rng.random() / 2))
            self.stats.requests += 1
            try:
                async with session.post(
                    self.base_url + path, json=payload, allow_redirects=False
                ) as response:
                    if response.status == 200:
                        body = decode_json(await read_capped(response, self.settings.max_response_bytes))
                        return parse_score_response(body, ids), None
                    if 300 <= response.status < 400:
                        # Following a redirect would send the batch wherever the tenant's service points.
                        location = response.headers.get("Location", "")[:200]
                        return None, (
                            f"HTTP {response.status} redirect to {location!r} not followed: the metric "
                            f"service must answer POST {path} itself"
                        )
                    text = (await response.content.read(ERROR_BODY_BYTES)).decode("utf-8", "replace")
                    failure = f"HTTP {response.status} from {path}: {text}"
                    if response.status not in RETRYABLE_STATUS:
                        # A 4xx other than 408/429 is a contract violation; retrying cannot fix it.
                        return None, failure
            except ProtocolError as exc:
                return None, f"metric service broke the protocol: {exc}"
            except TimeoutError:
                failure = f"timed out after {self.settings.timeout_seconds:g}s"
            except (aiohttp.ClientError, ValueError) as exc:
                failure = f"{type(exc).__name__}: {exc}"
        return None, failure

    def close(self) -> None:
        async def _close() -> None:
            if self._session is not None:
                await self._session.close()
                self._session = None

        if self._loop.is_running():
            self._run(_close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)


async def read_capped(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The response body, read chunk by chunk; ProtocolError as soon as it exceeds ``limit`` bytes, so an
    endless or huge body costs at most ``limit`` plus one chunk of memory."""
    encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise ProtocolError(
            f"response is compressed (Content-Encoding: {encoding[:40]}); answer uncompressed"
        )
    declared = response.content_length
    if declared is not None and declared > limit:
        raise ProtocolError(
            f"response body of {declared} bytes is over the {limit}-byte cap (spec.metric.maxResponseBytes)"
        )
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(_READ_CHUNK_BYTES):
        size += len(chunk)
        if size > limit:
            raise ProtocolError(
                f"response body exceeds the {limit}-byte cap (spec.metric.maxResponseBytes); stopped reading"
            )
        chunks.append(chunk)
    return b"".join(chunks)


def decode_json(body: bytes) -> Any:
    """Decode a response body, raising ProtocolError for anything the trainer must not hold: invalid JSON,
    nesting deeper than MAX_JSON_DEPTH. Integer literals are decoded as floats so that one past float
    range becomes inf (rejected as non-finite) instead of raising OverflowError on conversion."""
    try:
        value = json.loads(body, parse_int=float)
    except RecursionError:
        raise ProtocolError(f"response JSON nests deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise ProtocolError(f"response is not JSON: {str(exc)[:200]}") from None
    if _too_deep(value, MAX_JSON_DEPTH):
        raise ProtocolError(f"response JSON nests deeper than {MAX_JSON_DEPTH} levels")
    return value


def _too_deep(value: Any, limit: int) -> bool:
    """Whether containers nest more than ``limit`` levels (iterative: no recursion on hostile input)."""
    if not isinstance(value, dict | list):
        return False
    stack: list[tuple[dict[str, Any] | list[Any], int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def _clip(reason: str) -> str:
    if len(reason) <= MAX_REASON_CHARS:
        return reason
    return reason[:MAX_REASON_CHARS] + f"... ({len(reason) - MAX_REASON_CHARS} more characters)"


class ErrorBudget:
    """Fails the run when metric-service errors persist: the rollouts that were errors in the last
    ``window_steps`` steps must stay at or below ``budget`` times a full window's rollouts. Steps not yet
    run count as clean, so an outage early in a run is judged like one later on. Outages shorter than
    the budget allows (a pod restart, a rolling update) cost a few steps' signal but do not stop training."""

    def __init__(self, budget: float, window_steps: int = 20):
        if not 0.0 <= budget <= 1.0:
            raise ValueError(f"metric.errorBudget must be within [0, 1], got {budget}")
        self.budget = budget
        self.window_steps = max(1, window_steps)
        self.window: deque[tuple[int, int]] = deque(maxlen=self.window_steps)

    def record(self, errors: int, total: int) -> None:
        self.window.append((errors, total))

    @property
    def fraction(self) -> float:
        errors = sum(e for e, _ in self.window)
        total = sum(t for _, t in self.window)
        if not total:
            return 0.0
        full_window = total / len(self.window) * self.window_steps
        return errors / full_window

    def check(self, step: int) -> None:
        if self.fraction > self.budget:
            raise MetricServiceUnavailable(
                f"metric service errors at step {step}: {self.fraction:.1%} of a {self.window_steps}-step "
                f"window of rollouts could not be scored, above metric.errorBudget={self.budget:.1%}; "
                "check the metric pod's logs and readiness, or raise spec.metric.errorBudget"
            )
