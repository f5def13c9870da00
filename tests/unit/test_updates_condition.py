"""status.updates, which trainer rank 0 writes after every optimizer step, becomes the UpdatesEffective
condition, with one Warning event UpdatesVanishing naming the likely cause when the updates vanish. The
section is the tenant's trainer's words: anything outside its model is ignored."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.reconcile_world import events, running_world

VANISHING: dict[str, Any] = {
    "checkedStep": 9,
    "updateRatio": 2.1e-6,
    "updatedFraction": 0.004,
    "weightDtype": "bfloat16",
    "learningRate": 1e-6,
    "vanishing": True,
    "vanishingSteps": 3,
    "cause": "Precision",
}


def test_updates_that_apply_are_a_true_condition_without_events() -> None:
    world = running_world()
    world.job["status"]["updates"] = {**VANISHING, "vanishing": False, "vanishingSteps": 0, "cause": None}
    plan = world.step()
    condition = world.condition("UpdatesEffective")
    assert condition["status"] == "True" and condition["reason"] == "UpdatesApplied"
    assert ("Warning", "UpdatesVanishing") not in events(plan)


def test_vanishing_updates_are_a_false_condition_and_one_warning_naming_the_precision_fix() -> None:
    world = running_world()
    world.job["status"]["updates"] = dict(VANISHING)
    plan = world.step()
    condition = world.condition("UpdatesEffective")
    assert condition["status"] == "False" and condition["reason"] == "UpdatesVanishing"
    message = condition["message"]
    assert "since step 7" in message and "bfloat16" in message and "1e-06" in message
    assert "spec.model.dtype: float32" in message and "spec.grpo.learningRate" in message
    assert events(plan).count(("Warning", "UpdatesVanishing")) == 1
    # Posted when the condition turns False, not on every reconcile while it stays so.
    world.job["status"]["updates"] = {**VANISHING, "checkedStep": 10, "vanishingSteps": 4}
    assert ("Warning", "UpdatesVanishing") not in events(world.step())
    # Moving again: True, and a later relapse warns again.
    world.job["status"]["updates"] = {**VANISHING, "vanishing": False, "cause": None}
    world.step()
    assert world.condition("UpdatesEffective")["status"] == "True"
    world.job["status"]["updates"] = dict(VANISHING)
    assert events(world.step()).count(("Warning", "UpdatesVanishing")) == 1


@pytest.mark.parametrize(
    ("cause", "words"),
    [
        ("LearningRate", ("learning rate 1e-06 is too small", "Raise spec.grpo.learningRate")),
        ("TiedGroups", ("every group's rewards were equal", "dynamicSampling")),
        ("TruncatedCompletionsMasked", ("maxCompletionLength", "maskTruncatedCompletions off")),
    ],
)
def test_each_cause_has_its_own_explanation(cause: str, words: tuple[str, ...]) -> None:
    world = running_world()
    world.job["status"]["updates"] = {**VANISHING, "weightDtype": "float32", "cause": cause}
    world.step()
    message = world.condition("UpdatesEffective")["message"]
    assert all(word in message for word in words), message


@pytest.mark.parametrize(
    "forged",
    [
        {**VANISHING, "cause": "Anything\x1b[31m you like"},
        {**VANISHING, "updatedFraction": 7},
        {**VANISHING, "vanishingSteps": -1},
        {**VANISHING, "weightDtype": "x" * 5000},
        {**VANISHING, "surprise": 1},
        "vanishing",
        ["vanishing"],
    ],
)
def test_a_report_outside_the_model_is_ignored(forged: Any) -> None:
    world = running_world()
    world.job["status"]["updates"] = forged
    plan = world.step()
    assert all(c["type"] != "UpdatesEffective" for c in world.status()["conditions"])
    assert ("Warning", "UpdatesVanishing") not in events(plan)


def test_no_report_yet_means_no_condition() -> None:
    world = running_world()
    world.step()
    assert all(c["type"] != "UpdatesEffective" for c in world.status()["conditions"])
