"""status.servedModel, which trainer rank 0 writes after each weight sync, becomes the ServedModelInSync
condition, with one Warning event when the served model drifts from the trained one."""

from __future__ import annotations

from tests.unit.reconcile_world import events, running_world


def test_a_served_model_in_sync_is_a_true_condition_without_events() -> None:
    world = running_world()
    world.job["status"]["servedModel"] = {"inSync": True, "checkedStep": 4, "logprobDiff": 0.012}
    plan = world.step()
    condition = world.condition("ServedModelInSync")
    assert condition["status"] == "True" and condition["reason"] == "LogprobsMatch"
    assert "step 4" in condition["message"] and "0.0120" in condition["message"]
    assert ("Warning", "ServedModelDrift") not in events(plan)


def test_drift_is_a_false_condition_and_one_warning_event_naming_the_fix() -> None:
    world = running_world()
    world.job["status"]["servedModel"] = {
        "inSync": False,
        "checkedStep": 7,
        "logprobDiff": 0.93,
        "message": "vLLM is not serving\x1b[31m the weights being trained",
    }
    plan = world.step()
    condition = world.condition("ServedModelInSync")
    assert condition["status"] == "False" and condition["reason"] == "ServedModelDrift"
    assert "step 7" in condition["message"] and "0.9300" in condition["message"]
    assert "spec.generation.weightSync" in condition["message"]
    assert "\x1b" not in condition["message"] and "not serving[31m the weights" in condition["message"]
    assert events(plan).count(("Warning", "ServedModelDrift")) == 1
    # Posted when the condition turns False, not on every reconcile while it stays so.
    assert ("Warning", "ServedModelDrift") not in events(world.step())


def test_no_report_yet_means_no_condition() -> None:
    world = running_world()
    world.step()
    assert all(c["type"] != "ServedModelInSync" for c in world.status()["conditions"])
