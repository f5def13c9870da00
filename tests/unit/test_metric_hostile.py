"""The trainer's metric client against a hostile metric service: real HTTP servers that answer with numbers
past float range, deep nesting, endless or compressed bodies, redirects, out-of-bound rewards and slow
answers. Each must come back as error results for the batch's items: no exception, no hang, bounded memory."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pydantic
import pytest
from aiohttp import web
from grpo_metric import ScoreItem
from grpo_metric.protocol import ScoreResult
from grpo_operator.api.spec import GRPOJobSpec
from grpo_operator.api.trainer_config import TrainerConfig
from grpo_trainer.metric_client import MAX_REASON_CHARS, ClientSettings, MetricClient

from tests.harness.http_server import serve_in_thread

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Hostile:
    """One aiohttp server on a background loop. Each test mounts a handler under a case name and points
    the client at http://host:port/<case>, so the client posts to /<case>/score. ``hits`` counts the
    requests per path, ``written`` the bytes a streaming handler sent before the client hung up."""

    def __init__(self) -> None:
        self.app = web.Application()
        self.app.router.add_post("/{case}/score", self._dispatch)
        self.cases: dict[str, Handler] = {}
        self.hits: dict[str, int] = {}
        self.written = 0
        self.url = ""

    def route(self, case: str, handler: Handler) -> str:
        self.cases[case] = handler
        return f"{self.url}/{case}"

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        handler = self.cases.get(request.match_info["case"])
        if handler is None:
            raise web.HTTPNotFound()
        self.hits[request.path] = self.hits.get(request.path, 0) + 1
        return await handler(request)


def ids_of(body: dict[str, Any]) -> list[str]:
    return [item["id"] for item in body["items"]]


async def good(request: web.Request) -> web.Response:
    body = await request.json()
    return web.json_response({"results": [{"id": i, "reward": 0.5} for i in ids_of(body)]})


def raw_json(text_of_results: Callable[[list[str]], str]) -> Handler:
    """A 200 whose body is exactly the text built from the request's ids (no re-encoding)."""

    async def handler(request: web.Request) -> web.Response:
        ids = ids_of(await request.json())
        return web.Response(body=text_of_results(ids).encode(), content_type="application/json")

    return handler


@pytest.fixture
def hostile() -> Iterator[Hostile]:
    server = Hostile()
    with serve_in_thread(server.app) as url:
        server.url = url
        yield server


def items(n: int = 3) -> list[ScoreItem]:
    return [ScoreItem(f"id-{i}", "p", "c", {}) for i in range(n)]


def score(url: str, n: int = 3, **overrides: Any) -> tuple[list[ScoreResult], float]:
    """Score ``n`` items in one batch; returns the results and the seconds it took."""
    settings: dict[str, Any] = {
        "url": url,
        "batch_size": 100,
        "timeout_seconds": 10.0,
        "max_retries": 0,
        "backoff_base_seconds": 0.01,
    }
    settings.update(overrides)
    client = MetricClient(ClientSettings(**settings))
    started = time.monotonic()
    try:
        results = client.score(items(n))
    finally:
        client.close()
    return results, time.monotonic() - started


def assert_all_errors(results: list[ScoreResult], reason: str) -> None:
    assert [r.kind for r in results] == ["error"] * len(results), results
    assert all(reason in r.reason for r in results), results[0].reason


def test_integer_reward_past_float_range_is_an_error(hostile: Hostile) -> None:
    huge = "1" + "0" * 400  # valid JSON; float() of it raised OverflowError
    url = hostile.route(
        "bigint",
        raw_json(
            lambda ids: (
                '{"results": ['
                + f'{{"id": "{ids[0]}", "reward": {huge}}}, {{"id": "{ids[1]}", "reward": -1e400}}, '
                + f'{{"id": "{ids[2]}", "reward": 1}}]}}'
            )
        ),
    )
    results, _ = score(url)
    assert [r.kind for r in results] == ["error", "error", "reward"]
    assert "not finite" in results[0].reason and "not finite" in results[1].reason
    assert results[2].reward == 1.0


def test_integer_literal_past_the_digit_limit_is_an_error(hostile: Hostile) -> None:
    url = hostile.route(
        "digits", raw_json(lambda ids: f'{{"results": [{{"id": "{ids[0]}", "reward": {"9" * 6000}}}]}}')
    )
    results, _ = score(url, n=1)
    assert results[0].kind == "error" and "not finite" in results[0].reason


def test_nesting_past_any_depth_is_an_error(hostile: Hostile) -> None:
    depth = 200_000  # far past Python's recursion limit: json.loads raised RecursionError
    url = hostile.route("deep", raw_json(lambda ids: "[" * depth + "]" * depth))
    results, _ = score(url)
    assert_all_errors(results, "nests deeper than 32 levels")


def test_nesting_inside_a_result_is_bounded_too(hostile: Hostile) -> None:
    # Deep enough to decode, deep enough that quoting the value would recurse hundreds of levels.
    nested = "[" * 900 + "]" * 900
    url = hostile.route(
        "deep-error",
        raw_json(
            lambda ids: (
                json.dumps({"results": [{"id": i, "error": 0} for i in ids]})[:-2]
                + f', {{"id": "x", "error": {nested}}}]}}'
            )
        ),
    )
    results, _ = score(url)
    assert_all_errors(results, "nests deeper than 32 levels")


def test_endless_body_is_cut_at_the_cap(hostile: Hostile) -> None:
    async def endless(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(b'{"results": [{"id": "id-0", "error": "')
        chunk = b"x" * 65536
        try:
            while True:
                await response.write(chunk)
                hostile.written += len(chunk)
        except (ConnectionError, RuntimeError):
            return response

    url = hostile.route("endless", endless)
    results, seconds = score(url, max_response_bytes=256 * 1024, timeout_seconds=30.0)
    assert_all_errors(results, "exceeds the 262144-byte cap (spec.metric.maxResponseBytes)")
    # It stopped at the cap, not at the timeout, and the server could push little more than the cap
    # plus the socket buffers before the client hung up.
    assert seconds < 10
    time.sleep(0.2)
    assert hostile.written < 64 * 1024 * 1024


def test_declared_oversized_body_is_refused_before_reading(hostile: Hostile) -> None:
    async def big(request: web.Request) -> web.Response:
        ids = ids_of(await request.json())
        padding = " " * 2_000_000
        return web.Response(
            body=json.dumps({"results": [{"id": i, "reward": 1.0} for i in ids]}).encode() + padding.encode(),
            content_type="application/json",
        )

    url = hostile.route("big", big)
    results, _ = score(url, max_response_bytes=1024 * 1024)
    assert_all_errors(results, "is over the 1048576-byte cap")
    # The default cap (4 MiB) accepts the same answer: the cap is what refused it.
    results, _ = score(url)
    assert [r.reward for r in results] == [1.0, 1.0, 1.0]


def test_compressed_body_is_not_inflated(hostile: Hostile) -> None:
    # 64 MiB of zeros in about 64 KiB: inflating it would defeat the size cap.
    bomb = gzip.compress(b"0" * (64 * 1024 * 1024), compresslevel=9)

    async def gzipped(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(
            body=bomb, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"}
        )

    url = hostile.route("gzip", gzipped)
    results, _ = score(url, max_response_bytes=1024 * 1024)
    assert_all_errors(results, "compressed (Content-Encoding: gzip)")


def test_redirect_is_not_followed(hostile: Hostile) -> None:
    target = hostile.route("elsewhere", good)

    async def redirect(request: web.Request) -> web.Response:
        await request.read()
        raise web.HTTPTemporaryRedirect(target + "/score")

    url = hostile.route("redirect", redirect)
    results, _ = score(url, max_retries=2)
    assert_all_errors(results, "HTTP 307 redirect to")
    assert "not followed" in results[0].reason
    # The batch never reached the redirect's target, and a redirect is not retried.
    assert hostile.hits.get("/elsewhere/score", 0) == 0 and hostile.hits["/redirect/score"] == 1


def test_rewards_beyond_the_bound_are_errors(hostile: Hostile) -> None:
    url = hostile.route(
        "bound",
        raw_json(
            lambda ids: json.dumps(
                {
                    "results": [
                        {"id": ids[0], "reward": 1e300},
                        {"id": ids[1], "reward": -2e6},
                        {"id": ids[2], "reward": -1e6},
                    ]
                }
            )
        ),
    )
    results, _ = score(url)
    assert [r.kind for r in results] == ["error", "error", "reward"]
    assert "outside [-1e+06, 1e+06] (spec.metric.maxAbsReward)" in results[0].reason
    assert results[2].reward == -1e6
    # The bound is the spec's: raised, the same answers are rewards.
    results, _ = score(url, max_abs_reward=1e7)
    assert [r.kind for r in results] == ["error", "reward", "reward"]
    assert "outside [-1e+07, 1e+07]" in results[0].reason and results[1].reward == -2e6


def test_body_that_trickles_in_is_bounded_by_the_timeout(hostile: Hostile) -> None:
    async def trickle(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        try:
            await response.write(b'{"results": [')
            while True:  # one byte every 100 ms: never idle long enough for a read timeout alone
                await asyncio.sleep(0.1)
                await response.write(b" ")
        except (ConnectionError, RuntimeError):
            return response

    url = hostile.route("trickle", trickle)
    results, seconds = score(url, timeout_seconds=1.0, max_retries=1)
    assert_all_errors(results, "timed out after 1s")
    # Two attempts of one second each, plus a short backoff.
    assert seconds < 4


def test_service_that_never_answers_is_bounded_by_the_timeout(hostile: Hostile) -> None:
    async def silent(request: web.Request) -> web.Response:
        # Never answers; gives up only once the client has hung up (so the server can shut down).
        while request.transport is not None and not request.transport.is_closing():
            await asyncio.sleep(0.05)
        return web.Response(status=204)

    url = hostile.route("silent", silent)
    results, seconds = score(url, timeout_seconds=0.5)
    assert_all_errors(results, "timed out after 0.5s")
    assert seconds < 3


def test_error_status_with_an_endless_body_reads_only_its_start(hostile: Hostile) -> None:
    async def endless_500(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(status=500)
        await response.prepare(request)
        try:
            while True:
                await response.write(b"E" * 65536)
        except (ConnectionError, RuntimeError):
            return response

    url = hostile.route("endless500", endless_500)
    results, seconds = score(url, timeout_seconds=30.0)
    assert_all_errors(results, "HTTP 500 from /score: EEE")
    assert len(results[0].reason) < 400 and seconds < 10


def test_huge_error_reasons_are_clipped(hostile: Hostile) -> None:
    url = hostile.route(
        "reason",
        raw_json(lambda ids: json.dumps({"results": [{"id": i, "error": "r" * 1_000_000} for i in ids]})),
    )
    results, _ = score(url)
    assert [r.kind for r in results] == ["error"] * 3
    assert all(len(r.reason) <= MAX_REASON_CHARS + 40 for r in results)
    assert results[0].reason.endswith("(999500 more characters)")


def _spec(**metric: Any) -> GRPOJobSpec:
    return GRPOJobSpec.model_validate(
        {
            "model": {"name": "m"},
            "dataset": {"train": "hf://a/b"},
            "grpo": {"groupSize": 8, "promptsPerStep": 4, "steps": 10},
            "metric": {"image": "img", **metric},
        }
    )


def test_limits_come_from_the_spec_through_trainer_json() -> None:
    def rendered(spec: GRPOJobSpec) -> dict[str, Any]:
        config = TrainerConfig.from_spec(
            "ns", "job", None, spec, metric_url="http://job-metric:8080", generation_host="job-gen.ns.svc"
        )
        metric: dict[str, Any] = json.loads(config.dump_json())["metric"]
        return metric

    defaults = rendered(_spec())
    assert (defaults["maxResponseBytes"], defaults["maxAbsReward"]) == (4 * 1024 * 1024, 1e6)
    custom = rendered(_spec(maxResponseBytes=65536, maxAbsReward=10))
    assert (custom["maxResponseBytes"], custom["maxAbsReward"]) == (65536, 10.0)
    for bad in ({"maxResponseBytes": 100}, {"maxAbsReward": 0}, {"maxAbsReward": 1e13}):
        with pytest.raises(pydantic.ValidationError, match=r"maxResponseBytes|maxAbsReward"):
            _spec(**bad)
