"""Manifests the API must accept: the small job and every feature on top of it."""

from __future__ import annotations

from tests.unit.manifests import CLIENT, ENVIRONMENT, Case, case

VALID_CASES: list[Case] = [
    case("minimal", "", {}),
    case("client-rollouts-minimal", "", CLIENT),
    case("metric-rollouts-explicit", "", {"spec.rollouts": {"source": "Metric"}}),
    case(
        "every-tracker",
        "",
        {
            "spec.tracking": {
                "tensorBoard": {"enabled": True},
                "mlflow": {
                    "trackingUri": "http://mlflow.mlflow.svc:5000",
                    "credentialsSecret": "mlflow-auth",
                },
                "wandb": {
                    "project": "grpo",
                    "entity": "ml-team",
                    "apiKeySecretRef": {"name": "wandb", "key": "apiKey"},
                },
            }
        },
    ),
    case(
        "trackers-turned-off",
        "",
        {"spec.tracking": {"mlflow": {"enabled": False}, "wandb": {"enabled": False}}},
    ),
    case(
        "wandb-offline-without-key", "", {"spec.tracking": {"wandb": {"project": "grpo", "mode": "offline"}}}
    ),
    case(
        "several-vllm-replicas",
        "",
        {
            "spec.generation": {"replicas": 4, "weightSync": "Volume", "gpus": 2, "tensorParallelSize": 2},
            "spec.checkpoints": {"volume": {"accessMode": "ReadWriteMany"}},
        },
    ),
    case(
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
    case(
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
    case(
        "prompt-format",
        "",
        {
            "spec.dataset.systemPrompt": "End with a line '#### <number>'.",
            "spec.dataset.promptTemplate": 'Q ({level}): {prompt} Reply as {{"answer": n}}',
            "spec.dataset.applyChatTemplate": False,
        },
    ),
    case("name-40-chars", "", {}, name="a" + "b" * 39),
    case(
        "realistic-math",
        "",
        {
            "spec.grpo": {"groupSize": 8, "promptsPerStep": 4, "steps": 500, "epsilonHigh": 0.28},
            "spec.trainer": {"gpusPerNode": 2, "perDeviceBatchSize": 4},
            "spec.dataset.validation": "hf://openai/gsm8k:main#test",
            "spec.grpo.validation": {"everySteps": 50},
        },
    ),
    case(
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
    case(
        "hf-with-revision-and-slice",
        "",
        {"spec.dataset.train": "hf://gsm8k@refs/convert/parquet#train[:90%]"},
    ),
    case(
        "tensor-parallel-4-of-4",
        "",
        {"spec.generation": {"gpus": 4, "tensorParallelSize": 4, "maxModelLen": 4096}},
    ),
    case("tensor-parallel-follows-gpus", "", {"spec.generation.gpus": 2}),
    case(
        "builtin-rewards-weighted",
        "",
        {
            "spec.metric": {
                "image": "ghcr.io/grpo-operator/metric-builtin:0.1.0",
                "rewards": [
                    {"type": "mathAnswer", "field": "solution"},
                    {"type": "regex", "pattern": "^<think>.*</think>"},
                    {"type": "exactMatch", "name": "label", "pattern": "Answer: (\\w+)"},
                    {"type": "length", "maxTokens": 512},
                ],
                "rewardWeights": {"math_answer": 1.0, "format": 0.2, "length": 0.1},
            }
        },
    ),
    case(
        "function-from-a-configmap",
        "",
        {
            "spec.metric": {
                "image": "ghcr.io/grpo-operator/metric-builtin:0.1.0",
                "function": {"configMap": "team-reward", "key": "reward.py", "name": "score"},
            }
        },
    ),
    case(
        "multi-node-rwx",
        "",
        {
            "spec.grpo": {"groupSize": 16, "promptsPerStep": 8, "steps": 100},
            "spec.trainer": {"nodes": 4, "gpusPerNode": 8},
            "spec.checkpoints": {"volume": {"accessMode": "ReadWriteMany", "size": "1Ti"}},
        },
    ),
    case(
        "multi-node-existing-claim",
        "",
        {"spec.trainer.nodes": 2, "spec.checkpoints.volume": {"existingClaim": "shared-ckpt"}},
    ),
    case(
        "lora-and-dr-grpo",
        "",
        {
            "spec.grpo.lora": {"enabled": True, "r": 8, "alpha": 16, "targetModules": ["q_proj", "v_proj"]},
            "spec.grpo.lossType": "dr_grpo",
            "spec.grpo.scaleRewards": "none",
        },
    ),
    case("preset-dapo", "", {"spec.grpo.preset": "dapo"}),
    case("preset-dr-grpo-overridden", "", {"spec.grpo.preset": "dr-grpo", "spec.grpo.scaleRewards": "batch"}),
    case("preset-gspo-reusing-batches", "", {"spec.grpo.preset": "gspo", "spec.grpo.numIterations": 2}),
    # The preset's dynamic sampling is left out where the client samples.
    case("client-preset-dapo", "", {**CLIENT, "spec.grpo.preset": "dapo"}),
    case(
        "client-vespo-and-chat-template",
        "",
        {
            **CLIENT,
            "spec.grpo.lossType": "vespo",
            "spec.grpo.chatTemplateKwargs": {"enable_thinking": "false"},
        },
    ),
    case("cispo-clip", "", {"spec.grpo.lossType": "cispo", "spec.grpo.epsilonHigh": 5.0}),
    case(
        "luspo-sequence-level",
        "",
        {"spec.grpo.lossType": "luspo", "spec.grpo.importanceSamplingLevel": "sequence"},
    ),
    case(
        "vespo-token-correction",
        "",
        {"spec.grpo.lossType": "vespo", "spec.grpo.vllmImportanceSamplingMode": "token_truncate"},
    ),
    case("sapo", "", {"spec.grpo.lossType": "sapo"}),
    case(
        "sampling-and-correction-knobs",
        "",
        {
            "spec.grpo.topK": 50,
            "spec.grpo.minP": 0.05,
            "spec.grpo.repetitionPenalty": 1.05,
            "spec.grpo.chatTemplateKwargs": {"enable_thinking": "false", "reasoning_effort": "low"},
            "spec.grpo.maskTruncatedCompletions": True,
            "spec.grpo.numIterations": 4,
            "spec.grpo.vllmImportanceSamplingCorrection": True,
            "spec.grpo.vllmImportanceSamplingMode": "token_truncate",
            "spec.grpo.vllmImportanceSamplingCap": 2.0,
        },
    ),
    case(
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
    case(
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
    case(
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
    case(
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
    case(
        "model-on-rwx-volume",
        "",
        {
            "spec.model.name": "/workspace/models/qwen",
            "spec.checkpoints.volume": {"accessMode": "ReadWriteMany"},
        },
    ),
    case(
        "model-on-rwx-existing-claim",
        "",
        {
            "spec.model.name": "/workspace/models/qwen",
            "spec.checkpoints.volume": {"existingClaim": "models", "accessMode": "ReadWriteMany"},
        },
    ),
    case("model-in-the-image", "", {"spec.model.name": "/models/qwen"}),
    case("budget-gpu-hours", "", {"spec.budget": {"gpuHours": 12.5}}),
    case("budget-whole-gpu-hours-and-warning", "", {"spec.budget": {"gpuHours": 500, "warnAtPercent": 100}}),
    case("explicit-null-optional", "", {"spec.grpo.epsilonHigh": None, "spec.dataset.validation": None}),
    case("environment-minimal", "", ENVIRONMENT),
    case(
        "environment-sandboxed-with-egress",
        "",
        {
            **ENVIRONMENT,
            "spec.environment": {
                "image": "ghcr.io/example/coder-env:1.0",
                "port": 8001,
                "replicas": 2,
                "runtimeClassName": "gvisor",
                "egressCidrs": ["10.40.0.0/16", "2001:db8::/32"],
                "maxTurns": 4,
                "maxTurnTokens": 256,
                "actionFormat": "ToolCall",
                "observationRole": "tool",
                "reward": "Sum",
            },
        },
    ),
]
