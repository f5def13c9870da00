"""A client reward that no advantage can be computed from (1e308 twice: the group's sum overflows) must
not fail the run, and above all must not fail it again on every restart: the gateway replays a step's
groups until a checkpoint covers it. The trainer skips such a group (advantage 0), counts it, and trains
on. The gateway is the contract's test double, which, unlike the real one, passes the reward through."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.trainer.client_toy import client_config, start, static_group
from tests.trainer.gateway_double import GatewayDouble
from tests.trainer.toy import read_jsonl

pytestmark = pytest.mark.trainer

POISON = [1e308, 1e308, 0.0, 0.0]
SEED_REWARDS = [0.9, 0.6, 0.3, 0.2]
SEED_ADVANTAGES = [1.4606, 0.3651, -0.7303, -1.0954]


def wait_step(gateway: GatewayDouble, step: int, process: subprocess.Popen[bytes], log: Path) -> None:
    """Like GatewayDouble.wait_trained, but a trainer that exits instead fails the test at once."""
    deadline = time.monotonic() + 300
    while gateway.trained_step() < step:
        code = process.poll()
        assert code is None, f"the trainer exited {code} before step {step}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"the trainer did not report step {step}"
        time.sleep(0.05)


def skipped_counter(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    match = re.search(r"^grpo_groups_skipped_total\{[^}]*\} (\S+)$", text, re.MULTILINE)
    assert match, "grpo_groups_skipped_total is not exported"
    return float(match.group(1))


def test_a_group_with_an_overflowing_reward_is_skipped_counted_and_not_replayed_into_failure(
    tmp_path: Path, chat_model: Path
) -> None:
    with GatewayDouble() as gateway:
        config, _ = client_config(
            tmp_path, chat_model, gateway.url, steps=2, group_size=4, prompts_per_step=2, every_steps=2
        )
        metrics_port = int(json.loads(config.read_text())["metricsPort"])
        poisoned = gateway.submit(static_group("q1:", POISON))
        gateway.submit(static_group("q2:", SEED_REWARDS))
        first = start(config, tmp_path, "first")
        wait_step(gateway, 1, first, tmp_path / "first.log")
        assert skipped_counter(metrics_port) == 1.0
        # Killed before any checkpoint: the restarted trainer is handed step 1's groups again.
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
        again = start(config, tmp_path, "again")
        gateway.submit(static_group("q3:", [0.1, 0.2, 0.3, 0.4]))
        gateway.submit(static_group("q4:", [0.5, 0.5, 0.1, 0.0]))
        assert again.wait(timeout=300) == 0, (tmp_path / "again.log").read_text()[-3000:]

    step_one = [ids for _, step, ids in gateway.served if step == 1]
    assert len(step_one) == 2 and step_one[0] == step_one[1], "step 1's groups were replayed"
    for name in ("first", "again"):
        log = (tmp_path / f"{name}.log").read_text()
        assert (
            f"step 1: the client's group 0 of the step (batch_id {poisoned}): its reward past float32's range (|r| > 3.4e+38) is "
            in log
        )
        assert "beyond the reward bound [-1e+06, 1e+06]; the group is skipped" in log
        assert "non-finite" not in log and "not finite" not in log
    records = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert [(r["step"], r["skipped_groups"], r["groups"]) for r in records] == [
        (1, 1, 1),
        (1, 1, 1),
        (2, 0, 2),
    ]
    # The step's reward statistics are the healthy group's, not 1e308's.
    assert records[0]["reward_mean"] == pytest.approx(0.5)
    assert all(r["loss"] is not None for r in records)
    samples = [s for s in read_jsonl(tmp_path / "out" / "samples.jsonl") if s["step"] == 1][:8]
    assert [s["advantage"] for s in samples[:4]] == [0.0] * 4
    assert [round(s["advantage"], 4) for s in samples[4:8]] == SEED_ADVANTAGES
    assert json.loads((tmp_path / "ckpt" / "latest.json").read_text())["step"] == 2
    assert gateway.progress[-1]["state"] == "finished"
