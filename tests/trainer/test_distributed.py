"""Two trainer processes under torchrun on the CPU (gloo): the launch command the operator uses,
rewards gathered across ranks for groups that straddle them, per-rank RNG state in checkpoints, and
dynamic sampling agreeing on its refill rounds across ranks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from grpo_metric import MetricServer

from tests.trainer.toy import REPO, free_port, read_jsonl, trainer_config, trainer_env

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
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [
        str(torchrun),
        "--nnodes=1",
        "--nproc-per-node=2",
        "--node-rank=0",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        "-m",
        "grpo_trainer",
    ]
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
