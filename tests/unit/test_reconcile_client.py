"""reconcile for client-rollout jobs (spec.rollouts.source: Client): the rollout gateway instead of the
metric service, a trainer waiting for its client is not a stall, and a client's cancel is final."""

from __future__ import annotations

from typing import Any

from grpo_operator.reconcile.conditions import format_time

from tests.unit.test_reconcile import World, events, job_object


def client_world(**spec: Any) -> World:
    job = job_object(**spec)
    del job["spec"]["metric"], job["spec"]["dataset"]
    job["spec"]["rollouts"] = {"source": "Client"}
    world = World(job)
    world.settle()
    world.run_all()
    world.settle()
    assert world.status()["phase"] == "Running"
    return world


def kinds(world: World) -> set[tuple[str, str]]:
    return {(kind, name) for kind, name in world.objects if kind != "Pod"}


def make_gateway_available(world: World) -> None:
    world.objects[("Deployment", "math-rollouts")]["status"] = {"availableReplicas": 1}


def test_client_job_runs_the_gateway_instead_of_the_metric_service() -> None:
    world = client_world()
    children = kinds(world)
    assert {
        ("Deployment", "math-rollouts"),
        ("Service", "math-rollouts"),
        ("Service", "math-policy"),
    } <= children
    assert ("NetworkPolicy", "math-rollouts") in children
    assert not {c for c in children if "metric" in c[1]}, children
    assert "MetricReady" not in {c["type"] for c in world.status()["conditions"]}
    gateway = world.condition("GatewayReady")
    assert gateway["status"] == "False" and gateway["reason"] == "Starting"
    make_gateway_available(world)
    world.step()
    assert world.condition("GatewayReady")["status"] == "True"
    assert "math-rollouts" in world.condition("GatewayReady")["message"]


def test_waiting_for_the_client_is_not_a_stall() -> None:
    world = client_world(runPolicy={"progressDeadlineSeconds": 900})
    world.advance(100)
    world.job["status"]["progress"] = {"step": 3, "lastStepTime": format_time(world.now)}
    world.advance(10)
    world.job["status"]["progress"]["waitingForClientSince"] = format_time(world.now)
    world.advance(5000)  # the client took long over its rollouts (or is validating)
    plan = world.step()
    assert world.status()["phase"] == "Running", world.status()
    assert plan.restart is None and not plan.deletes
    # A step after the wait restarts the clock; no new wait and no step for the deadline is a stall.
    world.job["status"]["progress"]["lastStepTime"] = format_time(world.now)
    world.job["status"]["progress"]["step"] = 4
    world.advance(901)
    plan = world.step()
    assert world.status()["reason"] == "ProgressDeadlineExceeded"
    assert plan.restart is not None and plan.restart.counted


def test_a_wait_reported_by_an_earlier_gang_does_not_hide_a_stall() -> None:
    world = client_world(runPolicy={"progressDeadlineSeconds": 900})
    world.job["status"]["progress"] = {"step": 3, "waitingForClientSince": format_time(world.now)}
    world.advance(10)
    world.terminate("math-trainer-1-0", 1, "killed while waiting")
    world.settle()
    world.run_all()
    world.settle()
    assert world.status()["phase"] == "Running" and world.status()["trainerAttempt"] == 2
    world.advance(901)  # the new gang never steps and never reports a wait of its own
    world.step()
    assert world.status()["reason"] == "ProgressDeadlineExceeded"


def test_cancel_by_the_client_is_final_and_stops_the_gateway() -> None:
    world = client_world(runPolicy={"backoffLimit": 3})
    world.job["status"]["progress"] = {"step": 7, "totalSteps": 500}
    world.terminate("math-trainer-1-0", 7, "the client cancelled the run")
    plan = world.step()
    status = world.status()
    assert status["phase"] == "Failed" and status["reason"] == "CancelledByClient"
    assert "cancelled" in status["message"] and "after step 7" in status["message"]
    assert plan.restart is None and status.get("restarts", 0) == 0
    assert ("Warning", "CancelledByClient") in events(plan)
    assert ("Deployment", "math-rollouts") not in world.objects
    assert "GatewayReady" not in {c["type"] for c in status["conditions"]}
    assert world.reconcile().is_empty()


def test_the_gateway_outlives_success_and_suspend() -> None:
    world = client_world()
    world.job["spec"]["suspend"] = True
    world.settle()
    assert world.status()["phase"] == "Suspended"
    assert ("Deployment", "math-rollouts") in world.objects, "the client's session survives a suspend"
    world.job["spec"]["suspend"] = False
    world.settle()
    world.run_all()
    world.settle()
    world.job["status"]["progress"] = {"step": 500, "totalSteps": 500}
    world.terminate("math-trainer-2-0", 0)
    world.settle()
    assert world.status()["phase"] == "Succeeded"
    # DSPy calls terminate after its last step: the gateway answers until the job is deleted.
    assert ("Deployment", "math-rollouts") in world.objects
    assert ("Service", "math-rollouts") in world.objects


def test_a_failed_client_job_stops_its_gateway() -> None:
    world = client_world(runPolicy={"backoffLimit": 0})
    world.terminate("math-trainer-1-0", 1, "boom")
    world.settle()
    assert world.status()["phase"] == "Failed"
    assert ("Deployment", "math-rollouts") not in world.objects
