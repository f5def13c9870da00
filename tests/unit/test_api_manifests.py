"""Valid and invalid GRPOJob manifests (tests/unit/valid_manifests.py, tests/unit/invalid_manifests.py),
checked against the pydantic models.

The same cases run against a real API server in tests/integration/test_crd_validation.py: a manifest
is rejected by both, naming the same field, or accepted by both with the same defaults.
"""

from __future__ import annotations

from typing import Any

import pydantic
import pytest
from grpo_operator.api import GRPOJob, describe_validation_error

from tests.unit.invalid_manifests import INVALID_CASES
from tests.unit.manifests import Case, with_changes
from tests.unit.valid_manifests import VALID_CASES


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
    assert any("must equal spec.generation.gpus" in e and "Leave tensorParallelSize out" in e for e in errors)
    errors = pydantic_errors(with_changes({"spec.model.name": "--enforce-eager"}))
    assert any("must not start with '-'" in e for e in errors)
    errors = pydantic_errors(with_changes({"spec.grpo.formatFailureScore": 0.0}))
    assert any("lower formatFailureScore" in e for e in errors)
