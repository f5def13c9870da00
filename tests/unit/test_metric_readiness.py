"""The MetricReady condition, and keeping GPU-only node labels off the CPU-only metric pod.

A metric pod that cannot be scheduled or pulled used to show only as trainers that waited for it and
restarted; the condition and a Warning event now say which pod and why.
"""

from __future__ import annotations

from typing import Any

from grpo_operator.builders import gang_pods, job_from_object, metric_workload
from grpo_operator.reconcile.conditions import changed_conditions
from grpo_operator.reconcile.metric_readiness import FIRST_METRIC_REPORT_AFTER_SECONDS
from grpo_operator.settings import OperatorSettings

from tests.unit.reconcile_world import World, events, job_object

H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


def add_metric_pod(world: World, status: dict[str, Any]) -> dict[str, Any]:
    """A pod of the metric Deployment, as its ReplicaSet would create it (the operator never does)."""
    name = "math-metric-7d9f8c6b5-x2k4q"
    pod: dict[str, Any] = {
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"grpo.dev/job": "math", "grpo.dev/role": "metric"},
        },
        "spec": {"containers": [{"name": "metric"}]},
        "status": status,
    }
    world.objects[("Pod", name)] = pod
    return pod


def set_available(world: World, replicas: int) -> None:
    world.objects[("Deployment", "math-metric")]["status"] = {"availableReplicas": replicas}


def test_metric_ready_turns_true_when_the_deployment_has_an_available_pod() -> None:
    world = World(job_object())
    world.settle()
    world.run_all()
    world.settle()
    cond = world.condition("MetricReady")
    assert (cond["status"], cond["reason"]) == ("False", "Starting"), "a Running job always says it"
    add_metric_pod(world, {"phase": "Running"})
    set_available(world, 1)
    plan = world.step()
    cond = world.condition("MetricReady")
    assert (cond["status"], cond["reason"]) == ("True", "Available")
    assert "math-metric" in cond["message"]
    assert plan.changed_conditions == ["MetricReady True (Available)"], "the operator's log says what changed"


def test_a_new_jobs_metric_readiness_is_first_said_with_its_running_status() -> None:
    world = World(job_object())
    first = world.step()
    assert first.status is not None
    assert all(c["type"] != "MetricReady" for c in world.status()["conditions"]), "nothing said yet"
    world.settle()
    add_metric_pod(world, {"phase": "Running"})
    set_available(world, 1)
    plan = world.step()
    assert plan.status is None, "the metric service coming up while the gang starts costs no write of its own"
    world.run_all()
    plan = world.step()
    assert plan.status is not None and plan.status["phase"] == "Running"
    cond = world.condition("MetricReady")
    assert (cond["status"], cond["reason"]) == ("True", "Available"), "said in the same write as Running"


def test_a_job_that_cannot_be_scheduled_says_its_metric_readiness_at_once() -> None:
    world = World(job_object())
    world.step()
    scheduler = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no GPUs"}
    world.pod("math-trainer-1-1")["status"]["conditions"] = [scheduler]
    world.step()
    assert world.status()["reason"] == "Unschedulable"
    cond = world.condition("MetricReady")
    assert (cond["status"], cond["reason"]) == ("False", "Starting"), "said with the reason the job waits"


def test_a_slow_start_says_its_metric_readiness_with_its_next_phase_change_after_30_s() -> None:
    world = World(job_object())
    world.settle()
    add_metric_pod(world, {"phase": "Running"})
    set_available(world, 1)
    world.advance(FIRST_METRIC_REPORT_AFTER_SECONDS + 300)
    assert world.settle().is_empty(), "a long bring-up costs no status write for the metric service alone"
    assert world.status()["phase"] == "Pending"
    assert all(c["type"] != "MetricReady" for c in world.status()["conditions"]), "not said yet"
    world.schedule_all()
    plan = world.step()
    assert plan.status is not None and world.status()["phase"] == "Initializing"
    cond = world.condition("MetricReady")
    assert (cond["status"], cond["reason"]) == ("True", "Available"), "said with the containers starting"


def test_a_quick_start_leaves_metric_readiness_to_the_running_write() -> None:
    world = World(job_object())
    world.settle()
    add_metric_pod(world, {"phase": "Running"})
    set_available(world, 1)
    world.advance(FIRST_METRIC_REPORT_AFTER_SECONDS - 1)
    world.schedule_all()
    world.step()
    assert world.status()["phase"] == "Initializing"
    assert all(c["type"] != "MetricReady" for c in world.status()["conditions"]), "within 30 s: not yet"
    world.run_all()
    world.step()
    assert world.status()["phase"] == "Running"
    assert world.condition("MetricReady")["status"] == "True"


def test_an_unschedulable_metric_pod_is_named_with_the_schedulers_reason_and_one_warning() -> None:
    world = World(job_object())
    world.settle()
    scheduler = "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."
    add_metric_pod(
        world,
        {
            "phase": "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": scheduler}
            ],
        },
    )
    plan = world.step()
    cond = world.condition("MetricReady")
    assert (cond["status"], cond["reason"]) == ("False", "Unschedulable")
    assert "math-metric-7d9f8c6b5-x2k4q" in cond["message"] and scheduler in cond["message"]
    assert "gpuNodeSelector" in cond["message"]
    assert ("Warning", "MetricNotReady") in events(plan)
    # The same cause on the next reconciles: no second event, no status write.
    before = len(world.plans)
    assert world.settle().is_empty()
    assert all(("Warning", "MetricNotReady") not in events(p) for p in world.plans[before:])
    # The phase is the gang's business, not the metric service's.
    assert world.status()["phase"] == "Pending"


def test_a_metric_image_that_cannot_be_pulled_names_the_image() -> None:
    world = World(job_object())
    world.settle()
    add_metric_pod(
        world,
        {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [
                {
                    "name": "metric",
                    "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}},
                }
            ],
        },
    )
    plan = world.step()
    cond = world.condition("MetricReady")
    assert (cond["status"], cond["reason"]) == ("False", "ImagePullBackOff")
    assert "ghcr.io/grpo-operator/metric-math:0.1.0" in cond["message"]
    assert ("Warning", "MetricNotReady") in events(plan)


def test_a_metric_service_that_goes_away_is_reported_and_the_gang_keeps_running() -> None:
    world = World(job_object())
    world.settle()
    world.run_all()
    add_metric_pod(world, {"phase": "Running"})
    set_available(world, 1)
    world.settle()
    assert world.status()["phase"] == "Running"
    set_available(world, 0)
    world.objects.pop(("Pod", "math-metric-7d9f8c6b5-x2k4q"))
    add_metric_pod(
        world,
        {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "metric",
                    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s"}},
                }
            ],
        },
    )
    plan = world.step()
    cond = world.condition("MetricReady")
    assert (cond["status"], cond["reason"]) == ("False", "CrashLoopBackOff")
    assert ("Warning", "MetricNotReady") in events(plan)
    assert world.status()["phase"] == "Running" and plan.restart is None


def test_finished_and_suspended_jobs_drop_the_condition() -> None:
    world = World(job_object())
    world.settle()
    world.run_all()
    world.settle()
    assert world.condition("MetricReady")
    world.job["spec"]["suspend"] = True
    world.settle()
    assert all(c["type"] != "MetricReady" for c in world.status()["conditions"])


def test_gpu_node_selector_pins_the_gpu_pods_but_not_the_metric_pod() -> None:
    job = job_from_object(
        job_object(scheduling={"nodeSelector": {"pool": "team-a"}, "gpuNodeSelector": H100})
    )
    settings = OperatorSettings()
    deployment = next(m for m in metric_workload(job, settings) if m["kind"] == "Deployment")
    metric_selector = deployment["spec"]["template"]["spec"]["nodeSelector"]
    assert metric_selector == {"pool": "team-a"}
    for pod in gang_pods(job, settings, 1, ""):
        selector = pod["spec"]["nodeSelector"]
        assert selector == {"pool": "team-a", **H100}, pod["metadata"]["name"]


def test_gpu_node_selector_wins_over_the_operators_gpu_selector_for_the_same_key() -> None:
    job = job_from_object(job_object(scheduling={"gpuNodeSelector": {"nvidia.com/gpu.present": "yes"}}))
    settings = OperatorSettings(gpu_node_selector={"nvidia.com/gpu.present": "true"})
    for pod in gang_pods(job, settings, 1, ""):
        assert pod["spec"]["nodeSelector"]["nvidia.com/gpu.present"] == "yes"


def test_the_log_of_a_status_write_names_each_condition_it_changed() -> None:
    before = [
        {"type": "Scheduled", "status": "True", "reason": "AllPodsScheduled", "message": "a"},
        {"type": "MetricReady", "status": "False", "reason": "Starting", "message": "b"},
        {"type": "Suspended", "status": "False", "reason": "Resumed", "message": "c"},
    ]
    after = [
        {"type": "Scheduled", "status": "True", "reason": "AllPodsScheduled", "message": "a, reworded"},
        {"type": "MetricReady", "status": "True", "reason": "Available", "message": "b"},
    ]
    assert changed_conditions(before, after) == ["MetricReady True (Available)", "Suspended removed"]
    # The stored status is the tenant's to write: garbage there names nothing and raises nothing.
    assert changed_conditions("garbage", after[1:]) == ["MetricReady True (Available)"]
    assert changed_conditions([1, None, {"type": "MetricReady"}], []) == ["MetricReady removed"]
