"""reconcile(job, observed, now, settings) -> Plan: lifecycle, failures, deadlines, idempotence.

The tests keep the cluster's state as plain data (the job object and its children) and apply each
plan to it the way the API server would, so "running reconcile again changes nothing" and "an
operator killed half-way converges" are checked on the real decision code.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from grpo_operator.reconcile import OWNED_STATUS_FIELDS, Observed, Plan, reconcile
from grpo_operator.reconcile.conditions import format_time
from grpo_operator.reconcile.record import ANNOTATION_RECORD, read_record, record_annotation
from grpo_operator.settings import OperatorSettings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

T0 = datetime(2026, 11, 29, 8, 0, 0, tzinfo=UTC)
SETTINGS = OperatorSettings()
CKPT = "/workspace/checkpoints/step-50"


def job_object(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": {"name": "Qwen/Qwen2.5-1.5B-Instruct"},
        "dataset": {"train": "hf://openai/gsm8k:main#train"},
        "grpo": {"groupSize": 8, "promptsPerStep": 4, "steps": 500},
        "metric": {"image": "ghcr.io/grpo-operator/metric-math:0.1.0"},
        "trainer": {"nodes": 2, "gpusPerNode": 2},
        "checkpoints": {"volume": {"accessMode": "ReadWriteMany"}},
        "runPolicy": {"backoffLimit": 2},
    }
    for key, value in spec.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return {
        "apiVersion": "grpo.dev/v1alpha1",
        "kind": "GRPOJob",
        "metadata": {"name": "math", "namespace": "ns", "uid": "uid-1", "generation": 1},
        "spec": base,
    }


@dataclass
class World:
    """The job and its children as the API server would hold them."""

    job: dict[str, Any]
    objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    now: datetime = T0
    nodes: frozenset[str] | None = frozenset({"gpu-node-0", "gpu-node-1", "cpu-node-0"})
    plans: list[Plan] = field(default_factory=list)
    serial: int = 0
    # Secrets the operator created, by name: never observed (the operator does not list, watch or read them).
    secrets: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Deleted pods stay, terminating, until gone() (a real kubelet's grace period); else they vanish at once.
    graceful: bool = False
    settings: OperatorSettings = SETTINGS

    def observed(self) -> Observed:
        return Observed(objects=tuple(copy.deepcopy(list(self.objects.values()))), nodes=self.nodes)

    def reconcile(self) -> Plan:
        plan = reconcile(copy.deepcopy(self.job), self.observed(), self.now, self.settings)
        self.plans.append(plan)
        return plan

    def apply(
        self, plan: Plan, *, status: bool = True, deletes: bool = True, creates: int | None = None
    ) -> None:
        """Carry out a plan like the runtime does (optionally only part of it, as a killed operator would),
        with the API server's preconditions: a write naming a uid reaches only the object with that uid,
        and a create never replaces an existing object. Secrets first, under a generateName: the names the
        API server picks join the record and the status, as the runtime writes them."""
        recorded: dict[str, str] = {}
        for secret in plan.secrets:
            meta = secret.manifest["metadata"]
            assert "name" not in meta, "a generated Secret is created under a generateName only"
            generated = f"{meta['generateName']}x{self.serial + 1:04d}"
            created = self._created({**secret.manifest, "metadata": {**meta, "name": generated}})
            created["stringData"] = {secret.key: f"generated-{self.serial}"}
            self.secrets[generated] = created
            recorded[secret.status_field] = generated
        record, new_status = plan.record, plan.status
        if recorded:
            record = {**(record if record is not None else read_record(self.job) or {}), **recorded}
            new_status = {**(new_status or {}), **recorded}
        if status and record is not None:
            annotations = self.job["metadata"].setdefault("annotations", {})
            annotations[ANNOTATION_RECORD] = record_annotation(record)
        if status and new_status:
            current = self.job.setdefault("status", {})
            for key, value in new_status.items():
                if value is None:
                    current.pop(key, None)
                else:
                    current[key] = copy.deepcopy(value)
        for child_patch in plan.patches:
            target = self.objects.get((child_patch.ref.kind, child_patch.ref.name))
            if target is not None and self._same(target, child_patch.ref.uid):
                annotations = child_patch.patch.get("metadata", {}).get("annotations", {})
                target["metadata"].setdefault("annotations", {}).update(annotations)
        if deletes:
            for ref in plan.deletes:
                target = self.objects.get((ref.kind, ref.name))
                if target is not None and self._same(target, ref.uid):
                    if self.graceful and ref.kind == "Pod":
                        # A kubelet keeps the pod for its termination grace period.
                        target["metadata"]["deletionTimestamp"] = format_time(self.now)
                    else:
                        del self.objects[(ref.kind, ref.name)]
        for manifest in plan.applies:
            name = (manifest["kind"], manifest["metadata"]["name"])
            uid = manifest["metadata"].get("uid")
            existing = self.objects.get(name)
            if uid is None and existing is None:
                self.objects[name] = self._created(manifest)
            elif uid is not None and existing is not None and self._same(existing, uid):
                self.objects[name] = copy.deepcopy(manifest)
        for manifest in plan.creates[: creates if creates is not None else len(plan.creates)]:
            obj = self._created(manifest)
            obj["status"] = {"phase": "Pending"}
            self.objects.setdefault((obj["kind"], obj["metadata"]["name"]), obj)

    def _created(self, manifest: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(manifest)
        self.serial += 1
        obj["metadata"]["uid"] = f"uid-{obj['metadata']['name']}-{self.serial}"
        obj["metadata"]["creationTimestamp"] = format_time(self.now)
        return obj

    @staticmethod
    def _same(obj: dict[str, Any], uid: str | None) -> bool:
        assert uid is not None, f"a write to {obj['metadata']['name']} without a uid precondition"
        return bool(obj["metadata"].get("uid") == uid)

    def step(self) -> Plan:
        plan = self.reconcile()
        self.apply(plan)
        return plan

    def settle(self) -> Plan:
        """Reconcile and apply until nothing changes; returns the last (empty) plan."""
        for _ in range(10):
            plan = self.step()
            if plan.is_empty():
                return plan
        raise AssertionError(f"reconcile did not converge: {self.plans[-1]}")

    # --- pod lifecycles, the way kube-scheduler and kwok would move them ----------------------------------

    def pods(self, role: str | None = None) -> list[dict[str, Any]]:
        return [
            o
            for (kind, _), o in sorted(self.objects.items())
            if kind == "Pod" and (role is None or o["metadata"]["labels"]["grpo.dev/role"] == role)
        ]

    def pod(self, name: str) -> dict[str, Any]:
        return self.objects[("Pod", name)]

    def schedule_all(self) -> None:
        for i, pod in enumerate(self.pods()):
            pod["spec"]["nodeName"] = f"gpu-node-{i % 2}"
            pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]

    def run_all(self) -> None:
        """Every pod running and Ready (vLLM answers /health), as the kubelet reports it."""
        self.schedule_all()
        for pod in self.pods():
            pod["status"]["phase"] = "Running"
            pod["status"]["startTime"] = format_time(self.now)
            pod["status"]["conditions"].append(
                {"type": "Ready", "status": "True", "lastTransitionTime": format_time(self.now)}
            )

    def terminate(
        self, name: str, exit_code: int, message: str = "", phase: str | None = None, reason: str = "Error"
    ) -> None:
        pod = self.pod(name)
        pod["status"]["phase"] = phase or ("Succeeded" if exit_code == 0 else "Failed")
        pod["status"]["containerStatuses"] = [
            {
                "name": pod["spec"]["containers"][0]["name"],
                "state": {"terminated": {"exitCode": exit_code, "reason": reason, "message": message}},
            }
        ]

    def gone(self) -> None:
        """Every terminating pod finishes its grace period and leaves the API."""
        for key in [k for k, o in self.objects.items() if o["metadata"].get("deletionTimestamp")]:
            del self.objects[key]

    def status(self) -> dict[str, Any]:
        return dict(self.job.get("status") or {})

    def condition(self, type_: str) -> dict[str, Any]:
        return next(c for c in self.status()["conditions"] if c["type"] == type_)

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def running_world(**spec: Any) -> World:
    world = World(job_object(**spec))
    world.settle()
    world.run_all()
    world.settle()
    assert world.status()["phase"] == "Running"
    return world


def env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0]["env"]}


def events(plan: Plan) -> list[tuple[str, str]]:
    return [(e.type, e.reason) for e in plan.events]


def assert_second_gang_resumes_from_checkpoint(plan: Plan) -> None:
    """The plan creates the whole second gang, and its trainers resume from CKPT."""
    assert sorted(m["metadata"]["name"] for m in plan.creates) == [
        "math-gen-2-0",
        "math-trainer-2-0",
        "math-trainer-2-1",
    ]
    assert all(env(p)["RESUME_FROM"] == CKPT for p in plan.creates if "trainer" in p["metadata"]["name"])


# --- creation and steady state ---------------------------------------------------------------------------


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


def test_generation_failure_replaces_vllm_and_restarts_the_trainers() -> None:
    world = running_world()
    world.terminate("math-gen-1-0", 137, "", phase="Failed")
    plan = world.step()
    assert world.status()["reason"] == "GenerationFailed"
    assert world.status()["restarts"] == 1
    assert "math-trainer-1-0" in [r.name for r in plan.deletes]
    assert "math-gen-2-0" in [m["metadata"]["name"] for m in world.step().creates]


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
    }
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


# --- suspend, completion, TTL ----------------------------------------------------------------------------------


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


# --- ownership: same name is not ownership ----------------------------------------------------------------------


def foreign(kind: str, name: str, **metadata: Any) -> dict[str, Any]:
    """An object someone else created in the job's namespace (no controller reference to the job)."""
    meta = {"name": name, "namespace": "ns", "uid": f"theirs-{name}", **metadata}
    return {"apiVersion": "v1", "kind": kind, "metadata": meta, "data": {"keep": "me"}}


def applied_names(plan: Plan) -> set[tuple[str, str]]:
    return {(m["kind"], m["metadata"]["name"]) for m in plan.applies}


def test_pre_existing_same_name_objects_are_reported_and_never_taken_over() -> None:
    world = World(job_object())
    sa = foreign("ServiceAccount", "math-trainer")
    cm = foreign("ConfigMap", "math-config", labels={"grpo.dev/job": "math"})
    world.objects[("ServiceAccount", "math-trainer")] = copy.deepcopy(sa)
    world.objects[("ConfigMap", "math-config")] = copy.deepcopy(cm)
    plan = world.step()
    assert ("ServiceAccount", "math-trainer") not in applied_names(plan)
    assert ("ConfigMap", "math-config") not in applied_names(plan)
    assert not plan.creates, "no pod may run under someone else's ServiceAccount or config"
    assert not plan.deletes
    assert world.objects[("ServiceAccount", "math-trainer")] == sa
    assert world.objects[("ConfigMap", "math-config")] == cm
    status = world.status()
    assert status["phase"] == "Pending" and status["reason"] == "ChildConflict"
    assert "trainerAttempt" not in status, "the job has not started"
    conflict = world.condition("Conflict")
    assert conflict["status"] == "True"
    assert (
        "ConfigMap math-config" in conflict["message"]
        and "ServiceAccount math-trainer" in conflict["message"]
    )
    assert "Delete or rename" in conflict["message"]
    assert events(plan) == [("Warning", "ChildConflict")]
    assert world.reconcile().is_empty(), "the conflict is reported once, not every reconcile"

    # The owner deletes their objects: the job starts as if it had just been created.
    del world.objects[("ServiceAccount", "math-trainer")]
    del world.objects[("ConfigMap", "math-config")]
    plan = world.step()
    assert {("ServiceAccount", "math-trainer"), ("ConfigMap", "math-config")} <= applied_names(plan)
    assert [m["metadata"]["name"] for m in plan.creates] == [
        "math-gen-1-0",
        "math-trainer-1-0",
        "math-trainer-1-1",
    ]
    assert ("Normal", "Created") in events(plan)
    assert all(c["type"] != "Conflict" for c in world.status()["conditions"])


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("PersistentVolumeClaim", "math-ckpt"),
        ("Role", "math-trainer"),
        ("RoleBinding", "math-trainer"),
        ("Service", "math-trainer"),
        ("Service", "math-gen"),
        ("Service", "math-metric"),
        ("NetworkPolicy", "math-gen"),
        ("NetworkPolicy", "math-metric"),
        ("Deployment", "math-metric"),
        ("Pod", "math-trainer-1-1"),
        ("Pod", "math-gen-1-0"),
    ],
)
def test_every_child_kind_is_protected_from_takeover(kind: str, name: str) -> None:
    world = World(job_object())
    theirs = foreign(kind, name, labels={"grpo.dev/job": "math", "grpo.dev/role": "trainer"})
    world.objects[(kind, name)] = copy.deepcopy(theirs)
    plan = world.step()
    assert (kind, name) not in applied_names(plan)
    assert not plan.creates and not plan.deletes
    assert world.objects[(kind, name)] == theirs
    assert f"{kind} {name}" in world.condition("Conflict")["message"]


def test_a_labelled_look_alike_is_never_deleted_when_the_job_finishes() -> None:
    world = running_world()
    del world.objects[("Deployment", "math-metric")]
    theirs = foreign("Deployment", "math-metric", labels={"grpo.dev/job": "math", "grpo.dev/role": "metric"})
    world.objects[("Deployment", "math-metric")] = copy.deepcopy(theirs)
    world.terminate("math-trainer-1-0", 0)
    plan = world.step()
    assert world.status()["phase"] == "Succeeded"
    assert "math-metric" not in {r.name for r in plan.deletes}
    assert world.objects[("Deployment", "math-metric")] == theirs


def test_a_conflict_arising_mid_run_blocks_new_pods_but_leaves_everything_else_alone() -> None:
    world = running_world()
    del world.objects[("ConfigMap", "math-config")]
    world.objects[("ConfigMap", "math-config")] = foreign("ConfigMap", "math-config")
    world.terminate("math-trainer-1-1", 1, "boom")
    world.step()  # the failed gang is replaced: deleted now ...
    plan = world.step()  # ... but the new one is not created while the config is someone else's
    assert not plan.creates
    assert world.status()["reason"] == "ChildConflict"
    assert world.objects[("ConfigMap", "math-config")]["data"] == {"keep": "me"}


def test_a_claim_retained_by_an_earlier_job_of_the_same_name_is_not_reused_silently() -> None:
    first = running_world()
    retained = copy.deepcopy(first.objects[("PersistentVolumeClaim", "math-ckpt")])
    assert "ownerReferences" not in retained["metadata"], "retention Retain: the claim has no owner"
    assert retained["metadata"]["annotations"]["grpo.dev/job-uid"] == "uid-1"

    # The job is deleted and recreated under the same name: a new uid.
    second = World(job_object())
    second.job["metadata"]["uid"] = "uid-2"
    second.objects[("PersistentVolumeClaim", "math-ckpt")] = copy.deepcopy(retained)
    plan = second.step()
    assert not plan.creates and ("PersistentVolumeClaim", "math-ckpt") not in applied_names(plan)
    message = second.condition("Conflict")["message"]
    assert "earlier GRPOJob named math (uid uid-1)" in message
    assert "existingClaim: math-ckpt" in message and "kubectl delete pvc math-ckpt" in message
    assert second.objects[("PersistentVolumeClaim", "math-ckpt")] == retained

    # Opting in to the old checkpoints: the claim is mounted as an existing claim, never changed.
    second.job["spec"]["checkpoints"]["volume"]["existingClaim"] = "math-ckpt"
    plan = second.step()
    trainers = [m for m in plan.creates if "trainer" in m["metadata"]["name"]]
    assert trainers
    assert ("PersistentVolumeClaim", "math-ckpt") not in applied_names(plan)
    assert second.objects[("PersistentVolumeClaim", "math-ckpt")] == retained


def test_the_jobs_own_retained_claim_is_recognised_by_its_marks() -> None:
    world = running_world()
    claim = world.objects[("PersistentVolumeClaim", "math-ckpt")]
    assert world.reconcile().is_empty()
    claim["metadata"]["annotations"]["grpo.dev/job-uid"] = "uid-someone-else"
    assert world.reconcile().status is not None, "a claim marked for another job is not this job's"


def test_every_write_to_an_existing_child_names_its_uid() -> None:
    world = running_world()
    world.job["spec"]["metric"]["image"] = "ghcr.io/grpo-operator/metric-math:0.2.0"
    (update,) = world.reconcile().applies
    assert update["metadata"]["uid"] == world.objects[("Deployment", "math-metric")]["metadata"]["uid"]
    world.terminate("math-trainer-1-0", 1)
    plan = world.reconcile()
    assert {(r.name, r.uid) for r in plan.deletes} == {
        (name, world.pod(name)["metadata"]["uid"])
        for name in ("math-gen-1-0", "math-trainer-1-0", "math-trainer-1-1")
    }


def test_a_delete_never_removes_a_newer_object_of_the_same_name() -> None:
    world = running_world()
    world.terminate("math-trainer-1-0", 1)
    plan = world.reconcile()
    # Between the decision and the delete, someone replaced the vLLM pod with one of their own.
    world.objects[("Pod", "math-gen-1-0")] = foreign("Pod", "math-gen-1-0")
    world.apply(plan)
    assert world.objects[("Pod", "math-gen-1-0")]["metadata"]["uid"] == "theirs-math-gen-1-0"


# --- fencing: attempt n+1 starts only when attempt n is gone --------------------------------------------------------


def test_a_new_attempt_waits_until_every_old_pod_is_gone() -> None:
    world = running_world()
    world.graceful = True
    world.job["status"]["checkpoint"] = {"lastStep": 50, "path": CKPT}
    world.terminate("math-trainer-1-1", 1, "boom")
    restart = world.step()
    assert restart.deletes and not restart.creates
    plan = world.step()  # rank 0 may still be writing its SIGTERM checkpoint
    assert not plan.creates
    status = world.status()
    assert status["phase"] == "Restarting"
    assert status["reason"] == "TrainerFailed"
    assert "math-gen-1-0, math-trainer-1-0, math-trainer-1-1" in status["message"]
    assert "still terminating" in status["message"]
    assert world.condition("Running")["reason"] == "Restarting"
    assert world.reconcile().is_empty()
    # One pod is gone, the others are not: still waiting, and only for those.
    del world.objects[("Pod", "math-gen-1-0")]
    world.step()
    assert "math-gen-1-0" not in world.status()["message"]
    assert world.status()["phase"] == "Restarting"
    world.gone()
    plan = world.step()
    assert_second_gang_resumes_from_checkpoint(plan)


def test_a_resume_waits_for_the_suspended_gang_to_be_gone() -> None:
    world = running_world()
    world.graceful = True
    world.job["spec"]["suspend"] = True
    world.step()
    world.job["spec"]["suspend"] = False
    plan = world.step()
    assert not plan.creates
    assert world.status()["phase"] == "Restarting" and "still terminating" in world.status()["message"]
    world.gone()
    assert len(world.step().creates) == 3


# --- a hostile status: the operator decides from its own record ------------------------------------------------


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
