"""(b) kill the run after a checkpoint and resume: the step, the optimizer state and the data order
continue exactly where the checkpoint left them; SIGTERM checkpoints and exits 0."""

from __future__ import annotations

import json
import re
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch
from grpo_metric import MetricServer

from tests.trainer.toy import read_jsonl, start_trainer, train_prompts, trainer_config

pytestmark = pytest.mark.trainer

CATALOG = [
    "grpo_step",
    "grpo_total_steps",
    "grpo_reward_mean",
    "grpo_reward_std",
    "grpo_format_failures_total",
    "grpo_metric_errors_total",
    "grpo_zero_std_groups_total",
    "grpo_groups_total",
    "grpo_zero_std_group_ratio",
    "grpo_rollouts_total",
    "grpo_tokens_total",
    "grpo_step_duration_seconds_count",
    "grpo_completion_length_tokens",
    "grpo_clip_ratio",
    "grpo_loss",
    "grpo_last_step_timestamp_seconds",
    "grpo_metric_score_seconds_total",
    "grpo_non_finite_steps_total",
]


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def manifest(workdir: Path) -> dict[str, Any] | None:
    path = workdir / "ckpt" / "latest.json"
    return json.loads(path.read_text()) if path.is_file() else None


def run_to_end(workdir: Path, config: Path, **env: str) -> None:
    process = start_trainer(config, workdir / f"trainer-{time.monotonic_ns()}.log", **env)
    assert process.wait(timeout=600) == 0


def test_kill_after_checkpoint_then_resume_continues_exactly(
    tmp_path: Path, tiny_model: Path, toy_metric: MetricServer
) -> None:
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    for workdir in (straight, resumed):
        workdir.mkdir()
    common: dict[str, Any] = {"steps": 8, "every_steps": 3, "keep_last": 2, "learning_rate": 0.01}
    run_to_end(straight, trainer_config(straight, tiny_model, toy_metric.url, **common))

    config = trainer_config(resumed, tiny_model, toy_metric.url, **common)
    process = start_trainer(config, resumed / "killed.log")
    wait_for(lambda: (manifest(resumed) or {}).get("step") == 3, 300, "the step-3 checkpoint")
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    assert manifest(resumed)["step"] in (3, 6)  # type: ignore[index]
    killed_at = manifest(resumed)["step"]  # type: ignore[index]
    run_to_end(resumed, config)  # no RESUME_FROM: the manifest is found in checkpoints.dir

    # Step numbering continues and every step is logged once (records past the checkpoint were redone).
    steps = [r["step"] for r in read_jsonl(resumed / "out" / "metrics.jsonl")]
    assert steps == list(range(1, 9))
    # Data order: the prompts trained on after the checkpoint are the ones the uninterrupted run saw.
    assert train_prompts(resumed) == train_prompts(straight)
    # Model and optimizer state: restored RNG and optimizer make the resumed run reproduce the straight one.
    final = [manifest(w) for w in (straight, resumed)]
    assert final[0]["step"] == final[1]["step"] == 8  # type: ignore[index]
    a = torch.load(Path(final[0]["path"]) / "optimizer.pt", weights_only=False)  # type: ignore[index]
    b = torch.load(Path(final[1]["path"]) / "optimizer.pt", weights_only=False)  # type: ignore[index]
    assert a["state"][0]["step"] == b["state"][0]["step"] == 8
    for key in a["state"]:
        torch.testing.assert_close(a["state"][key]["exp_avg"], b["state"][key]["exp_avg"])
    # keepLast=2: only the two newest checkpoints remain, and the manifest names the newest.
    kept = sorted(p.name for p in (resumed / "ckpt").glob("step-*"))
    assert kept == ["step-6", "step-8"], (kept, killed_at)


def test_sigterm_saves_a_checkpoint_and_exits_0(
    tmp_path: Path, tiny_model: Path, toy_metric: MetricServer
) -> None:
    config = trainer_config(tmp_path, tiny_model, toy_metric.url, steps=400, every_steps=1000)
    process = start_trainer(config, tmp_path / "trainer.log")
    wait_for(lambda: len(read_jsonl(tmp_path / "out" / "metrics.jsonl")) >= 3, 300, "three steps")
    # While it runs, rank 0 serves the Prometheus catalog with the job's labels.
    port = json.loads(config.read_text())["metricsPort"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        exposition = response.read().decode()
    labels = '{grpojob="toy",namespace="default"}'
    for name in CATALOG:
        assert re.search(rf"^{name}{re.escape(labels)} ", exposition, re.MULTILINE), name
    assert "grpo_step_duration_seconds_bucket{" in exposition
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=120) == 0, (tmp_path / "trainer.log").read_text()[-3000:]
    saved = manifest(tmp_path)
    assert saved is not None
    last_logged = read_jsonl(tmp_path / "out" / "metrics.jsonl")[-1]["step"]
    assert saved["step"] == last_logged >= 3
    assert (Path(saved["path"]) / "optimizer.pt").is_file()
    assert (Path(saved["path"]) / "rng_state.pth").is_file()
    assert not (tmp_path / "out" / "model").exists()  # stopped, not finished

    # Resuming from RESUME_FROM picks up at the saved step.
    config.write_text(config.read_text().replace('"steps": 400', f'"steps": {saved["step"] + 2}'))
    run_to_end(tmp_path, config, RESUME_FROM=saved["path"])
    steps = [r["step"] for r in read_jsonl(tmp_path / "out" / "metrics.jsonl")]
    assert steps == list(range(1, saved["step"] + 3))


def test_resuming_from_the_final_checkpoint_trains_no_extra_step(
    tmp_path: Path, tiny_model: Path, toy_metric: MetricServer
) -> None:
    """A trainer killed after its last checkpoint (e.g. while saving the model) is restarted by the
    operator; the new one must finish the job, not train step S+1."""
    config = trainer_config(tmp_path, tiny_model, toy_metric.url, steps=4, every_steps=2)
    run_to_end(tmp_path, config)
    assert manifest(tmp_path)["step"] == 4  # type: ignore[index]
    model = tmp_path / "out" / "model"
    first = {p.name: p.stat().st_mtime_ns for p in model.iterdir()}

    log = tmp_path / "again.log"
    process = start_trainer(config, log)  # resumes from the manifest, as a restarted gang would
    assert process.wait(timeout=600) == 0, log.read_text()[-3000:]
    assert "already completes the 4 steps" in log.read_text()
    assert [r["step"] for r in read_jsonl(tmp_path / "out" / "metrics.jsonl")] == [1, 2, 3, 4]
    assert manifest(tmp_path)["step"] == 4  # type: ignore[index]
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("step-*")) == ["step-2", "step-4"]
    # The final model is written again from the step-4 weights.
    again = {p.name: p.stat().st_mtime_ns for p in model.iterdir()}
    assert again.keys() == first.keys() and all(again[k] >= first[k] for k in first)
