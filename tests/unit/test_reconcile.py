"""reconcile(job, observed, now, settings) -> Plan: a new job, suspend and resume, success, spec changes, idempotence.

The tests keep the cluster's state as plain data (the job object and its children) and apply each
plan to it the way the API server would, so "running reconcile again changes nothing" and "an
operator killed half-way converges" are checked on the real decision code.
"""

from __future__ import annotations

import copy

import pytest
from grpo_operator.reconcile import OWNED_STATUS_FIELDS
from grpo_operator.reconcile.conditions import format_time
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.reconcile_world import (
    CKPT,
    T0,
    World,
    env,
    events,
    job_object,
    running_world,
)


def test_new_job_creates_every_child_and_the_first_gang() -> None:
    world = World(job_object())
    plan = world.reconcile()
    assert plan.status is not None
    assert plan.status["trainerAttempt"] == 1
    assert plan.status["phase"] == "Pending"
    assert plan.status["restarts"] == 0
    assert plan.status["rollouts"] == 500 * 4 * 8
    assert plan.status["startTime"] == format_time(T0)
    assert plan.status["observedGeneration"] == 1
    applied = {(m["kind"], m["metadata"]["name"]) for m in plan.applies}
    assert ("ConfigMap", "math-config") in applied
    assert ("PersistentVolumeClaim", "math-ckpt") in applied
    assert ("Deployment", "math-metric") in applied
    assert [m["metadata"]["name"] for m in plan.creates] == [
        "math-gen-1-0",
        "math-trainer-1-0",
        "math-trainer-1-1",
    ]
    assert events(plan) == [("Normal", "Created")]
    assert not plan.deletes


def test_reconcile_is_idempotent_at_every_stage() -> None:
    world = World(job_object())
    world.apply(world.reconcile())
    assert world.reconcile().is_empty(), "a second reconcile after the first plan must change nothing"
    world.schedule_all()
    world.step()
    assert world.status()["phase"] == "Initializing"
    assert world.reconcile().is_empty()
    world.run_all()
    plan = world.step()
    assert world.status()["phase"] == "Running"
    assert events(plan) == [("Normal", "Running")]
    assert world.reconcile().is_empty()


def test_status_patches_never_touch_the_trainers_fields() -> None:
    world = running_world()
    world.job["status"]["progress"] = {"step": 10, "totalSteps": 500, "lastStepTime": format_time(world.now)}
    world.job["status"]["rewards"] = {"mean": 0.4}
    world.job["status"]["checkpoint"] = {"lastStep": 50, "path": CKPT}
    world.terminate("math-trainer-1-1", 1, "boom")
    world.settle()
    world.advance(3600 * 10)
    world.settle()
    for plan in world.plans:
        assert set((plan.status or {}).keys()) <= set(OWNED_STATUS_FIELDS)
    assert world.status()["rewards"] == {"mean": 0.4}
    assert world.status()["checkpoint"]["path"] == CKPT


def test_deleted_job_needs_nothing_from_the_operator() -> None:
    world = running_world()
    world.job["metadata"]["deletionTimestamp"] = format_time(world.now)
    assert world.reconcile().is_empty()


def test_stale_pods_of_earlier_attempts_are_removed() -> None:
    world = running_world()
    old = copy.deepcopy(world.pod("math-trainer-1-0"))
    old["metadata"]["name"] = "math-trainer-0-0"
    old["metadata"]["labels"]["grpo.dev/attempt"] = "0"
    world.objects[("Pod", "math-trainer-0-0")] = old
    plan = world.reconcile()
    assert [r.name for r in plan.deletes] == ["math-trainer-0-0"]
    assert plan.status is None


# --- why pending -------------------------------------------------------------------------------------------


def test_suspend_stops_all_pods_and_resume_continues_from_the_checkpoint() -> None:
    world = running_world()
    world.job["status"]["checkpoint"] = {"lastStep": 50, "path": CKPT}
    world.terminate("math-trainer-1-1", 1)
    world.settle()
    world.run_all()
    world.settle()
    assert world.status()["restarts"] == 1
    world.job["spec"]["suspend"] = True
    plan = world.step()
    assert world.status()["phase"] == "Suspended"
    assert world.condition("Suspended")["status"] == "True"
    assert {r.name for r in plan.deletes} == {
        "math-gen-2-0",
        "math-trainer-2-0",
        "math-trainer-2-1",
        "math-metric",
    }
    assert ("Normal", "Suspended") in events(plan)
    assert ("PersistentVolumeClaim", "math-ckpt") in world.objects
    assert world.status()["checkpoint"]["path"] == CKPT
    assert world.reconcile().is_empty()
    world.advance(3600)
    world.job["spec"]["suspend"] = False
    plan = world.step()
    assert world.status()["trainerAttempt"] == 3
    assert world.status()["restarts"] == 1, "suspend/resume is not a failure"
    assert world.condition("Suspended")["status"] == "False"
    assert ("Normal", "Resumed") in events(plan) and ("Normal", "ResumedFromCheckpoint") in events(plan)
    trainers = [m for m in plan.creates if "trainer" in m["metadata"]["name"]]
    assert [env(p)["RESUME_FROM"] for p in trainers] == [CKPT, CKPT]
    assert any(m["kind"] == "Deployment" for m in plan.applies)
    world.run_all()
    world.settle()
    assert world.status()["phase"] == "Running"


def test_job_created_suspended_starts_on_resume() -> None:
    world = World(job_object(suspend=True))
    world.settle()
    assert world.status()["phase"] == "Suspended"
    assert not world.pods()
    world.job["spec"]["suspend"] = False
    world.settle()
    assert [p["metadata"]["name"] for p in world.pods()] == [
        "math-gen-1-0",
        "math-trainer-1-0",
        "math-trainer-1-1",
    ]


def test_rank_zero_success_completes_the_job_and_stops_the_rest() -> None:
    world = running_world(runPolicy={"ttlSecondsAfterFinished": 600})
    world.job["status"]["progress"] = {"step": 500, "totalSteps": 500}
    world.terminate("math-trainer-1-0", 0)
    plan = world.step()
    status = world.status()
    assert status["phase"] == "Succeeded"
    assert status["completionTime"] == format_time(world.now)
    assert "500/500" in status["message"]
    assert world.condition("Succeeded")["status"] == "True"
    assert ("Normal", "Succeeded") in events(plan)
    assert {r.name for r in plan.deletes} == {"math-gen-1-0", "math-trainer-1-1", "math-metric"}
    assert plan.requeue_after == pytest.approx(600)
    assert world.reconcile().is_empty()
    world.advance(600)
    assert world.reconcile().delete_job


def test_finished_jobs_stay_finished() -> None:
    world = running_world()
    world.terminate("math-trainer-1-0", 0)
    world.settle()
    world.job["spec"]["suspend"] = True
    assert world.reconcile().is_empty()
    assert world.status()["phase"] == "Succeeded"


# --- spec changes ---------------------------------------------------------------------------------------------


def test_a_spec_change_that_shapes_the_pods_replaces_the_gang_uncounted() -> None:
    world = running_world()
    world.job["spec"]["generation"] = {"image": "vllm/vllm-openai:v0.30.0"}
    world.job["metadata"]["generation"] = 2
    plan = world.step()
    assert world.status()["reason"] == "SpecChanged"
    assert world.status()["restarts"] == 0
    assert world.status()["observedGeneration"] == 2
    plan = world.step()
    gen = next(m for m in plan.creates if m["metadata"]["name"] == "math-gen-2-0")
    assert gen["spec"]["containers"][0]["image"] == "vllm/vllm-openai:v0.30.0"


def test_a_metric_change_updates_the_deployment_without_touching_the_gang() -> None:
    world = running_world()
    world.job["spec"]["metric"]["image"] = "ghcr.io/grpo-operator/metric-math:0.2.0"
    plan = world.step()
    assert [m["kind"] for m in plan.applies] == ["Deployment"]
    assert not plan.creates and not plan.deletes
    assert world.status()["phase"] == "Running"


def test_a_metric_deployment_scaled_to_zero_by_hand_is_scaled_back() -> None:
    world = running_world()
    world.objects[("Deployment", "math-metric")]["spec"]["replicas"] = 0
    plan = world.step()
    applied = [m for m in plan.applies if m["kind"] == "Deployment"]
    assert applied and applied[0]["spec"]["replicas"] == 1
    assert not plan.creates and not plan.deletes
    assert world.step().applies == []  # once restored, nothing more to do


def test_retention_change_updates_the_volume_owner() -> None:
    world = running_world()
    world.job["spec"]["checkpoints"]["retention"] = "Delete"
    plan = world.step()
    (pvc,) = plan.applies
    assert pvc["kind"] == "PersistentVolumeClaim"
    assert pvc["metadata"]["ownerReferences"][0]["name"] == "math"
    assert not plan.creates


def test_an_invalid_spec_fails_with_a_message_naming_the_field() -> None:
    world = World(job_object(grpo={"groupSize": 1}))
    plan = world.step()
    assert world.status()["phase"] == "Failed"
    assert world.status()["reason"] == "InvalidSpec"
    assert "groupSize" in world.status()["message"]
    assert not plan.creates
    assert world.reconcile().is_empty()


# --- property: idempotence and invariants under random event sequences ---------------------------------------


ACTIONS = st.sampled_from(
    [
        "schedule",
        "run",
        "fail",
        "evict",
        "unschedulable",
        "checkpoint",
        "wait",
        "stall",
        "suspend",
        "resume",
        "win",
        "forge",
    ]
)


def _perturb(world: World, action: str, index: int) -> None:
    pods = [p for p in world.pods() if not p["metadata"].get("deletionTimestamp")]
    pod = pods[index % len(pods)] if pods else None
    if action == "schedule":
        world.schedule_all()
    elif action == "run":
        world.run_all()
    elif action == "fail" and pod is not None:
        world.terminate(pod["metadata"]["name"], 1, "boom")
    elif action == "evict" and pod is not None:
        pod["metadata"]["deletionTimestamp"] = format_time(world.now)
        pod["status"].setdefault("conditions", []).append(
            {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
        )
    elif action == "unschedulable" and pod is not None:
        pod["status"]["conditions"] = [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no GPUs"}
        ]
    elif action == "checkpoint":
        step = int(world.now.timestamp()) % 1000
        world.job.setdefault("status", {})["checkpoint"] = {"lastStep": step, "path": f"/ckpt/step-{step}"}
    elif action == "wait":
        world.advance(300)
    elif action == "stall":
        world.advance(2000)
    elif action in ("suspend", "resume"):
        world.job["spec"]["suspend"] = action == "suspend"
    elif action == "win" and pod is not None:
        world.terminate(pod["metadata"]["name"], 0)
    elif action == "forge":
        # Tenant code with the trainer's ServiceAccount rewrites the operator's status fields.
        forged = [
            {"restarts": 0},
            {"trainerAttempt": 99},
            {"phase": "Succeeded"},
            {"startTime": "2099-01-01T00:00:00Z"},
        ]
        world.job.setdefault("status", {}).update(forged[index % len(forged)])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(ACTIONS, st.integers(0, 5)), min_size=1, max_size=25))
def test_every_reconcile_is_idempotent_and_keeps_the_invariants(actions: list[tuple[str, int]]) -> None:
    world = World(job_object(runPolicy={"backoffLimit": 3, "progressDeadlineSeconds": 1800}))
    world.step()
    counted = 0
    for action, index in actions:
        _perturb(world, action, index)
        for _ in range(2):
            plan = world.step()
            assert set((plan.status or {}).keys()) <= set(OWNED_STATUS_FIELDS)
            counted += bool(plan.restart and plan.restart.counted)
            # Fencing: a gang replaced by this plan is deleted now and its successor created by the next.
            if not plan.deletes:
                break
        again = world.reconcile()
        assert again.is_empty(), f"not idempotent after {action}: {again}"
        status = world.status()
        assert status.get("restarts", 0) == counted <= 3, "no forged count resets the budget"
        attempt = status.get("trainerAttempt", 0)
        live = [p for p in world.pods() if not p["metadata"].get("deletionTimestamp")]
        # At most one gang exists: every pod still around belongs to the current attempt.
        assert {p["metadata"]["labels"]["grpo.dev/attempt"] for p in live} <= {str(attempt)}
        if status.get("phase") in ("Suspended",):
            assert not live
        if status.get("phase") in ("Succeeded", "Failed"):
            assert all(p["status"]["phase"] in ("Succeeded", "Failed") for p in live)
            assert ("Deployment", "math-metric") not in world.objects
