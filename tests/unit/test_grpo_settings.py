"""The one table of where each spec.grpo setting goes (api/grpo_settings.py): complete, and what the trainer
hands TRL and what users are told TRL's names are both come from it."""

from __future__ import annotations

from typing import Any

from grpo_operator.api.advice import TRL_NAMES
from grpo_operator.api.compat import wire_name
from grpo_operator.api.grpo_settings import GRPO_SETTINGS
from grpo_operator.api.grpo_spec import GRPOSpec
from grpo_operator.api.trainer_config import TrainerConfig
from grpo_trainer.grpo_config import grpo_config_kwargs, plan_batches

from tests.unit.test_config_mapping import spec

# A value for every setting TRL's default applies to until the spec sets it.
WHEN_SET: dict[str, Any] = {
    "topK": 20,
    "minP": 0.05,
    "repetitionPenalty": 1.1,
    "chatTemplateKwargs": {"enable_thinking": "false"},
    "importanceSamplingLevel": "sequence",
    "numIterations": 2,
    "maskTruncatedCompletions": True,
    "vllmImportanceSamplingCorrection": True,
    "vllmImportanceSamplingMode": "token_truncate",
    "vllmImportanceSamplingCap": 3.0,
}


def test_every_field_of_spec_grpo_has_exactly_one_row() -> None:
    rows = [s.field for s in GRPO_SETTINGS]
    assert sorted(rows) == sorted(set(rows)), "a field with two rows"
    missing = sorted(set(GRPOSpec.model_fields) - set(rows))
    assert not missing, (
        f"spec.grpo fields with no row in grpo_settings.GRPO_SETTINGS: {missing}. Say which TRL GRPOConfig "
        "field each becomes (always, or when_set), or that it is the trainer's own and where it is used"
    )
    assert set(rows) <= set(GRPOSpec.model_fields)
    for setting in GRPO_SETTINGS:
        assert bool(setting.trl) == (setting.passing != "own"), setting.field
        assert setting.passing != "own" or setting.note, f"{setting.field}: say where the trainer uses it"


def _kwargs(**grpo: Any) -> dict[str, Any]:
    config = TrainerConfig.from_spec(
        "team",
        "math",
        None,
        spec(**grpo),
        metric_url="http://m:8080",
        generation_host="g",
        backend="vllm-server",
    )
    return grpo_config_kwargs(config, plan_batches(64, 8, 8, 8), cuda=False)


def test_the_trainer_hands_trl_each_setting_as_the_table_says() -> None:
    unset, chosen = _kwargs(), _kwargs(**WHEN_SET)
    grpo = TrainerConfig.from_spec(
        "team",
        "math",
        None,
        spec(**WHEN_SET),
        metric_url="http://m:8080",
        generation_host="g",
        backend="vllm-server",
    ).grpo
    assert {wire_name(s.field) for s in GRPO_SETTINGS if s.passing == "when_set"} == set(WHEN_SET)
    for setting in GRPO_SETTINGS:
        for name in setting.trl:
            if setting.passing == "always":
                assert name in unset, name
            elif setting.passing == "when_set":
                # Unset: TRL's own default applies.
                assert name not in unset, name
                assert chosen[name] == setting.value_of(grpo), name
    assert chosen["chat_template_kwargs"] == {"enable_thinking": False}
    assert chosen["vllm_importance_sampling_clip_max"] == 3.0 and unset["data_seed"] == unset["seed"] == 42


def test_users_are_told_trls_names_from_the_same_table() -> None:
    for setting in GRPO_SETTINGS:
        for name in (*setting.trl, *setting.trl_aliases):
            assert TRL_NAMES[name] == f"spec.grpo.{wire_name(setting.field)}"
