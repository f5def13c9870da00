"""A diverging run never publishes NaN weights: after two good steps the metric turns absurd (rewards of
+-8e37 with scaleRewards none: finite advantages, but the gradients they scale overflow float32); the trainer exits 5 with a message naming the step,
no checkpoint of the bad step appears, and with keepLast 1 the last good checkpoint survives intact.
Then: enabling LoRA on top of those full-weight checkpoints is refused with exit 4 instead of loading with
"missing keys" and finishing without training."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from grpo_metric import MetricServer
from safetensors.torch import load_file

from tests.trainer.toy import fraction_of_target, read_jsonl, start_trainer, trainer_config

pytestmark = pytest.mark.trainer

GOOD_STEPS = 2
ROLLOUTS_PER_STEP = 4 * 8  # B * G of the toy configuration


class TurnsAbsurd:
    """The toy reward for the first GOOD_STEPS steps' completions, then +-8e37."""

    def __init__(self) -> None:
        self.scored = 0
        self.lock = threading.Lock()

    def __call__(self, example: dict[str, Any], completion: str) -> float:
        with self.lock:
            self.scored += 1
            absurd = self.scored > GOOD_STEPS * ROLLOUTS_PER_STEP
        if not absurd:
            return fraction_of_target(example, completion)
        return 8e37 if "a" in completion else -8e37


def test_non_finite_step_is_not_published_and_the_last_good_checkpoint_survives(
    tmp_path: Path, tiny_model: Path
) -> None:
    config = trainer_config(tmp_path, tiny_model, "http://unused", steps=6, every_steps=1, keep_last=1)
    with MetricServer(TurnsAbsurd()) as metric:
        raw = json.loads(config.read_text())
        raw["metric"]["url"] = metric.url
        raw["grpo"]["scaleRewards"] = "none"
        # The metric client refuses |reward| > metric.maxAbsReward (the spec caps it at 1e12), which keeps
        # absurd rewards out; lifted here in trainer.json to just under the trainer's own limit (advantages
        # representable in float32) so the step itself overflows, as a diverging step would make it, and
        # the guard behind that bound is what is tested.
        raw["metric"]["maxAbsReward"] = 8e37
        config.write_text(json.dumps(raw))
        log = tmp_path / "trainer.log"
        process = start_trainer(config, log)
        code = process.wait(timeout=600)
    output = log.read_text()
    assert code == 5, output[-3000:]
    assert "grpo-trainer: non-finite: step 3:" in output and "not finite" in output

    manifest = json.loads((tmp_path / "ckpt" / "latest.json").read_text())
    assert manifest["step"] == GOOD_STEPS
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("step-*")) == [f"step-{GOOD_STEPS}"]
    weights = load_file(str(Path(manifest["path"]) / "model.safetensors"))
    assert all(torch.isfinite(t).all() for t in weights.values())
    assert [r["step"] for r in read_jsonl(tmp_path / "out" / "metrics.jsonl")] == [1, 2]

    # The same volume, now with LoRA: the full-weight checkpoint is refused, naming both settings.
    raw = json.loads(config.read_text())
    raw["grpo"]["lora"] = {"enabled": True, "r": 4, "alpha": 8, "targetModules": ["q_proj", "v_proj"]}
    raw["metric"]["url"] = "http://127.0.0.1:9"  # refused before the metric service is needed
    config.write_text(json.dumps(raw))
    log = tmp_path / "lora.log"
    process = start_trainer(config, log)
    assert process.wait(timeout=300) == 4, log.read_text()[-3000:]
    line = next(x for x in log.read_text().splitlines() if x.startswith("grpo-trainer:"))
    assert line.startswith("grpo-trainer: checkpoint-mismatch:")
    assert "full weights, but this job trains" in line and "LoRA r=4" in line
    assert json.loads((tmp_path / "ckpt" / "latest.json").read_text()) == manifest
