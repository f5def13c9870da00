"""Every CEL rule has a name, and each one is enforced on both sides.

``RULE_BREAKERS`` holds, for every named rule, a change to a valid manifest that breaks that rule and
nothing else. Here the pydantic model must reject it with exactly that rule; the same manifests go to a
real API server in tests/integration/test_crd_validation.py, which must answer with the rule's message.
So a rule dropped from its validator or from the CRD, a validator raising another rule, or a new rule
without a manifest that breaks it, fails a test.
"""

from __future__ import annotations

from typing import Any, get_args

import pydantic
import pytest
from grpo_operator.api import GRPOJob, GRPOJobSpec
from grpo_operator.api.base import ApiModel, CelRule, CelRules, RuleViolation
from grpo_operator.api.budget import BudgetSpec
from grpo_operator.api.builtin_rewards import BuiltinReward
from grpo_operator.api.resource import NameRules
from grpo_operator.api.rollouts import RolloutsSpec
from grpo_operator.api.spec import (
    EnvVar,
    EnvVarSource,
    GenerationSpec,
    GRPOSpec,
    InputSpec,
    MetricSpec,
    ModelSpec,
    Toleration,
    TrainerSpec,
)
from grpo_operator.api.tracking import MlflowSpec, WandbSpec

from tests.unit.manifests import CLIENT, DELETE, ENVIRONMENT, with_changes

_SECRET = {"secretKeyRef": {"name": "s", "key": "k"}}

RULE_BREAKERS: dict[CelRule, dict[str, Any]] = {
    NameRules.at_most_max_length: {"metadata.name": "a" * 41},
    NameRules.dns1035_label: {"metadata.name": "1job"},
    ModelSpec.Rules.not_an_option: {"spec.model.name": "-Qwen/Qwen2.5"},
    GRPOSpec.Rules.format_failure_below_failure: {
        "spec.grpo.formatFailureScore": 0.0,
        "spec.grpo.failureScore": 0.0,
    },
    GRPOSpec.Rules.epsilon_high_at_least_epsilon: {"spec.grpo.epsilon": 0.2, "spec.grpo.epsilonHigh": 0.1},
    GRPOSpec.Rules.luspo_needs_sequence_level: {"spec.grpo.lossType": "luspo"},
    GRPOSpec.Rules.async_not_with_several_iterations: {
        "spec.grpo.maxStaleness": 1,
        "spec.grpo.numIterations": 2,
    },
    GRPOSpec.Rules.async_not_with_dynamic_sampling: {"spec.grpo.maxStaleness": 1, "spec.grpo.preset": "dapo"},
    GRPOSpec.Rules.async_keeps_the_correction: {
        "spec.grpo.maxStaleness": 2,
        "spec.grpo.vllmImportanceSamplingCorrection": False,
    },
    GRPOSpec.Rules.chat_template_kwargs_not_reserved: {"spec.grpo.chatTemplateKwargs": {"tokenize": "false"}},
    EnvVarSource.Rules.exactly_one_source: {"spec.trainer.env": [{"name": "T", "valueFrom": {}}]},
    EnvVar.Rules.value_or_value_from: {
        "spec.metric.env": [{"name": "T", "value": "x", "valueFrom": _SECRET}]
    },
    MetricSpec.Rules.reward_weight_names: {"spec.metric.rewardWeights": {"Accuracy": 1.0}},
    MetricSpec.Rules.rewards_or_function: {
        "spec.metric.rewards": [{"type": "mathAnswer"}],
        "spec.metric.function": {"configMap": "reward"},
    },
    MetricSpec.Rules.reward_names_unique: {
        "spec.metric.rewards": [{"type": "regex", "pattern": "a"}, {"type": "regex", "pattern": "b"}]
    },
    MetricSpec.Rules.weights_name_rewards: {
        "spec.metric.rewards": [{"type": "mathAnswer"}],
        "spec.metric.rewardWeights": {"accuracy": 1.0},
    },
    BuiltinReward.Rules.regex_needs_pattern: {"spec.metric.rewards": [{"type": "regex"}]},
    MlflowSpec.Rules.uri_when_enabled: {"spec.tracking": {"mlflow": {"experiment": "team-a"}}},
    WandbSpec.Rules.project_when_enabled: {"spec.tracking": {"wandb": {"mode": "offline"}}},
    WandbSpec.Rules.key_when_online: {"spec.tracking": {"wandb": {"project": "grpo"}}},
    BuiltinReward.Rules.length_needs_max_tokens: {"spec.metric.rewards": [{"type": "length"}]},
    BuiltinReward.Rules.max_tokens_is_for_length: {
        "spec.metric.rewards": [{"type": "mathAnswer", "maxTokens": 9}]
    },
    BuiltinReward.Rules.pattern_is_for_regex_or_exact_match: {
        "spec.metric.rewards": [{"type": "mathAnswer", "pattern": "x"}]
    },
    BuiltinReward.Rules.field_is_for_answers: {
        "spec.metric.rewards": [{"type": "regex", "pattern": "x", "field": "answer"}]
    },
    GenerationSpec.Rules.tp_equals_gpus: {"spec.generation": {"gpus": 2, "tensorParallelSize": 1}},
    GenerationSpec.Rules.no_gpus_in_resources: {
        "spec.generation.resources": {"limits": {"nvidia.com/mig-1g.10gb": 1}}
    },
    GenerationSpec.Rules.several_replicas_refuse_nccl: {
        "spec.generation": {"replicas": 2, "weightSync": "NCCL"}
    },
    GenerationSpec.Rules.colocate_is_in_process: {
        "spec.generation": {"mode": "Colocate", "gpus": 2, "tensorParallelSize": 2}
    },
    GenerationSpec.Rules.memory_share_is_colocate: {"spec.generation.colocateMemoryShare": 0.4},
    TrainerSpec.Rules.no_gpus_in_resources: {"spec.trainer.resources": {"requests": {"nvidia.com/gpu": 8}}},
    Toleration.Rules.exists_without_value: {
        "spec.scheduling.tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]
    },
    Toleration.Rules.seconds_need_no_execute: {
        "spec.scheduling.tolerations": [{"key": "k", "effect": "NoSchedule", "tolerationSeconds": 5}]
    },
    InputSpec.Rules.exactly_one_source: {"spec.inputs": [{"name": "d", "configMap": "a", "claim": "b"}]},
    InputSpec.Rules.sub_path_needs_claim: {"spec.inputs": [{"name": "d", "configMap": "a", "subPath": "x"}]},
    InputSpec.Rules.sub_path_inside_claim: {
        "spec.inputs": [{"name": "m", "claim": "c", "subPath": "a/../b"}]
    },
    BudgetSpec.Rules.sets_a_limit: {"spec.budget": {"warnAtPercent": 90}},
    GRPOJobSpec.Rules.batch_divides_evenly: {"spec.trainer.perDeviceBatchSize": 3},
    GRPOJobSpec.Rules.validation_needs_dataset: {"spec.grpo.validation": {"everySteps": 10}},
    GRPOJobSpec.Rules.model_on_volume_needs_rwx: {"spec.model.name": "/workspace/models/qwen"},
    GRPOJobSpec.Rules.volume_weight_sync_needs_rwx: {"spec.generation.weightSync": "Volume"},
    GRPOJobSpec.Rules.multi_node_needs_rwx: {"spec.trainer.nodes": 2},
    GRPOJobSpec.Rules.metric_required: {"spec.metric": DELETE},
    GRPOJobSpec.Rules.dataset_required: {"spec.dataset": DELETE},
    GRPOJobSpec.Rules.no_metric_with_client: {**CLIENT, "spec.metric": {"image": "m:1"}},
    GRPOJobSpec.Rules.no_dataset_with_client: {**CLIENT, "spec.dataset": {"train": "hf://a/b"}},
    GRPOJobSpec.Rules.no_dynamic_sampling_with_client: {**CLIENT, "spec.grpo.dynamicSampling": True},
    GRPOJobSpec.Rules.no_validation_with_client: {**CLIENT, "spec.grpo.validation": {"everySteps": 5}},
    GRPOJobSpec.Rules.no_iterations_with_client: {**CLIENT, "spec.grpo.numIterations": 2},
    GRPOJobSpec.Rules.no_async_with_client: {**CLIENT, "spec.grpo.maxStaleness": 1},
    GRPOJobSpec.Rules.colocate_not_with_client: {**CLIENT, "spec.generation.mode": "Colocate"},
    GRPOJobSpec.Rules.colocate_context_fits: {"spec.generation": {"mode": "Colocate", "maxModelLen": 64}},
    GRPOJobSpec.Rules.colocate_not_asynchronous: {
        "spec.generation.mode": "Colocate",
        "spec.grpo.maxStaleness": 1,
    },
    GRPOJobSpec.Rules.no_sampling_knobs_with_client: {**CLIENT, "spec.grpo.topK": 20},
    GRPOJobSpec.Rules.vespo_needs_token_correction: {"spec.grpo.lossType": "vespo"},
    TrainerSpec.Rules.offload_needs_fsdp: {"spec.trainer.cpuOffload": True},
    GRPOJobSpec.Rules.fsdp_not_with_lora: {
        "spec.trainer.sharding": "FSDP",
        "spec.grpo.lora": {"enabled": True},
    },
    GRPOJobSpec.Rules.fsdp_not_colocated: {
        "spec.trainer.sharding": "FSDP",
        "spec.generation.mode": "Colocate",
    },
    GRPOJobSpec.Rules.fsdp_not_asynchronous: {"spec.trainer.sharding": "FSDP", "spec.grpo.maxStaleness": 1},
    GRPOJobSpec.Rules.fsdp_not_with_client: {**CLIENT, "spec.trainer.sharding": "FSDP"},
    RolloutsSpec.Rules.client_only_for_client: {"spec.rollouts": {"source": "Metric", "client": {}}},
    GRPOJobSpec.Rules.environment_not_with_client: {
        **CLIENT,
        "spec.environment": ENVIRONMENT["spec.environment"],
    },
    GRPOJobSpec.Rules.environment_not_colocated: {**ENVIRONMENT, "spec.generation.mode": "Colocate"},
}


def _models(annotation: Any, found: dict[type[ApiModel], None]) -> None:
    """Every API model reachable from ``annotation`` through field types (lists, optionals, maps)."""
    if isinstance(annotation, type) and issubclass(annotation, ApiModel) and annotation not in found:
        found[annotation] = None
        for field in annotation.model_fields.values():
            _models(field.annotation, found)
    for arg in get_args(annotation):
        _models(arg, found)


def rule_owners() -> dict[type[CelRules], str]:
    """The rule classes of the CRD: each model's under spec, and the job name's at the root."""
    found: dict[type[ApiModel], None] = {}
    _models(GRPOJobSpec, found)
    owners: dict[type[CelRules], str] = {model.Rules: model.__name__ for model in found if list(model.Rules)}
    owners[NameRules] = "NameRules"
    return owners


def rule_id(rule: CelRule) -> str:
    """``<Model>.<rule name>``, for test ids and failure messages."""
    owner = next(name for rules, name in rule_owners().items() if any(r is rule for r in rules))
    return f"{owner}.{rule.name}"


def test_every_rule_has_a_manifest_that_breaks_it() -> None:
    named = {rule for rules in rule_owners() for rule in rules}
    missing = sorted(rule_id(r) for r in named - set(RULE_BREAKERS))
    assert missing == [], f"add a manifest to RULE_BREAKERS that breaks only: {missing}"
    assert set(RULE_BREAKERS) <= named


def test_rule_names_are_unique_and_bound() -> None:
    for rules, owner in rule_owners().items():
        names = [rule.name for rule in rules]
        assert None not in names, owner
        assert len(set(names)) == len(names), f"{owner}: {names}"
        for rule in rules:
            assert getattr(rules, str(rule.name)) is rule


def test_a_name_cannot_hold_two_rules() -> None:
    with pytest.raises(TypeError, match="two CEL rules are named 'same'"):

        class _Twice(CelRules):
            same = CelRule("self.a > 0", "a must be positive")
            same = CelRule("self.b > 0", "b must be positive")


def test_a_rule_cannot_belong_to_two_models() -> None:
    with pytest.raises((TypeError, RuntimeError)) as info:

        class _Again(CelRules):
            tp = GenerationSpec.Rules.tp_equals_gpus

    # Python 3.11 wraps an error raised in __set_name__ in a RuntimeError; 3.12 raises it as is.
    error = info.value.__cause__ if isinstance(info.value, RuntimeError) else info.value
    assert "bound a second time" in str(error) and "._Again.tp:" in str(error)
    assert GenerationSpec.Rules.tp_equals_gpus.name == "tp_equals_gpus"


@pytest.mark.parametrize("rule", list(RULE_BREAKERS), ids=rule_id)
def test_the_validator_raises_the_rule_it_names(rule: CelRule) -> None:
    with pytest.raises(pydantic.ValidationError) as info:
        GRPOJob.model_validate(with_changes(RULE_BREAKERS[rule]))
    errors = info.value.errors()
    assert len(errors) == 1
    cause = (errors[0].get("ctx") or {}).get("error")
    assert isinstance(cause, RuleViolation) and cause.rule is rule
    message = errors[0]["msg"].removeprefix("Value error, ")
    # A rule with a message expression adds this job's numbers after its fixed message.
    assert message == rule.message if rule.message_expression is None else message.startswith(rule.message)


def test_the_divisibility_error_gives_the_numbers() -> None:
    with pytest.raises(pydantic.ValidationError) as info:
        GRPOJob.model_validate(
            with_changes(
                {"spec.grpo.promptsPerStep": 6, "spec.grpo.groupSize": 3, "spec.trainer.gpusPerNode": 4}
            )
        )
    assert info.value.errors()[0]["msg"].endswith(
        ". Here B*G = 6*3 = 18 and the data-parallel batch is 1*4*1 = 4"
    )
