"""Start-up of a gang: vLLM's own start-up budget, the startup deadline that does not count it, and the
status that says what the job is waiting for."""

from __future__ import annotations

from typing import Any

from grpo_operator.reconcile.conditions import format_time

from tests.unit.reconcile_world import World, events, job_object

GEN = "math-gen-1-0"


def _start_vllm(world: World) -> None:
    """Every pod placed and running; vLLM's container runs but does not answer /health yet."""
    world.run_all()
    pod = world.pod(GEN)
    pod["status"]["conditions"] = [c for c in pod["status"]["conditions"] if c["type"] != "Ready"]
    pod["status"]["conditions"].append({"type": "Ready", "status": "False", "reason": "ContainersNotReady"})


def _vllm_ready(world: World) -> None:
    pod = world.pod(GEN)
    pod["status"]["conditions"] = [c for c in pod["status"]["conditions"] if c["type"] != "Ready"]
    pod["status"]["conditions"].append(
        {"type": "Ready", "status": "True", "lastTransitionTime": format_time(world.now)}
    )


def _world(**spec: Any) -> World:
    world = World(job_object(**spec))
    world.settle()
    _start_vllm(world)
    return world


def test_while_vllm_loads_the_job_is_initializing_and_says_for_how_long() -> None:
    world = _world()
    world.advance(4 * 60 + 12)
    world.step()
    status = world.status()
    assert status["phase"] == "Initializing"
    assert status["reason"] == "WaitingForGeneration"
    assert status["message"].startswith(f"waiting for vLLM pod {GEN} to become Ready (4m of 30m")
    running = world.condition("Running")
    assert (running["status"], running["message"]) == ("False", status["message"])
    # The status follows the clock: a reconcile within the minute is due.
    requeue = world.reconcile().requeue_after
    assert requeue is not None and requeue <= 60
    _vllm_ready(world)
    world.step()
    assert world.status()["phase"] == "Running"


def test_a_slow_vllm_start_does_not_spend_the_startup_deadline() -> None:
    world = _world(runPolicy={"startupDeadlineSeconds": 600})
    # 25 minutes of model download: far beyond the 600 s startup deadline, within vLLM's 1800 s budget.
    for _ in range(25):
        world.advance(60)
        world.step()
        assert world.status()["phase"] == "Initializing", world.status()["message"]
    _vllm_ready(world)
    plan = world.step()
    assert world.status()["phase"] == "Running"
    assert ("Normal", "Running") in events(plan)
    assert world.status()["restarts"] == 0


def test_vllm_not_ready_within_its_budget_is_a_counted_restart() -> None:
    world = _world(generation={"startupTimeoutSeconds": 600})
    world.advance(599)
    world.step()
    assert world.status()["phase"] == "Initializing"
    world.advance(2)
    plan = world.step()
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Restarting", "GenerationStartupTimeout")
    assert "spec.generation.startupTimeoutSeconds (600s)" in status["message"]
    assert status["restarts"] == 1 and status["trainerAttempt"] == 2
    assert plan.restart is not None and plan.restart.counted


def test_the_startup_deadline_counts_from_vllm_ready_for_the_trainers() -> None:
    world = _world(runPolicy={"startupDeadlineSeconds": 600})
    trainer = world.pod("math-trainer-1-0")
    trainer["status"]["phase"] = "Pending"
    trainer["status"]["containerStatuses"] = [
        {"name": "trainer", "state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}}}
    ]
    trainer["status"]["conditions"] = [c for c in trainer["status"]["conditions"] if c["type"] != "Ready"]
    world.advance(1200)
    _vllm_ready(world)
    world.step()
    assert world.status()["phase"] == "Initializing"
    assert world.status()["reason"] == "ImagePullBackOff"
    world.advance(599)
    world.step()
    assert world.status()["phase"] == "Initializing"
    world.advance(2)
    world.step()
    assert (world.status()["phase"], world.status()["reason"]) == ("Failed", "StartupDeadlineExceeded")


def test_a_running_gang_stays_running_when_vllm_briefly_fails_its_probe() -> None:
    world = _world()
    _vllm_ready(world)
    world.settle()
    assert world.status()["phase"] == "Running"
    _start_vllm(world)  # Ready=False again, containers still running
    world.advance(30)
    world.step()
    assert world.status()["phase"] == "Running"
