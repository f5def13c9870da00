"""Client-rollout jobs (trainer.json ``rollouts``): the trainer trains on the scored groups a client sends
through the rollout gateway, serves the current policy to the client, and ends, resumes and cancels the
way the client asks. The gateway here is the contract's test double (gateway_double.py); the client is
this test, sampling from the trainer's policy server and scoring with the toy task."""

from __future__ import annotations

import json
import signal
import urllib.request
from pathlib import Path

import pytest

from tests.trainer.client_toy import (
    PROMPTS,
    chat,
    client_config,
    post,
    sampled_group,
    start,
    static_group,
    wait_policy,
)
from tests.trainer.gateway_double import GatewayDouble
from tests.trainer.toy import read_jsonl

pytestmark = pytest.mark.trainer


def test_training_on_client_groups_learns_and_the_policy_server_follows(
    tmp_path: Path, chat_model: Path
) -> None:
    steps, group_size, prompts_per_step = 20, 8, 4
    with GatewayDouble() as gateway:
        config, port = client_config(tmp_path, chat_model, gateway.url, steps=steps, every_steps=10)
        log = tmp_path / "trainer.log"
        process = start(config, tmp_path)
        wait_policy(port, process, log)

        # OpenAI shapes on both routes and /v1/models.
        first = chat(port, "q1:", max_tokens=6, temperature=0)
        assert first["object"] == "chat.completion" and first["model"] == "arbor:tiny"
        assert first["choices"][0]["message"]["role"] == "assistant"
        assert first["usage"]["prompt_tokens"] > 0 and first["usage"]["completion_tokens"] <= 6
        text = post(
            port, "/v1/completions", {"model": "tiny", "prompt": ["ab", "cd"], "n": 2, "max_tokens": 3}
        )
        assert text["object"] == "text_completion" and len(text["choices"]) == 4
        assert all(isinstance(c["text"], str) for c in text["choices"])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as response:
            assert json.loads(response.read())["data"][0]["id"] == "tiny"

        for step in range(1, steps + 1):
            for b in range(prompts_per_step):
                gateway.submit(sampled_group(port, PROMPTS[(step * prompts_per_step + b) % 10], group_size))
            gateway.wait_trained(step)
            if step == steps - 1:
                # Before the last step: after it the trainer saves the final model and exits, closing the
                # policy server.
                greedy_after = chat(port, "q1:", max_tokens=6, temperature=0)
        assert process.wait(timeout=300) == 0, log.read_text()[-3000:]

    records = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    assert all(r["rollouts"] == 32 and r["groups"] == 4 for r in records)
    # The client sent back what the policy server sampled: every completion trained on its sampled tokens.
    assert all(
        r["client_completions_matched"] == 32 and r["client_completions_unmatched"] == 0 for r in records
    )
    rewards = [r["reward_mean"] for r in records]
    assert sum(rewards[:3]) / 3 < 0.3, rewards
    assert sum(rewards[-3:]) / 3 >= sum(rewards[:3]) / 3 + 0.3, rewards
    # The policy the client samples from is the one being trained.
    assert greedy_after["choices"][0]["message"]["content"] != first["choices"][0]["message"]["content"]
    # The gateway heard every step, the checkpoints and the end.
    assert gateway.progress[-1]["state"] == "finished" and gateway.progress[-1]["step"] == steps
    assert gateway.progress[-1]["checkpoint"]["name"] == f"step-{steps}"
    assert {p["checkpoint"]["step"] for p in gateway.progress if p["checkpoint"]} == {10, 20}
    assert (tmp_path / "out" / "model" / "config.json").is_file()
    samples = [s for s in read_jsonl(tmp_path / "out" / "samples.jsonl") if s["step"] == steps]
    assert samples and all(s["prompt"].startswith("q") for s in samples)


def test_advantages_are_the_projects_tied_groups_zero_and_format_failures_counted(
    tmp_path: Path, chat_model: Path
) -> None:
    with GatewayDouble() as gateway:
        config, _ = client_config(
            tmp_path,
            chat_model,
            gateway.url,
            steps=1,
            group_size=4,
            prompts_per_step=2,
            format_failure_score=-1.0,
        )
        gateway.submit(static_group("q1:", [0.9, 0.6, 0.3, 0.2]))  # the seed's worked example
        gateway.submit(static_group("q2:", [-1.0, -1.0, -1.0, -1.0]))  # tied: four format failures
        process = start(config, tmp_path)
        assert process.wait(timeout=300) == 0, (tmp_path / "trainer.log").read_text()[-3000:]
    samples = read_jsonl(tmp_path / "out" / "samples.jsonl")
    assert [round(s["advantage"], 4) for s in samples[:4]] == [1.4606, 0.3651, -0.7303, -1.0954]
    assert [s["advantage"] for s in samples[4:8]] == [0.0, 0.0, 0.0, 0.0]
    assert [s["formatFailure"] for s in samples[:8]] == [False] * 4 + [True] * 4
    (record,) = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert record["tied_groups"] == 1 and record["groups"] == 2
    assert record["format_failure_ratio"] == 0.5
    # Text the policy server never sampled is trained on its own tokens, and counted as such.
    assert record["client_completions_matched"] == 0 and record["client_completions_unmatched"] == 8


def test_a_group_of_the_wrong_size_never_reaches_training(tmp_path: Path, chat_model: Path) -> None:
    with GatewayDouble() as gateway:
        config, _ = client_config(
            tmp_path, chat_model, gateway.url, steps=2, group_size=4, prompts_per_step=2
        )
        gateway.submit(static_group("q1:", [0.9, 0.6, 0.3, 0.2]))
        gateway.submit(static_group("q2:", [0.1, 0.2, 0.3]))  # G - 1 items
        process = start(config, tmp_path)
        assert process.wait(timeout=300) == 1
    log = (tmp_path / "trainer.log").read_text()
    assert "has 3 items, but spec.grpo.groupSize is 4" in log
    assert read_jsonl(tmp_path / "out" / "metrics.jsonl") == []
    assert not (tmp_path / "ckpt" / "latest.json").exists()


def test_sigkill_then_resume_replays_the_retained_groups(tmp_path: Path, chat_model: Path) -> None:
    steps, prompts_per_step = 6, 2
    with GatewayDouble() as gateway:
        config, _ = client_config(
            tmp_path,
            chat_model,
            gateway.url,
            steps=steps,
            group_size=4,
            prompts_per_step=prompts_per_step,
            every_steps=2,
        )
        for step in range(1, 4):
            for b in range(prompts_per_step):
                gateway.submit(static_group(f"q{step}{b}:", [0.1 * step, 0.2, 0.3 + b, 0.4]))
        process = start(config, tmp_path, "killed")
        gateway.wait_trained(3)  # step 3 trained, newest checkpoint step 2; step 4 has no groups yet
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
        assert json.loads((tmp_path / "ckpt" / "latest.json").read_text())["step"] == 2
        first_attempt = {step: ids for _, step, ids in gateway.served}

        for step in range(4, steps + 1):
            for b in range(prompts_per_step):
                gateway.submit(static_group(f"q{step}{b}:", [0.1 * step, 0.2, 0.3 + b, 0.4]))
        process = start(config, tmp_path, "resumed")
        assert process.wait(timeout=300) == 0, (tmp_path / "resumed.log").read_text()[-3000:]

    # The resumed trainer asked for step 3 again and got the same groups; nothing was trained twice in the log.
    replays = [(step, ids) for _, step, ids in gateway.served if step == 3]
    assert len(replays) == 2 and replays[0][1] == replays[1][1] == first_attempt[3]
    assert [r["step"] for r in read_jsonl(tmp_path / "out" / "metrics.jsonl")] == list(range(1, steps + 1))
    assert json.loads((tmp_path / "ckpt" / "latest.json").read_text())["step"] == steps
    resumed_reports = [p for p in gateway.progress if p["step"] == 2 and p["checkpoint"]]
    assert resumed_reports, "the resumed trainer tells the gateway where it resumed"


@pytest.mark.parametrize(("kind", "code"), [("terminate", 0), ("cancel", 7)])
def test_terminate_and_cancel_end_the_run_as_the_client_asks(
    tmp_path: Path, chat_model: Path, kind: str, code: int
) -> None:
    with GatewayDouble() as gateway:
        config, _ = client_config(
            tmp_path, chat_model, gateway.url, steps=10, group_size=4, prompts_per_step=2
        )
        for step in range(1, 3):
            for b in range(2):
                gateway.submit(static_group(f"q{step}{b}:", [0.1, 0.2, 0.3 + b, 0.4]))
        process = start(config, tmp_path)
        gateway.wait_trained(2)
        gateway.stop(kind)
        assert process.wait(timeout=300) == code, (tmp_path / "trainer.log").read_text()[-3000:]

    assert [r["step"] for r in read_jsonl(tmp_path / "out" / "metrics.jsonl")] == [1, 2]
    manifest = tmp_path / "ckpt" / "latest.json"
    if kind == "terminate":
        assert json.loads(manifest.read_text())["step"] == 2  # the final checkpoint, written on terminate
        assert (tmp_path / "out" / "model" / "config.json").is_file()
        assert gateway.progress[-1]["state"] == "finished"
        assert gateway.progress[-1]["checkpoint"]["name"] == "step-2"
    else:
        assert not manifest.exists() and not (tmp_path / "out" / "model").exists()
        assert gateway.progress[-1]["state"] == "cancelled"
        assert (
            "grpo-trainer: cancelled: the client cancelled the run after step 2"
            in (tmp_path / "trainer.log").read_text()
        )


def test_a_requested_checkpoint_and_sigterm_while_waiting_for_the_client(
    tmp_path: Path, chat_model: Path
) -> None:
    with GatewayDouble() as gateway:
        config, _ = client_config(
            tmp_path, chat_model, gateway.url, steps=10, group_size=4, prompts_per_step=2, every_steps=5
        )
        gateway.request_checkpoint("after-first")  # the client's checkpoint route, picked up with step 1
        for step in range(1, 3):
            for b in range(2):
                gateway.submit(static_group(f"q{step}{b}:", [0.1, 0.2, 0.3 + b, 0.4]))
        process = start(config, tmp_path)
        gateway.wait_trained(2)
        # Now blocked on step 3's groups: SIGTERM must not wait for the client.
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == 0, (tmp_path / "trainer.log").read_text()[-3000:]

    published = sorted({p["checkpoint"]["step"] for p in gateway.progress if p["checkpoint"]})
    assert published == [1, 2]  # step 1 on request (everySteps is 5), step 2 on SIGTERM
    assert json.loads((tmp_path / "ckpt" / "latest.json").read_text())["step"] == 2
    assert not (tmp_path / "out" / "model").exists()  # stopped to be resumed, not finished
