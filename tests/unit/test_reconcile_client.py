"""reconcile for client-rollout jobs (spec.rollouts.source: Client): the rollout gateway instead of the
metric service, a trainer waiting for its client is not a stall, and a client's cancel is final."""

from __future__ import annotations

import copy
from typing import Any

from grpo_operator.reconcile.conditions import format_time

from tests.unit.reconcile_world import World, applied_names, events, foreign, job_object

GATEWAY = ("Deployment", "math-rollouts")


def client_job(**spec: Any) -> dict[str, Any]:
    job = job_object(**spec)
    del job["spec"]["metric"], job["spec"]["dataset"]
    job["spec"]["rollouts"] = {"source": "Client"}
    return job


def client_world(**spec: Any) -> World:
    world = World(client_job(**spec))
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


def _token_refs(manifest: dict[str, Any]) -> list[str]:
    spec = manifest["spec"].get("template", {}).get("spec") or manifest["spec"]
    return [
        e["valueFrom"]["secretKeyRef"]["name"]
        for c in spec["containers"]
        for e in c.get("env", [])
        if e["name"] == "GRPO_GATEWAY_INTERNAL_TOKEN"
    ]


def test_the_gateway_token_is_created_once_under_a_generated_name_the_status_records() -> None:
    world = World(client_job())
    first = world.reconcile()
    [secret] = first.secrets
    assert secret.key == "token" and secret.status_field == "gatewayTokenSecret"
    assert secret.manifest["metadata"]["generateName"] == "math-gateway-token-"
    assert "name" not in secret.manifest["metadata"], "a fixed name could be a Secret the tenant made"
    # Nothing that reads the token before its name is known: no gateway, no gang.
    assert GATEWAY not in applied_names(first) and not first.creates
    assert first.status is not None and first.status["phase"] == "Pending"
    world.apply(first)
    [(name, token)] = world.secrets.items()
    assert name.startswith("math-gateway-token-") and world.status()["gatewayTokenSecret"] == name
    owner = token["metadata"]["ownerReferences"]
    assert owner[0]["uid"] == "uid-1" and owner[0]["controller"] is True
    assert token["metadata"]["labels"]["grpo.dev/job"] == "math" and token["immutable"] is True
    assert not any(kind == "Secret" for kind, _ in world.objects), "never observed"

    world.settle()
    world.run_all()
    world.settle()
    assert world.status()["phase"] == "Running"
    assert _token_refs(world.objects[GATEWAY]) == [name]
    assert _token_refs(world.pod("math-trainer-1-0")) == [name]
    assert _token_refs(world.pod("math-trainer-1-1")) == _token_refs(world.pod("math-gen-1-0")) == []
    value = copy.deepcopy(token["stringData"])
    world.terminate("math-trainer-1-0", 1, "boom")
    world.settle()
    world.run_all()
    world.settle()
    assert world.status()["trainerAttempt"] == 2
    assert not any(plan.secrets for plan in world.plans[1:]), "created once"
    assert list(world.secrets) == [name] and world.secrets[name]["stringData"] == value
    assert _token_refs(world.pod("math-trainer-2-0")) == [name]


def test_a_tenant_secret_named_like_the_token_is_never_used() -> None:
    world = World(client_job())
    theirs = foreign("Secret", "math-gateway-token-abcde", labels={"grpo.dev/job": "math"})
    world.objects[("Secret", "math-gateway-token-abcde")] = copy.deepcopy(theirs)
    world.settle()
    world.run_all()
    world.settle()
    [name] = world.secrets
    assert name != "math-gateway-token-abcde"
    assert _token_refs(world.objects[GATEWAY]) == [name] == _token_refs(world.pod("math-trainer-1-0"))
    assert world.status()["phase"] == "Running" and "Conflict" not in {
        c["type"] for c in world.status()["conditions"]
    }
    assert world.objects[("Secret", "math-gateway-token-abcde")] == theirs


def test_a_forged_token_name_in_the_status_is_not_used() -> None:
    """The trainer can write the status: the name the gateway and the pods read comes from the operator's
    record, and the status is put back."""
    world = client_world()
    [name] = world.secrets
    world.job["status"]["gatewayTokenSecret"] = "dspy-token"
    plan = world.step()
    assert plan.status == {"gatewayTokenSecret": name} and not plan.secrets
    assert GATEWAY not in applied_names(plan) and _token_refs(world.objects[GATEWAY]) == [name]


def test_a_token_created_by_an_operator_stopped_before_its_status_write_is_left_to_the_job() -> None:
    world = World(client_job())
    world.apply(world.reconcile(), status=False)
    [orphan] = world.secrets
    assert "gatewayTokenSecret" not in world.status()
    world.settle()
    assert len(world.secrets) == 2 and world.status()["gatewayTokenSecret"] != orphan
    # Owned by the job: the garbage collector removes it with the job.
    assert world.secrets[orphan]["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert _token_refs(world.objects[GATEWAY]) == [world.status()["gatewayTokenSecret"]]


def test_a_deleted_token_is_not_recreated() -> None:
    """A documented limit: the pods holding the value keep it, and a new value would lock them out."""
    world = client_world()
    [name] = world.secrets
    del world.secrets[name]
    world.terminate("math-trainer-1-0", 1, "boom")
    world.settle()
    assert not world.secrets and world.status()["gatewayTokenSecret"] == name
    assert not any(plan.secrets for plan in world.plans[1:])
