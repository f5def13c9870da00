"""Which spec changes an existing GRPOJob accepts: ``check_immutable`` names the field of each change
that would strand the job's checkpoints, and allows the rest. tests/integration/test_crd_validation.py
runs the same updates against a real API server."""

from __future__ import annotations

from typing import Any

import pytest
from grpo_operator.api import GRPOJobSpec, check_immutable

from tests.unit.manifests import CLIENT, base_manifest, with_changes

IMMUTABLE_UPDATES: list[tuple[str, dict[str, Any]]] = [
    ("spec.model", {"spec.model.name": "Qwen/Qwen2.5-1.5B-Instruct"}),
    ("spec.model", {"spec.model.revision": "v2"}),
    ("spec.grpo.groupSize", {"spec.grpo.groupSize": 8}),
    ("spec.grpo.promptsPerStep", {"spec.grpo.promptsPerStep": 4}),
    # Full-weight and LoRA checkpoints (or adapters of another rank) cannot be resumed from each other.
    ("spec.grpo.lora", {"spec.grpo.lora": {"enabled": True}}),
    ("spec.grpo.lora", {"spec.grpo.lora": {"r": 8}}),
    (
        "spec.trainer.nodes",
        {"spec.trainer": {"nodes": 2}, "spec.checkpoints.volume.accessMode": "ReadWriteMany"},
    ),
    ("spec.trainer.gpusPerNode", {"spec.trainer.gpusPerNode": 2}),
    ("spec.trainer.perDeviceBatchSize", {"spec.trainer.perDeviceBatchSize": 2}),
    # A job that trained from its metric service cannot continue from a client.
    ("spec.rollouts.source", CLIENT),
    # vLLM pods of its own or none: a different set of children and another trainer loop.
    ("spec.generation.mode", {"spec.generation": {"mode": "Colocate"}}),
]

MUTABLE_UPDATES: list[dict[str, Any]] = [
    {"spec.grpo.steps": 20},
    {"spec.grpo.learningRate": 2e-6, "spec.grpo.temperature": 0.9},
    {"spec.suspend": True},
    {"spec.metric.image": "ghcr.io/grpo-operator/metric-math:0.2.0"},
    # The access token may be added (or its Secret renamed) without recreating the job.
    {"spec.model.tokenSecretRef": {"name": "hf-token", "key": "token"}},
    {"spec.generation": {"gpus": 2, "tensorParallelSize": 2}},
]


@pytest.mark.parametrize(("field", "changes"), IMMUTABLE_UPDATES, ids=[f for f, _ in IMMUTABLE_UPDATES])
def test_check_immutable_names_field(field: str, changes: dict[str, Any]) -> None:
    old = GRPOJobSpec.model_validate(base_manifest()["spec"])
    new = GRPOJobSpec.model_validate(with_changes(changes)["spec"])
    errors = check_immutable(old, new)
    assert len(errors) == 1 and errors[0].startswith(field), errors


@pytest.mark.parametrize("changes", MUTABLE_UPDATES)
def test_check_immutable_allows_other_changes(changes: dict[str, Any]) -> None:
    old = GRPOJobSpec.model_validate(base_manifest()["spec"])
    new = GRPOJobSpec.model_validate(with_changes(changes)["spec"])
    assert check_immutable(old, new) == []
