"""The trainer's metric client against real HTTP servers: batching, concurrency, retries, the circuit
breaker, timeouts and the error budget."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from grpo_metric import MetricServer, ScoreItem
from grpo_trainer.metric_client import (
    CircuitBreaker,
    ClientSettings,
    ErrorBudget,
    MetricClient,
    MetricServiceUnavailable,
)

from tests.harness.http_server import serve_in_thread


class FlakyServer:
    """A protocol server whose failures are scripted: ``fail_next`` requests answer 503, ``delay`` slows
    every request, and every request's batch size and concurrency are recorded."""

    def __init__(self) -> None:
        self.fail_next = 0
        self.delay = 0.0
        self.batch_sizes: list[int] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()

    async def score(self, request: web.Request) -> web.Response:
        body = await request.json()
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.batch_sizes.append(len(body["items"]))
            fail = self.fail_next > 0
            if fail:
                self.fail_next -= 1
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
            if fail:
                return web.json_response({"error": "overloaded"}, status=503)
            # Reverse the order: the client must match by id, not position.
            results = [{"id": i["id"], "reward": float(len(i["completion"]))} for i in body["items"]][::-1]
            return web.json_response({"results": results})
        finally:
            with self._lock:
                self.in_flight -= 1


@pytest.fixture
def flaky() -> Iterator[tuple[FlakyServer, str]]:
    state = FlakyServer()

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/score", state.score)
    app.router.add_get("/healthz", healthz)
    with serve_in_thread(app) as url:
        yield state, url


def items(n: int) -> list[ScoreItem]:
    return [ScoreItem(f"id-{i}", "p", "x" * i, {}) for i in range(n)]


def client(url: str, **overrides: Any) -> MetricClient:
    settings: dict[str, Any] = {
        "url": url,
        "batch_size": 4,
        "concurrency": 3,
        "timeout_seconds": 2.0,
        "max_retries": 2,
        "backoff_base_seconds": 0.01,
        "backoff_max_seconds": 0.02,
    }
    settings.update(overrides)
    return MetricClient(ClientSettings(**settings))


def test_batches_concurrency_and_id_matching(flaky: tuple[FlakyServer, str]) -> None:
    state, url = flaky
    state.delay = 0.1
    c = client(url)
    try:
        results = c.score(items(10))
    finally:
        c.close()
    assert [r.reward for r in results] == [float(i) for i in range(10)]
    assert sorted(state.batch_sizes) == [2, 4, 4]
    assert 2 <= state.max_in_flight <= 3


def test_retries_with_backoff_then_succeeds(flaky: tuple[FlakyServer, str]) -> None:
    state, url = flaky
    state.fail_next = 2
    c = client(url, batch_size=100)
    try:
        results = c.score(items(3))
    finally:
        c.close()
    assert all(r.kind == "reward" for r in results)
    assert c.stats.retries == 2 and c.stats.requests == 3


def test_persistent_5xx_makes_every_item_an_error(flaky: tuple[FlakyServer, str]) -> None:
    state, url = flaky
    state.fail_next = 100
    c = client(url, batch_size=100, max_retries=1)
    try:
        results = c.score(items(3))
    finally:
        c.close()
    assert [r.kind for r in results] == ["error"] * 3
    assert "HTTP 503" in results[0].reason


def test_timeout_is_an_error(flaky: tuple[FlakyServer, str]) -> None:
    state, url = flaky
    state.delay = 1.0
    c = client(url, timeout_seconds=0.2, max_retries=0)
    try:
        results = c.score(items(2))
    finally:
        c.close()
    assert [r.kind for r in results] == ["error", "error"]
    assert "timed out" in results[0].reason


def test_unreachable_service_opens_the_breaker_and_recovers() -> None:
    metric = MetricServer(lambda example, completion: 1.0).start()
    url = metric.url
    port = metric.port
    metric.stop()
    c = client(
        url, batch_size=1, concurrency=1, max_retries=0, breaker_threshold=2, breaker_cooldown_seconds=0.5
    )
    try:
        results = c.score(items(5))
        assert all(r.kind == "error" for r in results)
        assert c.breaker.state == "open"
        # Three of the five batches never reached the network: the breaker failed them fast.
        assert c.stats.short_circuited_batches == 3
        restarted = MetricServer(lambda example, completion: 1.0, port=port).start()
        try:
            time.sleep(0.6)
            assert [r.kind for r in c.score(items(2))] == ["reward", "reward"]
            assert c.breaker.state == "closed"
        finally:
            restarted.stop()
    finally:
        c.close()


def test_wait_ready_names_the_url_when_it_gives_up() -> None:
    c = client("http://127.0.0.1:9")
    try:
        with pytest.raises(MetricServiceUnavailable, match=r"127\.0\.0\.1:9.*spec\.metric\.port"):
            c.wait_ready(timeout_seconds=0.3, poll_seconds=0.1)
    finally:
        c.close()


def test_circuit_breaker_state_machine() -> None:
    now = [0.0]
    breaker = CircuitBreaker(threshold=2, cooldown_seconds=10, clock=lambda: now[0])
    assert breaker.allow()
    breaker.record_failure()
    assert breaker.state == "closed"
    breaker.record_failure()
    assert breaker.state == "open" and not breaker.allow()
    now[0] = 10.0
    assert breaker.state == "half-open"
    assert breaker.allow() and not breaker.allow()  # one probe at a time
    breaker.record_failure()
    assert breaker.state == "open"
    now[0] = 20.0
    assert breaker.allow()
    breaker.record_success()
    assert breaker.state == "closed"


def test_error_budget_sliding_window() -> None:
    budget = ErrorBudget(0.25, window_steps=4)
    budget.record(8, 8)  # an outage in the first step: one bad step of a four-step window
    assert budget.fraction == 0.25
    budget.check(step=1)
    for _ in range(3):
        budget.record(0, 8)
    budget.record(8, 8)  # the first bad step slid out; one bad step of four again
    budget.check(step=5)
    budget.record(8, 8)
    with pytest.raises(MetricServiceUnavailable, match=r"50\.0% of a 4-step window .*errorBudget=25\.0%"):
        budget.check(step=6)
    for _ in range(4):
        budget.record(0, 8)  # the service came back: old errors slide out of the window
    budget.check(step=10)
    with pytest.raises(ValueError, match="errorBudget"):
        ErrorBudget(1.5)
