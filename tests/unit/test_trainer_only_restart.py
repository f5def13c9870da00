"""A trainer-only gang restart keeps the running vLLM pods (issue 46, item 6): their names and labels follow
status.generationAttempt, not the trainers' attempt, so a failed trainer is replaced beside servers that
keep their loaded model, and the new trainers push their weights into them before their first step. The
whole gang restarts as before where keeping them is not known to be safe: NCCL weight sync, Kueue, a vLLM
pod that is not Ready, a spec change, or trainers that failed again beside kept servers before a step."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.reconcile_world import CKPT, World, env, running_world

pytestmark = pytest.mark.unit

VOLUME = {"weightSync": "Volume"}


def names(world: World, role: str) -> set[str]:
    return {p["metadata"]["name"] for p in world.pods(role)}


def trained(world: World, step: int) -> None:
    world.job["status"]["progress"] = {"step": step, "totalSteps": 500}
    world.job["status"]["checkpoint"] = {"lastStep": step, "path": CKPT}


def failed_trainer(**generation: Any) -> tuple[World, set[str]]:
    world = running_world(generation={**VOLUME, **generation})
    trained(world, 5)
    world.terminate("math-trainer-1-0", 1, "RuntimeError: CUDA error")
    deleted = {r.name for r in world.step().deletes}
    return world, deleted


def restarted_and_running() -> World:
    """failed_trainer's job once the old trainers are gone and attempt 2 runs beside the kept vLLM pod."""
    world, _ = failed_trainer()
    world.gone()
    world.settle()
    world.run_all()
    world.settle()
    return world


def test_a_failed_trainer_is_replaced_beside_the_running_vllm_pod() -> None:
    world, deleted = failed_trainer()
    assert deleted == {"math-trainer-1-0", "math-trainer-1-1"}, "vLLM keeps running"
    status = world.status()
    assert (status["trainerAttempt"], status["generationAttempt"], status["restarts"]) == (2, 1, 1)
    assert "restarting the trainers as attempt 2 (restart 1/2)" in status["message"]
    assert "beside the running vLLM pods of attempt 1" in status["message"]
    world.gone()
    world.settle()
    assert names(world, "generation") == {"math-gen-1-0"}
    assert names(world, "trainer") == {"math-trainer-2-0", "math-trainer-2-1"}
    assert [env(p)["RESUME_FROM"] for p in world.pods("trainer")] == [CKPT, CKPT]
    world.run_all()
    world.settle()
    status = world.status()
    assert status["phase"] == "Running"
    assert "(the vLLM pods of attempt 1, kept: only the trainers were restarted)" in status["message"]


def test_the_kept_servers_stay_through_a_second_trainer_failure_after_progress() -> None:
    world = restarted_and_running()
    trained(world, 9)  # the new trainers trained past the step they were restarted at
    world.terminate("math-trainer-2-1", 1, "boom")
    assert {r.name for r in world.step().deletes} == {"math-trainer-2-0", "math-trainer-2-1"}
    assert world.status()["generationAttempt"] == 1


def test_trainers_failing_again_before_a_step_beside_kept_servers_restart_the_whole_gang() -> None:
    world = restarted_and_running()
    world.terminate("math-trainer-2-0", 1, "cannot reach the vLLM server")  # still at step 5
    deleted = {r.name for r in world.step().deletes}
    assert deleted == {"math-gen-1-0", "math-trainer-2-0", "math-trainer-2-1"}
    status = world.status()
    assert (status["trainerAttempt"], status["generationAttempt"]) == (3, 3)
    assert "generationKeptAtStep" not in status
    world.gone()
    world.settle()
    assert names(world, "generation") == {"math-gen-3-0"}


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ({"generation": {}}, "NCCL weight sync: no test can show a kept server takes a new group"),
        (
            {"generation": VOLUME, "scheduling": {"queueName": "team-a"}},
            "Kueue admits and releases the gang as one group",
        ),
    ],
    ids=["nccl", "kueue"],
)
def test_the_whole_gang_restarts_where_keeping_vllm_is_not_known_to_be_safe(
    spec: dict[str, Any], why: str
) -> None:
    world = running_world(**spec)
    world.terminate("math-trainer-1-0", 1, "boom")
    deleted = {r.name for r in world.step().deletes}
    assert "math-gen-1-0" in deleted, why
    assert world.status()["generationAttempt"] == 2


def test_a_vllm_pod_that_is_not_ready_goes_with_the_trainers() -> None:
    world = running_world(generation=VOLUME)
    pod = world.pod("math-gen-1-0")
    pod["status"]["conditions"] = [c for c in pod["status"]["conditions"] if c["type"] != "Ready"]
    world.terminate("math-trainer-1-0", 1, "boom")
    assert "math-gen-1-0" in {r.name for r in world.step().deletes}


def test_a_kept_vllm_pod_that_fails_is_replaced_under_its_own_attempt() -> None:
    world = restarted_and_running()
    world.terminate("math-gen-1-0", 1, "vLLM crashed", phase="Failed")
    world.settle()
    assert "math-gen-1-1" in names(world, "generation"), world.status()["message"]
    assert names(world, "trainer") == {"math-trainer-2-0", "math-trainer-2-1"}, "the trainers keep running"


def test_a_resume_after_suspend_starts_a_whole_gang_again() -> None:
    world, _ = failed_trainer()
    world.gone()
    world.settle()
    world.job["spec"]["suspend"] = True
    world.settle()
    world.gone()
    world.job["spec"]["suspend"] = False
    world.settle()
    status = world.status()
    assert (status["trainerAttempt"], status["generationAttempt"]) == (3, 3)
    assert names(world, "generation") == {"math-gen-3-0"}


def test_the_trainer_cannot_move_the_generation_attempt() -> None:
    world, _ = failed_trainer()
    world.gone()
    world.settle()
    world.job["status"]["generationAttempt"] = 7  # written by a tenant's trainer, not the operator
    world.step()
    assert names(world, "generation") == {"math-gen-1-0"}
