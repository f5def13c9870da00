"""reconcile on a running gang: scheduling, failures and their reasons, and disruptions (deadlines, stalls and
an operator killed half-way are in test_reconcile_deadlines.py)."""

from __future__ import annotations

import pytest
from grpo_operator.reconcile.conditions import format_time

from tests.unit.reconcile_world import (
    CKPT,
    SETTINGS,
    World,
    env,
    events,
    job_object,
    running_world,
)


def test_unschedulable_pods_make_the_job_pending_with_the_schedulers_reason() -> None:
    world = World(job_object(trainer={"gpusPerNode": 8}, grpo={"promptsPerStep": 8}))
    world.step()
    message = "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 2 Insufficient nvidia.com/gpu."
    pod = world.pod("math-trainer-1-1")
    pod["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
    ]
    plan = world.step()
    status = world.status()
    assert status["phase"] == "Pending"
    assert status["reason"] == "Unschedulable"
    assert message in status["message"]
    assert world.condition("Scheduled")["status"] == "False"
    assert message in world.condition("Scheduled")["message"]
    assert ("Warning", "Unschedulable") in events(plan)
    assert world.reconcile().is_empty(), "the Unschedulable event is posted once, not every reconcile"


def test_kueue_gated_pods_wait_for_admission() -> None:
    world = World(job_object(scheduling={"queueName": "gpu-queue"}))
    world.step()
    for pod in world.pods():
        pod["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
        pod["status"]["conditions"] = [
            {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated", "message": "gated"}
        ]
    world.step()
    assert world.status()["reason"] == "WaitingForAdmission"
    assert world.status()["phase"] == "Pending"


def test_a_restarted_kueue_gang_releases_its_old_pod_group() -> None:
    world = World(job_object(scheduling={"queueName": "gpu-queue"}))
    world.settle()
    world.run_all()
    world.settle()
    for pod in world.pods():
        assert pod["metadata"]["annotations"]["kueue.x-k8s.io/retriable-in-group"] == "false"
        # Pods an earlier operator version created without the annotation get it before their delete.
        del pod["metadata"]["annotations"]["kueue.x-k8s.io/retriable-in-group"]
    world.terminate("math-trainer-1-0", 1)
    plan = world.reconcile()
    patched = {p.ref.name: p.patch for p in plan.patches}
    assert (
        set(patched)
        == {r.name for r in plan.deletes}
        == {"math-gen-1-0", "math-trainer-1-0", "math-trainer-1-1"}
    )
    for patch in patched.values():
        assert patch == {"metadata": {"annotations": {"kueue.x-k8s.io/retriable-in-group": "false"}}}
    world.apply(plan)
    new_groups = {m["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] for m in world.reconcile().creates}
    assert new_groups == {"math-a2"}
    no_queue = running_world()
    no_queue.terminate("math-trainer-1-0", 1)
    assert not no_queue.reconcile().patches


def test_waiting_containers_are_reported_while_initializing() -> None:
    world = World(job_object())
    world.step()
    world.schedule_all()
    world.pod("math-gen-1-0")["status"]["containerStatuses"] = [
        {
            "name": "vllm",
            "state": {"waiting": {"reason": "ImagePullBackOff", "message": "pull access denied"}},
        }
    ]
    world.step()
    assert world.status()["phase"] == "Initializing"
    assert world.status()["reason"] == "ImagePullBackOff"
    assert "pull access denied" in world.status()["message"]


# --- failures -----------------------------------------------------------------------------------------------


def test_trainer_failure_restarts_the_whole_gang_from_the_checkpoint() -> None:
    world = running_world()
    world.job["status"]["checkpoint"] = {"lastStep": 50, "path": CKPT, "time": format_time(world.now)}
    world.terminate("math-trainer-1-1", 1, "Traceback...\nRuntimeError: CUDA error: an illegal memory access")
    plan = world.reconcile()
    assert plan.status is not None
    assert plan.status["trainerAttempt"] == 2
    assert plan.status["restarts"] == 1
    assert plan.status["phase"] == "Restarting"
    assert plan.status["reason"] == "TrainerFailed"
    assert "CUDA error" in plan.status["message"] and "exit code 1" in plan.status["message"]
    assert {r.name for r in plan.deletes} == {"math-gen-1-0", "math-trainer-1-0", "math-trainer-1-1"}
    assert not plan.creates, "the new gang starts only once the old one is gone"
    assert events(plan) == [("Warning", "Restarting"), ("Normal", "ResumedFromCheckpoint")]
    assert plan.restart is not None and plan.restart.counted
    world.apply(plan)
    plan = world.step()
    assert [m["metadata"]["name"] for m in plan.creates] == [
        "math-gen-2-0",
        "math-trainer-2-0",
        "math-trainer-2-1",
    ]
    for pod in plan.creates[1:]:
        assert env(pod)["RESUME_FROM"] == CKPT
    assert world.reconcile().is_empty()
    world.run_all()
    world.step()
    assert world.status()["phase"] == "Running"
    assert world.status()["restarts"] == 1


def test_a_failed_vllm_pod_is_replaced_alone_while_the_trainers_run_on() -> None:
    world = running_world(generation={"startupTimeoutSeconds": 900})
    world.terminate("math-gen-1-0", 1, "RuntimeError: Engine core initialization failed", phase="Failed")
    plan = world.step()
    assert [m["metadata"]["name"] for m in plan.creates] == ["math-gen-1-1"]
    assert plan.deletes == [] and plan.restart is None  # the trainers and the failed pod (its log) stay
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Running", "GenerationReplaced")
    assert status.get("restarts", 0) == 0 and status["trainerAttempt"] == 1
    assert (
        "math-gen-1-0 failed: exit code 1; RuntimeError: Engine core initialization failed"
        in status["message"]
    )
    assert ("Warning", "GenerationReplaced") in events(plan)
    replacement = world.pod("math-gen-1-1")
    assert replacement["spec"]["containers"] == world.pod("math-gen-1-0")["spec"]["containers"]

    # While it starts, the job stays Running and says how long the trainers have waited of the budget.
    world.advance(125)
    world.step()
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Running", "GenerationReplaced")
    assert "vLLM pod math-gen-1-1 replaces a failed one" in status["message"]
    assert "(2m of 15m)" in status["message"]

    # Ready: the message says so once, and the job carries on in attempt 1.
    world.run_all()
    plan = world.step()
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Running", "AllPodsRunning")
    assert "math-gen-1-1 replaced a failed one" in status["message"]
    assert ("Normal", "Running") in events(plan)
    assert world.reconcile().is_empty()


def test_an_evicted_vllm_pod_is_replaced_alone_too() -> None:
    world = running_world()
    pod = world.pod("math-gen-1-0")
    pod["metadata"]["deletionTimestamp"] = format_time(world.now)
    pod["status"]["conditions"].append(
        {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    )
    plan = world.step()
    assert [m["metadata"]["name"] for m in plan.creates] == ["math-gen-1-1"]
    assert plan.restart is None
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Running", "GenerationReplaced")
    assert (
        "generation pod math-gen-1-0 was stopped from outside the job (EvictionByEvictionAPI)"
        in status["message"]
    )
    world.gone()  # the evicted pod leaves the API; its replacement is the attempt's vLLM pod now
    world.run_all()
    world.step()
    assert (world.status()["phase"], world.status()["reason"]) == ("Running", "AllPodsRunning")
    assert world.status()["trainerAttempt"] == 1


def test_a_replacement_vllm_pod_that_never_gets_ready_restarts_the_gang_counted() -> None:
    world = running_world(generation={"startupTimeoutSeconds": 600})
    world.terminate("math-gen-1-0", 1, "boom", phase="Failed")
    world.step()
    world.advance(601)
    plan = world.step()
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Restarting", "GenerationStartupTimeout")
    assert status["restarts"] == 1
    assert "math-gen-1-1, which replaced a failed one, did not become Ready" in status["message"]
    assert {"math-trainer-1-0", "math-gen-1-0", "math-gen-1-1"} <= {r.name for r in plan.deletes}


def test_the_progress_clock_restarts_when_a_replacement_gets_ready() -> None:
    world = running_world(
        runPolicy={"progressDeadlineSeconds": 900}, generation={"startupTimeoutSeconds": 1800}
    )
    world.advance(600)
    world.terminate("math-gen-1-0", 1, "boom", phase="Failed")
    world.step()
    world.advance(700)  # past the progress deadline since the gang started, within the start-up budget
    world.run_all()
    world.step()
    assert world.status()["phase"] == "Running"
    world.advance(899)
    world.step()
    assert world.status()["phase"] == "Running"
    world.advance(2)
    world.step()
    assert world.status()["reason"] == "ProgressDeadlineExceeded"


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        ("trainer-failed-too", "GenerationFailed"),
        ("before-running", "GenerationFailed"),
        ("oom", "OOMKilled"),
    ],
)
def test_a_vllm_failure_restarts_the_gang_where_replacing_it_alone_is_not_the_answer(
    setup: str, reason: str
) -> None:
    if setup == "before-running":
        world = World(job_object())
        world.settle()
        world.schedule_all()
        world.step()
    else:
        world = running_world()
    world.terminate(
        "math-gen-1-0",
        137 if setup == "oom" else 1,
        "",
        phase="Failed",
        reason="OOMKilled" if setup == "oom" else "Error",
    )
    if setup == "trainer-failed-too":
        world.terminate("math-trainer-1-0", 1, "NCCL timeout")
    plan = world.step()
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Restarting", reason), status["message"]
    assert status["restarts"] == 1 and plan.restart is not None
    assert "math-gen-1-1" not in [m["metadata"]["name"] for m in plan.creates]
    assert "math-trainer-1-0" in [r.name for r in plan.deletes]


def test_under_kueue_a_failed_vllm_pod_is_replaced_inside_the_gangs_pod_group() -> None:
    world = World(job_object(scheduling={"queueName": "gpu-queue"}))
    world.settle()
    world.run_all()
    world.settle()
    assert world.status()["phase"] == "Running"
    failed = world.pod("math-gen-1-0")
    world.terminate("math-gen-1-0", 1, "engine core died", phase="Failed", reason="Error")
    plan = world.step()
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Running", "GenerationReplaced"), status["message"]
    assert status.get("restarts", 0) == 0 and status["trainerAttempt"] == 1 and plan.restart is None
    assert not plan.deletes, "the trainer keeps running, and the failed pod is kept for its log"
    [replacement] = [m for m in plan.creates if m["metadata"]["name"] == "math-gen-1-1"]
    # The same pod group, size and retriable mark: Kueue admits it within the group's quota.
    group = "kueue.x-k8s.io/pod-group-name"
    assert replacement["metadata"]["labels"][group] == failed["metadata"]["labels"][group] == "math-a1"
    assert replacement["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    for key in ("kueue.x-k8s.io/pod-group-total-count", "kueue.x-k8s.io/retriable-in-group"):
        assert replacement["metadata"]["annotations"][key] == failed["metadata"]["annotations"][key]


def test_exhausting_the_backoff_limit_fails_the_job_with_the_reason() -> None:
    world = running_world(runPolicy={"backoffLimit": 1})
    world.terminate("math-trainer-1-0", 1, "loss is NaN")
    world.settle()
    assert world.status()["restarts"] == 1
    world.run_all()
    world.settle()
    world.terminate("math-trainer-2-0", 1, "loss is NaN again")
    plan = world.step()
    status = world.status()
    assert status["phase"] == "Failed"
    assert status["reason"] == "BackoffLimitExceeded"
    assert "loss is NaN again" in status["message"] and "backoffLimit (1)" in status["message"]
    assert status["completionTime"] == format_time(world.now)
    assert world.condition("Failed")["status"] == "True"
    assert ("Warning", "Failed") in events(plan)
    # The vLLM server, the other trainer and the metric service stop; the failed pod stays for its logs.
    assert {r.name for r in plan.deletes} == {"math-gen-2-0", "math-trainer-2-1", "math-metric"}
    world.settle()
    assert ("Pod", "math-trainer-2-0") in world.objects


def test_zero_backoff_limit_fails_on_the_first_failure() -> None:
    world = running_world(runPolicy={"backoffLimit": 0})
    world.terminate("math-trainer-1-0", 1)
    world.step()
    assert world.status()["phase"] == "Failed"
    assert world.status()["restarts"] == 0


def test_invalid_configuration_exit_code_fails_at_once() -> None:
    world = running_world()
    world.terminate("math-trainer-1-0", 2, "dataset column 'question' not found")
    world.step()
    assert world.status()["phase"] == "Failed"
    assert world.status()["reason"] == "PermanentFailure"
    assert "dataset column" in world.status()["message"]


def test_checkpoint_mismatch_fails_at_once_with_its_own_reason() -> None:
    world = running_world()
    message = (
        "checkpoint /workspace/checkpoints/step-40 holds model m@main, full weights, but this job trains "
        "model m@main, LoRA r=16 targetModules=['q_proj']"
    )
    world.terminate("math-trainer-1-0", 4, message)
    plan = world.step()
    status = world.status()
    assert status["phase"] == "Failed" and status["reason"] == "CheckpointMismatch"
    assert "full weights, but this job trains" in status["message"]
    assert world.condition("Failed")["reason"] == "CheckpointMismatch"
    assert ("Warning", "CheckpointMismatch") in events(plan)
    assert status.get("restarts", 0) == 0


def test_non_finite_step_is_a_counted_restart_with_its_own_reason() -> None:
    world = running_world(runPolicy={"backoffLimit": 1})
    world.terminate(
        "math-trainer-1-0", 5, "step 12: the loss is not finite; nothing from this step is published"
    )
    plan = world.step()
    status = world.status()
    assert status["phase"] == "Restarting" and status["reason"] == "NonFiniteTraining"
    assert status["restarts"] == 1 and plan.restart is not None and plan.restart.counted
    assert plan.restart.reason == "NonFiniteTraining"
    assert ("Warning", "NonFiniteTraining") in events(plan)
    assert "the loss is not finite" in status["message"]
    world.settle()
    world.run_all()
    world.settle()
    world.terminate("math-trainer-2-0", 5, "step 12: the loss is not finite")
    world.step()
    assert world.status()["phase"] == "Failed" and world.status()["reason"] == "BackoffLimitExceeded"


def test_trainer_exit_reasons_match_the_trainers_exit_codes() -> None:
    from grpo_operator.reconcile.restart_policy import TRAINER_EXIT_REASONS
    from grpo_trainer.errors import ExitCode

    assert TRAINER_EXIT_REASONS == {
        ExitCode.CHECKPOINT_MISMATCH: "CheckpointMismatch",
        ExitCode.NON_FINITE: "NonFiniteTraining",
        ExitCode.OUT_OF_MEMORY: "OutOfMemory",
        ExitCode.CANCELLED: "CancelledByClient",  # client-rollout jobs
        ExitCode.MEMORY_PLAN_EXCEEDED: "MemoryPlanExceeded",
        ExitCode.NOT_LEARNING: "NotLearning",
    }
    assert ExitCode.NOT_LEARNING in SETTINGS.permanent_exit_codes
    assert ExitCode.MEMORY_PLAN_EXCEEDED in SETTINGS.permanent_exit_codes
    assert ExitCode.CANCELLED in SETTINGS.permanent_exit_codes
    assert ExitCode.CHECKPOINT_MISMATCH in SETTINGS.permanent_exit_codes
    assert ExitCode.OUT_OF_MEMORY in SETTINGS.permanent_exit_codes
    assert ExitCode.NON_FINITE not in SETTINGS.permanent_exit_codes


CUDA_OOM_MESSAGE = (
    "the trainer ran out of GPU memory (CUDA out of memory: Tried to allocate 2.00 GiB); a restart needs the "
    "same memory, so the job is not retried. Try a smaller spec.trainer.perDeviceBatchSize (now 8)"
)


def test_cuda_out_of_memory_fails_at_once_saying_what_ran_out() -> None:
    """A job that cannot fit in GPU memory must not burn its backoffLimit on identical restarts."""
    world = running_world(runPolicy={"backoffLimit": 3})
    world.terminate("math-trainer-1-0", 6, CUDA_OOM_MESSAGE)
    plan = world.step()
    status = world.status()
    assert status["phase"] == "Failed" and status["reason"] == "OutOfMemory"
    assert status.get("restarts", 0) == 0 and plan.restart is None
    assert "does not fit in GPU memory" in status["message"]
    assert "perDeviceBatchSize" in status["message"]
    assert ("Warning", "OutOfMemory") in events(plan)


MEMORY_PLAN_MESSAGE = (
    "the training needs about 118.0 GiB per GPU (7.62B parameters, full fine-tuning, bfloat16, 1 GPU, batch 4; "
    "...); the GPU has 79.6 GiB, 71.7 GiB of it usable with 10% headroom. It would fit: with "
    "spec.trainer.sharding FSDP over 2 GPUs it needs 61.3 GiB per GPU"
)


def test_a_memory_plan_that_does_not_fit_fails_at_once_with_its_own_reason() -> None:
    world = running_world(runPolicy={"backoffLimit": 3})
    world.terminate("math-trainer-1-0", 8, MEMORY_PLAN_MESSAGE)
    plan = world.step()
    status = world.status()
    assert status["phase"] == "Failed" and status["reason"] == "MemoryPlanExceeded", status
    assert status.get("restarts", 0) == 0 and plan.restart is None
    assert "exit code 8 means the training as set up does not fit in GPU memory" in status["message"]
    assert "FSDP over 2 GPUs" in status["message"]
    assert ("Warning", "MemoryPlanExceeded") in events(plan)


NOT_LEARNING_MESSAGE = (
    "stopped as grpo.learningHealth.stopWhenUnhealthy asks: Not learning (NoSignal) since step 3: 100% of "
    "groups tied (every completion of a group scored the same, mostly 0.5), so their advantages are 0"
)


def test_a_job_stopped_for_not_learning_fails_at_once_naming_the_diagnosis() -> None:
    world = running_world(runPolicy={"backoffLimit": 3})
    world.terminate("math-trainer-1-0", 9, NOT_LEARNING_MESSAGE)
    plan = world.step()
    status = world.status()
    assert status["phase"] == "Failed" and status["reason"] == "NotLearning", status
    assert status.get("restarts", 0) == 0 and plan.restart is None
    assert "exit code 9 means the job was not learning" in status["message"]
    assert "NoSignal" in status["message"] and "100% of groups tied" in status["message"]


def test_out_of_memory_on_one_rank_is_reported_over_the_other_ranks_fallout() -> None:
    world = running_world(
        trainer={"nodes": 2, "gpusPerNode": 1}, checkpoints={"volume": {"accessMode": "ReadWriteMany"}}
    )
    world.terminate("math-trainer-1-0", 1, "DistBackendError: NCCL watchdog timeout")
    world.terminate("math-trainer-1-1", 6, CUDA_OOM_MESSAGE)
    world.step()
    status = world.status()
    assert status["phase"] == "Failed" and status["reason"] == "OutOfMemory", status
    assert "math-trainer-1-1" in status["message"]


def test_oom_killed_container_gets_its_own_reason_and_a_hint() -> None:
    world = running_world(runPolicy={"backoffLimit": 2})
    world.terminate("math-trainer-1-0", 137, "", reason="OOMKilled")
    plan = world.step()
    status = world.status()
    assert status["phase"] == "Restarting" and status["reason"] == "OOMKilled"
    assert plan.restart is not None and plan.restart.counted and plan.restart.reason == "OOMKilled"
    assert "host memory, not GPU memory" in status["message"]
    assert "spec.trainer.resources" in status["message"]
    assert ("Warning", "OOMKilled") in events(plan)


@pytest.mark.parametrize(
    ("condition_reason", "reported"),
    [
        ("EvictionByEvictionAPI", "Evicted"),
        ("PreemptionByScheduler", "Preempted"),
        ("DeletionByTaintManager", "NodeLost"),
    ],
)
def test_disruptions_restart_without_spending_the_budget(condition_reason: str, reported: str) -> None:
    world = running_world()
    pod = world.pod("math-trainer-1-1")
    pod["metadata"]["deletionTimestamp"] = format_time(world.now)
    pod["status"]["conditions"].append(
        {"type": "DisruptionTarget", "status": "True", "reason": condition_reason}
    )
    plan = world.step()
    assert world.status()["trainerAttempt"] == 2
    assert world.status()["restarts"] == 0
    assert world.status()["reason"] == reported
    assert plan.restart is not None and not plan.restart.counted
    assert "not counted" in world.status()["message"]
    assert "math-trainer-1-1" not in [r.name for r in plan.deletes], "a terminating pod is not deleted again"


def test_kubelet_eviction_and_node_loss_are_not_counted() -> None:
    world = running_world()
    world.pod("math-trainer-1-0")["status"].update({"phase": "Failed", "reason": "Evicted"})
    world.step()
    assert world.status()["restarts"] == 0 and world.status()["reason"] == "Evicted"
    world.run_all()
    world.step()
    world.nodes = frozenset({"cpu-node-0", "gpu-node-1"})
    world.pod("math-trainer-2-0")["spec"]["nodeName"] = "gpu-node-0"
    world.step()
    assert world.status()["restarts"] == 0 and world.status()["reason"] == "NodeLost"
    assert world.status()["trainerAttempt"] == 3


def test_a_pod_vanishing_while_running_restarts_the_gang_uncounted() -> None:
    world = running_world()
    del world.objects[("Pod", "math-trainer-1-1")]
    world.step()
    assert world.status()["reason"] == "PodDeleted"
    assert world.status()["restarts"] == 0
    assert world.status()["trainerAttempt"] == 2


def test_graceful_stop_of_rank_zero_is_not_success() -> None:
    world = running_world()
    pod = world.pod("math-trainer-1-0")
    world.terminate("math-trainer-1-0", 0)
    pod["status"]["conditions"].append(
        {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
    )
    world.step()
    assert world.status()["phase"] == "Restarting"
    assert world.status()["restarts"] == 0
