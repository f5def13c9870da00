"""Upgrading the operator must not disturb the jobs it already runs: fields added to the spec after the first
release (grpo_operator.api.compat.LATER_FIELDS) change neither the gang hash nor trainer.json while they
hold their defaults, so no running gang restarts and an older trainer image (pinned in a job's
spec.trainer.image, and strict about unknown keys) still reads its config."""

from __future__ import annotations

import json

import pytest
from grpo_operator.api import TrainerConfig
from grpo_operator.api.compat import LATER_FIELDS, wire_name
from grpo_operator.builders import gang_hash, job_from_object
from grpo_operator.builders.config import trainer_config_text
from grpo_operator.builders.gang import gang_hash_input
from grpo_operator.settings import OperatorSettings

from tests.unit.test_reconcile import job_object

LATER_KEYS = {"applyChatTemplate", "scorePath"}


def keys(value: object) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in keys(v)}
    return set()


def test_every_later_field_is_known_here() -> None:
    assert {wire_name(path[-1]) for path, _ in LATER_FIELDS} == LATER_KEYS


def test_defaults_leave_trainer_json_and_the_gang_hash_as_they_were() -> None:
    job = job_from_object(job_object())
    text = trainer_config_text(job, OperatorSettings())
    assert not keys(json.loads(text)) & LATER_KEYS
    dataset = TrainerConfig.model_validate_json(text).dataset
    assert dataset is not None and dataset.apply_chat_template is True  # the new trainer's default
    hashed = gang_hash_input(job)
    assert not keys(hashed) & LATER_KEYS and "inputs" not in hashed


@pytest.mark.parametrize(
    "spec",
    [
        {"dataset": {"applyChatTemplate": False}},
        {"dataset": {"systemPrompt": "Answer with ####."}},
        {"grpo": {"validation": {"everySteps": 0, "scorePath": "/validate"}}},
        {"inputs": [{"name": "data", "configMap": "prompts"}]},
    ],
)
def test_a_field_set_away_from_its_default_reaches_the_trainer_and_restarts_the_gang(
    spec: dict[str, object],
) -> None:
    base = job_from_object(job_object())
    job = job_from_object(job_object(**spec))
    assert gang_hash(job) != gang_hash(base)
    if "inputs" not in spec:
        assert trainer_config_text(job, OperatorSettings()) != trainer_config_text(base, OperatorSettings())
