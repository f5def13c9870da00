"""spec.tracking.tensorBoard on a real trainer process: the event files on the job's volume hold what
metrics.jsonl holds, step by step, plus the learning-health diagnosis, sample completions and the resolved
configuration, read back with TensorBoard's own reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from grpo_metric import MetricServer

from tests.trainer.toy import read_jsonl, start_trainer, trainer_config

pytestmark = pytest.mark.trainer


def test_tensorboard_event_files_hold_every_step_samples_and_the_resolved_configuration(
    tmp_path: Path, tiny_model: Path, toy_metric: MetricServer
) -> None:
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    config = trainer_config(tmp_path, tiny_model, toy_metric.url, steps=3, every_steps=3, validation_every=3)
    raw = json.loads(config.read_text())
    raw["tracking"] = {"tensorBoard": {"enabled": True}}
    raw["grpo"]["preset"] = "dr-grpo"
    config.write_text(json.dumps(raw))
    process = start_trainer(config, tmp_path / "trainer.log")
    assert process.wait(timeout=600) == 0, (tmp_path / "trainer.log").read_text()[-3000:]

    records = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    logdir = tmp_path / "out" / "tensorboard"
    events = event_accumulator.EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    # The metric's rewards, GRPO's own bookkeeping, TRL's figures and the update check, as metrics.jsonl.
    for name in ("reward_mean", "zero_std_group_ratio", "loss", "learning_rate", "updated_fraction"):
        assert f"grpo/{name}" in scalars, sorted(scalars)
        points = events.Scalars(f"grpo/{name}")
        assert [p.step for p in points] == [1, 2, 3]
        assert [p.value for p in points] == pytest.approx([r[name] for r in records], rel=1e-5)
    assert "grpo/validation_mean" in scalars

    texts = {tag: events.Tensors(tag) for tag in events.Tags()["tensors"]}

    def text(tag: str) -> str:
        return "\n".join(t.tensor_proto.string_val[0].decode() for t in texts[f"{tag}/text_summary"])

    # The resolved configuration: the preset's knobs filled in, and TRL's own arguments.
    assert '"scaleRewards": "none"' in text("config/trainer.json")
    assert '"loss_type": "dr_grpo"' in text("config/trl_arguments")
    assert "| prompt | completion | reward |" in text("samples/train")
    assert "| prompt | completion | reward |" in text("samples/validation")
    assert text("grpo/learning_health").split("\n") == [r["learning_health"] for r in records]
