"""``python -m grpo_gateway`` as its Deployment runs it: config from $GRPO_GATEWAY_CONFIG, both ports up,
a clean exit on SIGTERM, and a clear refusal to start without its config or its token."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

from tests.harness.gateway import gateway_config

REPO = Path(__file__).resolve().parents[2]


def launch(tmp_path: Path, text: str | None, **env: str) -> subprocess.Popen[str]:
    environ = {**os.environ, "PYTHONPATH": f"{REPO / 'operator'}:{REPO / 'trainer_image'}", **env}
    if text is not None:
        path = tmp_path / "gateway.json"
        path.write_text(text, encoding="utf-8")
        environ["GRPO_GATEWAY_CONFIG"] = str(path)
    else:
        environ.pop("GRPO_GATEWAY_CONFIG", None)
    return subprocess.Popen(
        [sys.executable, "-m", "grpo_gateway"],
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_for_health(proc: subprocess.Popen[str], url: str) -> requests.Response:
    deadline = time.monotonic() + 30
    while True:
        try:
            return requests.get(f"{url}/healthz", timeout=1)
        except requests.ConnectionError:
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "the gateway did not answer /healthz within 30s"
            time.sleep(0.2)


def test_the_gateway_serves_both_ports_and_stops_on_sigterm(tmp_path: Path) -> None:
    config = gateway_config()
    proc = launch(tmp_path, config.dump_json())
    try:
        assert wait_for_health(proc, f"http://127.0.0.1:{config.client_port}").status_code == 200
        answer = requests.post(
            f"http://127.0.0.1:{config.client_port}/v1/fine_tuning/grpo/status",
            json={"job_id": None},
            timeout=5,
        ).json()
        assert answer["job_id"] == "team-a/dspy" and len(answer["pending_batch_ids"]) == 2
        groups = requests.post(
            f"http://127.0.0.1:{config.internal_port}/internal/v1/groups",
            json={"step": 1, "attempt": 1, "wait_seconds": 0},
            timeout=5,
        )
        assert groups.json() == {"step": 1, "groups": []}
    finally:
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=30)[0]
    assert proc.returncode == 0, output
    assert "rollout gateway of job team-a/dspy" in output


def test_the_gateway_refuses_to_start_without_config_or_token(tmp_path: Path) -> None:
    no_config = launch(tmp_path, None)
    assert no_config.wait(30) == 2 and "GRPO_GATEWAY_CONFIG is not set" in no_config.communicate()[0]
    no_token = launch(
        tmp_path, gateway_config(token_env="GRPO_ROLLOUTS_TOKEN").dump_json(), GRPO_ROLLOUTS_TOKEN=""
    )
    output = no_token.communicate(timeout=30)[0]
    assert no_token.returncode != 0 and "spec.rollouts.client.tokenSecretRef" in output
