"""TRL's per-step log keys -> the fields of metrics.jsonl and the trainer's Prometheus gauges
(grpo_trainer.prom.LOGGED_SIGNALS, which progress.py applies to every step's logs)."""

from __future__ import annotations

from typing import Any

from grpo_trainer.prom import LOGGED_SIGNALS, TrainerMetrics, logged_fields, set_logged_gauges
from grpo_trainer.trl_adapter import LOG_KEYS, PROJECT_LOG_KEYS
from prometheus_client import CollectorRegistry

# One step's logs as TRL 1.16 hands them to callbacks, vLLM importance-sampling correction on.
LOGS: dict[str, Any] = {
    "loss": 0.01,
    "kl": 0.002,
    "learning_rate": 1e-6,
    "num_tokens": 4096.0,
    "entropy": 0.75,
    "clip_ratio/low_mean": 0.01,
    "clip_ratio/high_mean": 0.03,
    "clip_ratio/region_mean": 0.04,
    "completions/mean_length": 120.0,
    "completions/clipped_ratio": 0.125,
    "sampling/importance_sampling_ratio/mean": 0.99,
    "sampling/importance_sampling_ratio/min": 0.0,
    "sampling/importance_sampling_ratio/max": 1.7,
    "sampling/importance_sampling_masked_ratio": 0.002,
}

# metrics.jsonl field -> (Prometheus series, value) for the logs above.
EXPECTED = {
    "loss": ("grpo_loss", 0.01),
    "kl": ("grpo_kl", 0.002),
    "clip_ratio": ("grpo_clip_ratio", 0.04),
    "completion_length": ("grpo_completion_length_tokens", 120.0),
    "learning_rate": (None, 1e-6),
    "clip_ratio_low": ("grpo_clip_ratio_low", 0.01),
    "clip_ratio_high": ("grpo_clip_ratio_high", 0.03),
    "entropy": ("grpo_entropy", 0.75),
    "truncated_ratio": ("grpo_truncated_completion_ratio", 0.125),
    "importance_sampling_ratio_mean": ("grpo_importance_sampling_ratio_mean", 0.99),
    "importance_sampling_ratio_min": ("grpo_importance_sampling_ratio_min", 0.0),
    "importance_sampling_ratio_max": ("grpo_importance_sampling_ratio_max", 1.7),
    "importance_sampling_masked_ratio": ("grpo_importance_sampling_masked_ratio", 0.002),
}


def gauge_values(metrics: TrainerMetrics) -> dict[str, float]:
    return {
        sample.name: sample.value
        for family in metrics.registry.collect()
        if family.type == "gauge"
        for sample in family.samples
    }


def test_every_logged_key_lands_in_metrics_jsonl_under_its_field() -> None:
    assert logged_fields(LOGS) == {field: value for field, (_, value) in EXPECTED.items()}


def test_every_logged_key_sets_its_gauge() -> None:
    metrics = TrainerMetrics.create("job", "ns", CollectorRegistry())
    set_logged_gauges(metrics, LOGS)
    values = gauge_values(metrics)
    for field, (series, value) in EXPECTED.items():
        if series is not None:
            assert values[series] == value, field


def test_a_key_the_step_did_not_log_is_null_and_leaves_its_gauge_alone() -> None:
    metrics = TrainerMetrics.create("job", "ns", CollectorRegistry())
    set_logged_gauges(metrics, LOGS)
    # beta 0 and no vLLM correction: TRL logs neither kl nor the importance-sampling figures.
    later = {key: value for key, value in LOGS.items() if key != "kl" and not key.startswith("sampling/")}
    later["entropy"] = float("nan")
    fields = logged_fields(later)
    assert fields["kl"] is None and fields["importance_sampling_ratio_mean"] is None
    assert fields["entropy"] is None  # non-finite: null, as json.dumps(allow_nan=False) needs
    set_logged_gauges(metrics, later)
    values = gauge_values(metrics)
    assert values["grpo_importance_sampling_ratio_max"] == 1.7 and values["grpo_entropy"] == 0.75


def test_the_table_names_known_keys_gauges_and_unique_fields() -> None:
    fields = [signal.field for signal in LOGGED_SIGNALS]
    assert len(fields) == len(set(fields))
    known = set(LOG_KEYS.values()) | set(PROJECT_LOG_KEYS.values())
    for signal in LOGGED_SIGNALS:
        assert signal.log_key in known, signal
        if signal.gauge is not None:
            assert (
                hasattr(TrainerMetrics, "__dataclass_fields__")
                and signal.gauge in TrainerMetrics.__dataclass_fields__
            )
    assert set(EXPECTED) == set(fields)
