"""Vanishing updates (trainer_image/grpo_trainer/update_health.py): which weights are sampled, the
update-to-weight ratio and changed fraction on real tensors and a real AdamW step, and the decision that
the updates vanished, with its cause, as status.updates says it."""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the update check uses torch; install the [trainer] extra")

from grpo_operator.api.status import UpdatesStatus  # noqa: E402
from grpo_trainer.update_health import (  # noqa: E402
    SAMPLE_ELEMENTS,
    VANISHING_STEPS,
    StepSignal,
    UpdateHealth,
    UpdateProbe,
    UpdateSample,
    VanishingDetector,
    choose_cause,
    choose_sample,
    kind,
    measure,
    status_body,
)

# The trainable parameters of a 3-layer Qwen2-like model, in model order (named_parameters()).
QWEN = [
    "model.embed_tokens.weight",
    *[
        f"model.layers.{i}.{part}"
        for i in range(3)
        for part in (
            "self_attn.q_proj.weight",
            "self_attn.q_proj.bias",
            "self_attn.k_proj.weight",
            "self_attn.v_proj.weight",
            "self_attn.o_proj.weight",
            "mlp.gate_proj.weight",
            "mlp.up_proj.weight",
            "mlp.down_proj.weight",
            "input_layernorm.weight",
            "post_attention_layernorm.weight",
        )
    ],
    "model.norm.weight",
    "lm_head.weight",
]


def test_the_sample_spreads_over_the_kinds_and_the_depth_and_always_has_a_norm() -> None:
    chosen = choose_sample(QWEN)
    assert len(chosen) == 8
    assert chosen == choose_sample(list(QWEN))  # deterministic
    assert [n for n in QWEN if n in chosen] == chosen  # in the model's order
    kinds = [kind(n) for n in chosen]
    assert {k: kinds.count(k) for k in set(kinds)} == {
        "norm": 2,
        "attention": 2,
        "mlp": 2,
        "embedding": 1,
        "lm_head": 1,
    }
    # Two of a kind: the first and the last of the model, not two neighbours.
    attention = [n for n in chosen if kind(n) == "attention"]
    assert attention[0].startswith("model.layers.0.") and attention[1].startswith("model.layers.2.")
    assert "model.norm.weight" in chosen


def test_lora_samples_the_adapters_and_a_small_model_is_taken_whole() -> None:
    lora = [
        f"base_model.model.model.layers.{i}.{module}.lora_{ab}.default.weight"
        for i in range(4)
        for module in ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj")
        for ab in ("A", "B")
    ]
    chosen = choose_sample(lora)
    assert len(chosen) == 8 and {kind(n) for n in chosen} == {"attention", "mlp"}
    assert any(".lora_A." in n for n in chosen) and any(".lora_B." in n for n in chosen)
    assert choose_sample(["a.weight", "b.norm.weight"]) == ["a.weight", "b.norm.weight"]
    assert choose_sample([]) == []
    assert choose_sample(QWEN, count=1) == ["model.layers.1.post_attention_layernorm.weight"]


def test_ratio_and_fraction_on_known_tensors() -> None:
    before = [torch.tensor([3.0, 0.0, 1.0, 1.0]), torch.tensor([0.0, 0.0])]
    after = [torch.tensor([3.0, 4.0, 1.0, 1.0]), torch.tensor([0.0, 0.0])]
    sample = measure(before, after)
    assert sample.fraction == pytest.approx(1 / 6) and sample.elements == 6
    assert sample.ratio == pytest.approx(4 / math.sqrt(9 + 16 + 1 + 1))
    assert sample.dtype == "float32"
    same = measure(before, [t.clone() for t in before])
    assert same.fraction == 0.0 and same.ratio == 0.0
    # A zero tensor that moved (LoRA's B at its first step): no ratio to a zero weight, the fraction stands.
    moved = measure([torch.zeros(2)], [torch.zeros(2)])
    assert moved.ratio == 0.0
    with pytest.raises(ValueError):
        measure([torch.zeros(2)], [torch.zeros(3)])


def test_a_bfloat16_weight_whose_update_rounds_away_counts_as_unchanged() -> None:
    weight = torch.full((4,), 0.02, dtype=torch.bfloat16)
    nudged = weight + torch.tensor(1e-6, dtype=torch.bfloat16)  # well below half a bf16 ulp of 0.02
    assert measure([weight], [nudged]).fraction == 0.0
    wide = weight.float()
    assert measure([wide], [wide + 1e-6]).fraction == 1.0


def _adamw_probe(dtype: Any, lr: float) -> list[UpdateSample]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.LayerNorm(256)).to(dtype)
    with torch.no_grad():
        model[0].weight.normal_(0.0, 0.02)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    probe = UpdateProbe()
    samples = []
    for _ in range(3):
        model(torch.randn(8, 256, dtype=dtype)).square().mean().backward()
        probe.before_step(model)
        optimizer.step()
        optimizer.zero_grad()
        sample = probe.after_step()
        assert sample is not None
        samples.append(sample)
    assert probe.names == ["0.weight", "0.bias", "1.weight", "1.bias"]
    return samples


def test_adamw_at_lr_1e6_changes_almost_nothing_in_bfloat16_and_nearly_everything_in_float32() -> None:
    bf16 = _adamw_probe(torch.bfloat16, 1e-6)
    fp32 = _adamw_probe(torch.float32, 1e-6)
    assert all(s.fraction < 0.05 and s.dtype == "bfloat16" for s in bf16), bf16
    assert all(s.fraction > 0.99 and s.dtype == "float32" for s in fp32), fp32
    # Adam moves each element by about lr at first: a ratio of order lr / rms(weight) in float32.
    assert all(s.ratio is not None and 1e-6 < s.ratio < 1e-4 for s in fp32), fp32


def test_the_probe_reads_at_most_the_first_elements_of_each_tensor() -> None:
    big = torch.nn.Linear(1024, 128, bias=False)  # 131,072 elements
    probe = UpdateProbe()
    probe.before_step(big)
    with torch.no_grad():
        big.weight.view(-1)[SAMPLE_ELEMENTS:] += 1.0  # beyond the sample: not seen
    sample = probe.after_step()
    assert sample is not None and sample.elements == SAMPLE_ELEMENTS and sample.fraction == 0.0
    assert probe.after_step() is None  # one measurement per copy


def signal(**overrides: object) -> StepSignal:
    values: dict[str, object] = {
        "learning_rate": 1e-6,
        "peak_learning_rate": 1e-6,
        "zero_std_group_ratio": 0.25,
        "truncated_ratio": 0.0,
        "mask_truncated": False,
    }
    values.update(overrides)
    return StepSignal(**values)  # type: ignore[arg-type]


STILL = UpdateSample(ratio=2e-6, fraction=0.004, elements=1000, dtype="bfloat16")
MOVING = UpdateSample(ratio=3e-5, fraction=0.98, elements=1000, dtype="float32")


def test_vanishing_takes_three_still_steps_in_a_row() -> None:
    detector = VanishingDetector()
    verdicts = [detector.observe(STILL, signal()) for _ in range(VANISHING_STEPS)]
    assert [v.vanishing for v in verdicts] == [False, False, True]
    assert verdicts[-1].steps == 3 and verdicts[-1].cause == "Precision"
    # One step that moves ends it; the count starts again.
    assert detector.observe(MOVING, signal()).vanishing is False
    assert detector.observe(STILL, signal()).steps == 1


def test_steps_with_a_schedule_near_zero_or_skipped_by_the_scaler_are_not_judged() -> None:
    detector = VanishingDetector()
    detector.observe(STILL, signal())
    detector.observe(STILL, signal())
    # Warmup start / end of a decaying schedule, and a GradScaler-skipped step: neither extend nor break.
    assert detector.observe(MOVING, signal(learning_rate=0.0)).steps == 2
    assert detector.observe(STILL, signal(learning_rate=5e-8)).steps == 2
    assert detector.observe(STILL, signal(skipped=True)).steps == 2
    assert detector.observe(STILL, signal(learning_rate=None)).vanishing is True


def test_a_tiny_ratio_vanishes_even_when_every_element_moves() -> None:
    detector = VanishingDetector()
    crawl = UpdateSample(ratio=1e-10, fraction=1.0, elements=1000, dtype="float32")
    verdicts = [
        detector.observe(crawl, signal(learning_rate=1e-12, peak_learning_rate=1e-12)) for _ in range(3)
    ]
    assert verdicts[-1].vanishing and verdicts[-1].cause == "LearningRate"


def test_the_cause_follows_the_steps_figures() -> None:
    fp32_still = UpdateSample(ratio=0.0, fraction=0.0, elements=10, dtype="float32")
    assert choose_cause([fp32_still] * 3, [signal()] * 3) == "LearningRate"
    assert choose_cause([STILL] * 3, [signal()] * 3) == "Precision"
    tied = signal(zero_std_group_ratio=1.0)
    assert choose_cause([STILL] * 3, [tied] * 3) == "TiedGroups"
    truncated = signal(truncated_ratio=1.0, mask_truncated=True)
    assert choose_cause([fp32_still] * 3, [truncated] * 3) == "TruncatedCompletionsMasked"
    # Truncated but not masked: the completions still carry a gradient.
    assert choose_cause([fp32_still] * 3, [signal(truncated_ratio=1.0)] * 3) == "LearningRate"
    # One step of the run had a signal: the masks do not explain it.
    assert choose_cause([STILL] * 3, [tied, tied, signal()]) == "Precision"


def test_the_status_body_is_what_the_operator_validates() -> None:
    detector = VanishingDetector()
    for _ in range(3):
        verdict = detector.observe(STILL, signal())
    body = status_body(12, STILL, verdict, 1e-6)
    assert body == {
        "checkedStep": 12,
        "updateRatio": 2e-6,
        "updatedFraction": 0.004,
        "weightDtype": "bfloat16",
        "learningRate": 1e-6,
        "vanishing": True,
        "vanishingSteps": 3,
        "cause": "Precision",
    }
    assert UpdatesStatus.model_validate(body).cause == "Precision"
    odd = UpdateSample(ratio=None, fraction=0.0, elements=0, dtype="float8_e4m3fn")
    plain = status_body(1, odd, detector.observe(MOVING, signal()), float("nan"))
    assert plain == {"checkedStep": 1, "updatedFraction": 0.0, "vanishing": False, "vanishingSteps": 0}


def test_update_health_reports_each_measured_step_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    health = UpdateHealth()
    assert health.judge(1, signal()) is None  # nothing measured
    model = torch.nn.Linear(4, 4).to(torch.bfloat16)
    reports = []
    with caplog.at_level(logging.WARNING, logger="grpo_trainer.update_health"):
        for step in range(1, 5):
            health.before_step(model)
            health.after_step(skipped=False)  # nothing stepped: every element still
            report = health.judge(step, signal())
            assert report is not None
            reports.append(report)
    assert [r.changed for r in reports] == [False, False, True, False]
    assert reports[0].fields == {"update_ratio": 0.0, "updated_fraction": 0.0}
    assert reports[-1].status["vanishing"] is True and reports[-1].status["vanishingSteps"] == 4
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "step 3" in warnings[0] and "Precision" in warnings[0]
    # A step the scaler skipped is reported but not judged.
    health.before_step(model)
    health.after_step(skipped=True)
    skipped = health.judge(5, signal())
    assert skipped is not None and skipped.verdict.steps == 4
