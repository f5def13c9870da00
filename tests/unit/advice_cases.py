"""Manifests that draw apply-time warnings, and the fields each warning names: checked against
grpo_operator.api.advice in tests/unit/test_advice.py and against the chart's warnings policy on a real API
server in tests/helm/test_admission_warnings.py, so `kubectl grpo check` and `kubectl apply` agree."""

from __future__ import annotations

from typing import Any

from tests.unit.manifests import DELETE

# (id, changes to tests.unit.manifests.base_manifest, fields warned about, in advice.warnings order)
WARNING_CASES: list[tuple[str, dict[str, Any], list[str]]] = [
    ("pinned", {}, []),
    ("metric-untagged", {"spec.metric.image": "registry.example.com/team/metric"}, ["spec.metric.image"]),
    ("metric-latest", {"spec.metric.image": "metric:latest"}, ["spec.metric.image"]),
    ("registry-port-untagged", {"spec.metric.image": "registry:5000/team/metric"}, ["spec.metric.image"]),
    ("registry-port-tagged", {"spec.metric.image": "registry:5000/team/metric:2.1"}, []),
    ("digest", {"spec.metric.image": "registry.example.com/metric@sha256:" + "a" * 64}, []),
    (
        "trainer-and-vllm-latest",
        {"spec.trainer.image": "t:latest", "spec.generation.image": "vllm/vllm-openai"},
        ["spec.trainer.image", "spec.generation.image"],
    ),
    (
        "environment-latest",
        {"spec.metric": DELETE, "spec.environment": {"image": "registry.example.com/team/echo-env:latest"}},
        ["spec.environment.image"],
    ),
    # Colocated: no vLLM pod, so its image is not judged.
    (
        "colocated-vllm-image-unused",
        {"spec.generation": {"mode": "Colocate", "image": "vllm/vllm-openai"}},
        [],
    ),
    (
        "hub-url",
        {"spec.model.name": "https://huggingface.co/Qwen/Qwen2.5-0.5B-Instruct/tree/main"},
        ["spec.model.name"],
    ),
    ("other-url", {"spec.model.name": "s3://bucket/models/qwen"}, ["spec.model.name"]),
    (
        "rollouts-above",
        {"spec.grpo": {"groupSize": 16, "promptsPerStep": 1024, "steps": 1000}},
        ["spec.grpo.steps"],
    ),
    (
        "rollouts-iterations-below",
        {"spec.grpo": {"groupSize": 16, "promptsPerStep": 1024, "steps": 1000, "numIterations": 2}},
        [],
    ),
]
