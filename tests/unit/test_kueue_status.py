"""What a GRPOJob shows while Kueue holds it: the queue's own reason for the wait, and a preemption
(Kueue's eviction of the whole pod group) as an uncounted restart that stays visible until Kueue admits
the job again. The pod and Workload shapes are the ones Kueue v0.17 writes (see docs/kueue.md)."""

from __future__ import annotations

from typing import Any

from grpo_operator.reconcile.conditions import format_time

from tests.unit.reconcile_world import World, env, job_object

QUEUE = {"queueName": "gpu-queue"}
NO_QUOTA = (
    "couldn't assign flavors to pod set 4c1e2a7b: insufficient unused quota for nvidia.com/gpu in "
    "flavor gpu-h100, 5 more needed"
)
PREEMPTED = (
    "Preempted to accommodate a workload (UID: 5b7d, JobUID: 0f3c) due to prioritization in the ClusterQueue"
)


def gate(world: World) -> None:
    for pod in world.pods():
        pod["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
        pod["status"]["conditions"] = [
            {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated", "message": "gated"}
        ]


def pending_workload(name: str, message: str) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": name, "namespace": "ns"},
        "status": {
            "conditions": [
                {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": message}
            ]
        },
    }


def kueue_stops_the_gang(world: World, message: str) -> None:
    """What Kueue's pod controller does to each pod of an evicted group: a TerminationTarget condition,
    then a delete (the pods keep running their grace period)."""
    for pod in world.pods():
        pod["status"]["conditions"].append(
            {"type": "TerminationTarget", "status": "True", "reason": "WorkloadEvicted", "message": message}
        )
        pod["metadata"]["deletionTimestamp"] = format_time(world.now)


def test_a_queued_job_shows_kueues_reason_for_the_wait() -> None:
    world = World(job_object(scheduling=QUEUE))
    world.step()
    gate(world)
    world.objects[("Workload", "math-a1")] = pending_workload("math-a1", NO_QUOTA)
    plan = world.step()
    status = world.status()
    assert status["phase"] == "Pending"
    assert status["reason"] == "WaitingForAdmission"
    assert NO_QUOTA in status["message"] and "math-a1" in status["message"]
    assert NO_QUOTA in world.condition("Scheduled")["message"]
    assert any(e.reason == "WaitingForAdmission" and NO_QUOTA in e.message for e in plan.events)


def test_a_queued_job_without_a_readable_workload_still_says_it_waits_for_admission() -> None:
    world = World(job_object(scheduling=QUEUE))
    world.step()
    gate(world)
    world.step()
    assert world.status()["reason"] == "WaitingForAdmission"
    assert "not yet admitted by its queue" in world.status()["message"]


def test_kueue_preemption_restarts_uncounted_and_stays_visible_until_readmitted() -> None:
    world = World(job_object(scheduling=QUEUE))
    world.settle()
    world.run_all()
    world.settle()
    assert world.status()["phase"] == "Running"
    world.job["status"]["checkpoint"] = {"path": "/workspace/checkpoints/step-50", "step": 50}
    kueue_stops_the_gang(world, PREEMPTED)
    plan = world.step()
    assert plan.restart is not None and not plan.restart.counted
    assert world.status()["reason"] == "Preempted"
    assert world.status()["restarts"] == 0
    assert world.status()["trainerAttempt"] == 2
    # Fencing: the new attempt is created once the preempted pods are gone.
    world.gone()
    plan = world.step()
    # The preempted trainers write a SIGTERM checkpoint (step > 50) before Kueue admits the new attempt:
    # it must resume from the newest checkpoint the volume's latest.json names, not from step 50.
    new_trainers = [m for m in plan.creates if m["metadata"]["labels"]["grpo.dev/role"] == "trainer"]
    assert new_trainers and all(env(m)["RESUME_FROM"] == "/workspace/checkpoints" for m in new_trainers)
    # The new attempt's pods are a new pod group that Kueue gates until the quota is back.
    gate(world)
    world.objects[("Workload", "math-a2")] = pending_workload("math-a2", NO_QUOTA)
    world.step()
    status = world.status()
    assert status["phase"] == "Pending"
    assert status["reason"] == "Preempted"
    assert "preempted by Kueue" in status["message"] and NO_QUOTA in status["message"]
    assert status["restarts"] == 0
    # Admitted again: gates gone, pods run, the job is Running again with the budget untouched.
    world.run_all()
    for pod in world.pods():
        pod["spec"].pop("schedulingGates", None)
    world.settle()
    assert world.status()["phase"] == "Running"
    assert world.status()["restarts"] == 0


def test_other_kueue_evictions_are_uncounted_disruptions_too() -> None:
    world = World(job_object(scheduling=QUEUE))
    world.settle()
    world.run_all()
    world.settle()
    kueue_stops_the_gang(world, "Exceeded the PodsReady timeout ns/math-a1")
    plan = world.step()
    assert plan.restart is not None and not plan.restart.counted
    assert world.status()["reason"] == "EvictedByKueue"
    assert world.status()["restarts"] == 0
