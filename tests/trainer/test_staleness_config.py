"""spec.grpo.maxStaleness at its edges, in the trainer: 0 is the synchronous path, with identical results for
the same seed, and an asynchronous trainer.json with in-process sampling is refused with what to change.
(The asynchronous path itself runs against a real vLLM server: tests/trainer/test_vllm_weight_sync.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from grpo_metric import MetricServer

from tests.trainer.toy import read_jsonl, start_trainer, trainer_config

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

# Per-step figures that differ between runs only if training did.
SAME_FIGURES = ("reward_mean", "reward_std", "loss", "completion_length", "rollouts", "groups", "tied_groups")


def run(workdir: Path, model: Path, metric: MetricServer, **grpo: Any) -> int:
    workdir.mkdir()
    config = trainer_config(workdir, model, metric.url, steps=3, every_steps=3)
    data = json.loads(config.read_text())
    data["grpo"].update(grpo)
    config.write_text(json.dumps(data))
    return start_trainer(config, workdir / "trainer.log").wait(timeout=600)


def test_max_staleness_0_trains_exactly_as_unset(
    tmp_path: Path, tiny_model: Path, toy_metric: MetricServer
) -> None:
    unset, zero = tmp_path / "unset", tmp_path / "zero"
    assert run(unset, tiny_model, toy_metric) == 0, (unset / "trainer.log").read_text()[-3000:]
    assert run(zero, tiny_model, toy_metric, maxStaleness=0) == 0, (zero / "trainer.log").read_text()[-3000:]

    figures = [
        [{k: r[k] for k in SAME_FIGURES} for r in read_jsonl(w / "out" / "metrics.jsonl")]
        for w in (unset, zero)
    ]
    assert len(figures[0]) == 3 and figures[0] == figures[1], figures
    rows = read_jsonl(zero / "out" / "metrics.jsonl")
    assert not any("staleness" in r for r in rows)  # no sampling thread, no staleness record
    from safetensors.torch import load_file

    weights = [load_file(str(w / "ckpt" / "step-3" / "model.safetensors")) for w in (unset, zero)]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])


def test_max_staleness_with_in_process_sampling_exits_2_saying_what_to_change(
    tmp_path: Path, tiny_model: Path, toy_metric: MetricServer
) -> None:
    code = run(tmp_path / "run", tiny_model, toy_metric, maxStaleness=1)
    log = (tmp_path / "run" / "trainer.log").read_text()
    assert code == 2, log[-3000:]
    assert "grpo.maxStaleness > 0" in log and "use backend vllm-server, or remove maxStaleness" in log, log[
        -3000:
    ]
