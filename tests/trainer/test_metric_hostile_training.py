"""A metric service that answers every other batch with something hostile (a number past float range,
nesting past any depth, an endless body, a compressed bomb, a redirect, out-of-bound rewards, no answer
at all): the trainer counts those items as metric errors and keeps training on the rest, with finite
statistics, and finishes the run."""

from __future__ import annotations

import asyncio
import gzip
import json
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from aiohttp import web

from tests.harness.http_server import serve_in_thread
from tests.trainer.toy import fraction_of_target, read_jsonl, start_trainer, trainer_config

pytestmark = pytest.mark.trainer

Answer = Callable[[web.Request, list[str]], Awaitable[web.StreamResponse]]


def _json(text: str) -> web.Response:
    return web.Response(body=text.encode(), content_type="application/json")


async def _big_integer(_: web.Request, ids: list[str]) -> web.StreamResponse:
    return _json(
        json.dumps({"results": [{"id": i, "reward": 0} for i in ids]}).replace(
            ": 0}", ": 1" + "0" * 400 + "}"
        )
    )


async def _deep(_: web.Request, ids: list[str]) -> web.StreamResponse:
    return _json("[" * 100_000 + "]" * 100_000)


async def _endless(request: web.Request, ids: list[str]) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    await response.prepare(request)
    try:
        while True:
            await response.write(b" " * 65536)
    except (ConnectionError, RuntimeError):
        return response


async def _gzip_bomb(_: web.Request, ids: list[str]) -> web.StreamResponse:
    body = gzip.compress(
        json.dumps({"results": [{"id": i, "reward": 1.0} for i in ids]}).encode() + b" " * 8_000_000
    )
    return web.Response(body=body, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})


async def _redirect(_: web.Request, ids: list[str]) -> web.StreamResponse:
    raise web.HTTPTemporaryRedirect("/elsewhere/score")


async def _huge_rewards(_: web.Request, ids: list[str]) -> web.StreamResponse:
    return web.json_response({"results": [{"id": i, "reward": 1e300} for i in ids]})


async def _silent(request: web.Request, ids: list[str]) -> web.StreamResponse:
    while request.transport is not None and not request.transport.is_closing():
        await asyncio.sleep(0.05)
    return web.Response(status=204)


HOSTILE: dict[str, Answer] = {
    "big-integer": _big_integer,
    "deep": _deep,
    "endless": _endless,
    "gzip-bomb": _gzip_bomb,
    "redirect": _redirect,
    "huge-rewards": _huge_rewards,
    "silent": _silent,
}


class HostileMetric:
    """Answers requests alternately well (the toy metric) and with the next hostile answer in turn."""

    def __init__(self) -> None:
        self.requests = 0
        self.served: Counter[str] = Counter()
        self.elsewhere = 0
        self._lock = threading.Lock()

    async def score(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        with self._lock:
            turn = self.requests
            self.requests += 1
        if turn % 2 == 0:
            self.served["good"] += 1
            results = []
            for item in body["items"]:
                if not item["completion"]:
                    results.append({"id": item["id"], "formatFailure": True, "reason": "empty"})
                else:
                    results.append(
                        {"id": item["id"], "reward": fraction_of_target(item["example"], item["completion"])}
                    )
            return web.json_response({"results": results})
        name = list(HOSTILE)[(turn // 2) % len(HOSTILE)]
        self.served[name] += 1
        return await HOSTILE[name](request, [item["id"] for item in body["items"]])

    async def elsewhere_score(self, _: web.Request) -> web.StreamResponse:
        self.elsewhere += 1
        return web.json_response({"results": []})


@pytest.fixture
def hostile_metric() -> Iterator[tuple[HostileMetric, str]]:
    state = HostileMetric()

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/score", state.score)
    app.router.add_post("/elsewhere/score", state.elsewhere_score)
    app.router.add_get("/healthz", healthz)
    with serve_in_thread(app) as url:
        yield state, url


def test_trainer_keeps_training_through_hostile_answers(
    tmp_path: Path, tiny_model: Path, hostile_metric: tuple[HostileMetric, str]
) -> None:
    state, url = hostile_metric
    steps = 8
    metric = {
        "url": url,
        "batchSize": 8,
        "concurrency": 2,
        "timeoutSeconds": 1,
        "maxRetries": 0,
        "errorBudget": 0.9,
        "maxResponseBytes": 1024 * 1024,
        "maxAbsReward": 1000,
    }
    config = trainer_config(tmp_path, tiny_model, url, steps=steps, every_steps=100, extra={"metric": metric})
    process = start_trainer(config, tmp_path / "trainer.log", GRPO_METRIC_BREAKER_COOLDOWN_SECONDS="0.2")
    try:
        assert process.wait(timeout=600) == 0, (tmp_path / "trainer.log").read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()

    # Every hostile answer was served at least once, and the redirect's target was never called.
    assert set(HOSTILE) <= set(state.served), state.served
    assert state.elsewhere == 0
    records = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    # Hostile answers are metric errors, and the good half still trains: finite rewards and loss.
    assert sum(r["metric_error_ratio"] for r in records) / steps >= 0.2
    assert all(r["loss"] is not None for r in records)
    scored = [r for r in records if r["metric_error_ratio"] < 1.0]
    assert scored and all(r["reward_mean"] is not None and 0.0 <= r["reward_std"] <= 1.0 for r in scored)
    # No reward the trainer used is outside the toy metric's range: 1e300 never entered a group.
    samples = read_jsonl(tmp_path / "out" / "samples.jsonl")
    rewards = [s["reward"] for s in samples if s["reward"] is not None]
    assert rewards and all(-1.0 <= r <= 1.0 for r in rewards)
    log = (tmp_path / "trainer.log").read_text()
    assert "Traceback" not in log, log[-3000:]
