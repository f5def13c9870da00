"""Full fine-tuning at the numerics users get: ``model.dtype: bfloat16``, learning rate 1e-6, a model with
Hugging Face's default initialisation (std 0.02), the real trainer process.

Weights held in bf16 do not move at such a learning rate (an update below half a bf16 unit in the last
place rounds away: at lr 1e-6 that is every weight above about 4.9e-4 in magnitude), so the trainer keeps
fp32 master weights and computes under bf16 autocast. This pins both halves: nearly every element moves
in the first step, and the movement is the fp32 run's movement, not noise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from grpo_metric import MetricServer

from tests.trainer.toy import read_jsonl, start_trainer, trainer_config
from tests.trainer.weights import changed_fraction, changed_overall, load_weights, saved_dtypes, update_cosine

pytestmark = pytest.mark.trainer

LEARNING_RATE = 1e-6
STEPS = 3


def _train(workdir: Path, model: Path, metric: MetricServer, dtype: str) -> Path:
    config = trainer_config(
        workdir,
        model,
        metric.url,
        steps=STEPS,
        every_steps=1,
        keep_last=STEPS,
        learning_rate=LEARNING_RATE,
    )
    raw = json.loads(config.read_text())
    raw["model"]["dtype"] = dtype
    config.write_text(json.dumps(raw))
    log = workdir / "trainer.log"
    assert start_trainer(config, log).wait(timeout=600) == 0, log.read_text()[-3000:]
    assert [r["step"] for r in read_jsonl(workdir / "out" / "metrics.jsonl")] == list(range(1, STEPS + 1))
    return workdir / "ckpt"


@pytest.fixture(scope="module")
def default_init_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from grpo_trainer.tiny import build

    return build(tmp_path_factory.mktemp("default-init-model"), hidden_size=128, layers=2)


def test_bf16_at_lr_1e6_moves_every_weight_as_fp32_does(
    tmp_path: Path, default_init_model: Path, toy_metric: MetricServer
) -> None:
    initial = load_weights(default_init_model)
    # HF's default initialisation, not a test-friendly one: linear weights N(0, 0.02), norm weights 1.
    q = next(v for k, v in initial.items() if k.endswith("q_proj.weight"))
    assert 0.015 < float(q.std()) < 0.025

    bf16 = _train(tmp_path / "bf16", default_init_model, toy_metric, "bfloat16")
    step1, step3 = load_weights(bf16 / "step-1"), load_weights(bf16 / "step-3")
    total = changed_overall(initial, step1)
    assert total >= 0.99, f"only {total:.2%} of parameter elements changed in step 1"
    norms = {n: f for n, f in changed_fraction(initial, step1).items() if "norm" in n}
    assert norms and min(norms.values()) >= 0.99, norms
    # Checkpoints keep the fp32 masters: a resume continues from them, not from their bf16 rounding.
    assert saved_dtypes(bf16 / "step-1") == {"F32"}

    fp32 = _train(tmp_path / "fp32", default_init_model, toy_metric, "float32")
    cosine, ratio = update_cosine(step1, step3, load_weights(fp32 / "step-1"), load_weights(fp32 / "step-3"))
    assert cosine >= 0.99, f"the bf16 run's update from step 1 to 3 has cosine {cosine:.4f} with fp32's"
    assert 0.9 < ratio < 1.1, ratio

    # The final model is written in the job's dtype, ready to serve.
    final = tmp_path / "bf16" / "out" / "model"
    assert json.loads((final / "config.json").read_text())["dtype"] == "bfloat16"
    assert saved_dtypes(final) == {"BF16"}
