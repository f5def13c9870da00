"""status.learning, trainer rank 0's learning-health diagnosis, becomes the LearningHealthy condition with
one event per change of diagnosis. The section is the tenant's trainer's words: anything outside its model
is ignored, and messages are built from its typed fields."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.reconcile_world import events, running_world

NO_SIGNAL: dict[str, Any] = {
    "reason": "NoSignal",
    "healthy": False,
    "sinceStep": 7,
    "checkedStep": 9,
    "windowSteps": 5,
    "figures": {"tiedGroupRatio": 0.95, "tiedReward": 0.0, "bestReward": 1.0},
}
HEALTHY: dict[str, Any] = {
    "reason": "Healthy",
    "healthy": True,
    "sinceStep": 1,
    "checkedStep": 9,
    "windowSteps": 5,
    "figures": {"rewardMean": 0.4, "tiedGroupRatio": 0.1},
}


def test_a_healthy_job_has_a_true_condition_and_no_event() -> None:
    world = running_world()
    world.job["status"]["learning"] = dict(HEALTHY)
    plan = world.step()
    condition = world.condition("LearningHealthy")
    assert condition["status"] == "True" and condition["reason"] == "Healthy"
    assert not [e for e in events(plan) if e[1] in ("NotLearning", "LearningSolved", "LearningRecovered")]
    # The figures move every step; the condition does not, so it costs no status write.
    world.job["status"]["learning"] = {**HEALTHY, "checkedStep": 10, "figures": {"rewardMean": 0.5}}
    assert world.step().status is None or "conditions" not in (world.step().status or {})


def test_a_diagnosis_is_a_false_condition_and_one_warning_with_the_setting_to_change() -> None:
    world = running_world()
    world.job["status"]["learning"] = dict(HEALTHY)
    world.step()
    world.job["status"]["learning"] = dict(NO_SIGNAL)
    plan = world.step()
    condition = world.condition("LearningHealthy")
    assert condition["status"] == "False" and condition["reason"] == "NoSignal"
    message = condition["message"]
    assert message.startswith("Not learning (NoSignal) since step 7: 95% of groups tied")
    assert "spec.grpo.dynamicSampling" in message
    assert events(plan).count(("Warning", "NotLearning")) == 1
    # No event storm: the same diagnosis with new figures posts nothing and keeps the message.
    world.job["status"]["learning"] = {**NO_SIGNAL, "checkedStep": 10, "figures": {"tiedGroupRatio": 1.0}}
    assert ("Warning", "NotLearning") not in events(world.step())
    assert world.condition("LearningHealthy")["message"] == message
    # Another diagnosis is another warning; recovery is one Normal event.
    world.job["status"]["learning"] = {**NO_SIGNAL, "reason": "KLRunaway", "figures": {"kl": 2.5}}
    plan = world.step()
    assert events(plan).count(("Warning", "NotLearning")) == 1
    assert "2.5 nats" in world.condition("LearningHealthy")["message"]
    world.job["status"]["learning"] = dict(HEALTHY)
    plan = world.step()
    assert ("Normal", "LearningRecovered") in events(plan)
    assert world.condition("LearningHealthy")["status"] == "True"


def test_solved_is_healthy_and_says_to_stop_or_use_harder_prompts() -> None:
    world = running_world()
    world.job["status"]["learning"] = {
        **HEALTHY,
        "reason": "Solved",
        "figures": {"tiedGroupRatio": 1.0, "bestReward": 1.0},
    }
    plan = world.step()
    condition = world.condition("LearningHealthy")
    assert condition["status"] == "True" and condition["reason"] == "Solved"
    assert "stop early" in condition["message"] and "harder dataset" in condition["message"]
    assert ("Normal", "LearningSolved") in events(plan)


@pytest.mark.parametrize(
    "forged",
    [
        {**NO_SIGNAL, "reason": "Anything\x1b[31m you like"},
        {**NO_SIGNAL, "figures": {"tiedGroupRatio": "\x1b[2J"}},
        {**NO_SIGNAL, "figures": {"surprise": 1}},
        {**NO_SIGNAL, "sinceStep": -1},
        {**NO_SIGNAL, "figures": {"kl": 1e300}},
        "NoSignal",
        ["NoSignal"],
        None,
    ],
)
def test_a_forged_learning_status_sets_no_condition(forged: Any) -> None:
    world = running_world()
    world.job["status"]["learning"] = forged
    plan = world.step()
    assert not [c for c in world.job["status"].get("conditions") or [] if c["type"] == "LearningHealthy"]
    assert ("Warning", "NotLearning") not in events(plan)
