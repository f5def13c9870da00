"""The three places a user reads which child changes are batched (the setting's comment, the Helm value's
comment, docs/operations.md) name exactly the kinds the child-kind record batches."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from grpo_operator.builders.child_kinds import CHILD_KINDS, Wake

REPO = Path(__file__).resolve().parents[2]
DESCRIPTIONS = [
    REPO / "operator" / "grpo_operator" / "settings.py",
    REPO / "helm" / "grpo-operator" / "values.yaml",
    REPO / "docs" / "operations.md",
]


def batched_phrase() -> str:
    return " and ".join(sorted(k.plural for k in CHILD_KINDS if k.wake is Wake.BATCHED))


def test_the_record_batches_deployments_and_pods() -> None:
    # If this changes, so must the descriptions below; the test after this one checks them.
    assert batched_phrase() == "deployments and pods"


@pytest.mark.parametrize("path", DESCRIPTIONS, ids=lambda p: p.name)
def test_each_description_names_exactly_the_batched_kinds(path: Path) -> None:
    text = " ".join(line.strip(" #-") for line in path.read_text(encoding="utf-8").splitlines())
    found = re.findall(r"A change to a job's ([a-z ,]+?) (?:is reconciled|reconciles)", text)
    assert found, f"{path.relative_to(REPO)} no longer says which child changes are batched"
    assert set(found) == {batched_phrase()}, (
        f"{path.relative_to(REPO)} says {found} are batched; the child-kind record batches {batched_phrase()}"
    )
