"""Valid and invalid GRPOJob manifests, checked against the pydantic models.

The same cases run against a real API server in tests/integration/test_crd_validation.py: a manifest
is rejected by both, naming the same field, or accepted by both with the same defaults.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import pydantic
import pytest
from grpo_operator.api import GRPOJob, GRPOJobSpec, check_immutable, describe_validation_error

_DELETE = object()


def base_manifest(name: str = "job") -> dict[str, Any]:
    """A small valid job every case starts from."""
    return {
        "apiVersion": "grpo.dev/v1alpha1",
        "kind": "GRPOJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
            "dataset": {"train": "hf://openai/gsm8k:main#train"},
            "grpo": {"groupSize": 4, "promptsPerStep": 2, "steps": 10},
            "metric": {"image": "ghcr.io/grpo-operator/metric-math:0.1.0"},
        },
    }


def with_changes(changes: dict[str, Any], name: str = "job") -> dict[str, Any]:
    """``base_manifest`` with dotted-path changes applied; the value ``_DELETE`` removes the key."""
    manifest = base_manifest(name)
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        node = manifest
        for part in parents:
            node = node.setdefault(part, {})
        if value is _DELETE:
            node.pop(leaf, None)
        else:
            node[leaf] = copy.deepcopy(value)
    return manifest


@dataclass(frozen=True)
class Case:
    id: str
    manifest: dict[str, Any]
    # The field the error must name, as written in the manifest (e.g. "spec.grpo.groupSize").
    field: str


def _case(id: str, field: str, changes: dict[str, Any], name: str = "job") -> Case:
    return Case(id=id, manifest=with_changes(changes, name), field=field)


# A client-rollout job: the changes that turn base_manifest into one.
CLIENT: dict[str, Any] = {
    "spec.rollouts": {"source": "Client"},
    "spec.metric": _DELETE,
    "spec.dataset": _DELETE,
}


INVALID_CASES: list[Case] = [
    _case("group-size-1", "spec.grpo.groupSize", {"spec.grpo.groupSize": 1}),
    _case("group-size-0", "spec.grpo.groupSize", {"spec.grpo.groupSize": 0}),
    _case("group-size-too-big", "spec.grpo.groupSize", {"spec.grpo.groupSize": 512}),
    _case("group-size-string", "spec.grpo.groupSize", {"spec.grpo.groupSize": "8"}),
    _case("group-size-float", "spec.grpo.groupSize", {"spec.grpo.groupSize": 8.5}),
    _case("prompts-per-step-0", "spec.grpo.promptsPerStep", {"spec.grpo.promptsPerStep": 0}),
    _case("steps-0", "spec.grpo.steps", {"spec.grpo.steps": 0}),
    _case("steps-missing", "spec.grpo.steps", {"spec.grpo.steps": _DELETE}),
    _case("temperature-0", "spec.grpo.temperature", {"spec.grpo.temperature": 0}),
    _case("temperature-negative", "spec.grpo.temperature", {"spec.grpo.temperature": -0.5}),
    _case("top-p-0", "spec.grpo.topP", {"spec.grpo.topP": 0.0}),
    _case("top-p-above-1", "spec.grpo.topP", {"spec.grpo.topP": 1.5}),
    _case("learning-rate-0", "spec.grpo.learningRate", {"spec.grpo.learningRate": 0}),
    _case("beta-negative", "spec.grpo.beta", {"spec.grpo.beta": -0.1}),
    _case(
        "format-failure-equals-failure",
        "spec.grpo.formatFailureScore",
        {"spec.grpo.formatFailureScore": 0.0, "spec.grpo.failureScore": 0.0},
    ),
    _case(
        "format-failure-above-failure",
        "spec.grpo.formatFailureScore",
        {"spec.grpo.formatFailureScore": 1.0, "spec.grpo.failureScore": 0.5},
    ),
    _case(
        "epsilon-high-below-epsilon",
        "spec.grpo.epsilonHigh",
        {"spec.grpo.epsilon": 0.2, "spec.grpo.epsilonHigh": 0.1},
    ),
    _case("loss-type-unknown", "spec.grpo.lossType", {"spec.grpo.lossType": "ppo"}),
    _case("scale-rewards-unknown", "spec.grpo.scaleRewards", {"spec.grpo.scaleRewards": "batchwise"}),
    _case("lora-rank-0", "spec.grpo.lora.r", {"spec.grpo.lora": {"enabled": True, "r": 0}}),
    _case(
        "lora-no-target-modules", "spec.grpo.lora.targetModules", {"spec.grpo.lora": {"targetModules": []}}
    ),
    _case(
        "validation-without-dataset",
        "spec.grpo.validation.everySteps",
        {"spec.grpo.validation": {"everySteps": 10}},
    ),
    _case("generation-gpus-0", "spec.generation.gpus", {"spec.generation.gpus": 0}),
    _case("generation-gpus-above-node", "spec.generation.gpus", {"spec.generation.gpus": 9}),
    _case(
        "tensor-parallel-not-dividing",
        "spec.generation.tensorParallelSize",
        {"spec.generation": {"gpus": 3, "tensorParallelSize": 2}},
    ),
    _case(
        "data-parallel-generation",
        "spec.generation.tensorParallelSize",
        {"spec.generation": {"gpus": 8, "tensorParallelSize": 4}},
    ),
    _case(
        "generation-gpus-without-tensor-parallel",
        "spec.generation.tensorParallelSize",
        {"spec.generation.gpus": 2},
    ),
    _case(
        "env-value-and-value-from",
        "spec.trainer.env[0].valueFrom",
        {
            "spec.trainer.env": [
                {"name": "T", "value": "x", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
            ]
        },
    ),
    _case(
        "env-value-from-both-refs",
        "spec.metric.env[0].valueFrom",
        {
            "spec.metric.env": [
                {
                    "name": "T",
                    "valueFrom": {
                        "secretKeyRef": {"name": "s", "key": "k"},
                        "configMapKeyRef": {"name": "c", "key": "k"},
                    },
                }
            ]
        },
    ),
    _case(
        "env-value-from-empty",
        "spec.generation.env[0].valueFrom",
        {"spec.generation.env": [{"name": "T", "valueFrom": {}}]},
    ),
    _case(
        "env-secret-bad-name",
        "spec.trainer.env[0].valueFrom.secretKeyRef.name",
        {
            "spec.trainer.env": [
                {"name": "T", "valueFrom": {"secretKeyRef": {"name": "My_Secret", "key": "k"}}}
            ]
        },
    ),
    _case(
        "env-value-from-field-ref",
        "spec.trainer.env[0].valueFrom.fieldRef",
        {"spec.trainer.env": [{"name": "T", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]},
    ),
    _case(
        "model-token-without-key",
        "spec.model.tokenSecretRef.key",
        {"spec.model.tokenSecretRef": {"name": "hf"}},
    ),
    _case(
        "model-token-bad-key",
        "spec.model.tokenSecretRef.key",
        {"spec.model.tokenSecretRef": {"name": "hf", "key": "a/b"}},
    ),
    _case("model-on-rwo-volume", "spec.model.name", {"spec.model.name": "/workspace/models/qwen"}),
    _case(
        "model-on-rwo-existing-claim",
        "spec.model.name",
        {"spec.model.name": "/workspace/models/qwen", "spec.checkpoints.volume": {"existingClaim": "models"}},
    ),
    _case("model-name-is-an-option", "spec.model.name", {"spec.model.name": "--trust-remote-code"}),
    _case("model-name-starts-with-dash", "spec.model.name", {"spec.model.name": "-Qwen/Qwen2.5"}),
    _case(
        "gpu-memory-utilization-0",
        "spec.generation.gpuMemoryUtilization",
        {"spec.generation.gpuMemoryUtilization": 0},
    ),
    _case("trainer-gpus-0", "spec.trainer.gpusPerNode", {"spec.trainer.gpusPerNode": 0}),
    _case("trainer-gpus-above-node", "spec.trainer.gpusPerNode", {"spec.trainer.gpusPerNode": 16}),
    _case("trainer-nodes-0", "spec.trainer.nodes", {"spec.trainer.nodes": 0}),
    _case(
        "batch-not-divisible-by-gpus",
        "spec.grpo.promptsPerStep",
        {"spec.grpo.promptsPerStep": 3, "spec.grpo.groupSize": 2, "spec.trainer.gpusPerNode": 4},
    ),
    _case(
        "batch-not-divisible-by-per-device",
        "spec.grpo.promptsPerStep",
        {"spec.trainer.perDeviceBatchSize": 3},
    ),
    _case(
        "multi-node-rwo-volume",
        "spec.checkpoints.volume.accessMode",
        {"spec.trainer.nodes": 2},
    ),
    _case("model-name-empty", "spec.model.name", {"spec.model.name": ""}),
    _case("model-name-missing", "spec.model.name", {"spec.model": {"revision": "main"}}),
    _case("model-name-with-space", "spec.model.name", {"spec.model.name": "Qwen 2"}),
    _case("model-dtype-unknown", "spec.model.dtype", {"spec.model.dtype": "int8"}),
    _case("metric-image-empty", "spec.metric.image", {"spec.metric.image": ""}),
    _case("metric-missing", "spec.metric", {"spec.metric": _DELETE}),
    _case("metric-port-too-big", "spec.metric.port", {"spec.metric.port": 70000}),
    _case("metric-error-budget-above-1", "spec.metric.errorBudget", {"spec.metric.errorBudget": 1.5}),
    _case(
        "metric-env-duplicate",
        "spec.metric.env",
        {"spec.metric.env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]},
    ),
    _case("metric-env-bad-name", "spec.metric.env[0].name", {"spec.metric.env": [{"name": "9LIVES"}]}),
    _case(
        "pull-secret-bad-name",
        "spec.imagePullSecrets[0].name",
        {"spec.imagePullSecrets": [{"name": "Reg_Cred"}]},
    ),
    _case("pull-secret-no-name", "spec.imagePullSecrets[0].name", {"spec.imagePullSecrets": [{}]}),
    _case(
        "metric-resources-negative",
        "spec.metric.resources.requests.cpu",
        {"spec.metric.resources": {"requests": {"cpu": "-1"}}},
    ),
    _case(
        "metric-resources-not-quantity",
        "spec.metric.resources.limits.memory",
        {"spec.metric.resources": {"limits": {"memory": "lots"}}},
    ),
    _case("dataset-s3", "spec.dataset.train", {"spec.dataset.train": "s3://bucket/train.jsonl"}),
    _case("dataset-relative-file", "spec.dataset.train", {"spec.dataset.train": "file://data/train.jsonl"}),
    _case("dataset-csv", "spec.dataset.train", {"spec.dataset.train": "file:///workspace/train.csv"}),
    _case("dataset-bare-id", "spec.dataset.train", {"spec.dataset.train": "openai/gsm8k"}),
    _case(
        "dataset-validation-http",
        "spec.dataset.validation",
        {"spec.dataset.validation": "https://example.com/val.jsonl"},
    ),
    _case("dataset-train-missing", "spec.dataset.train", {"spec.dataset": {"promptField": "q"}}),
    _case("input-without-source", "spec.inputs[0]", {"spec.inputs": [{"name": "data"}]}),
    _case(
        "input-with-two-sources",
        "spec.inputs[0]",
        {"spec.inputs": [{"name": "data", "configMap": "a", "claim": "b"}]},
    ),
    _case(
        "input-subpath-escapes",
        "spec.inputs[0].subPath",
        {"spec.inputs": [{"name": "m", "claim": "models", "subPath": "a/../../b"}]},
    ),
    _case(
        "input-names-repeat",
        "spec.inputs",
        {"spec.inputs": [{"name": "d", "configMap": "a"}, {"name": "d", "claim": "b"}]},
    ),
    _case(
        "prompt-template-without-placeholder",
        "spec.dataset.promptTemplate",
        {"spec.dataset.promptTemplate": "Solve it."},
    ),
    _case(
        "prompt-template-stray-brace",
        "spec.dataset.promptTemplate",
        {"spec.dataset.promptTemplate": "Q: {prompt} {the answer}"},
    ),
    _case("checkpoints-every-0", "spec.checkpoints.everySteps", {"spec.checkpoints.everySteps": 0}),
    _case(
        "checkpoints-retention-unknown", "spec.checkpoints.retention", {"spec.checkpoints.retention": "Keep"}
    ),
    _case(
        "checkpoints-size-not-quantity",
        "spec.checkpoints.volume.size",
        {"spec.checkpoints.volume": {"size": "big"}},
    ),
    _case(
        "toleration-exists-with-value",
        "spec.scheduling.tolerations[0].value",
        {"spec.scheduling.tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]},
    ),
    _case(
        "toleration-seconds-without-noexecute",
        "spec.scheduling.tolerations[0].tolerationSeconds",
        {"spec.scheduling.tolerations": [{"key": "k", "effect": "NoSchedule", "tolerationSeconds": 5}]},
    ),
    _case("queue-name-invalid", "spec.scheduling.queueName", {"spec.scheduling.queueName": "Team_Queue"}),
    _case("backoff-limit-negative", "spec.runPolicy.backoffLimit", {"spec.runPolicy.backoffLimit": -1}),
    _case("suspend-not-bool", "spec.suspend", {"spec.suspend": "yes"}),
    _case("unknown-grpo-field", "spec.grpo.kl", {"spec.grpo.kl": 0.1}),
    _case("unknown-spec-field", "spec.replicas", {"spec.replicas": 2}),
    _case(
        "unknown-affinity-kind",
        "spec.scheduling.affinity.nodeAfinity",
        {"spec.scheduling.affinity": {"nodeAfinity": {}}},
    ),
    _case("name-too-long", "metadata.name", {}, name="a" * 41),
    _case("name-starts-with-digit", "metadata.name", {}, name="1job"),
    _case("name-with-dot", "metadata.name", {}, name="job.v1"),
    _case("spec-missing", "spec", {"spec": _DELETE}),
    # spec.rollouts: the client sends scored rollouts, so the job has no metric service and no dataset.
    _case("dataset-missing", "spec.dataset", {"spec.dataset": _DELETE}),
    _case("client-with-metric", "spec.metric", {**CLIENT, "spec.metric": {"image": "m:1"}}),
    _case("client-with-dataset", "spec.dataset", {**CLIENT, "spec.dataset": {"train": "hf://a/b"}}),
    _case(
        "client-dynamic-sampling", "spec.grpo.dynamicSampling", {**CLIENT, "spec.grpo.dynamicSampling": True}
    ),
    _case(
        "client-validation",
        "spec.grpo.validation.everySteps",
        {**CLIENT, "spec.grpo.validation": {"everySteps": 5}},
    ),
    _case("rollouts-source-unknown", "spec.rollouts.source", {"spec.rollouts": {"source": "Arbor"}}),
    _case(
        "rollouts-client-with-metric-source",
        "spec.rollouts.client",
        {"spec.rollouts": {"source": "Metric", "client": {}}},
    ),
    _case(
        "rollouts-peer-without-pod-labels",
        "spec.rollouts.client.allowFrom[0].podLabels",
        {**CLIENT, "spec.rollouts.client": {"allowFrom": [{"podLabels": {}}]}},
    ),
    _case(
        "rollouts-peer-bad-label-key",
        "spec.rollouts.client.allowFrom[0].podLabels",
        {**CLIENT, "spec.rollouts.client": {"allowFrom": [{"podLabels": {"bad key": "x"}}]}},
    ),
    _case(
        "rollouts-peer-bad-label-value",
        "spec.rollouts.client.allowFrom[0].namespaceLabels",
        {
            **CLIENT,
            "spec.rollouts.client": {
                "allowFrom": [{"podLabels": {"a": "b"}, "namespaceLabels": {"a": "-x"}}]
            },
        },
    ),
    _case(
        "rollouts-peer-every-namespace",
        "spec.rollouts.client.allowFrom[0].namespaceLabels",
        {**CLIENT, "spec.rollouts.client": {"allowFrom": [{"podLabels": {"a": "b"}, "namespaceLabels": {}}]}},
    ),
    _case(
        "rollouts-token-bad-secret-name",
        "spec.rollouts.client.tokenSecretRef.name",
        {**CLIENT, "spec.rollouts.client": {"tokenSecretRef": {"name": "Not_A_Name", "key": "token"}}},
    ),
]


VALID_CASES: list[Case] = [
    _case("minimal", "", {}),
    _case("client-rollouts-minimal", "", CLIENT),
    _case("metric-rollouts-explicit", "", {"spec.rollouts": {"source": "Metric"}}),
    _case(
        "client-rollouts-peers-and-token",
        "",
        {
            **CLIENT,
            "spec.rollouts.client": {
                "allowFrom": [
                    {"podLabels": {"app": "dspy-notebook"}},
                    {
                        "podLabels": {"app.kubernetes.io/name": "jupyter"},
                        "namespaceLabels": {"kubernetes.io/metadata.name": "notebooks"},
                    },
                ],
                "tokenSecretRef": {"name": "dspy-token", "key": "token"},
            },
        },
    ),
    _case(
        "inputs",
        "",
        {
            "spec.inputs": [
                {"name": "data", "configMap": "gsm8k-sample"},
                {"name": "model", "claim": "team-models", "subPath": "qwen/0.5b"},
            ],
            "spec.dataset.train": "file:///inputs/data/train.jsonl",
            "spec.model.name": "/inputs/model",
        },
    ),
    _case(
        "prompt-format",
        "",
        {
            "spec.dataset.systemPrompt": "End with a line '#### <number>'.",
            "spec.dataset.promptTemplate": 'Q ({level}): {prompt} Reply as {{"answer": n}}',
            "spec.dataset.applyChatTemplate": False,
        },
    ),
    _case("name-40-chars", "", {}, name="a" + "b" * 39),
    _case(
        "realistic-math",
        "",
        {
            "spec.grpo": {"groupSize": 8, "promptsPerStep": 4, "steps": 500, "epsilonHigh": 0.28},
            "spec.trainer": {"gpusPerNode": 2, "perDeviceBatchSize": 4},
            "spec.dataset.validation": "hf://openai/gsm8k:main#test",
            "spec.grpo.validation": {"everySteps": 50},
        },
    ),
    _case(
        "file-datasets",
        "",
        {
            "spec.dataset": {
                "train": "file:///workspace/data/train.jsonl",
                "validation": "file:///workspace/data/val.parquet",
                "promptField": "question",
            }
        },
    ),
    _case(
        "hf-with-revision-and-slice",
        "",
        {"spec.dataset.train": "hf://gsm8k@refs/convert/parquet#train[:90%]"},
    ),
    _case(
        "tensor-parallel-4-of-4",
        "",
        {"spec.generation": {"gpus": 4, "tensorParallelSize": 4, "maxModelLen": 4096}},
    ),
    _case(
        "multi-node-rwx",
        "",
        {
            "spec.grpo": {"groupSize": 16, "promptsPerStep": 8, "steps": 100},
            "spec.trainer": {"nodes": 4, "gpusPerNode": 8},
            "spec.checkpoints": {"volume": {"accessMode": "ReadWriteMany", "size": "1Ti"}},
        },
    ),
    _case(
        "multi-node-existing-claim",
        "",
        {"spec.trainer.nodes": 2, "spec.checkpoints.volume": {"existingClaim": "shared-ckpt"}},
    ),
    _case(
        "lora-and-dr-grpo",
        "",
        {
            "spec.grpo.lora": {"enabled": True, "r": 8, "alpha": 16, "targetModules": ["q_proj", "v_proj"]},
            "spec.grpo.lossType": "dr_grpo",
            "spec.grpo.scaleRewards": "none",
        },
    ),
    _case(
        "scheduling-passthrough",
        "",
        {
            "spec.scheduling": {
                "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                "tolerations": [
                    {"key": "team", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},
                    {"key": "spot", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60},
                ],
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                            ]
                        }
                    }
                },
                "priorityClassName": "high-priority",
                "queueName": "team-a",
            }
        },
    ),
    _case(
        "metric-env-and-resources",
        "",
        {
            "spec.metric": {
                "image": "registry.example.com/team/metric@sha256:" + "a" * 64,
                "env": [{"name": "MODE", "value": "strict"}, {"name": "LOG_LEVEL", "value": "debug"}],
                "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": 2}},
                "errorBudget": 0.0,
            }
        },
    ),
    _case(
        "scores-and-deadlines",
        "",
        {
            "spec.grpo.formatFailureScore": -2,
            "spec.grpo.failureScore": -1.5,
            "spec.runPolicy": {
                "backoffLimit": 0,
                "activeDeadlineSeconds": 86400,
                "ttlSecondsAfterFinished": 0,
            },
            "spec.suspend": True,
        },
    ),
    _case(
        "secrets-and-private-model",
        "",
        {
            "spec.model.tokenSecretRef": {"name": "hf-token", "key": "token"},
            "spec.trainer.env": [
                {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}}},
                {
                    "name": "MODE",
                    "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode", "optional": True}},
                },
                {"name": "EMPTY"},
            ],
            "spec.generation.env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}],
            "spec.metric.env": [
                {"name": "JUDGE_KEY", "valueFrom": {"secretKeyRef": {"name": "judge", "key": "key"}}}
            ],
        },
    ),
    _case(
        "model-on-rwx-volume",
        "",
        {
            "spec.model.name": "/workspace/models/qwen",
            "spec.checkpoints.volume": {"accessMode": "ReadWriteMany"},
        },
    ),
    _case(
        "model-on-rwx-existing-claim",
        "",
        {
            "spec.model.name": "/workspace/models/qwen",
            "spec.checkpoints.volume": {"existingClaim": "models", "accessMode": "ReadWriteMany"},
        },
    ),
    _case("model-in-the-image", "", {"spec.model.name": "/models/qwen"}),
    _case("explicit-null-optional", "", {"spec.grpo.epsilonHigh": None, "spec.dataset.validation": None}),
]


def pydantic_errors(manifest: dict[str, Any]) -> list[str]:
    """The model's verdict on a manifest: [] when valid, otherwise one line per error."""
    try:
        GRPOJob.model_validate(manifest)
    except pydantic.ValidationError as exc:
        return describe_validation_error(exc)
    return []


def test_enough_cases() -> None:
    assert len({c.id for c in INVALID_CASES}) == len(INVALID_CASES) >= 30
    assert len({c.id for c in VALID_CASES}) == len(VALID_CASES) >= 10


@pytest.mark.parametrize("case", INVALID_CASES, ids=lambda c: c.id)
def test_invalid_manifest_rejected_naming_field(case: Case) -> None:
    errors = pydantic_errors(case.manifest)
    assert errors, f"{case.id}: the model accepted an invalid manifest"
    text = "\n".join(errors)
    assert case.field in text, f"{case.id}: expected {case.field!r} in:\n{text}"


@pytest.mark.parametrize("case", VALID_CASES, ids=lambda c: c.id)
def test_valid_manifest_accepted(case: Case) -> None:
    assert pydantic_errors(case.manifest) == []


def test_cross_field_messages_say_the_fix() -> None:
    errors = pydantic_errors(with_changes({"spec.generation": {"gpus": 4, "tensorParallelSize": 2}}))
    assert any(
        "must equal spec.generation.gpus" in e and "Set tensorParallelSize to gpus" in e for e in errors
    )
    errors = pydantic_errors(with_changes({"spec.model.name": "--enforce-eager"}))
    assert any("must not start with '-'" in e for e in errors)
    errors = pydantic_errors(with_changes({"spec.grpo.formatFailureScore": 0.0}))
    assert any("lower formatFailureScore" in e for e in errors)


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
