"""(c) take the metric service down mid-run: the errors are counted, those answers get advantage 0, and
the run continues when the service returns; errors that outlast metric.errorBudget fail the run (exit 3)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from grpo_metric import MetricServer

from tests.trainer.toy import fraction_of_target, read_jsonl, start_trainer, trainer_config

pytestmark = pytest.mark.trainer


def wait_steps(out: Path, count: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while len(read_jsonl(out / "metrics.jsonl")) < count:
        assert time.monotonic() < deadline, f"fewer than {count} steps after {timeout}s"
        time.sleep(0.05)


def test_metric_outage_is_counted_and_training_continues(tmp_path: Path, tiny_model: Path) -> None:
    metric = MetricServer(fraction_of_target).start()
    port = metric.port
    config = trainer_config(tmp_path, tiny_model, metric.url, steps=30, every_steps=100, error_budget=0.6)
    process = start_trainer(config, tmp_path / "trainer.log", GRPO_METRIC_BREAKER_COOLDOWN_SECONDS="0.5")
    out = tmp_path / "out"
    try:
        wait_steps(out, 2)
        metric.stop()
        # At least two steps run entirely without the metric service. Counted from the records, not from
        # the step number: rollouts are scored ahead of the step that trains on them, so the first step
        # recorded after the stop may still hold scores from before it.
        deadline = time.monotonic() + 300
        while sum(r["metric_error_ratio"] == 1.0 for r in read_jsonl(out / "metrics.jsonl")) < 2:
            assert time.monotonic() < deadline, "fewer than 2 steps without the metric service after 300s"
            assert process.poll() is None, (tmp_path / "trainer.log").read_text()[-3000:]
            time.sleep(0.01)
        # Steps of the tiny model take tens of milliseconds, less than the restart and the breaker's
        # cool-down: hold the trainer while the service comes back, so the outage lasts a few steps on any
        # machine instead of however many fit into that time (a fast machine overran the error budget).
        process.send_signal(signal.SIGSTOP)
        try:
            metric = MetricServer(fraction_of_target, port=port).start()
            time.sleep(1.0)  # > GRPO_METRIC_BREAKER_COOLDOWN_SECONDS: the breaker lets the next batch try
        finally:
            process.send_signal(signal.SIGCONT)
        assert process.wait(timeout=600) == 0, (tmp_path / "trainer.log").read_text()[-3000:]
    finally:
        metric.stop()
        if process.poll() is None:
            process.kill()

    records = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 31))
    outage = [r for r in records if r["metric_error_ratio"] == 1.0]
    assert len(outage) >= 2
    # A step with nothing scored has no reward statistics: errors are not rewards.
    assert all(r["reward_mean"] is None for r in outage)
    assert records[-1]["metric_error_ratio"] == 0.0 and records[-1]["reward_mean"] is not None
    samples = [s for s in read_jsonl(out / "samples.jsonl") if s["step"] in {r["step"] for r in outage}]
    assert samples and all(s["reward"] is None and s["advantage"] == 0.0 for s in samples)


def test_errors_beyond_the_budget_fail_the_run_with_exit_3(tmp_path: Path, tiny_model: Path) -> None:
    metric = MetricServer(fraction_of_target).start()
    config = trainer_config(tmp_path, tiny_model, metric.url, steps=200, every_steps=1000, error_budget=0.3)
    process = start_trainer(config, tmp_path / "trainer.log")
    try:
        wait_steps(tmp_path / "out", 3)
        metric.stop()
        assert process.wait(timeout=300) == 3
    finally:
        if process.poll() is None:
            process.kill()
    log = (tmp_path / "trainer.log").read_text()
    assert "metric-unavailable:" in log and "errorBudget=30.0%" in log and "20-step window" in log
