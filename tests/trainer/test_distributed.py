"""Two trainer processes under torchrun on the CPU (gloo): the launch command the operator uses,
rewards gathered across ranks for groups that straddle them, per-rank RNG state in checkpoints, and
dynamic sampling agreeing on its refill rounds across ranks."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from grpo_metric import MetricServer

from tests.trainer.toy import REPO, read_jsonl, torchrun_command, trainer_config, trainer_env

pytestmark = pytest.mark.trainer


@pytest.mark.parametrize(
    ("prompts", "group", "per_device", "dynamic"),
    [
        (3, 4, 2, False),  # 12 completions over 2 ranks: rank 0 holds 1.5 groups, rank 1 the rest
        (4, 4, 4, True),  # whole groups per rank, tied groups refilled
    ],
)
def test_two_processes_under_torchrun(
    tmp_path: Path,
    tiny_model: Path,
    toy_metric: MetricServer,
    prompts: int,
    group: int,
    per_device: int,
    dynamic: bool,
) -> None:
    config = trainer_config(
        tmp_path,
        tiny_model,
        toy_metric.url,
        steps=3,
        every_steps=3,
        group_size=group,
        prompts_per_step=prompts,
        validation_every=3,
        dynamic_sampling=dynamic,
    )
    body = json.loads(config.read_text())
    body["trainer"].update(perDeviceBatchSize=per_device, gpusPerNode=2)
    config.write_text(json.dumps(body))
    command = torchrun_command(2)
    result = subprocess.run(
        command, cwd=REPO, env=trainer_env(config), capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]

    records = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]  # rank 0 alone writes the logs
    assert all(r["rollouts"] == prompts * group and r["groups"] == prompts for r in records)
    assert "validation_mean" in records[-1]
    manifest = json.loads((tmp_path / "ckpt" / "latest.json").read_text())
    step_dir = Path(manifest["path"])
    assert manifest["step"] == 3
    assert (step_dir / "rng_state_0.pth").is_file() and (step_dir / "rng_state_1.pth").is_file()
    if dynamic:
        state = json.loads((step_dir / "grpo_state.json").read_text())
        rounds = sum(r["refill_rounds"] for r in records)
        # Each refill round draws one prompt per local group on every rank (2 groups per rank here).
        assert state["refill"]["cursor"] + 64 * state["refill"]["epoch"] == 2 * rounds


def test_client_groups_are_broadcast_and_sliced_across_two_ranks(tmp_path: Path, chat_model: Path) -> None:
    """Client rollouts under torchrun: rank 0 pulls each step's groups and broadcasts them, every rank trains
    on its rows (a group straddles the ranks here), and the client's terminate ends both ranks with a
    checkpoint both wrote."""
    from tests.trainer.client_toy import client_config, static_group
    from tests.trainer.gateway_double import GatewayDouble

    with GatewayDouble() as gateway:
        config, _ = client_config(
            tmp_path, chat_model, gateway.url, steps=5, group_size=4, prompts_per_step=3, every_steps=5
        )
        body = json.loads(config.read_text())
        body["trainer"].update(perDeviceBatchSize=2, gpusPerNode=2)
        config.write_text(json.dumps(body))
        for step in range(1, 3):
            gateway.submit(static_group(f"q{step}0:", [0.9, 0.6, 0.3, 0.2]))
            gateway.submit(static_group(f"q{step}1:", [0.2, 0.4, 0.6, 0.8]))  # rows 4-7: ranks 0 and 1
            gateway.submit(static_group(f"q{step}2:", [0.5, 0.5, 0.5, 0.5]))
        command = torchrun_command(2)
        log = (tmp_path / "torchrun.log").open("wb")
        env = trainer_env(config, GRPO_GATEWAY_WAIT_SECONDS="1")
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=log)
        gateway.wait_trained(2)
        gateway.stop("terminate")
        assert process.wait(timeout=300) == 0, (tmp_path / "torchrun.log").read_text()[-3000:]

    records = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["rollouts"] == 12 and r["groups"] == 3 and r["tied_groups"] == 1 for r in records)
    # Rank 0's rows: the seed group and the first half of the straddling group, whose advantages use all
    # four rewards (mean 0.5, population sigma 0.2236), not only the two rank 0 holds.
    samples = [s for s in read_jsonl(tmp_path / "out" / "samples.jsonl") if s["step"] == 1]
    assert [round(s["advantage"], 4) for s in samples] == [1.4606, 0.3651, -0.7303, -1.0954, -1.3416, -0.4472]
    manifest = json.loads((tmp_path / "ckpt" / "latest.json").read_text())
    assert manifest["step"] == 2  # written on terminate by both ranks
    step_dir = Path(manifest["path"])
    assert (step_dir / "rng_state_0.pth").is_file() and (step_dir / "rng_state_1.pth").is_file()
    assert (tmp_path / "out" / "model" / "config.json").is_file()
