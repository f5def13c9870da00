"""A client-rollout trainer for tests: trainer.json with ``rollouts`` pointing at a gateway, and what a
client does (sample from the trainer's policy server, score with the toy task, build groups)."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.harness.ports import free_port
from tests.trainer.toy import fraction_of_target, start_trainer

# A minimal chat template in the tiny model's character vocabulary: turns on their own lines, then "=".
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}={% endif %}"
)
PROMPTS = [f"q{i}:" for i in range(10)]


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
