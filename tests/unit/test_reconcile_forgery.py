"""reconcile against a forged or garbled status: the operator trusts its own record, not what a trainer wrote."""

from __future__ import annotations

from typing import Any

import pytest
from grpo_operator.reconcile.conditions import format_time

from tests.unit.reconcile_world import (
    T0,
    World,
    foreign,
    job_object,
    running_world,
)


def forge(world: World, **fields: Any) -> None:
    """What tenant code with the trainer's ServiceAccount can do: merge-patch the job's status."""
    world.job.setdefault("status", {}).update(fields)


def test_a_forged_restart_count_does_not_reset_the_backoff_budget() -> None:
    world = running_world(runPolicy={"backoffLimit": 1})
    world.terminate("math-trainer-1-0", 1, "loss is NaN")
    world.settle()
    world.run_all()
    world.settle()
    assert world.status()["restarts"] == 1
    forge(world, restarts=0)
    plan = world.reconcile()
    assert plan.status == {"restarts": 1}, "the forged value is written back"
    world.terminate("math-trainer-2-0", 1, "loss is NaN again")
    world.step()
    assert world.status()["phase"] == "Failed" and world.status()["reason"] == "BackoffLimitExceeded"


def test_a_forged_attempt_or_phase_does_not_mislead_the_operator() -> None:
    world = running_world()
    forge(world, trainerAttempt=99, phase="Succeeded", completionTime=format_time(world.now))
    plan = world.step()
    assert not plan.deletes and not plan.creates, "the running gang of attempt 1 is left alone"
    status = world.status()
    assert status["trainerAttempt"] == 1 and status["phase"] == "Running"
    assert "completionTime" not in status
    forge(world, phase="Failed", conditions=[*status["conditions"], {"type": "Failed", "status": "True"}])
    world.step()
    assert world.status()["phase"] == "Running"
    assert all(c["type"] != "Failed" for c in world.status()["conditions"])
    assert world.reconcile().is_empty()


def test_a_forged_start_time_does_not_escape_the_active_deadline() -> None:
    world = running_world(runPolicy={"activeDeadlineSeconds": 3600})
    forge(world, startTime="2099-01-01T00:00:00Z")
    world.advance(3600)
    world.step()
    assert world.status()["phase"] == "Failed" and world.status()["reason"] == "DeadlineExceeded"


@pytest.mark.parametrize(
    "garbage",
    [
        {"restarts": "many", "trainerAttempt": -4, "phase": "Hacked", "startTime": "yesterday"},
        {"conditions": "none", "progress": "lots", "checkpoint": ["x"], "rewards": 7},
        {"conditions": [1, None, {"type": "Running"}, {"type": "Evil", "status": "True"}]},
        {"checkpoint": {"lastStep": "fifty", "path": {"nested": True}}, "progress": {"lastStepTime": 12}},
        {"restarts": True, "trainerAttempt": 1.5, "completionTime": None, "message": ["m"], "reason": 3},
    ],
)
def test_garbage_in_the_status_never_crashes_a_reconcile(garbage: dict[str, Any]) -> None:
    world = running_world()
    before = {k: world.status()[k] for k in ("phase", "restarts", "trainerAttempt", "startTime")}
    forge(world, **garbage)
    world.step()
    status = world.status()
    assert {k: status[k] for k in before} == before
    assert all(isinstance(c, dict) and c["type"] != "Evil" for c in status["conditions"])
    assert world.reconcile().is_empty()
    world.terminate("math-trainer-1-0", 1)
    world.step()
    assert world.status()["trainerAttempt"] == 2 and world.status()["restarts"] == 1


def test_an_unreadable_record_falls_back_to_the_status() -> None:
    world = running_world()
    world.job["metadata"]["annotations"]["grpo.dev/status-record"] = "{not json"
    plan = world.reconcile()
    assert plan.record is not None and plan.record["trainerAttempt"] == 1
    assert plan.status is None


def test_a_predecessors_pod_still_terminating_only_delays_the_new_job() -> None:
    world = World(job_object())
    world.job["metadata"]["uid"] = "uid-2"
    old = foreign("Pod", "math-trainer-1-0", deletionTimestamp=format_time(T0))
    old["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "grpo.dev/v1alpha1",
            "kind": "GRPOJob",
            "name": "math",
            "uid": "uid-1",
            "controller": True,
        }
    ]
    world.objects[("Pod", "math-trainer-1-0")] = old
    plan = world.step()
    assert not plan.creates and not plan.deletes
    assert "still being deleted" in world.condition("Conflict")["message"]
    del world.objects[("Pod", "math-trainer-1-0")]
    assert len(world.step().creates) == 3
