"""docs/coming-from-trl.md and `kubectl grpo check` name TRL settings: each must be a field of the TRL
release the trainer pins (or an argument of its GRPOTrainer), so a rename in TRL shows up here rather
than in a user's confusion."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
from grpo_operator.api.advice import TRL_NAMES
from trl.trainer.grpo_config import GRPOConfig
from trl.trainer.grpo_trainer import GRPOTrainer

pytestmark = pytest.mark.trainer


def test_every_trl_name_is_a_grpo_config_field_or_trainer_argument() -> None:
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    arguments = set(inspect.signature(GRPOTrainer.__init__).parameters)
    assert sorted(set(TRL_NAMES) - fields - arguments) == []
