"""reconcile on a running gang when time or the operator itself intervenes: deadlines and stalls, and an
operator killed half-way through a pass (the rest of the failure cases are in test_reconcile_failures.py)."""

from __future__ import annotations

import pytest
from grpo_operator.reconcile.conditions import format_time

from tests.unit.reconcile_world import (
    CKPT,
    World,
    assert_second_gang_resumes_from_checkpoint,
    env,
    events,
    job_object,
    running_world,
)

# --- operator restarts mid-way --------------------------------------------------------------------------------


def test_killed_after_the_status_patch_of_a_restart_converges_without_a_second_restart() -> None:
    world = running_world()
    world.job["status"]["checkpoint"] = {"lastStep": 50, "path": CKPT}
    world.terminate("math-trainer-1-1", 1, "boom")
    plan = world.reconcile()
    world.apply(plan, deletes=False, creates=0)  # only the status patch landed
    plan = world.step()
    assert world.status()["restarts"] == 1
    assert world.status()["trainerAttempt"] == 2
    assert {r.name for r in plan.deletes} == {"math-gen-1-0", "math-trainer-1-0", "math-trainer-1-1"}
    plan = world.step()
    assert_second_gang_resumes_from_checkpoint(plan)
    assert world.settle().is_empty()
    assert len(world.pods()) == 3


def test_killed_half_way_through_creating_pods_creates_only_the_rest() -> None:
    world = World(job_object())
    plan = world.reconcile()
    world.apply(plan, creates=1)
    plan = world.reconcile()
    assert [m["metadata"]["name"] for m in plan.creates] == ["math-trainer-1-0", "math-trainer-1-1"]
    assert plan.status is None
    world.apply(plan)
    assert world.reconcile().is_empty()


def test_missing_pods_keep_the_resume_point_of_their_gang() -> None:
    world = running_world()
    world.job["status"]["checkpoint"] = {"lastStep": 50, "path": CKPT}
    world.terminate("math-trainer-1-0", 1)
    world.step()  # the restart: the old gang is deleted
    restart = world.reconcile()
    world.apply(restart, creates=2)  # gen + rank 0 created with RESUME_FROM=CKPT, then killed
    world.job["status"]["checkpoint"] = {"lastStep": 60, "path": "/workspace/checkpoints/step-60"}
    plan = world.reconcile()
    (rank1,) = plan.creates
    assert rank1["metadata"]["name"] == "math-trainer-2-1"
    assert env(rank1)["RESUME_FROM"] == CKPT, "every rank of one gang resumes from the same checkpoint"


# --- deadlines -----------------------------------------------------------------------------------------------


def test_startup_deadline_fails_a_gang_that_never_runs() -> None:
    world = World(job_object(runPolicy={"startupDeadlineSeconds": 600}))
    world.step()
    pod = world.pod("math-trainer-1-1")
    pod["status"]["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/3 nodes are available",
        }
    ]
    plan = world.step()
    assert plan.requeue_after == pytest.approx(600)
    world.advance(599)
    assert world.step().status is None
    world.advance(2)
    plan = world.step()
    assert world.status()["phase"] == "Failed"
    assert world.status()["reason"] == "StartupDeadlineExceeded"
    assert "0/3 nodes are available" in world.status()["message"]
    assert events(plan) == [("Warning", "Failed")]


def test_active_deadline_fails_the_job() -> None:
    world = running_world(runPolicy={"activeDeadlineSeconds": 3600})
    world.advance(1800)
    assert world.reconcile().requeue_after == pytest.approx(1800)
    world.advance(1800)
    world.step()
    assert world.status()["phase"] == "Failed"
    assert world.status()["reason"] == "DeadlineExceeded"


def test_no_step_advance_is_a_stall_and_a_counted_restart() -> None:
    world = running_world(runPolicy={"progressDeadlineSeconds": 900})
    world.advance(600)
    world.job["status"]["progress"] = {"step": 3, "totalSteps": 500, "lastStepTime": format_time(world.now)}
    plan = world.reconcile()
    assert plan.is_empty()
    assert plan.requeue_after == pytest.approx(900)
    world.advance(899)
    assert world.reconcile().is_empty()
    world.advance(2)
    plan = world.step()
    assert world.status()["reason"] == "ProgressDeadlineExceeded"
    assert world.status()["restarts"] == 1
    assert "last step 3" in world.status()["message"]
    assert plan.restart is not None and plan.restart.counted


def test_progress_clock_starts_when_the_new_gang_runs() -> None:
    world = running_world(runPolicy={"progressDeadlineSeconds": 900})
    world.job["status"]["progress"] = {"step": 3, "lastStepTime": format_time(world.now)}
    world.terminate("math-trainer-1-0", 1)
    world.step()
    world.step()
    world.advance(2000)  # the new gang took long to start; the old lastStepTime must not count
    world.run_all()
    world.step()
    assert world.status()["phase"] == "Running"
    world.advance(100)
    assert world.reconcile().is_empty()
