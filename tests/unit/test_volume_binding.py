"""A new gang waits for its claim to be bound when the claim's StorageClass binds immediately.

The scheduler turns away a pod whose immediate claim is not bound yet ("pod has unbound immediate
PersistentVolumeClaims") and retries it with a growing back-off, and meanwhile the job reported a passing
Unschedulable with a Warning event. A class that binds for the first pod (WaitForFirstConsumer) needs the
pods to exist, and a class the operator cannot see is treated the same way: never wait for those.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import pytest
from grpo_operator.builders.storage import ANNOTATION_BIND_COMPLETED
from grpo_operator.reconcile import Observed
from grpo_operator.reconcile.observed import StorageClasses
from grpo_operator.settings import OperatorSettings, SettingsError

from tests.unit.reconcile_world import World, events, job_object

REPORTED_AFTER = OperatorSettings().volume_wait_reported_seconds

IMMEDIATE = StorageClasses((("fast", "Immediate"), ("local", "WaitForFirstConsumer")), default="fast")
FIRST_CONSUMER = StorageClasses((("fast", "Immediate"), ("local", "WaitForFirstConsumer")), default="local")


@dataclass
class ClassWorld(World):
    storage_classes: StorageClasses | None = None

    def observed(self) -> Observed:
        return Observed(
            objects=tuple(copy.deepcopy(list(self.objects.values()))),
            nodes=self.nodes,
            storage_classes=self.storage_classes,
        )

    def bind(self, claim: str = "math-ckpt") -> None:
        annotations = self.objects[("PersistentVolumeClaim", claim)]["metadata"].setdefault("annotations", {})
        annotations[ANNOTATION_BIND_COMPLETED] = "yes"


def world(
    classes: StorageClasses | None, settings: OperatorSettings | None = None, **spec: Any
) -> ClassWorld:
    return ClassWorld(
        job=job_object(**spec), storage_classes=classes, settings=settings or OperatorSettings()
    )


def test_pods_of_an_immediate_claim_are_created_once_it_is_bound() -> None:
    w = world(IMMEDIATE)
    first = w.step()
    assert ("PersistentVolumeClaim", "math-ckpt") in w.objects, "the claim is created at once"
    assert w.pods() == [] and not first.creates, "no pod before the claim is bound"
    assert ("Normal", "Created") in events(first) and not [e for e in first.events if e.type == "Warning"]
    assert w.status()["reason"] == "Scheduling", "while the claim is being created: pods still to be created"

    plan = w.step()  # woken by something else at once: most claims bind within a second, so no write yet
    assert w.pods() == [] and plan.status is None and plan.record is None
    assert plan.requeue_after is not None and plan.requeue_after <= REPORTED_AFTER
    w.advance(REPORTED_AFTER - 1)
    plan = w.step()  # a usual provisioning time: still no write
    assert w.pods() == [] and plan.status is None and plan.record is None
    w.advance(1)
    w.step()  # still not bound: now the status says what the gang waits for
    assert w.pods() == []
    assert w.status()["phase"] == "Pending" and w.status()["reason"] == "WaitingForVolume"
    assert "PersistentVolumeClaim math-ckpt" in w.status()["message"]
    assert w.condition("Scheduled")["reason"] == "WaitingForVolume"
    assert w.step().is_empty(), "waiting is a steady state: nothing to write while the claim is unbound"

    w.bind()
    w.step()
    assert [p["metadata"]["name"] for p in w.pods()] == [
        "math-gen-1-0",
        "math-trainer-1-0",
        "math-trainer-1-1",
    ]
    assert w.status()["reason"] == "Scheduling"
    w.settle()
    w.run_all()
    w.settle()
    assert w.status()["phase"] == "Running"


def test_a_claim_bound_before_the_next_reconcile_costs_no_status_write_of_its_own() -> None:
    w = world(IMMEDIATE)
    w.step()
    w.bind()
    plan = w.step()
    assert len(plan.creates) == 3 and plan.status is None, "the status already says: pods to be created"


def test_a_claim_that_binds_for_its_first_pod_gets_its_pods_at_once() -> None:
    for w in (
        world(FIRST_CONSUMER),  # the default class binds for the first pod
        world(
            IMMEDIATE, checkpoints={"volume": {"accessMode": "ReadWriteMany", "storageClassName": "local"}}
        ),
        world(None),  # StorageClasses not known (the operator may not list them)
        world(IMMEDIATE, checkpoints={"volume": {"accessMode": "ReadWriteMany", "storageClassName": "gone"}}),
        world(StorageClasses((("fast", "Immediate"),), default=None)),  # no default class: nothing binds it
    ):
        w.step()
        assert len(w.pods()) == 3, w.storage_classes


def test_an_existing_claim_is_never_waited_for() -> None:
    """The operator does not cache a claim it did not create, so it cannot see it bound: never wait."""
    w = world(
        IMMEDIATE, checkpoints={"volume": {"accessMode": "ReadWriteMany", "existingClaim": "team-data"}}
    )
    w.step()
    assert len(w.pods()) == 3


def test_an_explicit_immediate_class_waits_even_when_the_default_would_not() -> None:
    w = world(
        FIRST_CONSUMER, checkpoints={"volume": {"accessMode": "ReadWriteMany", "storageClassName": "fast"}}
    )
    w.step()
    w.advance(REPORTED_AFTER)
    w.step()
    assert w.pods() == [] and w.status()["reason"] == "WaitingForVolume"


def test_the_wait_is_reported_after_the_operator_setting() -> None:
    w = world(IMMEDIATE, settings=OperatorSettings(volume_wait_reported_seconds=5))
    w.step()
    plan = w.step()
    assert plan.status is None and plan.requeue_after is not None and plan.requeue_after <= 5
    w.advance(5)
    w.step()
    assert w.pods() == [] and w.status()["reason"] == "WaitingForVolume"


def test_a_startup_deadline_shorter_than_the_report_delay_still_fails_the_job_on_time() -> None:
    w = world(IMMEDIATE, runPolicy={"startupDeadlineSeconds": 10})
    w.step()
    plan = w.step()
    assert plan.requeue_after is not None and plan.requeue_after <= 10, "woken at the deadline"
    w.advance(10)
    w.step()
    assert w.status()["phase"] == "Failed" and w.status()["reason"] == "StartupDeadlineExceeded"
    assert w.pods() == []


def test_a_volume_wait_setting_out_of_range_is_refused_naming_it() -> None:
    for value in (-1.0, 601.0):
        with pytest.raises(SettingsError, match="volume_wait_reported_seconds must be between 0 and 600"):
            OperatorSettings(volume_wait_reported_seconds=value)


def test_a_claim_never_bound_fails_the_job_at_the_startup_deadline_naming_it() -> None:
    w = world(IMMEDIATE, runPolicy={"backoffLimit": 2, "startupDeadlineSeconds": 600})
    w.step()
    w.step()
    plan = w.reconcile()
    assert plan.requeue_after is not None and plan.requeue_after <= 600, "woken at the deadline"
    w.advance(601)
    w.step()
    status = w.status()
    assert status["phase"] == "Failed" and status["reason"] == "StartupDeadlineExceeded"
    assert "PersistentVolumeClaim math-ckpt was not bound" in status["message"]
    assert "kubectl describe pvc math-ckpt" in status["message"]
    assert w.pods() == []


def test_a_restarted_gang_does_not_wait_for_its_bound_claim() -> None:
    w = world(IMMEDIATE)
    w.step()
    w.bind()
    w.settle()
    w.run_all()
    w.settle()
    w.terminate("math-trainer-1-0", 1, "boom")
    w.settle()
    assert w.status()["trainerAttempt"] == 2
    assert {p["metadata"]["labels"]["grpo.dev/attempt"] for p in w.pods()} == {"2"}
