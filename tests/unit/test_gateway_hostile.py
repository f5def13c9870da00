"""The rollout gateway against a hostile client or pod, over real HTTP: rewards beyond the metric path's
bound, bodies too large or malformed, state that would grow without bound, and forged calls to the internal
port. Each must be refused with a status and a message, and change nothing the gateway reports."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from grpo_operator.api.gateway_config import DEFAULT_MAX_ABS_REWARD
from grpo_operator.api.spec import MetricSpec
from grpo_operator.api.trainer_config import MetricClientConfig
from grpo_operator.builders.rollouts import GATEWAY_PROBE_TIMEOUT_SECONDS

from tests.harness.gateway import MODEL, RunningGateway, gateway_config
from tests.unit.test_gateway_process import launch, wait_for_health
from tests.unit.test_gateway_protocol import JOB_ID, assert_arbor_error, group, send_window, status

CLIENT_ROUTES = [f"/v1/fine_tuning/grpo/{r}" for r in ("initialize", "status", "step", "checkpoint")] + [
    "/fine_tuning/grpo/cancel",
    "/v1/fine_tuning/grpo/terminate",
    "/v1/chat/completions",
    "/completions",
]
INTERNAL_ROUTES = ["/internal/v1/groups", "/internal/v1/progress"]


@pytest.fixture
def gw() -> Iterator[RunningGateway]:
    with RunningGateway(gateway_config()) as running:
        yield running


def step(gw: RunningGateway, batch_id: int, batch: Any) -> requests.Response:
    return gw.arbor("step", {"job_id": JOB_ID, "model": MODEL, "batch_id": batch_id, "batch": batch})


# --- A. rewards ----------------------------------------------------------------------------------------------


def test_the_client_path_has_the_metric_paths_reward_bound() -> None:
    assert MetricSpec.model_fields["max_abs_reward"].default == DEFAULT_MAX_ABS_REWARD
    assert MetricClientConfig.model_fields["max_abs_reward"].default == DEFAULT_MAX_ABS_REWARD
    assert gateway_config().max_abs_reward == DEFAULT_MAX_ABS_REWARD


@pytest.mark.parametrize("reward", [1e308, -2e6, 10**400, 1_000_001])
def test_a_reward_beyond_the_bound_is_refused_naming_it_and_the_item(gw: RunningGateway, reward: Any) -> None:
    batch_id = status(gw)["pending_batch_ids"][0]
    batch = group()
    batch[2]["reward"] = reward
    assert_arbor_error(step(gw, batch_id, batch), 400, "batch[2].reward", "|reward| <= 1e+06")
    # The group was not taken: its id is still open and a bounded group fills it.
    assert batch_id in status(gw)["pending_batch_ids"]
    batch[2]["reward"] = -DEFAULT_MAX_ABS_REWARD
    assert step(gw, batch_id, batch).status_code == 200


# --- B. body limits and bounded state ------------------------------------------------------------------------


def test_a_body_over_its_routes_limit_is_413_naming_the_limit(gw: RunningGateway) -> None:
    control = gw.config.max_control_body_bytes
    big = b'{"job_id": null, "pad": "' + b"x" * control + b'"}'
    declared = requests.post(f"{gw.client_url}/v1/fine_tuning/grpo/status", data=big, timeout=30)
    assert_arbor_error(declared, 413, f"limit of {control} bytes")
    # Chunked (no Content-Length): cut off as soon as the stream passes the limit.
    chunked = requests.post(
        f"{gw.client_url}/v1/fine_tuning/grpo/status", data=iter([big[:40000], big[40000:]]), timeout=30
    )
    assert_arbor_error(chunked, 413, f"limit of {control} bytes")
    internal = requests.post(f"{gw.internal_url}/internal/v1/progress", data=big, timeout=30)
    assert_arbor_error(internal, 413, f"limit of {control} bytes")
    transcript = gw.config.max_transcript_bytes
    chat = requests.post(f"{gw.client_url}/v1/chat/completions", data=b"x" * (transcript + 1), timeout=30)
    assert_arbor_error(chat, 413, f"limit of {transcript} bytes")
    # A step carries a group: a body far over the control limit but within G transcripts is read.
    batch_id = status(gw)["pending_batch_ids"][0]
    batch = group()
    batch[0]["messages"][0]["content"] = "y" * (2 * control)
    assert step(gw, batch_id, batch).status_code == 200
    limit = gw.config.max_step_body_bytes
    batch[0]["messages"][0]["content"] = "y" * limit
    assert_arbor_error(step(gw, status(gw)["pending_batch_ids"][0], batch), 413, f"limit of {limit} bytes")


def test_checkpoint_requests_are_capped_by_count_and_bytes() -> None:
    with RunningGateway(gateway_config(max_checkpoint_requests=2)) as gw:
        for name in ("a", "b"):
            assert gw.arbor("checkpoint", {"job_id": JOB_ID, "checkpoint_name": name}).status_code == 200
        refused = gw.arbor("checkpoint", {"job_id": JOB_ID, "checkpoint_name": "c"})
        assert_arbor_error(refused, 429, "2 checkpoint requests")
    with RunningGateway(gateway_config()) as gw:
        metadata = {"note": "m" * 60_000}
        answers = [
            gw.arbor("checkpoint", {"job_id": JOB_ID, "checkpoint_name": f"c{i}", "metadata": metadata})
            for i in range(18)
        ]
        assert [a.status_code for a in answers[:17]] == [200] * 17
        assert_arbor_error(answers[17], 429, "1048576 bytes")


def test_held_completions_are_capped_while_the_trainer_is_away() -> None:
    # No policy server: every completion is held for completion_wait_seconds.
    with RunningGateway(gateway_config(max_held_completions=2, completion_wait_seconds=4.0)) as gw:
        body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        held: list[int] = []

        def send() -> None:
            held.append(
                requests.post(f"{gw.client_url}/v1/chat/completions", json=body, timeout=30).status_code
            )

        threads = [threading.Thread(target=send) for _ in range(2)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        third = requests.post(f"{gw.client_url}/v1/chat/completions", json=body, timeout=30)
        assert_arbor_error(third, 429, "maxHeldCompletions = 2")
        for thread in threads:
            thread.join()
        assert held == [503, 503]


def test_healthz_answers_while_large_bodies_arrive(tmp_path: Path) -> None:
    """The gateway as its pod runs it: 16 MiB bodies to a control route and to the step route (refused
    unread), and bodies just under the step limit (parsed off the event loop), 4 at once each."""
    config = gateway_config()
    proc = launch(tmp_path, config.dump_json())
    client = f"http://127.0.0.1:{config.client_port}"
    try:
        wait_for_health(proc, client)
        item = b'{"a":[]},'

        def body(size: int) -> bytes:
            return b'{"batch_id":1,"batch":[' + item * (size // len(item) - 4) + b'{"a":[]}]}'

        huge, near_limit = body(16 * 1024 * 1024), body(config.max_step_body_bytes - 1024)
        sent = [("status", huge), ("step", huge), ("step", near_limit)]
        codes: list[int] = []
        senders = [
            threading.Thread(
                target=lambda route, data: codes.append(
                    requests.post(f"{client}/v1/fine_tuning/grpo/{route}", data=data, timeout=60).status_code
                ),
                args=pair,
            )
            for pair in sent
            for _ in range(4)
        ]
        for sender in senders:
            sender.start()
        worst = 0.0
        while any(s.is_alive() for s in senders):
            started = time.monotonic()
            assert requests.get(f"{client}/healthz", timeout=5).status_code == 200
            worst = max(worst, time.monotonic() - started)
            time.sleep(0.05)
        for sender in senders:
            sender.join()
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    assert sorted(codes) == [400] * 4 + [413] * 8
    # Within the timeout of the probes the operator gives the gateway's pod, or the kubelet restarts it.
    assert worst < GATEWAY_PROBE_TIMEOUT_SECONDS, f"/healthz took {worst:.2f} s while large bodies arrived"


# --- C. the internal port's secret ----------------------------------------------------------------------------


def test_a_forged_progress_report_without_the_internal_secret_changes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GRPO_GATEWAY_INTERNAL_TOKEN", "inner-s3cret")
    config = gateway_config(internal_token_env="GRPO_GATEWAY_INTERNAL_TOKEN")
    with RunningGateway(config, internal_token="inner-s3cret") as gw:
        send_window(gw)
        forged: dict[str, Any] = {
            "attempt": 99,
            "step": 3,
            "state": "finished",
            "checkpoint": {"name": "forged", "step": 3, "dir": "/x"},
        }
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic Og=="}):
            answer = requests.post(
                f"{gw.internal_url}/internal/v1/progress", json=forged, headers=headers, timeout=10
            )
            assert_arbor_error(answer, 403, "GRPO_GATEWAY_INTERNAL_TOKEN")
            groups = requests.post(
                f"{gw.internal_url}/internal/v1/groups", json={"step": 1, "wait_seconds": 0}, timeout=10
            )
            assert_arbor_error(groups, 403, "internal secret")
        after = status(gw)
        assert (
            after["status"] == "running" and after["checkpoints"] == {} and after["last_checkpoint"] is None
        )
        # The trainer, holding the secret, is served as before.
        assert len(gw.groups(1)["groups"]) == 2
        assert gw.progress(1, checkpoint=1)["ok"] is True
        assert status(gw)["last_checkpoint"] == "step-1"
        assert requests.get(f"{gw.internal_url}/healthz", timeout=10).status_code == 200


# --- D. malformed bodies ---------------------------------------------------------------------------------------

MALFORMED: dict[str, bytes] = {
    "not JSON": b"{",
    "not UTF-8": b'{"job_id": "\xff"}',
    "nested 100000 deep": b"[" * 100_000 + b"]" * 100_000,
    "nested 40 deep": b'{"a":' * 40 + b"1" + b"}" * 40,
    "a 100000-digit number": b'{"step": ' + b"9" * 100_000 + b"}",
    "a list": b"[]",
    "a string": b'"status"',
    "a number": b"1",
    "null": b"null",
    "empty": b"",
}


@pytest.mark.parametrize("body", list(MALFORMED), ids=list(MALFORMED))
def test_every_route_answers_a_malformed_body_with_400(gw: RunningGateway, body: str) -> None:
    raw = MALFORMED[body]
    if len(raw) > gw.config.max_control_body_bytes:
        raw = raw[: gw.config.max_control_body_bytes // 2] + raw[-gw.config.max_control_body_bytes // 2 :]
    urls = [gw.client_url + r for r in CLIENT_ROUTES] + [gw.internal_url + r for r in INTERNAL_ROUTES]
    for url in urls:
        answer = requests.post(url, data=raw, headers={"Content-Type": "application/json"}, timeout=30)
        assert answer.status_code == 400, (url, answer.text)
        message = answer.json()["message"]
        assert "request body" in message, (url, message)
    assert status(gw)["status"] == "running"


WRONG_TYPES: list[tuple[str, dict[str, Any], str]] = [
    ("/v1/fine_tuning/grpo/initialize", {"model": ["x"]}, "is not this job's model"),
    (
        "/v1/fine_tuning/grpo/initialize",
        {"model": MODEL, "trainer_config": {"num_generations": "4"}},
        "num_gen",
    ),
    ("/v1/fine_tuning/grpo/step", {"batch_id": "1", "batch": []}, "batch_id"),
    ("/v1/fine_tuning/grpo/checkpoint", {"checkpoint_name": {"a": 1}}, "checkpoint_name"),
    ("/internal/v1/groups", {"step": "1"}, "step must be"),
    ("/internal/v1/groups", {"step": 1, "attempt": -1}, "attempt must be"),
    ("/internal/v1/groups", {"step": 1, "wait_seconds": -1}, "wait_seconds"),
    ("/internal/v1/groups", {"step": 1, "wait_seconds": "soon"}, "wait_seconds"),
    ("/internal/v1/progress", {"attempt": "1", "step": 1}, "attempt must be"),
    ("/internal/v1/progress", {"attempt": 1, "step": 1, "checkpoint": {"step": [3]}}, "checkpoint.step"),
]


@pytest.mark.parametrize(("route", "body", "words"), WRONG_TYPES, ids=[f"{r}-{w}" for r, _, w in WRONG_TYPES])
def test_a_field_of_the_wrong_type_is_400_naming_it(
    gw: RunningGateway, route: str, body: dict[str, Any], words: str
) -> None:
    base = gw.internal_url if route.startswith("/internal") else gw.client_url
    answer = requests.post(base + route, data=json.dumps(body), timeout=30)
    assert_arbor_error(answer, 400, words)


def test_a_step_with_a_malformed_group_is_400(gw: RunningGateway) -> None:
    batch_id = status(gw)["pending_batch_ids"][0]
    deep: Any = "x"
    for _ in range(40):
        deep = [deep]
    for batch, words in (
        (None, "batch must be a list"),
        ([1, 2, 3, 4], "batch[0] must be an object"),
        ([{"messages": deep, "completion": {}, "reward": 1}] * 4, "nested deeper than 32"),
        ([{"messages": [{"role": "user", "content": 1}], "completion": {}, "reward": 1}] * 4, "messages"),
    ):
        assert_arbor_error(step(gw, batch_id, batch), 400, words)
    assert batch_id in status(gw)["pending_batch_ids"]
