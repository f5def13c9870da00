"""The rollout gateway's contract, over real HTTP: Arbor's routes as the client sends them, the internal
routes as trainer rank 0 calls them, completion forwarding through a trainer restart, the bearer token."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.harness.gateway import MODEL, RunningGateway, gateway_config

JOB_ID = "team-a/dspy"


def group(g: int = 4, reward: float = 1.0, tag: str = "q") -> list[dict[str, Any]]:
    return [
        {
            "messages": [{"role": "user", "content": f"{tag}?"}],
            "completion": {"role": "assistant", "content": f"{tag}-{i}"},
            "reward": reward + i,
        }
        for i in range(g)
    ]


@pytest.fixture
def gw() -> Iterator[RunningGateway]:
    with RunningGateway(gateway_config()) as running:
        yield running


def status(gw: RunningGateway) -> dict[str, Any]:
    response = gw.arbor("status", {"job_id": JOB_ID})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def send_window(gw: RunningGateway, tag: str = "q") -> list[int]:
    ids = status(gw)["pending_batch_ids"]
    for batch_id in ids:
        response = gw.arbor(
            "step", {"job_id": JOB_ID, "model": MODEL, "batch_id": batch_id, "batch": group(tag=tag)}
        )
        assert response.status_code == 200, response.text
    return list(ids)


def assert_arbor_error(response: requests.Response, status_code: int, *words: str) -> None:
    assert response.status_code == status_code, response.text
    body = response.json()
    assert set(body) == {"type", "message", "timestamp"}, body
    for word in words:
        assert word in body["message"], body["message"]


# --- initialize and status ----------------------------------------------------------------------------------


def test_initialize_attaches_to_the_job_on_both_paths_and_is_idempotent(gw: RunningGateway) -> None:
    body = {
        "model": f"openai/arbor:{MODEL}",
        "trainer_config": {"num_generations": 4, "learning_rate": 1e-5, "max_steps": 500, "unknown_knob": 1},
        "inference_config": {"model": MODEL, "max_seq_len": None},
        "gpu_config": {"type": "multi", "multi": {"num_inference_gpus": 1, "num_training_gpus": 1}},
    }
    first = gw.arbor("initialize", body).json()
    again = gw.arbor("initialize", body, prefix="").json()
    assert first["job_id"] == again["job_id"] == JOB_ID
    assert first["current_model"] == MODEL  # bare: the provider adds openai/arbor: itself
    assert set(first) == {
        "job_id",
        "status",
        "current_model",
        "checkpoints",
        "last_checkpoint",
        "pending_batch_ids",
    }
    assert first["status"] == "running" and first["checkpoints"] == {} and first["last_checkpoint"] is None


def test_initialize_refuses_another_model_and_another_group_size(gw: RunningGateway) -> None:
    other = gw.arbor("initialize", {"model": "openai/arbor:gpt2", "trainer_config": {"num_generations": 4}})
    assert_arbor_error(other, 400, "spec.model.name", MODEL)
    wrong_g = gw.arbor("initialize", {"model": MODEL, "trainer_config": {"num_generations": 8}})
    assert_arbor_error(wrong_g, 400, "spec.grpo.groupSize", "num_rollouts_per_grpo_step=4")


def test_status_of_another_job_is_404(gw: RunningGateway) -> None:
    assert_arbor_error(gw.arbor("status", {"job_id": "other/job"}), 404, JOB_ID)


def test_exactly_b_fresh_increasing_ids_and_the_next_window_only_when_the_trainer_catches_up(
    gw: RunningGateway,
) -> None:
    first = status(gw)["pending_batch_ids"]
    assert len(first) == 2 and first == sorted(first) and len(set(first)) == 2
    assert status(gw)["pending_batch_ids"] == first  # asking again announces nothing new
    send_window(gw)
    # B groups are waiting and the trainer has not asked for step 1: the client is one step ahead.
    assert status(gw)["pending_batch_ids"] == []
    assert len(gw.groups(1)["groups"]) == 2
    second = status(gw)["pending_batch_ids"]
    assert len(second) == 2 and min(second) > max(first)


def test_ids_are_never_reused_by_a_restarted_gateway() -> None:
    config = gateway_config()
    with RunningGateway(config) as gw:
        before = send_window(gw)
    with RunningGateway(config) as gw:
        after = status(gw)["pending_batch_ids"]
    assert min(after) > max(before)


def test_no_window_beyond_the_s_steps_of_the_run(gw: RunningGateway) -> None:
    for step in (1, 2, 3):
        send_window(gw, tag=f"s{step}")
        assert len(gw.groups(step)["groups"]) == 2
    # S = 3 steps are covered: nothing more to send until the run ends.
    assert status(gw)["pending_batch_ids"] == []
    gw.progress(3, checkpoint=3, state="finished")
    after = status(gw)
    assert after["status"] == "succeeded"
    # A client that wants more steps than spec.grpo.steps is told so instead of polling forever.
    response = gw.arbor(
        "step",
        {"job_id": JOB_ID, "model": MODEL, "batch_id": after["pending_batch_ids"][0], "batch": group()},
    )
    assert_arbor_error(response, 400, "spec.grpo.steps = 3", "num_train_steps")


def test_the_last_window_is_announced_when_the_trainer_asks_for_its_step_before_the_client_polls(
    gw: RunningGateway,
) -> None:
    """The trainer finished step S-1 and asks for step S before DSPy's next status poll: step S has no
    groups yet, so the window for it must still be announced (it once was not, and both sides waited)."""
    for step in (1, 2):
        send_window(gw, tag=f"s{step}")
        assert len(gw.groups(step)["groups"]) == 2
    assert gw.groups(3, wait_seconds=0.2)["groups"] == []
    assert len(status(gw)["pending_batch_ids"]) == 2
    send_window(gw, tag="s3")
    assert len(gw.groups(3)["groups"]) == 2
    assert status(gw)["pending_batch_ids"] == []


# --- step validation -----------------------------------------------------------------------------------------


def test_a_group_of_the_wrong_size_is_refused_naming_the_field(gw: RunningGateway) -> None:
    batch_id = status(gw)["pending_batch_ids"][0]
    response = gw.arbor("step", {"job_id": JOB_ID, "model": MODEL, "batch_id": batch_id, "batch": group(g=3)})
    assert_arbor_error(response, 400, "spec.grpo.groupSize", "3 completions")
    assert batch_id in status(gw)["pending_batch_ids"], "a refused group does not fill its id"


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"reward": math.nan}, ("batch[2].reward", "finite")),
        ({"reward": True}, ("batch[2].reward",)),
        ({"completion": "just text"}, ("batch[2].completion",)),
        ({"messages": []}, ("batch[2].messages",)),
    ],
)
def test_a_bad_item_is_refused_naming_it(
    gw: RunningGateway, change: dict[str, Any], words: tuple[str, ...]
) -> None:
    batch = group()
    batch[2] = {**batch[2], **change}
    batch_id = status(gw)["pending_batch_ids"][0]
    # NaN is not JSON: send the body as Python's json writes it (NaN), as a careless client would.
    response = requests.post(
        f"{gw.client_url}/v1/fine_tuning/grpo/step",
        data=json.dumps({"job_id": JOB_ID, "batch_id": batch_id, "batch": batch}),
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert_arbor_error(response, 400, *words)


def test_unknown_and_filled_batch_ids_are_refused(gw: RunningGateway) -> None:
    ids = status(gw)["pending_batch_ids"]
    unknown = gw.arbor("step", {"job_id": JOB_ID, "batch_id": max(ids) + 1000, "batch": group()})
    assert_arbor_error(unknown, 400, "was never announced", "pending_batch_ids")
    assert gw.arbor("step", {"job_id": JOB_ID, "batch_id": ids[0], "batch": group()}).status_code == 200
    again = gw.arbor("step", {"job_id": JOB_ID, "batch_id": ids[0], "batch": group()})
    assert_arbor_error(again, 400, "was filled already")


# --- the trainer's side: groups, replay, progress --------------------------------------------------------------


def test_a_trainer_asking_for_another_b_is_refused(gw: RunningGateway) -> None:
    response = requests.post(
        f"{gw.internal_url}/internal/v1/groups", json={"step": 1, "count": 3, "attempt": 1}, timeout=10
    )
    assert_arbor_error(response, 400, "spec.grpo.promptsPerStep = 2")


def test_groups_long_poll_until_b_groups_arrive_in_order(gw: RunningGateway) -> None:
    started = time.monotonic()
    assert gw.groups(1, wait_seconds=0.5) == {"step": 1, "groups": []}
    assert time.monotonic() - started >= 0.4
    answer: dict[str, Any] = {}
    waiter = threading.Thread(target=lambda: answer.update(gw.groups(1, wait_seconds=10)))
    waiter.start()
    time.sleep(0.3)
    ids = send_window(gw, tag="first")
    waiter.join(15)
    assert answer["step"] == 1 and [g["batch_id"] for g in answer["groups"]] == ids
    items = answer["groups"][0]["items"]
    assert len(items) == 4 and items[1] == {
        "messages": [{"role": "user", "content": "first?"}],
        "completion": {"role": "assistant", "content": "first-1"},
        "reward": 2.0,
    }


def test_a_restarted_trainer_gets_the_same_groups_until_a_checkpoint_covers_them(gw: RunningGateway) -> None:
    send_window(gw, tag="one")
    step1 = gw.groups(1)
    gw.progress(1)
    send_window(gw, tag="two")
    step2 = gw.groups(2)
    # The trainer dies during step 2 and resumes from scratch (no checkpoint yet): replay.
    assert gw.groups(1, attempt=2) == step1
    gw.progress(1, attempt=2, checkpoint=1)
    assert gw.groups(2, attempt=2) == step2
    # Step 1 is covered by checkpoint step-1 and is gone; a late report of attempt 1 changes nothing.
    gw.progress(0, attempt=1)
    assert gw.groups(1, attempt=2, wait_seconds=0.2)["groups"] == []
    assert status(gw)["last_checkpoint"] == "step-1"
    entry = status(gw)["checkpoints"]["step-1"]
    assert entry["global_step"] == 1 and entry["checkpoint_dir"] == "/workspace/checkpoints/step-1"
    assert entry["requested"] is False


def test_a_checkpoint_request_reaches_the_trainer_and_is_answered_under_its_name(gw: RunningGateway) -> None:
    response = gw.arbor(
        "checkpoint", {"job_id": JOB_ID, "checkpoint_name": "best", "metadata": {"score": 0.9}}
    )
    assert response.status_code == 200 and response.json()["last_checkpoint"] is None
    send_window(gw)
    answer = gw.groups(1)
    assert answer["checkpoint"] == {"name": "best", "metadata": {"score": 0.9}}
    gw.progress(1, checkpoint=1)
    after = status(gw)
    assert after["last_checkpoint"] == "best"
    assert after["checkpoints"]["best"]["requested"] is True
    assert after["checkpoints"]["best"]["metadata"] == {"score": 0.9}


# --- terminate and cancel -----------------------------------------------------------------------------------


def test_terminate_trains_what_was_sent_then_stops_and_stays_answerable(gw: RunningGateway) -> None:
    send_window(gw)
    answer = gw.arbor("terminate", {"job_id": JOB_ID}).json()
    assert answer["status"] == "terminating" and answer["pending_batch_ids"] == []
    assert len(gw.groups(1)["groups"]) == 2, "groups already sent are still trained"
    assert gw.groups(2) == {"step": 2, "groups": [], "stop": "terminate"}
    gw.progress(1, checkpoint=1, state="finished")
    for _ in range(2):  # DSPy may call terminate again; the answer is the final status
        final = gw.arbor("terminate", {"job_id": JOB_ID}).json()
        assert final["status"] == "succeeded" and final["current_model"] == MODEL
        assert final["pending_batch_ids"] == [], "a client that terminated is asked for nothing more"


def test_cancel_stops_the_trainer_at_once(gw: RunningGateway) -> None:
    send_window(gw)
    assert gw.arbor("cancel", {"job_id": JOB_ID}).json()["status"] == "pending_cancel"
    assert gw.groups(1) == {"step": 1, "groups": [], "stop": "cancel"}
    gw.progress(0, state="cancelled")
    assert status(gw)["status"] == "cancelled"
    assert gw.arbor("terminate", {"job_id": JOB_ID}).json()["status"] == "cancelled"


# --- completions ------------------------------------------------------------------------------------------------


def chat(
    gw: RunningGateway, token: str | None = None, model: str = f"arbor:{MODEL}", path: str = "/v1"
) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": "2+2?"}],
        "max_tokens": 8,
        "temperature": 1.0,
    }
    return requests.post(f"{gw.client_url}{path}/chat/completions", json=body, headers=headers, timeout=60)


def test_completions_are_forwarded_unchanged_to_the_policy_server(gw: RunningGateway) -> None:
    policy = gw.start_policy(lambda body: "4")
    response = chat(gw, path="")
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "4"
    assert policy.requests[-1] == {
        "model": f"arbor:{MODEL}",
        "messages": [{"role": "user", "content": "2+2?"}],
        "max_tokens": 8,
        "temperature": 1.0,
    }
    text = requests.post(
        f"{gw.client_url}/v1/completions", json={"model": MODEL, "prompt": "2+2="}, timeout=30
    )
    assert text.status_code == 200 and text.json()["choices"][0]["text"] == "4"
    assert_arbor_error(chat(gw, model="arbor:gpt2"), 404, MODEL)


def test_a_completion_is_held_while_the_trainer_restarts() -> None:
    with RunningGateway(gateway_config(completion_wait_seconds=20.0)) as gw:
        result: dict[str, Any] = {}
        caller = threading.Thread(target=lambda: result.update(response=chat(gw)))
        caller.start()
        time.sleep(2.0)  # the trainer's policy server is not there yet
        assert caller.is_alive(), "the request must be held, not failed"
        gw.start_policy(lambda body: "back")
        caller.join(20)
        response = result["response"]
        assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"] == "back"


def test_a_held_completion_whose_client_gave_up_is_not_sampled() -> None:
    with RunningGateway(gateway_config(completion_wait_seconds=30.0)) as gw:
        with pytest.raises(requests.Timeout):
            requests.post(
                f"{gw.client_url}/v1/chat/completions",
                json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
                timeout=1.0,
            )
        time.sleep(2.5)  # the gateway notices at its next retry
        policy = gw.start_policy(lambda body: "late")
        time.sleep(2.0)
        assert policy.requests == [], "a request nobody waits for must not reach the trainer"


def test_a_completion_the_trainer_never_takes_is_503_with_arbors_body() -> None:
    with RunningGateway(gateway_config(completion_wait_seconds=2.0)) as gw:
        started = time.monotonic()
        response = chat(gw)
        assert 1.5 <= time.monotonic() - started < 10
        assert_arbor_error(response, 503, "did not answer within 2s")


def test_every_client_route_requires_the_jobs_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRPO_ROLLOUTS_TOKEN", "s3cret")
    with RunningGateway(gateway_config(token_env="GRPO_ROLLOUTS_TOKEN")) as gw:
        gw.start_policy(lambda body: "ok")
        assert_arbor_error(chat(gw), 401, "Authorization: Bearer")
        assert_arbor_error(chat(gw, token="wrong"), 401, "tokenSecretRef")
        assert chat(gw, token="s3cret").status_code == 200
        models = requests.get(
            f"{gw.client_url}/v1/models", headers={"Authorization": "Bearer s3cret"}, timeout=10
        )
        assert models.json()["data"][0]["id"] == MODEL
        assert requests.get(f"{gw.client_url}/v1/models", timeout=10).status_code == 401
        # Arbor's provider sends no headers of its own: the token travels in api_base's path (or basic auth).
        for route in ("initialize", "status", "step", "checkpoint", "cancel", "terminate"):
            for prefix in ("/v1", ""):
                refused = gw.arbor(route, {"job_id": JOB_ID}, prefix=prefix)
                assert_arbor_error(refused, 401, "tokenSecretRef", "/t/<token>/v1/")
                assert_arbor_error(gw.arbor(route, {"job_id": JOB_ID}, token="wrong"), 401)
        assert gw.arbor("status", {"job_id": JOB_ID}, token="s3cret").status_code == 200
        assert gw.arbor("status", {"job_id": JOB_ID}, prefix="/t/s3cret/v1").status_code == 200
        assert_arbor_error(gw.arbor("status", {"job_id": JOB_ID}, prefix="/t/wrong/v1"), 401)
        bearer = requests.post(
            f"{gw.client_url}/v1/fine_tuning/grpo/status",
            json={"job_id": JOB_ID},
            headers={"Authorization": "Bearer s3cret"},
            timeout=10,
        )
        assert bearer.status_code == 200
        for path in ("/v1/chat/completions", "/completions"):
            refused = requests.post(f"{gw.client_url}{path}", data=b"x" * 10_000, timeout=10)
            assert_arbor_error(refused, 401, "tokenSecretRef")
        # The probes need no token, and the refusals above changed nothing.
        assert requests.get(f"{gw.client_url}/healthz", timeout=10).status_code == 200
        assert gw.arbor("status", {"job_id": JOB_ID}, token="s3cret").json()["status"] == "running"
