"""Each trainer process keeps its output on the job's volume (logs/attempt-N/rank-R.log under outputDir)
as well as in its pod's log: the last words of a trainer that failed outlive the pod a gang restart deletes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from grpo_metric import MetricServer
from grpo_trainer.log_capture import OutputTee

from tests.trainer.toy import REPO, read_jsonl, start_trainer, trainer_config, trainer_env

pytestmark = pytest.mark.trainer


def test_a_failed_trainers_last_words_stay_on_the_volume(tmp_path: Path, tiny_model: Path) -> None:
    # No metric service answers: the trainer gives up waiting and exits 3 with its reason.
    config = trainer_config(tmp_path, tiny_model, "http://127.0.0.1:9")
    env = {**trainer_env(config), "GRPO_TRAINER_ATTEMPT": "2", "GRPO_METRIC_READY_TIMEOUT_SECONDS": "2"}
    result = subprocess.run(
        [sys.executable, "-m", "grpo_trainer"], env=env, cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 3, result.stderr[-3000:]
    kept = (tmp_path / "out" / "logs" / "attempt-2" / "rank-0.log").read_text()
    # The same text the pod's log got, the final reason included.
    assert "grpo-trainer: metric-unavailable:" in result.stderr
    assert "grpo-trainer: metric-unavailable:" in kept
    assert kept.strip().splitlines()[-1] == result.stderr.strip().splitlines()[-1]


def test_a_training_run_keeps_its_log_beside_its_metrics(
    tmp_path: Path, tiny_model: Path, toy_metric: MetricServer
) -> None:
    config = trainer_config(tmp_path, tiny_model, toy_metric.url, steps=2, every_steps=2)
    process = start_trainer(config, tmp_path / "trainer.log", GRPO_TRAINER_ATTEMPT="1")
    assert process.wait(timeout=600) == 0, (tmp_path / "trainer.log").read_text()[-3000:]
    assert len(read_jsonl(tmp_path / "out" / "metrics.jsonl")) == 2
    kept = (tmp_path / "out" / "logs" / "attempt-1" / "rank-0.log").read_text()
    assert "learning health" in kept or "step 2" in kept
    # Everything the pod's log got (stdout and stderr; their lines may interleave in another order).
    assert sorted(kept.splitlines()) == sorted((tmp_path / "trainer.log").read_text().splitlines())


def test_the_kept_log_is_bounded_and_keeps_the_newest_lines(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.log"
    tee = OutputTee(path, limit=4096, fds=(2,))
    tee.start()
    try:
        for i in range(400):
            os.write(2, f"line {i:04d} of the trainer's stderr\n".encode())
    finally:
        tee.stop()
    newest, older = path.read_text(), path.with_name("rank-0.log.1").read_text()
    assert newest.endswith("line 0399 of the trainer's stderr\n")
    assert len(newest) <= 4096 and len(older) <= 4096
    assert "line 0000" not in newest + older  # the oldest lines went: the process keeps at most 2 x limit
