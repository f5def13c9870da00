"""Client-rollout jobs (trainer.json ``rollouts``): the trainer trains on the scored groups a client sends
through the rollout gateway, serves the current policy to the client, and ends, resumes and cancels the
way the client asks. The gateway here is the contract's test double (gateway_double.py); the client is
this test, sampling from the trainer's policy server and scoring with the toy task."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.trainer.gateway_double import GatewayDouble
from tests.trainer.toy import fraction_of_target, free_port, read_jsonl, start_trainer

pytestmark = pytest.mark.trainer

# A minimal chat template in the tiny model's character vocabulary: turns on their own lines, then "=".
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}={% endif %}"
)
PROMPTS = [f"q{i}:" for i in range(10)]


@pytest.fixture(scope="session")
def chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from grpo_trainer.tiny import build
    from transformers import AutoTokenizer

    path = build(tmp_path_factory.mktemp("tiny-chat-model"))
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    return path


def client_config(
    workdir: Path,
    model: Path,
    gateway_url: str,
    *,
    steps: int,
    group_size: int = 8,
    prompts_per_step: int = 4,
    every_steps: int = 5,
    learning_rate: float = 0.02,
    format_failure_score: float = -1.0,
) -> tuple[Path, int]:
    policy_port = free_port()
    config: dict[str, Any] = {
        "apiVersion": "grpo.dev/v1alpha1",
        "kind": "TrainerConfig",
        "job": {"namespace": "default", "name": "dspy"},
        "model": {"name": str(model), "dtype": "float32"},
        "grpo": {
            "groupSize": group_size,
            "promptsPerStep": prompts_per_step,
            "steps": steps,
            "learningRate": learning_rate,
            "maxCompletionLength": 8,
            "maxPromptLength": 16,
            "formatFailureScore": format_failure_score,
        },
        "trainer": {"nodes": 1, "gpusPerNode": 1, "perDeviceBatchSize": group_size},
        "generation": {"backend": "transformers"},
        "rollouts": {"servedModel": "tiny", "gatewayUrl": gateway_url, "policyPort": policy_port},
        "checkpoints": {"dir": str(workdir / "ckpt"), "everySteps": every_steps, "keepLast": 2},
        "outputDir": str(workdir / "out"),
        "metricsPort": free_port(),
        "statusPatchIntervalSeconds": 1.0,
    }
    path = workdir / "trainer.json"
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    return path, policy_port


def start(config: Path, workdir: Path, name: str = "trainer") -> subprocess.Popen[bytes]:
    return start_trainer(config, workdir / f"{name}.log", GRPO_GATEWAY_WAIT_SECONDS="2")


def post(port: int, path: str, body: dict[str, Any], timeout: float = 120) -> Any:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def wait_policy(port: int, process: subprocess.Popen[bytes], log: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()[-3000:]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise AssertionError("the policy server did not come up")


def chat(port: int, prompt: str, **sampling: Any) -> dict[str, Any]:
    body = {"model": "arbor:tiny", "messages": [{"role": "user", "content": prompt}], **sampling}
    answer: dict[str, Any] = post(port, "/v1/chat/completions", body)
    return answer


def rollout(prompt: str, completion: str, reward: float) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": prompt}],
        "completion": {"role": "assistant", "content": completion},
        "reward": reward,
    }


def sampled_group(port: int, prompt: str, group_size: int) -> list[dict[str, Any]]:
    """What DSPy does for one example: G rollouts from the current policy, scored client-side."""
    answer = chat(port, prompt, n=group_size, max_tokens=8, temperature=1.0)
    texts = [c["message"]["content"] for c in answer["choices"]]
    return [rollout(prompt, t, fraction_of_target({}, t) if t else -1.0) for t in texts]


def static_group(prompt: str, rewards: list[float]) -> list[dict[str, Any]]:
    return [rollout(prompt, "a" * (i + 1), r) for i, r in enumerate(rewards)]


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
        greedy_after = chat(port, "q1:", max_tokens=6, temperature=0)
        assert process.wait(timeout=300) == 0, log.read_text()[-3000:]

    records = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    assert all(r["rollouts"] == 32 and r["groups"] == 4 for r in records)
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
