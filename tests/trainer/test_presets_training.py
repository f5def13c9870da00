"""Each spec.grpo.preset trains the toy task to the end, and its knobs reach TRL: the GRPOConfig saved in the
final checkpoint (training_args.bin, HF Trainer's copy of the arguments it ran with) holds them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from grpo_metric import MetricServer

from tests.trainer.toy import read_jsonl, start_trainer, trainer_config

pytestmark = pytest.mark.trainer

STEPS = 6

# preset, the knobs the spec adds, the GRPOConfig attributes the run must have had.
CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "dapo",
        {},
        {"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28, "mask_truncated_completions": True},
    ),
    ("dr-grpo", {}, {"loss_type": "dr_grpo", "scale_rewards": "none"}),
    # GSPO's clip acts only on reused batches: two optimizer steps per generated batch.
    (
        "gspo",
        {"numIterations": 2},
        {
            "importance_sampling_level": "sequence",
            "loss_type": "grpo",
            "epsilon": 3e-4,
            "epsilon_high": 4e-4,
            "num_iterations": 2,
        },
    ),
]


@pytest.mark.parametrize(("preset", "knobs", "expected"), CASES, ids=[c[0] for c in CASES])
def test_a_preset_trains_to_the_end_with_its_knobs_in_trl(
    tmp_path: Path,
    tiny_model: Path,
    toy_metric: MetricServer,
    preset: str,
    knobs: dict[str, Any],
    expected: dict[str, Any],
) -> None:
    config = trainer_config(tmp_path, tiny_model, toy_metric.url, steps=STEPS, every_steps=STEPS)
    raw = json.loads(config.read_text())
    # The toy config sets dynamicSampling itself, which would win over the preset's.
    del raw["grpo"]["dynamicSampling"]
    raw["grpo"].update({"preset": preset, **knobs})
    config.write_text(json.dumps(raw))
    log = tmp_path / "trainer.log"
    process = start_trainer(config, log)
    assert process.wait(timeout=900) == 0, log.read_text()[-3000:]

    records = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    rewards = [r["reward_mean"] for r in records]
    print(f"{preset}: reward_mean first step {rewards[0]:.4f}, last step {rewards[-1]:.4f}: {rewards}")

    args = torch.load(tmp_path / "ckpt" / f"step-{STEPS}" / "training_args.bin", weights_only=False)
    assert {name: getattr(args, name) for name in expected} == expected
    text = log.read_text()
    assert f"GRPO preset {preset}: " in text
    if preset == "dapo":
        # Dynamic sampling is the trainer's own (not TRL's): the preset turned it on.
        assert "dynamic_sampling=True" in text
    if knobs.get("numIterations") == 2:
        # Steps 2, 4, 6 train again on the batch of the step before: nothing is generated or counted.
        assert [r["rollouts"] for r in records] == [32, 0] * (STEPS // 2)
        samples = {s["step"] for s in read_jsonl(tmp_path / "out" / "samples.jsonl") if s["split"] == "train"}
        assert samples == {1, 3, 5}
