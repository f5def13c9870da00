"""Manifests the API must reject, each with the field the error must name (as written in the manifest)."""

from __future__ import annotations

from tests.unit.manifests import CLIENT, DELETE, ENVIRONMENT, Case, case

INVALID_CASES: list[Case] = [
    case("group-size-1", "spec.grpo.groupSize", {"spec.grpo.groupSize": 1}),
    case("group-size-0", "spec.grpo.groupSize", {"spec.grpo.groupSize": 0}),
    case("group-size-too-big", "spec.grpo.groupSize", {"spec.grpo.groupSize": 512}),
    case("group-size-string", "spec.grpo.groupSize", {"spec.grpo.groupSize": "8"}),
    case("group-size-float", "spec.grpo.groupSize", {"spec.grpo.groupSize": 8.5}),
    case("prompts-per-step-0", "spec.grpo.promptsPerStep", {"spec.grpo.promptsPerStep": 0}),
    case("steps-0", "spec.grpo.steps", {"spec.grpo.steps": 0}),
    case("steps-missing", "spec.grpo.steps", {"spec.grpo.steps": DELETE}),
    case("temperature-0", "spec.grpo.temperature", {"spec.grpo.temperature": 0}),
    case("temperature-negative", "spec.grpo.temperature", {"spec.grpo.temperature": -0.5}),
    case("top-p-0", "spec.grpo.topP", {"spec.grpo.topP": 0.0}),
    case("top-p-above-1", "spec.grpo.topP", {"spec.grpo.topP": 1.5}),
    case("learning-rate-0", "spec.grpo.learningRate", {"spec.grpo.learningRate": 0}),
    case("beta-negative", "spec.grpo.beta", {"spec.grpo.beta": -0.1}),
    case(
        "format-failure-equals-failure",
        "spec.grpo.formatFailureScore",
        {"spec.grpo.formatFailureScore": 0.0, "spec.grpo.failureScore": 0.0},
    ),
    case(
        "format-failure-above-failure",
        "spec.grpo.formatFailureScore",
        {"spec.grpo.formatFailureScore": 1.0, "spec.grpo.failureScore": 0.5},
    ),
    case(
        "epsilon-high-below-epsilon",
        "spec.grpo.epsilonHigh",
        {"spec.grpo.epsilon": 0.2, "spec.grpo.epsilonHigh": 0.1},
    ),
    case("loss-type-unknown", "spec.grpo.lossType", {"spec.grpo.lossType": "ppo"}),
    case("preset-unknown", "spec.grpo.preset", {"spec.grpo.preset": "ppo"}),
    # The preset's epsilonHigh (0.28) counts where the spec leaves it unset.
    case(
        "preset-epsilon-high-below-epsilon",
        "spec.grpo.epsilonHigh",
        {"spec.grpo.preset": "dapo", "spec.grpo.epsilon": 0.3},
    ),
    case(
        "gspo-clip-below-epsilon",
        "spec.grpo.epsilonHigh",
        {"spec.grpo.preset": "gspo", "spec.grpo.epsilon": 0.2},
    ),
    case("luspo-token-level", "spec.grpo.importanceSamplingLevel", {"spec.grpo.lossType": "luspo"}),
    case(
        "vespo-sequence-correction",
        "spec.grpo.vllmImportanceSamplingMode",
        {"spec.grpo.lossType": "vespo", "spec.grpo.vllmImportanceSamplingMode": "sequence_mask"},
    ),
    case(
        "importance-sampling-level-unknown",
        "spec.grpo.importanceSamplingLevel",
        {"spec.grpo.importanceSamplingLevel": "group"},
    ),
    case("num-iterations-0", "spec.grpo.numIterations", {"spec.grpo.numIterations": 0}),
    case("num-iterations-above-8", "spec.grpo.numIterations", {"spec.grpo.numIterations": 9}),
    case(
        "mask-truncated-not-bool",
        "spec.grpo.maskTruncatedCompletions",
        {"spec.grpo.maskTruncatedCompletions": "yes"},
    ),
    case("top-k-negative", "spec.grpo.topK", {"spec.grpo.topK": -1}),
    case("min-p-above-1", "spec.grpo.minP", {"spec.grpo.minP": 1.5}),
    case("repetition-penalty-0", "spec.grpo.repetitionPenalty", {"spec.grpo.repetitionPenalty": 0}),
    case(
        "chat-template-kwargs-bool",
        "spec.grpo.chatTemplateKwargs.enable_thinking",
        {"spec.grpo.chatTemplateKwargs": {"enable_thinking": False}},
    ),
    case(
        "chat-template-kwargs-reserved",
        "spec.grpo.chatTemplateKwargs",
        {"spec.grpo.chatTemplateKwargs": {"add_generation_prompt": "false"}},
    ),
    case(
        "chat-template-kwargs-too-many",
        "spec.grpo.chatTemplateKwargs",
        {"spec.grpo.chatTemplateKwargs": {f"k{i}": "x" for i in range(17)}},
    ),
    case(
        "vllm-is-mode-unknown",
        "spec.grpo.vllmImportanceSamplingMode",
        {"spec.grpo.vllmImportanceSamplingMode": "token"},
    ),
    case(
        "vllm-is-cap-1", "spec.grpo.vllmImportanceSamplingCap", {"spec.grpo.vllmImportanceSamplingCap": 1.0}
    ),
    case("scale-rewards-unknown", "spec.grpo.scaleRewards", {"spec.grpo.scaleRewards": "batchwise"}),
    case("lora-rank-0", "spec.grpo.lora.r", {"spec.grpo.lora": {"enabled": True, "r": 0}}),
    case("lora-no-target-modules", "spec.grpo.lora.targetModules", {"spec.grpo.lora": {"targetModules": []}}),
    case(
        "validation-without-dataset",
        "spec.grpo.validation.everySteps",
        {"spec.grpo.validation": {"everySteps": 10}},
    ),
    case("generation-gpus-0", "spec.generation.gpus", {"spec.generation.gpus": 0}),
    case("generation-gpus-above-node", "spec.generation.gpus", {"spec.generation.gpus": 9}),
    case(
        "generation-replicas-0",
        "spec.generation.replicas",
        {"spec.generation": {"replicas": 0, "weightSync": "Volume"}},
    ),
    case(
        "generation-replicas-above-16",
        "spec.generation.replicas",
        {"spec.generation": {"replicas": 17, "weightSync": "Volume"}},
    ),
    case(
        "tensor-parallel-not-dividing",
        "spec.generation.tensorParallelSize",
        {"spec.generation": {"gpus": 3, "tensorParallelSize": 2}},
    ),
    case(
        "data-parallel-generation",
        "spec.generation.tensorParallelSize",
        {"spec.generation": {"gpus": 8, "tensorParallelSize": 4}},
    ),
    case(
        "builtin-reward-of-no-type",
        "spec.metric.rewards[0].type",
        {"spec.metric.rewards": [{"type": "fuzzyMatch"}]},
    ),
    case(
        "function-configmap-not-a-name",
        "spec.metric.function.configMap",
        {"spec.metric.function": {"configMap": "Team_Reward"}},
    ),
    case(
        "colocate-with-generation-gpus",
        "spec.generation.mode",
        {"spec.generation": {"mode": "Colocate", "gpus": 2}},
    ),
    case(
        "env-value-and-value-from",
        "spec.trainer.env[0].valueFrom",
        {
            "spec.trainer.env": [
                {"name": "T", "value": "x", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
            ]
        },
    ),
    case(
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
    case(
        "env-value-from-empty",
        "spec.generation.env[0].valueFrom",
        {"spec.generation.env": [{"name": "T", "valueFrom": {}}]},
    ),
    case(
        "env-secret-bad-name",
        "spec.trainer.env[0].valueFrom.secretKeyRef.name",
        {
            "spec.trainer.env": [
                {"name": "T", "valueFrom": {"secretKeyRef": {"name": "My_Secret", "key": "k"}}}
            ]
        },
    ),
    case(
        "env-value-from-field-ref",
        "spec.trainer.env[0].valueFrom.fieldRef",
        {"spec.trainer.env": [{"name": "T", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]},
    ),
    case(
        "model-token-without-key",
        "spec.model.tokenSecretRef.key",
        {"spec.model.tokenSecretRef": {"name": "hf"}},
    ),
    case(
        "model-token-bad-key",
        "spec.model.tokenSecretRef.key",
        {"spec.model.tokenSecretRef": {"name": "hf", "key": "a/b"}},
    ),
    case("model-on-rwo-volume", "spec.model.name", {"spec.model.name": "/workspace/models/qwen"}),
    case(
        "model-on-rwo-existing-claim",
        "spec.model.name",
        {"spec.model.name": "/workspace/models/qwen", "spec.checkpoints.volume": {"existingClaim": "models"}},
    ),
    case("model-name-is-an-option", "spec.model.name", {"spec.model.name": "--trust-remote-code"}),
    case("model-name-starts-with-dash", "spec.model.name", {"spec.model.name": "-Qwen/Qwen2.5"}),
    case(
        "gpu-memory-utilization-0",
        "spec.generation.gpuMemoryUtilization",
        {"spec.generation.gpuMemoryUtilization": 0},
    ),
    case("trainer-gpus-0", "spec.trainer.gpusPerNode", {"spec.trainer.gpusPerNode": 0}),
    case("trainer-gpus-above-node", "spec.trainer.gpusPerNode", {"spec.trainer.gpusPerNode": 16}),
    case("trainer-nodes-0", "spec.trainer.nodes", {"spec.trainer.nodes": 0}),
    case(
        "batch-not-divisible-by-gpus",
        "spec.grpo.promptsPerStep",
        {"spec.grpo.promptsPerStep": 3, "spec.grpo.groupSize": 2, "spec.trainer.gpusPerNode": 4},
    ),
    case(
        "batch-not-divisible-by-per-device",
        "spec.grpo.promptsPerStep",
        {"spec.trainer.perDeviceBatchSize": 3},
    ),
    case(
        "multi-node-rwo-volume",
        "spec.checkpoints.volume.accessMode",
        {"spec.trainer.nodes": 2},
    ),
    case("model-name-empty", "spec.model.name", {"spec.model.name": ""}),
    case("model-name-missing", "spec.model.name", {"spec.model": {"revision": "main"}}),
    case("model-name-with-space", "spec.model.name", {"spec.model.name": "Qwen 2"}),
    case("model-dtype-unknown", "spec.model.dtype", {"spec.model.dtype": "int8"}),
    case("metric-image-empty", "spec.metric.image", {"spec.metric.image": ""}),
    case("metric-missing", "spec.metric", {"spec.metric": DELETE}),
    case("metric-port-too-big", "spec.metric.port", {"spec.metric.port": 70000}),
    case("metric-error-budget-above-1", "spec.metric.errorBudget", {"spec.metric.errorBudget": 1.5}),
    case(
        "metric-env-duplicate",
        "spec.metric.env",
        {"spec.metric.env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]},
    ),
    case("metric-env-bad-name", "spec.metric.env[0].name", {"spec.metric.env": [{"name": "9LIVES"}]}),
    case(
        "pull-secret-bad-name",
        "spec.imagePullSecrets[0].name",
        {"spec.imagePullSecrets": [{"name": "Reg_Cred"}]},
    ),
    case("pull-secret-no-name", "spec.imagePullSecrets[0].name", {"spec.imagePullSecrets": [{}]}),
    case(
        "metric-resources-negative",
        "spec.metric.resources.requests.cpu",
        {"spec.metric.resources": {"requests": {"cpu": "-1"}}},
    ),
    case(
        "metric-resources-not-quantity",
        "spec.metric.resources.limits.memory",
        {"spec.metric.resources": {"limits": {"memory": "lots"}}},
    ),
    case("dataset-s3", "spec.dataset.train", {"spec.dataset.train": "s3://bucket/train.jsonl"}),
    case("dataset-relative-file", "spec.dataset.train", {"spec.dataset.train": "file://data/train.jsonl"}),
    case("dataset-csv", "spec.dataset.train", {"spec.dataset.train": "file:///workspace/train.csv"}),
    case("dataset-bare-id", "spec.dataset.train", {"spec.dataset.train": "openai/gsm8k"}),
    case(
        "dataset-validation-http",
        "spec.dataset.validation",
        {"spec.dataset.validation": "https://example.com/val.jsonl"},
    ),
    case("dataset-train-missing", "spec.dataset.train", {"spec.dataset": {"promptField": "q"}}),
    case("input-without-source", "spec.inputs[0]", {"spec.inputs": [{"name": "data"}]}),
    case(
        "input-with-two-sources",
        "spec.inputs[0]",
        {"spec.inputs": [{"name": "data", "configMap": "a", "claim": "b"}]},
    ),
    case(
        "input-subpath-escapes",
        "spec.inputs[0].subPath",
        {"spec.inputs": [{"name": "m", "claim": "models", "subPath": "a/../../b"}]},
    ),
    case(
        "input-names-repeat",
        "spec.inputs",
        {"spec.inputs": [{"name": "d", "configMap": "a"}, {"name": "d", "claim": "b"}]},
    ),
    case(
        "prompt-template-without-placeholder",
        "spec.dataset.promptTemplate",
        {"spec.dataset.promptTemplate": "Solve it."},
    ),
    case(
        "prompt-template-stray-brace",
        "spec.dataset.promptTemplate",
        {"spec.dataset.promptTemplate": "Q: {prompt} {the answer}"},
    ),
    case("checkpoints-every-0", "spec.checkpoints.everySteps", {"spec.checkpoints.everySteps": 0}),
    case(
        "checkpoints-retention-unknown", "spec.checkpoints.retention", {"spec.checkpoints.retention": "Keep"}
    ),
    case(
        "checkpoints-size-not-quantity",
        "spec.checkpoints.volume.size",
        {"spec.checkpoints.volume": {"size": "big"}},
    ),
    case(
        "toleration-exists-with-value",
        "spec.scheduling.tolerations[0].value",
        {"spec.scheduling.tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]},
    ),
    case(
        "toleration-seconds-without-noexecute",
        "spec.scheduling.tolerations[0].tolerationSeconds",
        {"spec.scheduling.tolerations": [{"key": "k", "effect": "NoSchedule", "tolerationSeconds": 5}]},
    ),
    case("queue-name-invalid", "spec.scheduling.queueName", {"spec.scheduling.queueName": "Team_Queue"}),
    case("backoff-limit-negative", "spec.runPolicy.backoffLimit", {"spec.runPolicy.backoffLimit": -1}),
    case("suspend-not-bool", "spec.suspend", {"spec.suspend": "yes"}),
    case("unknown-grpo-field", "spec.grpo.kl", {"spec.grpo.kl": 0.1}),
    case("unknown-spec-field", "spec.replicas", {"spec.replicas": 2}),
    case(
        "unknown-affinity-kind",
        "spec.scheduling.affinity.nodeAfinity",
        {"spec.scheduling.affinity": {"nodeAfinity": {}}},
    ),
    case("name-too-long", "metadata.name", {}, name="a" * 41),
    case("name-starts-with-digit", "metadata.name", {}, name="1job"),
    case("name-with-dot", "metadata.name", {}, name="job.v1"),
    case("spec-missing", "spec", {"spec": DELETE}),
    # spec.rollouts: the client sends scored rollouts, so the job has no metric service and no dataset.
    case("dataset-missing", "spec.dataset", {"spec.dataset": DELETE}),
    case("client-with-metric", "spec.metric", {**CLIENT, "spec.metric": {"image": "m:1"}}),
    case("client-with-dataset", "spec.dataset", {**CLIENT, "spec.dataset": {"train": "hf://a/b"}}),
    case(
        "client-dynamic-sampling", "spec.grpo.dynamicSampling", {**CLIENT, "spec.grpo.dynamicSampling": True}
    ),
    case(
        "client-validation",
        "spec.grpo.validation.everySteps",
        {**CLIENT, "spec.grpo.validation": {"everySteps": 5}},
    ),
    case("client-num-iterations", "spec.grpo.numIterations", {**CLIENT, "spec.grpo.numIterations": 2}),
    case("client-min-p", "spec.grpo", {**CLIENT, "spec.grpo.minP": 0.05}),
    case(
        "client-importance-sampling-correction",
        "spec.grpo",
        {**CLIENT, "spec.grpo.vllmImportanceSamplingCorrection": False},
    ),
    case("rollouts-source-unknown", "spec.rollouts.source", {"spec.rollouts": {"source": "Arbor"}}),
    case(
        "rollouts-client-with-metric-source",
        "spec.rollouts.client",
        {"spec.rollouts": {"source": "Metric", "client": {}}},
    ),
    case(
        "rollouts-peer-without-pod-labels",
        "spec.rollouts.client.allowFrom[0].podLabels",
        {**CLIENT, "spec.rollouts.client": {"allowFrom": [{"podLabels": {}}]}},
    ),
    case(
        "rollouts-peer-bad-label-key",
        "spec.rollouts.client.allowFrom[0].podLabels",
        {**CLIENT, "spec.rollouts.client": {"allowFrom": [{"podLabels": {"bad key": "x"}}]}},
    ),
    case(
        "rollouts-peer-bad-label-value",
        "spec.rollouts.client.allowFrom[0].namespaceLabels",
        {
            **CLIENT,
            "spec.rollouts.client": {
                "allowFrom": [{"podLabels": {"a": "b"}, "namespaceLabels": {"a": "-x"}}]
            },
        },
    ),
    case(
        "rollouts-peer-every-namespace",
        "spec.rollouts.client.allowFrom[0].namespaceLabels",
        {**CLIENT, "spec.rollouts.client": {"allowFrom": [{"podLabels": {"a": "b"}, "namespaceLabels": {}}]}},
    ),
    case(
        "rollouts-token-bad-secret-name",
        "spec.rollouts.client.tokenSecretRef.name",
        {**CLIENT, "spec.rollouts.client": {"tokenSecretRef": {"name": "Not_A_Name", "key": "token"}}},
    ),
    case(
        "mlflow-uri-not-http",
        "spec.tracking.mlflow.trackingUri",
        {"spec.tracking": {"mlflow": {"trackingUri": "file:///tmp/mlruns"}}},
    ),
    case(
        "environment-egress-not-a-cidr",
        "spec.environment.egressCidrs[0]",
        {**ENVIRONMENT, "spec.environment": {"image": "e:1", "egressCidrs": ["10.0.0.1"]}},
    ),
    case(
        "environment-too-many-turns",
        "spec.environment.maxTurns",
        {**ENVIRONMENT, "spec.environment": {"image": "e:1", "maxTurns": 65}},
    ),
    # spec.budget (issue 49): the cap the operator suspends the job at.
    case("budget-gpu-hours-0", "spec.budget.gpuHours", {"spec.budget": {"gpuHours": 0}}),
    case("budget-gpu-hours-negative", "spec.budget.gpuHours", {"spec.budget": {"gpuHours": -5}}),
    case("budget-gpu-hours-text", "spec.budget.gpuHours", {"spec.budget": {"gpuHours": "100"}}),
    case("budget-without-a-limit", "spec.budget.gpuHours", {"spec.budget": {"warnAtPercent": 90}}),
    case(
        "budget-warn-at-0", "spec.budget.warnAtPercent", {"spec.budget": {"gpuHours": 10, "warnAtPercent": 0}}
    ),
    case(
        "budget-warn-above-100",
        "spec.budget.warnAtPercent",
        {"spec.budget": {"gpuHours": 10, "warnAtPercent": 101}},
    ),
    case(
        "budget-warn-fraction",
        "spec.budget.warnAtPercent",
        {"spec.budget": {"gpuHours": 10, "warnAtPercent": 80.5}},
    ),
    case(
        "environment-action-field-not-a-name",
        "spec.environment.actionField",
        {**ENVIRONMENT, "spec.environment": {"image": "e:1", "actionField": "a-b"}},
    ),
]
