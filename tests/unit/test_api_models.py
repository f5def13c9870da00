"""Pure behaviour of the API models: dataset URIs, defaults, cost arithmetic, status, TrainerConfig."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml
from grpo_operator.api import (
    DatasetURIError,
    GRPOJob,
    GRPOJobSpec,
    GRPOJobStatus,
    ProgressStatus,
    TrainerConfig,
    compute_metric_calls,
    compute_rollouts,
    compute_validation_calls,
    parse_dataset_uri,
)
from grpo_operator.api.generate import repo_root

EXAMPLES = repo_root() / "examples"


def _spec(**grpo: Any) -> GRPOJobSpec:
    return GRPOJobSpec.model_validate(
        {
            "model": {"name": "m"},
            "dataset": {"train": "hf://a/b", "validation": "hf://a/b#test"},
            "grpo": {"groupSize": 8, "promptsPerStep": 4, "steps": 500, **grpo},
            "metric": {"image": "img"},
        }
    )


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("hf://openai/gsm8k", {"scheme": "hf", "location": "openai/gsm8k", "split": "train"}),
        (
            "hf://openai/gsm8k:main@v1.0#test",
            {"location": "openai/gsm8k", "config": "main", "revision": "v1.0", "split": "test"},
        ),
        ("hf://gsm8k#train[:90%]", {"location": "gsm8k", "split": "train[:90%]", "revision": None}),
        ("hf://org/ds@refs/pr/1", {"revision": "refs/pr/1", "config": None}),
        (
            "file:///workspace/data/train.jsonl",
            {
                "scheme": "file",
                "location": "/workspace/data/train.jsonl",
                "file_format": "jsonl",
                "split": None,
            },
        ),
        ("file:///data/x.json", {"file_format": "json"}),
        ("file:///d/part-0.parquet", {"file_format": "parquet", "location": "/d/part-0.parquet"}),
    ],
)
def test_parse_dataset_uri(uri: str, expected: dict[str, Any]) -> None:
    parsed = parse_dataset_uri(uri)
    for key, value in expected.items():
        assert getattr(parsed, key) == value, key


@pytest.mark.parametrize(
    ("uri", "why"),
    [
        ("s3://bucket/train.jsonl", "unsupported dataset URI scheme 's3'"),
        ("https://x/y.jsonl", "unsupported dataset URI scheme 'https'"),
        ("file://relative/train.jsonl", "malformed"),
        ("file:///data/train.csv", "malformed"),
        ("hf://", "malformed"),
        ("hf://a/b/c", "malformed"),
        ("openai/gsm8k", "malformed"),
        ("hf://openai/gsm8k\n", "malformed"),
    ],
)
def test_parse_dataset_uri_rejects_with_help(uri: str, why: str) -> None:
    with pytest.raises(DatasetURIError) as info:
        parse_dataset_uri(uri)
    assert why in str(info.value)
    assert "hf://<org>/<name>" in str(info.value) and "file:///" in str(info.value)


def test_defaults_are_the_documented_ones() -> None:
    spec = _spec()
    assert (spec.model.revision, spec.model.dtype) == ("main", "bfloat16")
    g = spec.grpo
    assert (g.learning_rate, g.temperature, g.top_p, g.beta, g.epsilon, g.epsilon_high) == (
        1e-6,
        1.0,
        1.0,
        0.0,
        0.2,
        None,
    )
    assert (g.loss_type, g.scale_rewards, g.format_failure_score, g.failure_score) == (
        "dapo",
        "group",
        -1.0,
        0.0,
    )
    assert (g.max_prompt_length, g.max_completion_length, g.seed, g.dynamic_sampling) == (512, 256, 42, False)
    assert g.lora.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"] and not g.lora.enabled
    assert (g.validation.every_steps, g.validation.max_prompts) == (0, 64)
    assert spec.metric is not None
    assert (spec.metric.port, spec.metric.batch_size, spec.metric.error_budget) == (8080, 32, 0.05)
    assert (spec.generation.gpus, spec.generation.tensor_parallel_size) == (1, 1)
    # No CRD default: an unset image is the platform's (operator settings), read when pods are built.
    assert spec.generation.image is None
    assert (spec.trainer.nodes, spec.trainer.gpus_per_node, spec.trainer.per_device_batch_size) == (1, 1, 1)
    assert spec.trainer.image is None
    ck = spec.checkpoints
    assert (ck.every_steps, ck.keep_last, ck.retention) == (50, 3, "Retain")
    assert (ck.volume.size, ck.volume.access_mode, ck.volume.existing_claim) == (
        "50Gi",
        "ReadWriteOnce",
        None,
    )
    rp = spec.run_policy
    assert (rp.backoff_limit, rp.startup_deadline_seconds, rp.progress_deadline_seconds) == (3, 1800, 1800)
    assert spec.suspend is False


def test_camel_case_on_the_wire_snake_case_in_python() -> None:
    spec = _spec(learningRate=2e-6)
    assert spec.grpo.learning_rate == 2e-6
    wire = spec.to_dict()
    assert wire["grpo"]["learningRate"] == 2e-6 and "learning_rate" not in wire["grpo"]
    assert "epsilonHigh" not in wire["grpo"]  # unset optionals are left out, not sent as null
    assert GRPOJobSpec.model_validate(wire) == spec
    # populate by name works too, for code that builds specs in Python
    assert GRPOJobSpec.model_validate(spec.model_dump(by_alias=False)) == spec


def test_strict_types_like_the_api_server() -> None:
    with pytest.raises(pydantic.ValidationError):
        _spec(steps="500")
    with pytest.raises(pydantic.ValidationError):
        _spec(dynamicSampling="true")
    assert _spec(temperature=1).grpo.temperature == 1.0  # an integer is a valid number
    # kubectl sends YAML `500.0` as JSON `500`; an integral float is the integer it names.
    steps = _spec(steps=500.0).grpo.steps
    assert steps == 500 and type(steps) is int
    with pytest.raises(pydantic.ValidationError):
        _spec(steps=500.5)


def test_quantities_are_normalised_to_strings() -> None:
    spec = GRPOJobSpec.model_validate(
        {
            **_spec().to_dict(),
            "metric": {"image": "i", "resources": {"requests": {"cpu": 2, "memory": "1Gi"}}},
        }
    )
    assert spec.metric is not None and spec.metric.resources.requests == {"cpu": "2", "memory": "1Gi"}


def test_rollouts_and_metric_calls() -> None:
    spec = _spec(validation={"everySteps": 50, "maxPrompts": 64})
    assert compute_rollouts(spec) == 500 * 4 * 8 == 16_000
    assert compute_validation_calls(spec) == 10 * 64
    assert compute_metric_calls(spec) == 16_640
    no_validation = _spec()
    assert compute_metric_calls(no_validation) == compute_rollouts(no_validation)
    # Validation runs at step 50 and after the last step (99), as the trainer does.
    assert compute_validation_calls(_spec(steps=99, validation={"everySteps": 50})) == 2 * 64


def test_gradient_accumulation_from_topology() -> None:
    spec = GRPOJobSpec.model_validate(
        {**_spec().to_dict(), "trainer": {"gpusPerNode": 2, "perDeviceBatchSize": 4}}
    )
    assert spec.trainer_world_size() == 2
    assert spec.gradient_accumulation_steps() == 32 // 8 == 4


@pytest.mark.parametrize(
    "path",
    sorted([*EXAMPLES.glob("*.yaml"), *EXAMPLES.glob("environments/*/grpojob.yaml")]),
    ids=lambda p: p.name,
)
def test_examples_are_valid(path: Path) -> None:
    job = GRPOJob.from_object(yaml.safe_load(path.read_text()))
    assert job.metadata.name and len(job.metadata.name) <= 40


def test_realistic_example_is_the_math_job() -> None:
    job = GRPOJob.from_object(yaml.safe_load((EXAMPLES / "grpojob.yaml").read_text()))
    s = job.spec
    assert s.model.name == "Qwen/Qwen2.5-1.5B-Instruct"
    assert (s.grpo.group_size, s.grpo.prompts_per_step, s.grpo.steps) == (8, 4, 500)
    assert s.generation.gpus == 1 and s.trainer_world_size() == 2
    assert compute_rollouts(s) == 16_000 and compute_metric_calls(s) == 16_640


def test_progress_display_follows_step() -> None:
    progress = ProgressStatus(step=12, total_steps=500)
    assert progress.to_dict() == {"step": 12, "totalSteps": 500, "display": "12/500"}
    assert ProgressStatus.model_validate({"step": 3}).display == "3"
    assert ProgressStatus().to_dict() == {}


def test_status_round_trip_from_api_json() -> None:
    raw = {
        "phase": "Running",
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "TrainerRunning",
                "lastTransitionTime": "2025-01-02T03:04:05Z",
            }
        ],
        "progress": {"step": 1, "totalSteps": 2, "display": "1/2"},
        "rewards": {"mean": 0.5, "std": 0.1, "formatFailureRatio": 0.0, "zeroStdGroupRatio": 0.25},
        "checkpoint": {
            "lastStep": 1,
            "path": "/workspace/checkpoints/step-1",
            "time": "2025-01-02T03:04:05Z",
        },
        "restarts": 0,
        "rollouts": 64,
        "trainerAttempt": 0,
    }
    status = GRPOJobStatus.model_validate(raw)
    assert status.conditions is not None
    assert status.conditions[0].last_transition_time == datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert status.to_dict() == raw
    # A partial status (what the trainer patches) never carries the operator's fields.
    assert GRPOJobStatus(progress=ProgressStatus(step=1)).to_dict() == {
        "progress": {"step": 1, "display": "1"}
    }


def test_status_rejects_unknown_phase() -> None:
    with pytest.raises(pydantic.ValidationError):
        GRPOJobStatus.model_validate({"phase": "Training"})


def test_trainer_config_from_spec_round_trips() -> None:
    spec = _spec(validation={"everySteps": 50})
    cfg = TrainerConfig.from_spec(
        "ns",
        "job",
        "uid-1",
        spec,
        metric_url="http://job-metric:8080",
        generation_host="job-gen.ns.svc",
    )
    text = cfg.dump_json()
    data = json.loads(text)
    assert data["apiVersion"] == "grpo.dev/v1alpha1" and data["kind"] == "TrainerConfig"
    assert data["job"] == {"namespace": "ns", "name": "job", "uid": "uid-1"}
    assert data["grpo"]["groupSize"] == 8 and data["grpo"]["validation"]["everySteps"] == 50
    assert data["generation"] == {
        "backend": "vllm-server",
        "serverHost": "job-gen.ns.svc",
        "serverPort": 8000,
        "weightSyncPort": 51216,
        "startupTimeoutSeconds": 1800.0,
        "requestTimeoutSeconds": 600.0,
    }
    assert data["metric"]["url"] == "http://job-metric:8080" and data["metric"]["errorBudget"] == 0.05
    assert data["checkpoints"] == {"dir": "/workspace/checkpoints", "everySteps": 50, "keepLast": 3}
    assert data["outputDir"] == "/workspace/output"
    assert (data["metricsPort"], data["statusPatchIntervalSeconds"]) == (9090, 10.0)
    assert TrainerConfig.model_validate_json(text) == cfg
    # Pure: the same inputs render the same bytes (the ConfigMap does not churn).
    again = TrainerConfig.from_spec(
        "ns", "job", "uid-1", spec, metric_url="http://job-metric:8080", generation_host="job-gen.ns.svc"
    )
    assert again.dump_json() == text


def test_trainer_config_load(tmp_path: Path) -> None:
    cfg = TrainerConfig.from_spec(
        "ns",
        "job",
        None,
        _spec(),
        metric_url="http://127.0.0.1:8080",
        generation_host=None,
        backend="transformers",
    )
    path = tmp_path / "trainer.json"
    path.write_text(cfg.dump_json())
    loaded = TrainerConfig.load(path)
    assert loaded == cfg and loaded.generation.backend == "transformers" and loaded.job.uid is None


def test_trainer_config_needs_a_vllm_host() -> None:
    with pytest.raises(ValueError, match="generation_host"):
        TrainerConfig.from_spec("ns", "job", None, _spec(), metric_url="http://m:8080", generation_host=None)


def test_trainer_config_rejects_unknown_keys() -> None:
    cfg = TrainerConfig.from_spec("ns", "j", None, _spec(), metric_url="http://m", generation_host="g")
    data = json.loads(cfg.dump_json())
    data["grpo"]["groupsize"] = 4
    with pytest.raises(pydantic.ValidationError, match="groupsize"):
        TrainerConfig.model_validate(data)


def test_api_imports_neither_kopf_nor_kubernetes() -> None:
    import subprocess

    code = (
        "import sys, grpo_operator.api, grpo_operator.api.generate; "
        "bad = [m for m in ('kopf', 'kubernetes') if m in sys.modules]; "
        "sys.exit(f'api imported {bad}' if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
