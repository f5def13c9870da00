"""reconcile and objects it did not create: same name is not ownership, uid-preconditioned writes and deletes, and
older pods and claims of the same name."""

from __future__ import annotations

import copy

import pytest

from tests.unit.reconcile_world import (
    CKPT,
    World,
    applied_names,
    assert_second_gang_resumes_from_checkpoint,
    events,
    foreign,
    job_object,
    running_world,
)

# --- ownership: same name is not ownership ----------------------------------------------------------------------


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
